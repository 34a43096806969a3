"""AEP event <-> CloudEvents 1.0 JSON (AEP-0005 §2, bindings B1–B5; pinned by ce-roundtrip/).

Forward: ``type`` gets the ``dev.aep.`` root, the envelope's AEP attributes become ``aep*``
extensions with their values unchanged and no default filled in, AEP extension attributes and
``traceparent`` pass unprefixed, ``datacontenttype`` only with data. The inverse is here so the
round trip can be held to the pins; a CE whose type is not under ``dev.aep.`` is not AEP (None).
"""

from __future__ import annotations

import re
from typing import Any

PREFIX = "dev.aep."
# B4: AEP attribute -> CloudEvents extension.
RENAMED = {"aep": "aepversion", "agent": "aepagentid", "session": "aepsessionid", "run": "aeprunid",
           "step": "aepstep", "seq": "aepsequence", "epoch": "aepepoch", "cause": "aepcausationid",
           "severity": "aepseverity", "capture": "aepcapture"}
BACK = {v: k for k, v in RENAMED.items()}
COPIED = ("id", "source", "subject", "time")  # B2, with data
CORE = frozenset({"aep", "id", "type", "subject", "time", "source", "agent", "session", "run", "step", "seq",
                  "epoch", "cause", "traceparent", "severity", "capture", "data"})
_NAME = re.compile(r"^[a-z0-9]{1,20}$")
# CE attributes the forward projection writes itself beside CORE's: an AEP extension of one of these
# names (legal in AEP: none is an AEP core name) would overwrite it, e.g. ``specversion: "0.3"``
# making every receiver refuse the batch, or ``aepcapture`` declaring a level the event does not have.
WRITTEN = frozenset({"specversion", "datacontenttype", "dataschema", "traceparent", *RENAMED.values()})


def to_cloudevent(event: dict[str, Any]) -> dict[str, Any]:
    """The structured-mode CloudEvent of a stamped AEP event."""
    ce: dict[str, Any] = {"specversion": "1.0"}
    for name in ("id", "source"):
        ce[name] = event[name]
    ce["type"] = PREFIX + event["type"]
    for name in ("subject", "time"):
        if name in event:
            ce[name] = event[name]
    if "data" in event:
        ce["datacontenttype"] = "application/json"
    for name, ext in RENAMED.items():
        if name in event:
            ce[ext] = event[name]
    if "traceparent" in event:
        ce["traceparent"] = event["traceparent"]  # B5: the Distributed Tracing extension
    for name, value in event.items():
        if name not in CORE and name not in WRITTEN:
            ce[name] = value  # AEP extension attributes pass unprefixed; one that would overwrite is left out
    if "data" in event:
        ce["data"] = event["data"]
    return ce


def from_cloudevent(ce: dict[str, Any]) -> dict[str, Any] | None:
    """The AEP event a CloudEvent carries; None for a CE that is not AEP. Illegal names are dropped."""
    ce_type = ce.get("type")
    if not isinstance(ce_type, str) or not ce_type.startswith(PREFIX):
        return None
    event: dict[str, Any] = {"aep": ce.get("aepversion", "0.1"), "type": ce_type[len(PREFIX):]}
    for name, value in ce.items():
        if name in ("specversion", "datacontenttype", "type", "aepversion"):
            continue
        if name in BACK:
            event[BACK[name]] = value
        elif name in COPIED or name in ("data", "traceparent"):
            event[name] = value
        elif _NAME.match(name) and name not in CORE and isinstance(value, (str, int, bool)):
            event[name] = value  # unknown aep* names too, under their own name (AEP-0005 §2 rule 2)
    return event
