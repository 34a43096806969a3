"""``aep-collector-hook VENDOR [EVENT] [--url URL] [--wait SECONDS]``: the fail-open command-hook shim.

A vendor that runs a command per hook firing runs this: it reads the hook payload from stdin,
POSTs it to the vendor's collector receiver (``/hook``, with ``?hook=EVENT`` when an event is
given: some vendors' payloads do not name their own), and prints the receiver's reply. On ANY
failure (receiver down, slow, non-2xx, a reply that is not a JSON object, empty or oversized
stdin) it prints the vendor's neutral reply instead, and it always exits 0: a hook must never
break the agent it observes (reference stack §0.1 "fail-open").

It is started once per hook firing, so it imports nothing but the C socket module: no
``socket.py`` (enum, selectors), no ``http.client`` (email, ssl), no ``json`` (re), no ``os``,
nothing from this project but its vendor table (``TABLE``, literals). ``python -X importtime -m aep_collector.pipeline.shim`` shows what it costs;
``bench/bench_shim.py`` measures it against a bare interpreter (registered commands run a copy of
this file, ``~/.aep/bin/aep_collector_hook.py``, as ``python -S -I -c "import aep_collector_hook
..."``: no site, cached bytecode; ``receivers/registration.py``). Because of that it checks a
reply's framing (status, ``Content-Type``, ``Content-Length``) and, unless it is the neutral
``{}``, that its body is one JSON object with ``json``'s C scanner (``_json``, without the
``json`` package and its ``re``): whatever else comes back is never passed on to the agent.

The shim knows no vendor itself: what it knows of each (port, neutral replies, held hooks, waits)
is the table generated from the vendor declarations (``vendors()``). Receiver address: the
vendor's declared port on 127.0.0.1, overridden by ``--url`` or by the environment variable
``AEP_<VENDOR>_URL`` (``kimi-code`` -> ``AEP_KIMI_CODE_URL``), e.g. ``http://127.0.0.1:9378`` (path ``/hook`` unless the URL names one). Only plain ``http`` to the
local receiver is spoken.

Waiting: a hook the receiver may hold for an operator (``held`` below) waits up to the vendor's
default hold window plus a margin; every other hook waits ``SHORT_WAIT`` (the receiver replies
neutrally itself after its ``reply_timeout``, 5 s by default). ``--wait`` overrides both; the
registrations ``aep-collector hooks VENDOR`` prints pass it, computed from the config. The wait
includes reading stdin (at most ``STDIN_WAIT``), so a vendor slow to hand over its payload, or
one that leaves stdin open, never makes the hook outlast ``CONNECT_WAIT`` plus that wait.

``AEP_HOOK_DEBUG=1`` writes the reason for a neutral reply to stderr (stdout stays the vendor's).
"""

import sys

try:  # the C module socket.py wraps: everything needed here, at a fraction of socket.py's import cost
    import _socket
except ImportError:  # pragma: no cover - every CPython build has it
    import socket as _socket  # type: ignore[no-redef]

CONNECT_WAIT = 1.0
"""Seconds to reach the receiver (a closed port is refused at once; this bounds a dead host)."""
SHORT_WAIT = 6.0
"""Seconds to wait for the reply to a hook that is never held."""
MAX_STDIN = 16 << 20
"""Payloads above this are not forwarded (the receiver would refuse them anyway)."""
STDIN_WAIT = 2.0
"""Seconds the payload may take to arrive on stdin; past them the hook is answered neutrally."""
STDIN_QUIET = 0.1
"""A vendor that writes its payload and leaves stdin open: once nothing more has come for this
long and what came is one whole JSON object, that is the payload (nothing valid can follow one).
Not sooner: a vendor still writing (a trailing newline) would get EPIPE once the shim is gone."""
MAX_REPLY = 4 << 20


class Vendor:
    """What the shim knows of one vendor: port, fail-open replies, hooks that may be held."""

    __slots__ = ("port", "neutral", "by_event", "held", "wait", "needs_event", "detached")

    def __init__(self, port: int, neutral: "bytes | None" = b"{}", by_event: "dict[str, bytes] | None" = None,
                 held: "tuple[str, ...]" = (), wait: float = SHORT_WAIT, needs_event: bool = False,
                 detached: "tuple[str, ...]" = ()) -> None:
        self.port = port
        self.neutral = neutral
        """Printed on failure; ``None`` prints nothing (for vendors whose contract is empty stdout)."""
        self.by_event = by_event or {}
        """Byte-pinned neutral replies per event (keys lower-case)."""
        self.held = held
        self.wait = wait
        """Seconds a held hook waits: the receiver's default hold window plus a margin."""
        self.needs_event = needs_event
        """The payload does not name its hook, so EVENT is required."""
        self.detached = detached
        """Events (lower-case) whose reply the vendor ignores and whose hook it may kill early: the
        shim answers neutrally at once and a detached child (its own session) delivers the payload."""


TABLE = "aep_collector_hook_vendors"
"""The vendor table's module: ``{agent: Vendor keyword arguments}`` as Python literals, generated from
the vendor declarations and written beside the shim's copy by ``ensure_shim``
(``aep_collector.receivers.registration``). The shim itself names no vendor."""
VENDORS: "dict[str, Vendor] | None" = None
"""The table once loaded (``vendors()``)."""


def vendors() -> "dict[str, Vendor]":
    """The vendor table: beside this file's copy; run from the package (console script, ``-m``),
    the hook folder's copy of it, else the declarations themselves. ``{}`` when it is missing or
    broken: every vendor is then unknown and answered with ``{}`` (fail-open)."""
    global VENDORS
    if VENDORS is None:
        VENDORS = {}
        try:
            VENDORS = {name: Vendor(**entry) for name, entry in _table().items()}
        except BaseException:  # whatever the table does (even SystemExit), the hook is answered
            pass
    return VENDORS


def _table() -> "dict[str, dict]":
    try:
        return __import__(TABLE).VENDORS  # the copy's folder leads sys.path: the table beside it
    except Exception:
        if not __package__:
            raise
    folder = getenv("AEP_HOOK_DIR") or (getenv("HOME") or "~") + "/.aep"
    sys.path.insert(0, folder + "/bin")
    try:
        return __import__(TABLE).VENDORS
    except Exception:
        from aep_collector.receivers import registration  # the slow way: import the collector

        try:  # once: write the table (and the copy) so the next hook reads it in a fraction of a ms
            registration.ensure_shim()
        except Exception:  # a read-only home still gets its answer, slowly
            pass
        return registration.shim_entries()
    finally:
        sys.path.remove(folder + "/bin")


class Failed(Exception):
    """Anything that makes the shim answer neutrally."""


class TooLarge(Failed):
    """The receiver refused the body as over its ``max_bytes`` (413): ``slim`` it and send again."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"receiver refused the payload as over {limit} bytes")
        self.limit = limit


def env_name(vendor: str) -> str:
    """``AEP_<VENDOR>_URL`` for ``vendor`` (``kimi-code`` -> ``AEP_KIMI_CODE_URL``)."""
    return "AEP_" + vendor.upper().replace("-", "_") + "_URL"


def parse_url(url: str) -> "tuple[str, int, str]":
    """``http://host:port/path`` -> (host, port, path); the path defaults to ``/hook``."""
    if not url.startswith("http://"):
        raise Failed("only http:// receiver URLs are supported")
    rest = url[len("http://"):]
    slash = rest.find("/")
    hostport, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    if hostport.startswith("["):  # [::1]:8378
        end = hostport.find("]")
        if end < 0:
            raise Failed("unclosed [ in URL host")
        host, tail = hostport[1:end], hostport[end + 1:]
    else:
        host, _, port_text = hostport.rpartition(":")
        host, tail = (host, ":" + port_text) if host else (hostport, "")
    if not tail.startswith(":") or not tail[1:].isdigit():
        raise Failed("the receiver URL must name its port")
    if not host:
        raise Failed("the receiver URL has no host")
    return host, int(tail[1:]), path if path not in ("", "/") else "/hook"


def _quote(text: str) -> str:
    """Percent-encode a query value (hook names are identifiers; anything else is escaped)."""
    safe = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
    return "".join(c if c in safe else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in text)


def exchange(host: str, port: int, target: str, body: bytes, wait: float) -> bytes:
    """POST ``body`` and return the reply body of a 2xx JSON reply; raise ``Failed`` otherwise."""
    import time  # already loaded by the interpreter: free

    head = (f"POST {target} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1")
    try:
        # A bytes host: a str one is run through the "idna" codec, whose import (re, stringprep,
        # unicodedata) alone costs more than the rest of the shim.
        infos = _socket.getaddrinfo(host.encode("ascii"), port, 0, _socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise Failed(f"cannot resolve {host}: {exc}") from None
    sock = None
    for family, kind, proto, _name, addr in infos:
        candidate = _socket.socket(family, kind, proto)
        try:
            candidate.settimeout(CONNECT_WAIT)
            candidate.connect(addr)
        except OSError:
            candidate.close()
            continue
        sock = candidate
        break
    if sock is None:
        raise Failed(f"receiver {host}:{port} is not reachable")
    deadline = time.monotonic() + wait
    try:
        sock.settimeout(max(wait, 0.001))
        sock.sendall(head + body)
        chunks: list[bytes] = []
        size = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failed("reply timed out")
            sock.settimeout(left)
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
            size += len(data)
            if size > MAX_REPLY:
                raise Failed("reply too large")
            if _complete(b"".join(chunks)):
                break
    except OSError as exc:  # refused, reset, timed out
        raise Failed(f"{type(exc).__name__}: {exc}") from None
    finally:
        sock.close()
    return _body(b"".join(chunks))


def deliver(host: str, port: int, target: str, body: bytes, wait: float) -> bytes:
    """``exchange``, and once more with the payload ``slim``med when the receiver refused it as too
    large: a tool's huge output must not cost the agent's stream its ``tool.completed``."""
    import time  # already loaded by the interpreter: free

    deadline = time.monotonic() + wait
    try:
        return exchange(host, port, target, body, wait)
    except TooLarge as refused:
        return exchange(host, port, target, slim(body, refused.limit), deadline - time.monotonic())


SLIM_KEEP = 512
"""Top-level strings up to this many characters are never dropped by ``slim`` (ids, names, paths)."""


def slim(body: bytes, limit: int) -> bytes:
    """``body`` (a JSON object) with its bulkiest top-level values dropped, largest first, until it
    fits in ``limit`` bytes: what is kept is whole (a digest of a cut value would be wrong), and the
    mapping emits the event without what it can no longer compute. Rare, so ``json`` is imported here."""
    import json

    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise Failed(f"oversized payload is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise Failed("oversized payload is not a JSON object")
    return slim_payload(payload, limit)


def slim_payload(payload: "dict[str, object]", limit: int) -> bytes:
    """``slim`` on a payload already decoded; ``payload`` itself loses the dropped keys (the
    receiver slims a body it was sent whole, the same way)."""
    import json

    out = json.dumps(payload, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if len(out) <= limit:  # only its spelling was over (whitespace, escapes): nothing to drop
        return out
    sizes = {key: len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
             for key, value in payload.items()
             if isinstance(value, dict | list) or (isinstance(value, str) and len(value) > SLIM_KEEP)}
    for key in sorted(sizes, key=sizes.__getitem__, reverse=True):
        del payload[key]
        out = json.dumps(payload, ensure_ascii=False).encode("utf-8", "surrogatepass")
        if len(out) <= limit:
            return out
    raise Failed(f"payload over {limit} bytes even without its bulk")


def _split(raw: bytes) -> "tuple[int, dict[str, str], bytes]":
    end = raw.find(b"\r\n\r\n")
    if end < 0:
        raise Failed("reply headers incomplete")
    lines = raw[:end].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise Failed("not an HTTP reply")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, raw[end + 4:]


def _complete(raw: bytes) -> bool:
    """True once the headers and ``Content-Length`` bytes of body have arrived."""
    try:
        _, headers, body = _split(raw)
    except Failed:
        return False
    length = headers.get("content-length")
    return length is not None and length.isdigit() and len(body) >= int(length)


def _body(raw: bytes) -> bytes:
    status, headers, body = _split(raw)
    if status == 413:
        at = body.find(b'"max_bytes":')  # the receiver's refusal names its limit (receivers/body.py)
        digits = body[at + 12:].lstrip()[:20].split(b",")[0].split(b"}")[0].strip() if at >= 0 else b""
        if digits.isdigit():
            raise TooLarge(int(digits))
    if not 200 <= status < 300:
        raise Failed(f"receiver answered HTTP {status}")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise Failed("chunked replies are not expected from the receiver")
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or len(body) < int(length):
            raise Failed("reply body truncated")
        body = body[:int(length)]
    if not body.strip():
        return b""  # the receiver's "reply nothing" (HookSurface.neutral may be None)
    if "json" not in headers.get("content-type", "").lower():
        raise Failed("reply is not JSON")
    text = body.strip()
    if text != b"{}" and not json_object(text):  # the neutral reply, most replies, needs no scan
        raise Failed("reply is not a JSON object")
    return text


class _Strict:
    """What ``_json.make_scanner`` reads off a decoder: strict strings, no hooks, NaN refused."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int

    @staticmethod
    def parse_constant(name: str) -> None:
        raise ValueError(f"{name} is not JSON")


def json_object(raw: bytes) -> bool:
    """Whether ``raw`` is UTF-8 holding one JSON object and nothing else but JSON whitespace.

    By ``json``'s C scanner alone (``_json``, a small extension module): the ``json`` package would
    import ``re``, which costs more than the rest of the shim. Without the C module, ``json`` it is.
    """
    try:
        text = raw.decode("utf-8").strip(" \t\r\n")
        try:
            import _json
        except ImportError:  # pragma: no cover - every CPython build has it
            import json

            return isinstance(json.loads(text, parse_constant=_Strict.parse_constant), dict)
        value, end = _json.make_scanner(_Strict)(text, 0)  # type: ignore[arg-type]
    except Exception:  # not UTF-8, not JSON, too deep (the scanner's errors need json.decoder: any will do)
        return False
    return end == len(text) and isinstance(value, dict)


def _compact(pinned: bytes) -> bytes:
    """The receiver's serialization of a pinned literal (``HookServer`` writes compact JSON)."""
    return pinned.replace(b'": ', b'":').replace(b", ", b",")


def neutral(vendor: "Vendor | None", event: "str | None") -> bytes:
    """The fail-open stdout for ``vendor`` at ``event``."""
    if vendor is None:
        return b"{}"
    if event:
        pinned = vendor.by_event.get(event.strip().lower())
        if pinned is not None:
            return pinned
    return vendor.neutral or b""


def _read_stdin(deadline: float) -> "bytes | None":
    """The payload, or ``None`` when it is over ``MAX_STDIN`` (the rest is drained, not left to
    EPIPE). Read until EOF, or until ``STDIN_QUIET`` passes with nothing more after one whole JSON
    object (a vendor that leaves stdin open); ``Failed`` at ``deadline`` short of either."""
    stream = sys.stdin.buffer if sys.stdin is not None else None
    if stream is None:
        return b""
    try:
        import posix  # built in and loaded; off POSIX stdin is read to EOF, as it always was

        fd = stream.fileno()
        blocking = posix.get_blocking(fd)
    except Exception:
        data = stream.read(MAX_STDIN + 1)
        if len(data) <= MAX_STDIN:
            return data
        while stream.read(1 << 20):
            pass
        return None
    # Non-blocking while the shim reads, so a read that would wait says so instead: only then is
    # ``select`` imported to wait with a deadline. The usual vendor has written the payload and
    # closed stdin before the interpreter is up, and never gets there.
    if blocking:
        posix.set_blocking(fd, False)
    try:
        return _read_until(fd, deadline)
    finally:
        if blocking:
            posix.set_blocking(fd, True)  # the descriptor is shared (the vendor's, a /bin/sh chain's)


def _read_until(fd: int, deadline: float) -> "bytes | None":
    """``_read_stdin`` on the non-blocking ``fd``."""
    import posix
    import time  # both already loaded by the interpreter: free

    chunks: list[bytes] = []
    size = 0
    checked = -1  # the size at which the data so far was last checked for one whole object
    quiet = None  # when the silence after the last data started
    while True:
        try:
            data = posix.read(fd, 1 << 16)
        except BlockingIOError:
            now = time.monotonic()
            if chunks and checked != size:
                if quiet is None:
                    quiet = now
                if now - quiet >= STDIN_QUIET or now >= deadline:
                    joined = b"".join(chunks)
                    if json_object(joined):
                        return joined  # whole, and the vendor stopped writing: stdin left open
                    checked = size
            if now >= deadline:
                raise Failed(f"stdin not closed within {STDIN_WAIT:g}s, and no whole JSON object on it"
                             if size <= MAX_STDIN else "oversized payload") from None
            wake = deadline if quiet is None or checked == size else min(deadline, quiet + STDIN_QUIET)
            import select  # only a vendor still writing, or leaving stdin open, gets here

            select.select([fd], [], [], max(wake - now, 0.0))
            continue
        if not data:
            return b"".join(chunks) if size <= MAX_STDIN else None
        quiet = None
        size += len(data)
        if size <= MAX_STDIN:
            chunks.append(data)
        elif chunks:
            chunks = []  # over the bound: the rest is only drained


def _args(argv: "list[str]") -> "tuple[str, str | None, str | None, float | None]":
    positional: list[str] = []
    url = wait = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--url=") or arg.startswith("--wait="):
            name, _, value = arg.partition("=")
        elif arg in ("--url", "--wait") and i + 1 < len(argv):
            name, value = arg, argv[i + 1]
            i += 1
        else:
            positional.append(arg)
            i += 1
            continue
        i += 1
        if name == "--url":
            url = value
        else:
            try:
                wait = float(value)
            except ValueError:
                wait = None
    if not positional:
        raise Failed("usage: aep-collector-hook VENDOR [EVENT] [--url URL] [--wait SECONDS]")
    return positional[0], positional[1] if len(positional) > 1 else None, url, wait


def getenv(name: str) -> "str | None":
    """An environment variable, read without importing ``os`` (its import is most of the shim's own cost)."""
    try:
        import posix  # built in and already loaded: the source os.environ is copied from
    except ImportError:  # pragma: no cover - Windows
        import os

        return os.environ.get(name)
    value = posix.environ.get(name.encode())
    return None if value is None else value.decode("utf-8", "surrogateescape")


def _fork() -> "bool | None":
    """Fork: True in the child (its own session, stdio on /dev/null), False in the parent, None
    when fork is unavailable or fails (then the caller delivers inline)."""
    try:
        import posix  # built in: no import cost
    except ImportError:  # pragma: no cover - Windows
        return None
    try:
        if posix.fork() != 0:
            return False
    except OSError:
        return None
    try:
        posix.setsid()  # out of the vendor's process group: a group kill no longer reaches it
        null = posix.open("/dev/null", posix.O_RDWR)
        for fd in (0, 1, 2):
            posix.dup2(null, fd)  # the vendor sees the hook's output end when the parent exits
    except OSError:
        pass
    return True


def _exit() -> None:
    import posix

    posix._exit(0)


def run(argv: "list[str]") -> bytes:
    """Everything but the printing: the bytes the vendor should see on stdout."""
    import time  # already loaded by the interpreter: free

    vendor = event = None
    try:
        name, event, url, wait = _args(argv)
        vendor = vendors().get(name.lower().replace("_", "-"))
        if vendor is None:
            raise Failed(f"unknown vendor {name!r} (known: {', '.join(sorted(vendors())) or 'none: no vendor table'})")
        started = time.monotonic()
        body = _read_stdin(started + STDIN_WAIT)
        if body is None or not body.strip():
            raise Failed("empty or oversized payload")
        if not body.lstrip().startswith(b"{"):
            raise Failed("the payload is not a JSON object")  # garbage: no round trip for it
        if vendor.needs_event and not event:
            raise Failed("this vendor's payloads do not name their hook: pass EVENT")
        if url is None:
            url = getenv(env_name(name.lower().replace("_", "-")))
        host, port, path = parse_url(url) if url else ("127.0.0.1", vendor.port, "/hook")
        target = path + ("&" if "?" in path else "?") + "hook=" + _quote(event) if event else path
        if wait is None:
            named = event or ""
            held = named in vendor.held or (not named and any(b'"%s"' % h.encode() in body for h in vendor.held))
            wait = vendor.wait if held else SHORT_WAIT
        wait -= time.monotonic() - started  # the time stdin took counts as waiting (see the docstring)
        if event and event.strip().lower() in vendor.detached:
            child = _fork()
            if child:
                try:  # deliver; never print, never return into main
                    deliver(host, port, target, body, wait)
                finally:
                    _exit()
            if child is False:
                return neutral(vendor, event)  # the parent answers at once; the child delivers
        reply = deliver(host, port, target, body, wait)
        if event:
            pinned = vendor.by_event.get(event.strip().lower())
            if pinned is not None and reply == _compact(pinned):
                return pinned  # the byte-exact form the vendor pins
        return reply
    except Exception as exc:  # fail open, whatever it was
        if getenv("AEP_HOOK_DEBUG"):
            sys.stderr.write(f"aep-collector-hook: {exc}; replying neutral\n")
        return neutral(vendor, event)


def main(argv: "list[str] | None" = None) -> int:
    """Console-script entry: print the reply (or the neutral one) and exit 0, always."""
    args = sys.argv[1:] if argv is None else argv
    try:
        out = run(args)
    except BaseException:  # even an interrupt while reading stdin must not become a vendor-side failure
        vendor = vendors().get(args[0].lower().replace("_", "-")) if args else None
        out = neutral(vendor, args[1] if len(args) > 1 and not args[1].startswith("--") else None)
    try:
        if out:
            sys.stdout.buffer.write(out)
            sys.stdout.buffer.flush()
    except Exception:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
