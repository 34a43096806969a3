"""The OpenCode-family surface (OpenCode and its fork Kilo Code): plugin moments and their held loops.

The in-process plugin POSTs the mapping's moment shapes (the fixture inputs):
``{kind: "bus", event}`` from the ``event`` hook, ``{kind: "tool.before"|"tool.after", input,
output}`` from ``tool.execute.before/after`` and ``{kind: "permission.ask", permission}`` from the
hold-open ``permission.ask`` hook. A payload without ``kind`` is named by ``?name=`` or a ``{name,
payload}`` wrapper (a bus type, or a hook name such as ``tool.execute.before``). ``bus_moments``
decodes every POST into its moment once, here; ``Signal.payload`` is that moment, ``Signal.session``
the session it belongs to (the fixtures' ``identity.session_from``), and a bus ask carries what its
card offers (``Signal.options``, ``Signal.form``): the mapping draws the card from them, and an
answer is checked against the same.

Control. ``permission.ask`` is held on the shared loop while a control route is live; the reply
is ``{"status": "allow"|"deny"}``, which the plugin applies to the hook's ``output.status``;
timeout, dismissal and every failure reply ``{}`` (output untouched: the vendor prompts the user).
Kilo Code >=7.4.6 has no held hook: its bus ``permission.asked`` / ``question.asked`` are answered
in the background over Kilo's own server routes, at the ``PluginInput.serverUrl`` the plugin sends
in the ``X-AEP-Server-Url`` header (percent-encoded, loopback only; ``X-AEP-Directory`` becomes the
``x-kilo-directory`` of the answer); the plugin's POST is answered at once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aiohttp
from aep_collector.pipeline.control import RESPOND, Hold, attention_key
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.payload import get_dict, get_str
from aep_collector.pipeline.vendor import VendorDeclaration
from aep_collector.receivers.forms import form_validator, form_values
from aep_collector.receivers.held import AttentionHolder, permission_choice, permission_validator, recorded
from aep_collector.receivers.hook_http import FailOpenDelivery, HookError, HookServer, vendor_config
from aep_collector.receivers.tool_gate import HeldConfig
from aiohttp import web

from . import bus_replies, install
from .bus_moments import HOOK_NAMES, decode
from .bus_replies import NEUTRAL_REPLY
from .moments import need_name, unwrap

log = logging.getLogger("aep.receiver.bus")

SERVER_URL_HEADER = "X-AEP-Server-Url"
DIRECTORY_HEADER = "X-AEP-Directory"
_SETTLES = {"permission.replied": "permission", "question.replied": "question", "question.rejected": "question"}
_KEPT = 1024  # sessions whose vendor server address is remembered


def _never() -> bool:
    return False


def loopback_url(value: Any) -> str | None:
    """``value`` as an ``http(s)://`` base URL on a loopback host, else None (never answer elsewhere)."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parts = urlsplit(value.strip())
        host = parts.hostname or ""
        if parts.scheme not in ("http", "https") or not host:
            return None
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        return None
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


class BusSurface:
    """One OpenCode-family vendor's side of the shared hook server."""

    def __init__(self, agent: str, config: Any, component: str) -> None:
        self.agent = agent
        self.config = config
        self.component = component
        self.loop = AttentionHolder(self.agent, component, config.attention_timeout)
        self.routes = bool(getattr(config, "reply_routes", False))
        self.servers: dict[str, tuple[str, str | None]] = {}
        """session -> (vendor server base URL, project directory) as the plugin last sent them."""
        self.delivering: set[str] = set()
        """Keys whose answer is being POSTed to the vendor: their settle echo is ours, not news."""
        self.tasks: set[asyncio.Task[Any]] = set()
        self.http: aiohttp.ClientSession | None = None
        self.host: Host | None = None

    async def on_start(self, host: Host, server: HookServer) -> None:
        assert server.deliver is not None
        self.host = host
        self.loop.bind(host, server.deliver, [RESPOND], server.consumer)

    async def on_stop(self) -> None:
        # The router freed every hold before receivers stop: let background holds write their
        # closing legs, then cancel what is still running (a reply-route POST in flight).
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=2)
        for task in list(self.tasks):
            task.cancel()
        if self.http is not None:
            await self.http.close()
            self.http = None

    # -- the request ------------------------------------------------------------------------------

    def signal(self, payload: dict[str, Any], request: web.Request) -> Signal:
        body, given = unwrap(payload, request)
        kind = body.get("kind")
        event = body.get("event")
        bus_type = event.get("type") if isinstance(event, dict) else body.get("type") if kind is None else None
        if bus_type is not None and not isinstance(bus_type, str):
            # The type is what the event is: a list or object there names nothing we could record.
            raise HookError(400, "invalid-payload",
                            f"event.type must be a string (a bus event type), got {type(bus_type).__name__}")
        if kind == "bus":
            name = get_str(get_dict(body, "event"), "type") or given
        elif isinstance(kind, str) and kind in HOOK_NAMES:
            name = HOOK_NAMES[kind]
        else:
            name = given
        name = need_name(name, "kind (or event.type)")
        signal = decode(self.agent, name, body)
        # The plugin percent-encodes both (a header value is Latin-1; a directory may not be).
        url = loopback_url(unquote(request.headers.get(SERVER_URL_HEADER, "")))
        if url is not None:  # receiver-private: only _remember_server reads it
            signal.attrs = {"server_url": url, "directory": unquote(request.headers.get(DIRECTORY_HEADER, "")) or None}
        return signal

    def neutral(self, signal: Signal | None) -> Any:
        return NEUTRAL_REPLY

    def awaits_reply(self, signal: Signal) -> bool:
        """The plugin reads only the held ``permission.ask`` reply; every other moment may be batched."""
        return signal.name == HOOK_NAMES["permission.ask"]

    async def handle(self, signal: Signal, deliver: FailOpenDelivery) -> Any:
        moment = signal.payload  # decoded by ``signal`` (bus_moments.decode)
        session = signal.session
        self._remember_server(signal, session)
        if moment["kind"] == "permission.ask":
            return await self._held_ask(signal, get_dict(moment, "permission"))
        event = get_dict(moment, "event")
        bus_type = event.get("type")
        if bus_type in ("permission.asked", "question.asked"):
            if self.routes:
                return await self._route_card(signal, event, session, deliver)
            signal.respond_via = ["oob"]  # AEP-0008: nothing here can deliver an answer
        if bus_type in _SETTLES:
            props = get_dict(event, "properties")
            vendor_id = get_str(props, "permissionID") or get_str(props, "requestID")
            key = attention_key(_SETTLES[bus_type], vendor_id)
            if key in self.delivering:
                return NEUTRAL_REPLY  # the echo of the answer we are delivering; our legs say it
            await deliver([signal])
            for hold in self.loop.pending(session or "unknown"):
                if hold.key == key:
                    self.loop.settle_oob(hold)  # answered in the vendor's own prompt
            return NEUTRAL_REPLY
        if bus_type == "session.deleted":
            await self.loop.sweep(session)
            self.servers.pop(session or "", None)
        await deliver([signal])
        return NEUTRAL_REPLY

    # -- the held permission.ask hook ------------------------------------------------------------

    async def _held_ask(self, signal: Signal, perm: dict[str, Any]) -> Any:
        key = attention_key("permission", get_str(perm, "id"))
        # A plugin that aborted its fetch dismisses it; the hook output carries only status, so
        # any guidance text is visible on the stream alone.
        end = await self.loop.hold_permission(signal, key)
        if end.applied is None:
            return NEUTRAL_REPLY  # no operator, timeout, dismissal: the vendor prompts the user
        return bus_replies.permission_reply(end.applied.option)

    # -- Kilo >=7.4.6: bus asks answered over the vendor's REST routes --------------------------------

    def _remember_server(self, signal: Signal, session: str | None) -> None:
        attrs = signal.attrs
        if attrs and attrs.get("server_url") and session:
            self.servers.pop(session, None)
            self.servers[session] = (attrs["server_url"], attrs.get("directory"))
            while len(self.servers) > _KEPT:
                del self.servers[next(iter(self.servers))]

    async def _route_card(self, signal: Signal, event: dict[str, Any], session: str | None,
                          deliver: FailOpenDelivery) -> Any:
        props = get_dict(event, "properties")
        server = self.servers.get(session or "")
        vendor_id = get_str(props, "id")
        if server is None or session is None or vendor_id is None:
            # Nowhere to deliver an answer: the card is informational (AEP-0008 respond_via).
            signal.respond_via = ["oob"]
            await deliver([signal])
            return NEUTRAL_REPLY
        # An answer is checked against what the card offers: the vendor's reply enum, or the form.
        options: list[dict[str, str]] = signal.options or []
        if event.get("type") == "permission.asked":
            key = attention_key("permission", vendor_id)
            validate = permission_validator(options)
            fields: list[dict[str, Any]] | None = None
        else:
            key = attention_key("question", vendor_id)
            fields = signal.form.fields if signal.form is not None else []
            validate = form_validator(fields, legacy=len(fields) == 1)
        hold = await self.loop.request(signal, validate, key, vendor_ui=True)  # Kilo prompts in parallel
        if hold is not None:
            # The plugin's event hook is observation: answer it now and settle in the background.
            task = asyncio.ensure_future(self._settle_over_route(hold, props, session, vendor_id, server, options,
                                                                 fields))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return NEUTRAL_REPLY

    async def _settle_over_route(self, hold: Hold, props: dict[str, Any], session: str, vendor_id: str,
                                 server: tuple[str, str | None], options: list[dict[str, str]],
                                 fields: list[dict[str, Any]] | None) -> None:
        # The plugin's POST was answered at once and its connection may close: the answer goes to
        # Kilo's server, so a closed plugin connection is not a vendor hanging up (never gone).
        outcome = await self.loop.wait(hold, gone=_never)
        if outcome.how != "answered" or outcome.answer is None:
            return  # timeout/dismissal/oob: nothing is sent, the vendor's own prompt stays
        assert hold.key is not None
        self.delivering.add(hold.key)
        try:
            if fields is None:
                applied = permission_choice(outcome.answer, options, refusing="reject")
                path = bus_replies.permission_route(vendor_id)
                body: dict[str, Any] = bus_replies.permission_route_body(applied.option, applied.text)
                answer = recorded(applied)  # any text is delivered as the reject message (kilocode.json)
            else:
                values = form_values(outcome.answer, fields)
                path = bus_replies.question_route(vendor_id)
                body = bus_replies.question_route_body(props.get("questions"), values)
                answer = {"values": values}
            problem = await self._post(server, path, body)
            if problem is None:
                await self.loop.answered(hold, outcome, answer, fields)
                return
            # Accepted but not applied: say so rather than claim an answer the vendor never got.
            if self.host is not None:
                self.host.health.fail(self.component, "reply-route", problem)
            await self.loop.emit(hold, "attention.resolved", {"resolution": "dismissed"}, cause_request=True)
        finally:
            self.delivering.discard(hold.key)

    async def _post(self, server: tuple[str, str | None], path: str, body: dict[str, Any]) -> str | None:
        """POST ``body`` to the vendor server; None on a 2xx, else what went wrong."""
        base, directory = server
        # The instance the session lives in; Kilo's server decodeURIComponent()s the header.
        headers = {"x-kilo-directory": quote(directory, safe="")} if directory else {}
        if self.http is None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.reply_route_timeout))
        try:
            async with self.http.post(base + path, json=body, headers=headers) as resp:
                if 200 <= resp.status < 300:
                    if self.host is not None:
                        self.host.health.recover(self.component, "reply-route")
                    return None
                return f"POST {path} answered HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return f"POST {path} failed: {type(exc).__name__}: {exc}"


@dataclass
class BusConfig(HeldConfig):
    """The keys every OpenCode-family receiver has (its module adds the ``endpoint`` default)."""

    attention_timeout: float = 55.0
    """Seconds a held ask waits for an operator before ``{}`` (the plugin's own hold bound is above it)."""
    reply_routes: bool = True
    """Answer bus asks (OpenCode 1.18, Kilo >=7.4.6) over the vendor's server routes
    (``POST /permission/{id}/reply``, ``POST /question/{id}/reply``) at the loopback
    ``serverUrl`` the plugin forwards."""
    reply_route_timeout: float = 5.0
    """Seconds one such POST may take."""

    def validate(self) -> None:
        super().validate()
        if self.reply_route_timeout <= 0:
            raise ValueError("reply_route_timeout must be positive")


def declare(agent: str, config_name: str, port: int, description: str) -> VendorDeclaration:
    """One OpenCode-family vendor: this surface, the shipped plug-in file, its own identity and port.

    Its config class (``config_name``, exported by the vendor's module) is ``BusConfig`` with the
    ``endpoint`` default on ``port``. Its mapping is ``aep_collector.processors.mapping.<agent>``.
    """
    config_class = vendor_config(agent, BusConfig, port, f"{__package__}.{agent}", config_name)
    return VendorDeclaration(
        agent=agent, receiver_type=agent, port=port, config_class=config_class,
        surface=lambda cfg, component: BusSurface(agent, cfg, component),
        mapping=f"aep_collector.processors.mapping.{agent}", registration=install.renderer(agent),
        neutral_reply=NEUTRAL_REPLY, description=description)
