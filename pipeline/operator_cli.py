"""The operator commands of ``aep-collector``: watch the stream and answer held requests.

They talk to a running collector's relay role (found through ``<state_dir>/relay.json``, or
``--url``/``--token``) over its own AEP bindings — SSE to read, the WebSocket to send commands —
or read JSONL logs (``--file``) through ``aep_collector.pipeline.jsonl_files``. Every failure is one ``error:``
line and an exit code; never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fnmatch
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .atomic import atomic_write

# Exit codes: one per outcome a script may want to branch on.
OK = 0
REJECTED = 1
USAGE = 2
NOT_FOUND = 3
UNREACHABLE = 4
NO_ANSWER = 5

SEVERITIES = ("debug", "info", "notice", "warning", "error", "critical")
OPERATOR_AGENT = "aep-operator"
ACK_WINDOW = 10.0
"""Seconds ``respond``/``cancel`` wait for the ack when the target declares no window (AEP-0004's
default ``ack_window_ms``); the target's own declaration, read from the roster, wins."""
RETRIES = 2
"""Times a command is sent again, with the same id, after a window of silence (as AEP's reference CLI)."""
ROSTER_WAIT = 3.0
"""Seconds to wait for the roster that declares the window; a relay that does not answer gets the default."""
ROSTER_MAX = 64 * 1024 * 1024
"""Bytes one frame from the collector may have: its roster names every session it remembers (up to
100,000 of its own, ~18 MB), far past a WebSocket client's default 4 MiB."""


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# -- finding the collector ------------------------------------------------------------------------


def state_dir() -> Path:
    return Path(os.environ.get("AEP_STATE_DIR") or "~/.aep").expanduser()


@dataclass
class Target:
    url: str
    token: str


def target(args: argparse.Namespace) -> Target:
    """Where the relay role listens and its token: flags, then env, then ``relay.json``."""
    url, token = getattr(args, "url", None), getattr(args, "token", None) or os.environ.get("AEP_TOKEN")
    doc: dict[str, Any] = {}
    path = state_dir() / "relay.json"
    if url is None or token is None:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CliError(f"no running collector found: {path} does not exist "
                           "(start one with `aep-collector`, or pass --url and --token)", UNREACHABLE) from None
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot read {path}: {exc}", UNREACHABLE) from None
    local = str(doc.get("endpoint") or "").rstrip("/")
    url = (url or local).rstrip("/")
    # The token file is that collector's credential: never sent to another --url (a typo, or a
    # relay another user runs on this host, which could then command this collector's agents).
    if token is None and doc.get("token_file") and url == local:
        try:
            token = Path(doc["token_file"]).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"cannot read the relay token {doc['token_file']}: {exc.strerror}", UNREACHABLE) from None
    if not url:
        raise CliError(f"{path} names no endpoint", UNREACHABLE)
    if not token:
        mine = f" (the token file in {path} is for {local} only)" if doc.get("token_file") and url != local else ""
        raise CliError(f"no relay token: set AEP_TOKEN or pass --token{mine}", UNREACHABLE)
    return Target(url, token)


def _unreachable(t: Target, exc: BaseException) -> CliError:
    return CliError(f"collector unreachable at {t.url}: {exc}", UNREACHABLE)


# -- reading events -------------------------------------------------------------------------------


def read_file_events(path: str) -> Iterator[dict[str, Any]]:
    """The one JSONL reader of the operator commands: a session log (rotated and compressed
    parts included, via ``aep_collector.pipeline.jsonl_files``), skipping lines that are not AEP events."""
    from .jsonl_files import iter_lines

    try:
        for line in iter_lines(path):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and ev.get("aep") == "0.1":
                yield ev
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", USAGE) from None


EXHAUSTED = ": replay-exhausted "
"""The comment a relay sends before replaying a session it no longer holds from the asked position
(AEP-0003 §3.3): ``{session} {earliest epoch}:{earliest seq}``."""


def exhausted(rest: str) -> None:
    """Tell the operator a resume skipped events the collector no longer holds (AEP-0003 §5: the
    consumer should go to a history store), instead of carrying on as if nothing was missed."""
    session, _, earliest = rest.rpartition(" ")
    print(printable(f"warning: the collector no longer holds every event of session {session} after the "
                    f"position resumed from; it goes on from {earliest} (the ones before are in the "
                    "session's JSONL log)"), file=sys.stderr, flush=True)


async def sse_events(t: Target, flt: dict[str, Any], from_: Any = None, live: bool = True,
                     ) -> AsyncIterator[dict[str, Any]]:
    """Events from the relay role's SSE stream (replay first when ``from_`` is given)."""
    import aiohttp

    params = {"filter": json.dumps(flt)}
    if from_ is not None:
        params["from"] = from_ if isinstance(from_, str) else json.dumps(from_)
    if not live:
        params["live"] = "0"
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=None if live else 30)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http, \
                http.get(f"{t.url}/stream", params=params,
                         headers={"Authorization": f"Bearer {t.token}", "Accept": "text/event-stream"}) as r:
            if r.status == 401:
                raise CliError("the collector refused the token (401): check AEP_TOKEN or --token", UNREACHABLE)
            if r.status != 200:  # 400: what we asked is refused; anything else: no relay serves it there
                raise CliError(f"the collector answered {r.status}: {(await r.text())[:200]}",
                               USAGE if r.status == 400 else UNREACHABLE)
            last = ""  # the relay's last comment: why the stream ends, when it says
            async for raw in r.content:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                if line.startswith("data:"):
                    try:
                        ev = json.loads(line[5:].strip())
                    except ValueError:
                        continue
                    if isinstance(ev, dict):  # anything else is no event (and would crash the commands)
                        yield ev
                elif line.startswith(EXHAUSTED):
                    exhausted(line[len(EXHAUSTED):])
                elif line.startswith(":") and line != ": ping":
                    last = line
    except aiohttp.ClientError as exc:
        raise _unreachable(t, exc) from None
    # A live stream never ends on its own, and a replay ends with its marker: any other end means
    # the events stop here, which a script reading the output must not take for success.
    if last == ": shutting-down":
        raise CliError(f"the collector at {t.url} is stopping: the stream ended", UNREACHABLE)
    if live:
        raise CliError(f"the collector at {t.url} ended the stream (it disconnects a consumer that falls "
                       "too far behind); run the command again to resume", UNREACHABLE)
    if last != ": replay-complete":
        raise CliError(f"the collector at {t.url} ended its replay before it was complete", UNREACHABLE)


async def history(t: Target, flt: dict[str, Any]) -> list[dict[str, Any]]:
    """Everything the relay role holds that matches ``flt`` (replay-all, no live tail)."""
    return [ev async for ev in sse_events(t, flt, "all", live=False)]


# -- rendering ------------------------------------------------------------------------------------

_COLOURS = {"debug": "2", "info": "0", "notice": "36", "warning": "33", "error": "31", "critical": "1;31"}

# What an event's author could use to rewrite the operator's terminal: C0/C1 controls (ANSI and OSC
# escapes, a carriage return that hides the start of a command) and the bidi overrides.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: Any) -> str:
    """``text`` as it may reach the operator's terminal: every control character shown as an
    escape (``\\x1b``), never interpreted. Event content is the agent's (a tool's input, a
    prompt), and ``pending`` is where the operator decides on it."""
    return _UNPRINTABLE.sub(_escape, text if isinstance(text, str) else str(text))


def summary(ev: dict[str, Any]) -> str:
    data = raw if isinstance(raw := ev.get("data"), dict) else {}
    bits = []
    tool = data.get("tool")
    if isinstance(tool, dict) and tool.get("name"):
        bits.append(str(tool["name"]))
    for key in ("kind", "status", "resolution", "reason", "prompt"):
        if isinstance(data.get(key), str):
            bits.append(f"{key}={data[key][:60]}")
    if isinstance(data.get("answer"), dict):
        bits.append("answer=" + json.dumps(data["answer"], ensure_ascii=False)[:60])
    if ev.get("subject"):
        bits.append(f"subject={ev['subject']}")
    return " ".join(bits)


def line_of(ev: dict[str, Any], colour: bool) -> str:
    when = str(ev.get("time", ""))[11:23]
    sev = ev.get("severity", "info")
    text = printable(f"{when} {str(ev.get('agent', '?')):<12} {str(ev.get('session', '-'))[:12]:<12} "
                     f"{str(ev.get('type', '?')):<26} {summary(ev)}").rstrip()
    if colour and sev in _COLOURS and _COLOURS[sev] != "0":
        return f"\x1b[{_COLOURS[sev]}m{text}\x1b[0m"
    return text


def json_line(ev: dict[str, Any]) -> str:
    """One event as a JSON line; the characters JSON leaves raw that a terminal would act on
    (C1 controls, bidi overrides) are written as ``\\u`` escapes (the same JSON value)."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}",
                            json.dumps(ev, ensure_ascii=False, separators=(",", ":")))


def emit(ev: dict[str, Any], as_json: bool, colour: bool) -> None:
    sys.stdout.write((json_line(ev) if as_json else line_of(ev, colour)) + "\n")
    sys.stdout.flush()


def position(ev: dict[str, Any]) -> tuple[int, int, str]:
    seq = ev.get("seq")
    return (ev.get("epoch", 0), seq if isinstance(seq, int) else 1 << 62, str(ev.get("time", "")))


# -- tail -----------------------------------------------------------------------------------------


def tail_filter(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """The server-side attr-match filter and any client-side type glob it cannot express."""
    flt: dict[str, Any] = {}
    if args.agent:
        flt["agent"] = args.agent
    if args.session:
        flt["session"] = args.session
    if args.severity:
        if args.severity not in SEVERITIES:
            raise CliError(f"--severity must be one of {', '.join(SEVERITIES)}", USAGE)
        flt["severity"] = {"gte": args.severity}
    glob = None
    if args.type:
        t = args.type
        if "*" not in t:
            flt["type"] = t
        elif t.endswith(".*") and "*" not in t[:-2]:
            flt["type"] = t
        else:
            glob = t
    return flt, glob


def local_match(flt: dict[str, Any], glob: str | None, ev: dict[str, Any]) -> bool:
    from aep_collector.exporters.relay_server.match import matches

    return matches(flt, ev) and (glob is None or fnmatch.fnmatchcase(str(ev.get("type", "")), glob))


def cursor_path() -> Path:
    return state_dir() / "tail.cursor.json"


def load_cursor() -> list[dict[str, Any]]:
    try:
        doc = json.loads(cursor_path().read_text(encoding="utf-8"))
        return [p for p in doc if isinstance(p, dict) and isinstance(p.get("session"), str)][-500:]
    except (OSError, ValueError, TypeError):
        return []


def save_cursor(seen: dict[str, tuple[int, int]]) -> None:
    path = cursor_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps([{"session": s, "epoch": e, "seq": q} for s, (e, q) in seen.items()][-500:]))
    except OSError:
        pass  # resuming is a convenience; tailing goes on without it


def _stop_on_signals() -> list[int]:
    """End the running command cleanly on SIGTERM or SIGHUP (a supervisor, ``timeout``, a closed
    terminal), as on Ctrl-C, so its ``finally`` runs; returned is the signal taken, once one is."""
    task, loop, stopped = asyncio.current_task(), asyncio.get_running_loop(), []

    def stop(signum: int) -> None:
        stopped.append(signum)
        if task is not None:
            task.cancel()

    for name in ("SIGTERM", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):  # no handlers on this loop
                loop.add_signal_handler(signum, stop, int(signum))
    return stopped


async def cmd_tail(args: argparse.Namespace) -> int:
    flt, glob = tail_filter(args)
    colour = sys.stdout.isatty() and not args.json and "NO_COLOR" not in os.environ
    if args.file:
        for ev in read_file_events(args.file):
            if local_match(flt, glob, ev):
                emit(ev, args.json, colour)
        return OK
    t = target(args)
    from_: Any = "all" if args.all else None
    seen: dict[str, tuple[int, int]] = {}
    if from_ is None and not args.no_resume:
        cursor = load_cursor()
        seen = {p["session"]: (p.get("epoch", 0), p.get("seq", -1)) for p in cursor}
        from_ = [p for p in cursor if "session" not in flt or p["session"] == flt["session"]] or None
    stopped = _stop_on_signals()
    try:
        async for ev in sse_events(t, flt, from_):
            if isinstance(ev.get("session"), str) and isinstance(ev.get("seq"), int):
                seen[ev["session"]] = (ev.get("epoch", 0), ev["seq"])
                seen[ev["session"]] = seen.pop(ev["session"])  # most recent last
            if glob is None or fnmatch.fnmatchcase(str(ev.get("type", "")), glob):
                emit(ev, args.json, colour)
    except asyncio.CancelledError:
        if not stopped:
            raise
        return 128 + stopped[0]
    finally:
        if not args.no_resume:
            save_cursor(seen)
    return OK


# -- timeline -------------------------------------------------------------------------------------


async def cmd_timeline(args: argparse.Namespace) -> int:
    if args.file:
        events = [ev for ev in read_file_events(args.file) if ev.get("session") == args.session]
    else:
        events = await history(target(args), {"session": args.session})
    if not events:
        raise CliError(f"no events for session {args.session!r}"
                       + (f" in {args.file}" if args.file else " held by the collector"), NOT_FOUND)
    unique: dict[tuple[Any, Any], dict[str, Any]] = {}
    for ev in events:  # dedupe on (source, id): delivery is at-least-once
        unique.setdefault((ev.get("source"), ev.get("id")), ev)
    ordered = sorted(unique.values(), key=position)
    colour = sys.stdout.isatty() and not args.json and "NO_COLOR" not in os.environ
    if not args.dag:
        for ev in ordered:
            emit(ev, args.json, colour)
        return OK
    ids = {ev.get("id") for ev in ordered}
    children: dict[Any, list[dict[str, Any]]] = {}
    roots = []
    for ev in ordered:
        if ev.get("cause") in ids and ev.get("cause") != ev.get("id"):
            children.setdefault(ev["cause"], []).append(ev)
        else:
            roots.append(ev)
    done: set[Any] = set()

    def draw(ev: dict[str, Any], prefix: str, last: bool, top: bool) -> None:
        if ev.get("id") in done:
            return
        done.add(ev.get("id"))
        branch = "" if top else ("└─ " if last else "├─ ")
        sys.stdout.write(prefix + branch + printable(f"{ev.get('type')} {ev.get('id')} {summary(ev)}").rstrip() + "\n")
        kids = children.get(ev.get("id"), [])
        for i, kid in enumerate(kids):
            draw(kid, prefix + ("" if top else ("   " if last else "│  ")), i == len(kids) - 1, False)

    for root in roots:
        draw(root, "", True, True)
    return OK


# -- pending, respond, cancel ---------------------------------------------------------------------


def open_requests(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``attention.requested`` events with no ``attention.resolved``/``timeout`` for them yet."""
    closed = {ev.get("subject") for ev in events if ev.get("type") in ("attention.resolved", "attention.timeout")}
    seen: set[Any] = set()
    out = []
    for ev in sorted(events, key=lambda e: str(e.get("time", ""))):
        if ev.get("type") == "attention.requested" and ev.get("id") not in closed and ev.get("id") not in seen:
            seen.add(ev.get("id"))
            out.append(ev)
    return out


def time_left(ev: dict[str, Any]) -> str:
    data = ev.get("data")
    expires = data.get("expires_at") if isinstance(data, dict) else None
    if not isinstance(expires, str):
        return ""
    try:
        left = datetime.fromisoformat(expires.replace("Z", "+00:00")) - datetime.now(UTC)
    except (ValueError, TypeError, OverflowError):  # not RFC 3339, or without an offset
        return ""
    return f"{max(int(left.total_seconds()), 0)} s left"


async def cmd_pending(args: argparse.Namespace) -> int:
    requests = open_requests(await history(target(args), {"type": "attention.*"}))
    if args.json:
        for ev in requests:
            emit(ev, True, False)
        return OK
    if not requests:
        print("no open attention requests")
        return OK
    for ev in requests:
        # Any emitter's request reaches this list: odd shapes are shown as far as they go, never
        # a crash that hides the others, and every string is printed inert (``printable``).
        data = raw if isinstance(raw := ev.get("data"), dict) else {}
        via = data.get("respond_via")
        answerable = not isinstance(via, list) or "control" in via
        head = f"{ev.get('id')}  {ev.get('agent')}  session {ev.get('session')}  {data.get('kind', '?')}"
        left = time_left(ev)
        print(printable(head) + (f"  ({left})" if left else "") + ("" if answerable else "  [answer in the agent's own UI]"))
        if data.get("prompt"):
            print(f"    {printable(data['prompt'])}")
        for opt in _items(data.get("options")):
            print("    " + printable(f"option {opt.get('id')}" + (f": {opt['label']}" if opt.get("label") else "")))
        for fld in _items(data.get("fields")):
            kind = fld.get("type", "?")
            req = " (required)" if fld.get("required") else ""
            label = f" {fld['label']!s}" if fld.get("label") and fld.get("label") != fld.get("id") else ""
            # AEP-0002 §5.2: a select field is answered with its ``choices[].id``s.
            choices = [str(c.get("id")) + (f" ({c['label']})" if c.get("label") and c.get("label") != c.get("id")
                                           else "") for c in _items(fld.get("choices"))]
            print("    " + printable(f"field {fld.get('id')}: {kind}{req}{label}"
                                     + (f"; one of {', '.join(choices)}" if choices else "")))
    return OK


def _items(value: Any) -> list[dict[str, Any]]:
    """The objects of a list in a request's payload (anything else in it is skipped)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _command(type_: str, session: str, **extra: Any) -> dict[str, Any]:
    from .envelope import Ulid, rfc3339_ms, safe_host, source_uri

    return {"aep": "0.1", "id": Ulid().new(), "type": type_, "time": rfc3339_ms(time.time()),
            "source": source_uri(safe_host(socket.gethostname()), OPERATOR_AGENT, None), "agent": OPERATOR_AGENT,
            "session": session, **extra}


def declared_window(entries: Any, session: str) -> float | None:
    """The ack window (seconds) a roster declares for the target holding ``session``, if any."""
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("session") == session:
            control = entry.get("control")
            window = control.get("ack_window_ms") if isinstance(control, dict) else None
            if isinstance(window, int) and not isinstance(window, bool) and window > 0:
                return min(window, 3_600_000) / 1000  # an hour at most: a typo must not hang a script
    return None


async def send_command(t: Target, cmd: dict[str, Any], window: float | None = None, retries: int = RETRIES,
                       hint: str | None = None) -> int:
    """Send one command over the WebSocket and report its ack: accepted, rejected, or a refusal.

    Subscribes to the acks before sending, then waits the target's declared ack window (``window``
    overrides it), sending the same command again (same id: the target decides once) up to
    ``retries`` times before giving up (AEP-0004 §3: silence past the window is a local timeout).
    ``hint`` is printed after an ``invalid`` rejection whose ``detail`` did not reach us."""
    import aiohttp

    def silence() -> CliError:
        return CliError(f"no answer to {cmd['type']} {cmd['id']} after {sends} send(s), "
                        f"waiting {wait:g} s after each", NO_ANSWER)

    def closed(code: int | None, reason: Any) -> CliError:
        how = "the collector closed the connection" + (f" ({code}{f': {reason}' if reason else ''})" if code else "")
        if not sends:
            return CliError(f"{how} before {cmd['type']} was sent", UNREACHABLE)
        return CliError(f"{how} after {cmd['type']} {cmd['id']} was sent and before it was answered: whether the "
                        f"agent took it is unknown (see `aep-collector timeline {cmd['session']}`)", UNREACHABLE)

    sends, wait, subscribed = 0, window if window is not None else ACK_WINDOW, False
    try:
        async with aiohttp.ClientSession() as http, \
                http.ws_connect(f"{t.url}/socket", headers={"Authorization": f"Bearer {t.token}"},
                                max_msg_size=ROSTER_MAX) as ws:
            await ws.send_str(json.dumps({"type": "hello", "versions": ["0.1"], "role": "consumer",
                                          "identity": {"agent": OPERATOR_AGENT,
                                                       "instance": f"{socket.gethostname()}/{os.getpid()}"}}))
            await ws.send_str(json.dumps({"type": "subscribe", "id": "acks", "filter": {
                "session": cmd["session"], "cause": cmd["id"]}}))
            deadline = time.monotonic() + 30.0  # for the subscription (and roster), then per send

            async def send() -> None:
                nonlocal sends, deadline
                await ws.send_str(json.dumps(cmd))
                sends += 1
                deadline = time.monotonic() + wait

            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    if not subscribed:  # sending now could miss the ack: nothing to report from
                        raise CliError("the collector did not confirm the ack subscription within 30 s", NO_ANSWER)
                    if sends == 0:  # the roster never came: the default window, and send
                        await send()
                        continue
                    if sends > retries:
                        raise silence()
                    await send()
                    continue
                try:
                    msg = await ws.receive(timeout=left)
                except TimeoutError:  # aiohttp's is also a ClientError: not "unreachable", silence
                    deadline = 0.0
                    continue
                if msg.type != aiohttp.WSMsgType.TEXT:
                    raise closed(ws.close_code, msg.extra if msg.type == aiohttp.WSMsgType.CLOSE else None)
                try:
                    frame = json.loads(msg.data)
                except ValueError:
                    continue  # no frame: nothing in it answers the command (nor refuses it)
                if not isinstance(frame, dict):
                    continue
                kind = frame.get("type")
                if kind == "subscribed" and frame.get("id") == "acks" and not subscribed:
                    subscribed = True
                    if window is None:
                        await ws.send_str(json.dumps({"type": "roster", "id": "window"}))
                        deadline = time.monotonic() + ROSTER_WAIT
                    else:
                        await send()
                elif kind in ("roster", "error") and frame.get("id") == "window" and sends == 0:
                    if kind == "roster":
                        wait = declared_window(frame.get("entries"), cmd["session"]) or ACK_WINDOW
                    await send()
                elif kind == "error" and frame.get("cause") == cmd["id"]:
                    code = frame.get("code")
                    detail = frame.get("detail", "")
                    if code == "no-route":
                        raise CliError(f"no running agent owns session {cmd['session']}: {detail}", NOT_FOUND)
                    raise CliError(f"refused by the collector ({code}): {detail}", REJECTED)
                elif kind == "error" and frame.get("id") == "acks":
                    raise CliError(f"the collector refused the subscription: {frame.get('detail')}", UNREACHABLE)
                elif kind == "control.accepted" and frame.get("cause") == cmd["id"]:
                    print(f"accepted ({cmd['type']} {cmd['id']})")
                    return OK
                elif kind == "control.rejected" and frame.get("cause") == cmd["id"]:
                    data = frame.get("data") or {}
                    reason, detail = data.get("reason", "?"), data.get("detail", "")
                    if not detail and reason == "invalid" and hint:  # the detail is gated redacted (§3)
                        detail = hint
                    print(printable(f"rejected: {reason}" + (f" ({detail})" if detail else "")), file=sys.stderr)
                    return REJECTED
    except (aiohttp.ClientError, OSError) as exc:
        raise _unreachable(t, exc) from None


def answer_of(args: argparse.Namespace) -> dict[str, Any]:
    if args.allow:
        return {"option": "allow"}
    if args.deny is not None:
        return {"option": "deny", **({"text": args.deny} if args.deny else {})}
    if args.text is not None:
        return {"text": args.text}
    try:
        values = json.loads(args.values)
    except ValueError as exc:
        raise CliError(f"--values is not valid JSON: {exc}", USAGE) from None
    if not isinstance(values, dict):
        raise CliError('--values must be a JSON object of field ids to values, e.g. \'{"db": "postgres"}\'', USAGE)
    return {"values": values}


def _capture_of(answer: dict[str, Any]) -> str:
    """The level a command states (AEP-0004 §2): ``metadata`` for a bare option (or numbers and
    booleans), ``redacted`` for free text and string form values, which the relay role fans out
    only to subscribers at that level or above (and, should the text hold a secret §9.4 would
    still change, only to ``full`` ones: an operator's text is not redacted before the agent reads it)."""
    values = answer.get("values")
    texts = isinstance(values, dict) and any(not isinstance(v, (int, float, bool)) or v is None
                                             for v in values.values())
    return "redacted" if "text" in answer or texts else "metadata"


async def cmd_respond(args: argparse.Namespace) -> int:
    answer = answer_of(args)
    t = target(args)
    events = await history(t, {"type": "attention.*"})
    request = next((ev for ev in events if ev.get("type") == "attention.requested"
                    and ev.get("id") == args.request), None)
    if request is None:
        raise CliError(f"no such request {args.request!r} (see `aep-collector pending`)", NOT_FOUND)
    if request not in open_requests(events):
        raise CliError(f"request {args.request} is already resolved", NOT_FOUND)
    cmd = _command("control.attention.respond", request["session"], subject=args.request, cause=args.request,
                   capture=_capture_of(answer), data={"answer": answer})
    return await send_command(t, cmd, args.timeout, args.retries, answer_hint(request, answer))


def answer_hint(request: dict[str, Any], answer: dict[str, Any]) -> str | None:
    """What ``request`` takes, said from its own payload, for an answer the agent refused as
    ``invalid``: the agent's reason is gated ``redacted`` and the default ceiling drops it."""
    data = raw if isinstance(raw := request.get("data"), dict) else {}
    fields = _items(data.get("fields"))
    if fields:
        values = answer.get("values")
        if not isinstance(values, dict):
            return "this request is a form: answer it with --values; `aep-collector pending` lists its fields"
        missing = [str(f.get("id")) for f in fields if f.get("required") and str(f.get("id")) not in values]
        if missing:
            return f"required field(s) left out of --values: {', '.join(missing)}"
        return "a value is not one this request's fields take (see `aep-collector pending`)"
    options = [str(o.get("id")) for o in _items(data.get("options"))]
    return f"this request's options: {', '.join(options)}" if options else None


async def cmd_cancel(args: argparse.Namespace) -> int:
    t = target(args)
    events = await history(t, {"run": args.run})
    if not events:
        raise CliError(f"no such run {args.run!r} held by the collector", NOT_FOUND)
    if any(ev.get("type") in ("run.finished", "run.failed", "run.cancelled") for ev in events):
        raise CliError(f"run {args.run} has already ended", NOT_FOUND)
    data: dict[str, Any] = {"scope": "run"}
    if args.reason:
        data["reason"] = args.reason
    cmd = _command("control.cancel", events[0]["session"], run=args.run,
                   capture="redacted" if args.reason else "metadata", data=data)
    return await send_command(t, cmd, args.timeout, args.retries)


# -- status ---------------------------------------------------------------------------------------

def wiring_places() -> list[tuple[str, Path, tuple[str, ...]]]:
    """Where each declared vendor's registration lands in the user's home (its first ``--install``
    target), and what marks it as ours there (the receiver's port, the shim's command name).
    Vendors wired per workspace (``project`` targets) are left out: no home file says."""
    from aep_collector.receivers.registration import declarations
    from aep_collector.receivers.wiring import resolve

    places: list[tuple[str, Path, tuple[str, ...]]] = []
    for agent, decl in sorted(declarations().items()):
        try:
            target = decl.registration(None, None).targets[0]
        except Exception:  # a plug-in's renderer that cannot render without a config
            continue
        if target.base != "project":
            places.append((agent, resolve(target, None, None), (f":{decl.port}", "aep-collector-hook")))
    return places


def wiring() -> list[tuple[str, str]]:
    out = []
    try:
        from aep_collector.receivers.wiring import records_dir

        installed = {p.stem for p in records_dir().glob("*.json")}
    except Exception:  # the install records are a hint; the config files are the truth
        installed = set()
    for vendor, path, marks in wiring_places():
        texts: list[str] = []
        try:
            if path.is_dir():
                texts = [p.read_text(errors="replace") for p in sorted(path.iterdir())[:50] if p.is_file()]
            elif path.exists():
                texts = [path.read_text(errors="replace")]
        except OSError:
            texts = []
        if not path.exists():
            out.append((vendor, f"not wired ({path} absent)"))
        elif any(m in t for t in texts for m in marks):
            how = ", by `aep-collector hooks --install`" if vendor in installed else ""
            out.append((vendor, f"wired ({path}{how})"))
        else:
            out.append((vendor, f"not wired ({path} has no aep-collector hook)"))
    return out


async def cmd_status(args: argparse.Namespace) -> int:
    import aiohttp

    path = state_dir() / "relay.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = {}
    code = OK
    pid = doc.get("pid")
    alive = False
    if isinstance(pid, int):
        try:
            os.kill(pid, 0)
            alive = True
        except PermissionError:
            alive = True
        except OSError:
            alive = False
    if not doc:
        print(f"collector: not running here (no {path})")
        code = UNREACHABLE
    else:
        print(f"collector: {'running' if alive else 'not running'} (pid {pid}, state {state_dir()})")
        if not alive:
            code = UNREACHABLE
    health: dict[str, Any] = {}
    if doc and alive:
        try:
            t = target(args)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http, \
                    http.get(f"{t.url}/healthz", headers={"Authorization": f"Bearer {t.token}"}) as r:
                health = await r.json() if r.status != 401 else {}
            if "sessions" not in health:
                # /healthz is public: it answers {"ok": true} to anyone and adds the counts and the
                # collector's health only for the right token, so their absence is the refusal.
                health = {}
                print(f"relay role: {t.url}: token refused")
                print("error: the collector refused the token: check AEP_TOKEN or --token", file=sys.stderr)
                code = UNREACHABLE
            else:
                print(f"relay role: {t.url} (token file {doc.get('token_file') or 'from AEP_TOKEN'}); "
                      f"{health['sessions']} sessions, {health.get('connections', '?')} connections, "
                      f"{health.get('subscribers', '?')} subscribers")
        except (CliError, aiohttp.ClientError, OSError, ValueError, TimeoutError) as exc:
            print(f"relay role: unreachable ({exc})")
            code = UNREACHABLE
    collector = health.get("collector") or {}
    if collector:
        state = "ok" if collector.get("ok") else "problems"
        print(f"health: {state}")
        for comp, problems in (collector.get("problems") or {}).items():
            for cause, detail in problems.items():
                print("    " + printable(f"{comp}: {cause}: {detail}"))
        for comp, n in (collector.get("dropped") or {}).items():
            print(f"    {comp}: {n} dropped")
    await _listeners(args)
    if health:
        last: dict[str, dict[str, Any]] = health.get("last_events") or {}
        print("last event per agent:" if last else "last event per agent: none yet")
        for agent, ev in sorted(last.items()):
            print("    " + printable(f"{agent:<14} {ev.get('time')} {ev.get('type')} (session {ev.get('session', '-')})"))
    print("vendors in this user's config files:")
    for vendor, state in wiring():
        print(f"    {vendor:<12} {state}")
    return code


async def _listeners(args: argparse.Namespace) -> None:
    """Which receivers answer on the ports of the config (default or ``--config``)."""
    import aiohttp

    from .cli import DEFAULT_CONFIG, _registry
    from .config import ConfigError, load, parse_endpoint

    try:
        cfg = load(getattr(args, "status_config", None) or DEFAULT_CONFIG, _registry())
    except (ConfigError, OSError) as exc:
        print(f"receivers: cannot read the config ({exc})")
        return
    print("receivers:")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        for cid, (_factory, rcfg) in cfg.receivers.items():
            endpoints = [getattr(rcfg, "endpoint", None)] + [getattr(getattr(rcfg, k, None), "endpoint", None)
                                                             for k in ("http",)]
            endpoint = next((e for e in endpoints if isinstance(e, str) and e), None)
            if endpoint is None:
                continue
            try:
                host, port = parse_endpoint(endpoint)
                async with http.get(f"http://{host}:{port}/healthz") as r:
                    state = "listening" if r.status < 500 else f"answers {r.status}"
            except (aiohttp.ClientError, OSError, TimeoutError, ConfigError):
                state = "not listening"
            print(f"    {cid:<14} {endpoint:<22} {state}")


# -- argparse wiring ------------------------------------------------------------------------------


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", metavar="URL", help="the collector's relay role (default: from <state dir>/relay.json)")
    p.add_argument("--token", metavar="TOKEN", help="its bearer token (default: AEP_TOKEN, then the token file)")


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds between 0 and 3600")
    return value


def _count(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count between 0 and 10")
    return value


def _sending(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                   help="how long to wait for the ack after each send (default: the window the agent "
                        f"declares, else {ACK_WINDOW:.0f} s)")
    p.add_argument("--retries", type=_count, default=RETRIES, metavar="N",
                   help=f"send the same command again this many times on silence (default {RETRIES})")


def add_commands(sub: Any) -> None:
    tail = sub.add_parser("tail", help="follow events live, one line each (or --json)",
                          description="Follow the collector's events live. Resumes where the last tail stopped.")
    tail.add_argument("--agent", metavar="AGENT", help="only this agent (e.g. claude-code)")
    tail.add_argument("--session", metavar="SESSION", help="only this session")
    tail.add_argument("--type", metavar="PATTERN", help="only these types (e.g. tool.* or attention.requested)")
    tail.add_argument("--severity", metavar="LEVEL", help="at least this severity (debug ... critical)")
    tail.add_argument("--json", action="store_true", help="print each event as a JSON line")
    tail.add_argument("--all", action="store_true", help="start with everything the collector holds")
    tail.add_argument("--no-resume", action="store_true", help="do not resume from (nor record) the last position")
    tail.add_argument("--file", metavar="FILE", help="read a session's JSONL log instead of the collector")
    _connection(tail)
    tl = sub.add_parser("timeline", help="one session in order (--dag: as a cause tree)",
                        description="Print one session's events in (epoch, seq) order.")
    tl.add_argument("session", metavar="SESSION", help="the session id")
    tl.add_argument("--dag", action="store_true", help="draw the cause tree")
    tl.add_argument("--json", action="store_true", help="print each event as a JSON line")
    tl.add_argument("--file", metavar="FILE", help="read the session's JSONL log instead of the collector")
    _connection(tl)
    pend = sub.add_parser("pending", help="open attention requests, with their options or fields",
                          description="List the attention requests still waiting for an answer.")
    pend.add_argument("--json", action="store_true", help="print each request as a JSON line")
    _connection(pend)
    resp = sub.add_parser("respond", help="answer a held request (exit 0 accepted, 1 rejected, 3 no such request, "
                                          "4 unreachable, 5 no answer)",
                          description="Answer an attention request through the collector.")
    resp.add_argument("request", metavar="REQUEST", help="the request id (see `aep-collector pending`)")
    how = resp.add_mutually_exclusive_group(required=True)
    how.add_argument("--allow", action="store_true", help="grant a permission")
    how.add_argument("--deny", nargs="?", const="", metavar="REASON", help="refuse a permission, optionally saying why")
    how.add_argument("--text", metavar="TEXT", help="answer in words (never grants a permission unless it names allow)")
    how.add_argument("--values", metavar="JSON", help='fill a form, e.g. \'{"db": "postgres"}\'')
    _sending(resp)
    _connection(resp)
    can = sub.add_parser("cancel", help="cancel a running agent run (same exit codes as respond)",
                         description="Ask the agent running RUN to stop it (AEP control.cancel).")
    can.add_argument("run", metavar="RUN", help="the run id")
    can.add_argument("--reason", metavar="TEXT", help="why (kept at the capture level of the log)")
    _sending(can)
    _connection(can)
    st = sub.add_parser("status", help="is a collector running, what listens where, health, wiring",
                        description="Report on the running collector and this user's agent wiring.")
    st.add_argument("--config", dest="status_config", metavar="FILE", help="the config whose ports to check")
    _connection(st)


COMMANDS = {"tail": cmd_tail, "timeline": cmd_timeline, "pending": cmd_pending, "respond": cmd_respond,
            "cancel": cmd_cancel, "status": cmd_status}


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except CliError as exc:
        print(f"error: {printable(exc)}", file=sys.stderr)  # it may quote what the collector said
        return exc.code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # an operator command reports, it never dumps a traceback
        print(f"error: {_exception_name(exc)}: {printable(exc)}", file=sys.stderr)
        return REJECTED if not isinstance(exc, OSError) else UNREACHABLE



def _exception_name(exc: BaseException) -> str:
    """``zlib.error``, not ``error`` (which would read ``error: error: ...``); builtins bare."""
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
