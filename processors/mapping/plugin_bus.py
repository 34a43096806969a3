"""The OpenCode-family mapping (OpenCode and its fork Kilo Code): plugin bus events and hooks to drafts.

Named after its receiver side, ``aep_collector.receivers.plugin_vendors.bus``.

AEP-0002 Annex A.7/A.8; pinned by ``conformance/fixtures/mappings/opencode.json`` and ``kilocode.json``.

Signals (what the in-process plugin POSTs; the receiver wraps it unchanged):

======================  ===================================  ==========================================
surface                 ``Signal.name``                      ``Signal.payload`` (the fixture ``input``)
======================  ===================================  ==========================================
``event`` hook          the bus type (``session.idle``)      ``{"kind": "bus", "event": {type, properties}}``
``tool.execute.before`` ``tool.execute.before``              ``{"kind": "tool.before", "input", "output"}``
``tool.execute.after``  ``tool.execute.after``               ``{"kind": "tool.after", "input", "output"}``
``permission.ask``      ``permission.ask``                   ``{"kind": "permission.ask", "permission"}``
======================  ===================================  ==========================================

The receiver decodes every POST into its moment (``aep_collector.receivers.plugin_vendors.bus_moments``:
hook names as ``kind``, bare bus events, payloads named by ``?name=``), so ``Signal.payload`` is a
moment and its ``kind`` (the fixture's discriminant) decides; this module never reads the wire.
The receiver also applies the fixtures' ``identity.session_from`` (``Signal.session``) and decodes
what a bus ask offers (``Signal.options``: Kilo's reply enum; ``Signal.form``: a question's form),
since it finds a moment's holds and checks an answer by them; the cards are drawn here from those.

What the plugin gets back (the reply contract, the reply routes) is the receiver's:
``aep_collector.receivers.plugin_vendors.bus_replies``.

Asks and their settles share an ``_attention_key`` (``attention_key(kind, vendor id)``); the mapping
processor's attention book pairs them, drops a vendor echo of a card the control loop already
closed, and sweeps open cards before ``session.ended``. The receiver's hold passes the same key.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.control import attention_key
from aep_collector.pipeline.model import Event, Form, Signal

from .drafting import (
    PERMISSION_OPTIONS,
    digest,
    draft,
    get_dict,
    get_str,
    permission_prompt,
    snake_case,
    tool_ref,
)

# Reference stack §1.7: the machinery/UI plane rides x.{vendor}.* at debug.
_DEBUG_PREFIXES = ("message.", "file.", "lsp.", "tui.", "installation.", "server.")
_KEPT = 1024  # bound of every runtime table (user message ids, pending tools)
MAX_SESSIONS = 4096
"""Sessions tracked, least recently active forgotten first: a daemon lives for weeks and a session
is ended only by ``session.deleted``, which ``opencode run`` never sends."""
_DEBUG_TYPES = frozenset({"command.executed", "session.diff", "session.updated", "shell.env"})


@dataclass
class SessionTrack:
    """Per-session runtime facts the pure mapping cannot know."""

    run_open: bool = False
    users: dict[str, None] = field(default_factory=dict)
    """Ids of user messages already seen (insertion-ordered, bounded): a re-update is not a prompt."""
    todos: list[Any] = field(default_factory=list)
    """The last ``todo.updated`` snapshot, diffed against the next one."""


@dataclass
class BusState:
    """Runtime state of one OpenCode-family vendor: synthesized runs, todo snapshots, pending tools."""

    sessions: dict[str, SessionTrack] = field(default_factory=dict)
    pending_tools: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    """callID -> (tool name, received_ns of ``tool.execute.before``); bounded, oldest evicted."""

    def track(self, session: str | None) -> SessionTrack:
        key = session or ""
        found = self.sessions.get(key) or SessionTrack()
        _bounded_put(self.sessions, key, found, MAX_SESSIONS)  # now the most recently active
        return found


def new_state() -> BusState:
    """Fresh runtime state."""
    return BusState()


def _bounded_put(table: dict[str, Any], key: str, value: Any, limit: int = _KEPT) -> None:
    # A before without its after (an aborted tool) or an echo that never comes must not grow forever.
    table.pop(key, None)
    table[key] = value
    while len(table) > limit:
        del table[next(iter(table))]


def bus_fallback(agent: str, bus_type: Any) -> str:
    """``x.{agent}.{bus type}`` with dots kept, each segment made a valid type token."""
    raw = bus_type if isinstance(bus_type, str) else ""
    segs = [snake_case(s) for s in raw.split(".") if s.strip()]
    if not segs:
        segs = ["unknown"]
    if segs[0] == "control":
        # AEP-0001 §5.2: x.{v}.control.* is command-shaped (no seq); a bus event is not a command.
        segs.insert(0, "bus")
    if len(segs) < 2:
        # The x.* grammar needs two segments after the vendor token (ACP precedent: `.event`).
        segs.append("event")
    return f"x.{agent}." + ".".join(segs)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class BusFamily:
    """One OpenCode-family vendor: its agent identity and which permission surfaces it has."""

    agent: str

    # -- pure mapping (fixture-pinned) -------------------------------------------------------------

    def map_moment(self, signal: Signal) -> Event | None:
        """One decoded moment (``Signal.payload``: ``{kind, ...}``) -> one draft, or None (deliberately nothing)."""
        m = signal.payload if isinstance(signal.payload, dict) else {}
        kind = m.get("kind")
        session = signal.session
        if kind == "tool.before":
            return self._tool_before(get_dict(m, "input"), m.get("output"), session)
        if kind == "tool.after":
            return self._tool_after(get_dict(m, "input"), m.get("output"), session)
        if kind == "permission.ask":
            return self._ask(get_dict(m, "permission"), PERMISSION_OPTIONS, session)
        return self._bus(get_dict(m, "event"), session, signal)

    # -- stateful mapping -------------------------------------------------------------------------

    def map_signal(self, signal: Signal, state: BusState) -> list[Event]:
        """A plugin moment -> drafts, applying run synthesis, todo diffs, callID pairing and dedupe."""
        # The receiver's decoding (receivers/plugin_vendors/bus_moments.py); never trust a shape.
        moment = signal.payload if isinstance(signal.payload, dict) else {}
        session = signal.session
        kind = moment.get("kind")
        if kind == "tool.before":
            return self._paired_before(moment, session, signal.received_ns, state)
        if kind == "tool.after":
            return self._paired_after(moment, session, signal.received_ns, state)
        event = get_dict(moment, "event")
        bus_type = event.get("type")
        if bus_type == "todo.updated":
            track = state.track(session)
            snapshot = get_dict(event, "properties").get("todos")
            nxt = snapshot if isinstance(snapshot, list) else []
            out = diff_todos(track.todos, nxt, session)
            track.todos = nxt
            return out
        if bus_type == "message.part.updated":
            failed = self._failed_part(event, session, signal.received_ns, state)
            if failed is not None:
                return [failed]
        mapped = self.map_moment(signal)
        if mapped is None:
            return []
        return self._apply_runtime(mapped, event, session, state)

    def _failed_part(self, event: dict[str, Any], session: str | None, now_ns: int,
                     state: BusState) -> Event | None:
        """A tool part that ended in ``error`` for a call still open: ``tool.failed``.

        ``tool.execute.after`` never fires for a call that threw (a rejected permission, seen
        live with OpenCode 1.18.33); the message part is the only place the failure shows.
        """
        part = get_dict(get_dict(event, "properties"), "part")
        tool_state = get_dict(part, "state")
        call = get_str(part, "callID")
        if part.get("type") != "tool" or tool_state.get("status") != "error" or call not in state.pending_tools:
            return None
        name, started = state.pending_tools.pop(call)
        name = name or get_str(part, "tool") or "unknown"
        error: dict[str, Any] = {"type": "tool_error"}
        message = get_str(tool_state, "error")
        if message:
            error["message"] = message  # redacted-gated by the schema
        data: dict[str, Any] = {"tool": tool_ref(name, call), "error": error}
        if now_ns >= started:
            data["duration_ms"] = (now_ns - started) // 1_000_000
        return draft("tool.failed", data, subject=name, session=session)

    def _apply_runtime(self, mapped: Event, event: dict[str, Any], session: str | None,
                       state: BusState) -> list[Event]:
        kind = mapped["type"]
        if kind == "session.started":
            _bounded_put(state.sessions, session or "", SessionTrack(), MAX_SESSIONS)
        elif kind == "session.ended":
            state.sessions.pop(session or "", None)
        elif kind == "run.started":
            track = state.track(session)
            msg = get_str(get_dict(get_dict(event, "properties"), "info"), "id")
            seen = msg is not None and msg in track.users
            if msg is not None and not seen:
                _bounded_put(track.users, msg, None)
            if track.run_open or seen:
                # Annex A.7: a user message while a run is open (steering), or a later update of a
                # message already seen, never opens a run; it stays visible in the vendor plane.
                return [draft(f"x.{self.agent}.message.updated", {"role": "user"}, session=session,
                              severity="debug")]
            track.run_open = True
        elif kind == "run.finished":
            track = state.track(session)
            if not track.run_open:
                return []  # opencode.json session_idle: only an open run is closed
            track.run_open = False
        # attention.resolved echoes of a card our own loop settled are the attention book's to drop.
        return [mapped]

    def _paired_before(self, moment: dict[str, Any], session: str | None, now_ns: int,
                       state: BusState) -> list[Event]:
        inp = get_dict(moment, "input")
        mapped = self._tool_before(inp, moment.get("output"), session)
        call = get_str(inp, "callID")
        if call is not None:
            _bounded_put(state.pending_tools, call, (get_str(inp, "tool"), now_ns))
        return [mapped]

    def _paired_after(self, moment: dict[str, Any], session: str | None, now_ns: int,
                      state: BusState) -> list[Event]:
        inp = dict(get_dict(moment, "input"))
        call = get_str(inp, "callID")
        pending = state.pending_tools.pop(call, None) if call is not None else None
        if pending is not None and get_str(inp, "tool") is None and pending[0]:
            inp["tool"] = pending[0]  # callID pairs exactly: the before hook named the tool
        mapped = self._tool_after(inp, moment.get("output"), session)
        if pending is not None and now_ns >= pending[1]:
            # Receiver-observed wall time between the two hooks; only when callID paired them.
            mapped["data"]["duration_ms"] = (now_ns - pending[1]) // 1_000_000
        return [mapped]

    # -- moment builders --------------------------------------------------------------------------

    def _tool_before(self, inp: dict[str, Any], output: Any, session: str | None) -> Event:
        name = get_str(inp, "tool")
        data: dict[str, Any] = {"tool": tool_ref(name, get_str(inp, "callID"))}
        out = output if isinstance(output, dict) else {}
        if "args" in out:
            data["args_digest"] = digest(out["args"])
            if isinstance(out["args"], dict):
                data["args"] = out["args"]
        return draft("tool.requested", data, subject=name or "unknown", session=session)

    def _tool_after(self, inp: dict[str, Any], output: Any, session: str | None) -> Event:
        # opencode.json tool_after: the typed hook has NO error surface, so always tool.completed;
        # failures arrive session-scoped as x.{vendor}.session.error.
        name = get_str(inp, "tool")
        data: dict[str, Any] = {"tool": tool_ref(name, get_str(inp, "callID"))}
        hints: dict[str, str] = {}
        out = output if isinstance(output, dict) else {}
        if "output" in out:
            data["result_digest"] = digest(out["output"])
            if isinstance(out["output"], str | dict):
                data["result"] = out["output"]
        title = get_str(out, "title")
        if title is not None:
            data["title"] = title
            hints["title"] = "redacted"
        return draft("tool.completed", data, subject=name or "unknown", session=session,
                     _capture=hints or None)

    def _ask(self, perm: dict[str, Any], options: list[dict[str, str]] | None,
             session: str | None) -> Event:
        # Fixture shape {type, title}; the >=7.4.6 runtime Request is {permission, patterns}.
        name = get_str(perm, "type") or get_str(perm, "permission") or "unknown"
        detail = get_str(perm, "title")
        if detail is None:
            patterns = perm.get("patterns")
            if isinstance(patterns, list):
                detail = ", ".join(p for p in patterns if isinstance(p, str) and p) or None
        data: dict[str, Any] = {"kind": "permission", "prompt": permission_prompt(name, detail)}
        if options is not None:
            data["options"] = copy.deepcopy(options)
        data["respond_via"] = ["control"] if options is not None else ["oob"]
        # AEP-0002 §4.1: attention.requested severity >= notice RECOMMENDED.
        return draft("attention.requested", data, subject=name, session=session, severity="notice",
                     _attention_key=attention_key("permission", get_str(perm, "id")))

    def _question(self, props: dict[str, Any], form: Form, session: str | None) -> Event:
        data = {"kind": "form", "prompt": form.prompt, "fields": copy.deepcopy(form.fields), "respond_via": ["control"]}
        return draft("attention.requested", data, subject=get_str(props, "id"), session=session,
                     severity="notice", _structural={"prompt": form.structural}, _fields=copy.deepcopy(form.fields),
                     _attention_key=attention_key("question", get_str(props, "id")))

    def _bus(self, event: dict[str, Any], session: str | None, signal: Signal) -> Event | None:
        t = event.get("type")
        props = get_dict(event, "properties")
        info = get_dict(props, "info")
        v = self.agent
        if t == "session.created":
            data: dict[str, Any] = {"client": {"name": v}}
            if get_str(info, "version"):
                data["client"]["version"] = info["version"]
            if get_str(info, "parentID"):
                data["parent"] = {"session": info["parentID"]}  # the delegation shape: child names parent
            if get_str(info, "title"):
                data["label"] = info["title"]
            if get_str(info, "directory"):
                data["cwd"] = info["directory"]
            return draft("session.started", data, session=session)
        if t == "session.deleted":
            return draft("session.ended", {"reason": "normal"}, session=session)
        if t == "session.idle":
            return draft("run.finished", {}, session=session)
        if t == "session.compacted":
            return draft("session.compacted", {}, session=session)  # announced after the fact
        if t == "session.status":
            status = props.get("status")
            sub = status if isinstance(status, str) else get_str(status, "type")
            data = {}
            if get_str(status, "message"):
                data["message"] = status["message"]
            return draft("progress.status", data, subject=sub, session=session)
        if t == "session.error":
            err = get_dict(props, "error")
            data, hints = {}, {}
            if get_str(err, "name"):
                data["type"] = err["name"]
            message = get_str(get_dict(err, "data"), "message")
            if message is not None:
                data["message"], hints["message"] = message, "redacted"
            # Design record decision 4: never run.failed — OpenCode does not say the turn died.
            return draft(f"x.{v}.session.error", data, session=session, severity="error",
                         _capture=hints or None)
        if t == "message.updated":
            role = get_str(info, "role")
            if role == "user":
                return draft("run.started", {"trigger": "user"}, session=session)
            data = {"role": role} if role else {}
            tokens = get_dict(info, "tokens")
            if _int(tokens.get("input")) is not None:
                data["gen_ai.usage.input_tokens"] = tokens["input"]
            if _int(tokens.get("output")) is not None:
                data["gen_ai.usage.output_tokens"] = tokens["output"]
            return draft(f"x.{v}.message.updated", data, session=session, severity="debug")
        if t in ("permission.updated", "todo.updated"):
            # permission.updated: the held permission.ask hook is the first-class carrier;
            # todo.updated: a snapshot, diffed by diff_todos in map_signal.
            return None
        if t == "permission.replied":
            pid = get_str(props, "permissionID") or get_str(props, "requestID")
            return draft("attention.resolved", {"resolution": "answered"}, subject=pid, session=session,
                         _attention_key=attention_key("permission", pid))
        if t == "command.executed":
            data, hints = {}, {}
            if get_str(props, "name"):
                data["name"] = props["name"]
            if get_str(props, "arguments"):
                data["arguments"], hints["arguments"] = props["arguments"], "redacted"
            return draft(f"x.{v}.command.executed", data, session=session, severity="debug",
                         _capture=hints or None)
        if t == "file.edited" and get_str(props, "file"):
            return draft(f"x.{v}.file.edited", {"file": props["file"]}, session=session,
                         severity="debug", _capture={"file": "redacted"})
        if t == "permission.asked":
            # Kilo >=7.4.6 and OpenCode 1.18 ask on the bus and are answered over their REST routes
            # with the options the receiver decoded (Kilo's reply enum). Without them (a signal no
            # receiver decoded) the card is informational: permission.replied closes it, nothing
            # here could deliver an answer (AEP-0008 respond_via).
            return self._ask(props, signal.options, session)
        if t == "question.asked":
            if signal.form is None:
                return draft(bus_fallback(v, t), {}, session=session)  # no decoded form: never guess fields
            return self._question(props, signal.form, session)
        if t in ("question.replied", "question.rejected"):
            rid = get_str(props, "requestID")
            # question.rejected is not pinned: the vendor dismissed it; close the card, never orphan it.
            how = "answered" if t == "question.replied" else "dismissed"
            return draft("attention.resolved", {"resolution": how}, subject=rid, session=session,
                         _attention_key=attention_key("question", rid))
        name = bus_fallback(v, t)
        bus = name[len(f"x.{v}."):]
        debug = bus in _DEBUG_TYPES or bus.startswith(_DEBUG_PREFIXES)
        return draft(name, {}, session=session, severity="debug" if debug else None)


def diff_todos(prev: Any, nxt: Any, session: str | None = None) -> list[Event]:
    """Snapshot diff: new ids plan (+complete if already done), ->completed completes, else silent."""
    before: dict[str, Any] = {}
    for item in prev if isinstance(prev, list) else []:
        tid = get_str(item, "id")
        if tid is not None:
            before[tid] = item.get("status")
    out: list[Event] = []
    seen: set[str] = set()
    for item in nxt if isinstance(nxt, list) else []:
        tid = get_str(item, "id")
        if tid is None or tid in seen:
            continue
        seen.add(tid)
        done = item.get("status") == "completed"
        title = get_str(item, "content")
        if tid not in before:
            out.append(_task_draft("progress.task.planned", tid, title, session))
            if done:
                out.append(_task_draft("progress.task.completed", tid, title, session))
        elif done and before[tid] != "completed":
            out.append(_task_draft("progress.task.completed", tid, title, session))
    return out


def _task_draft(type_: str, tid: str, title: str | None, session: str | None) -> Event:
    if title is None:
        return draft(type_, {}, subject=tid, session=session)
    # todos $comment: task content is redacted-gated, so the whole task object goes with it below
    # redacted (gating task.title alone would leave an empty `task` where the pin has none).
    return draft(type_, {"task": {"title": title}}, subject=tid, session=session,
                 _capture={"task": "redacted"})
