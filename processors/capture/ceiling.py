"""The capture ceiling: the emitter-side cap for drafts and the hop-side down-level (AEP-0001 §8.2).

Both walk ``data`` with the per-type ``x-aep-capture`` annotations (``annotations.json``, derived
from the schemas by ``build_annotations.py``) and drop every field whose minimum level is above
the level the event will carry. They differ where the spec makes them differ:

* the emitter (``cap_draft``) holds the original content, so at ``redacted`` it runs the §9.4
  pipeline and may claim ``redacted``; below it, it knows the structural values of the
  ``[metadata*]`` fields (``_structural``) and the form's field specs (``_fields``);
* a hop (``downlevel``) holds neither, so it never mints ``redacted`` (§8.2(e)), synthesizes the
  prompt, and keeps only numbers and booleans of form values (AEP-0002 §5.3, "known lossy").

The emitter also checks values, not only fields (issue #12, ``structure.py``): below ``full`` every
string it keeps as structure — in ``data`` and the envelope's subject and ids — is screened, and
content found there leaves only as its opaque digest (or redacted, at ``redacted``).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import quote, unquote

from .redact import PLAIN_RUN, SECRET, SHAPE_LITERAL, Redactor, is_credential_key
from .structure import (
    ENVELOPE_IDS,
    ENVELOPE_TOKEN,
    EXTENSION_DEFAULT,
    FIELD_CLASSES,
    TOKEN,
    WILDCARD,
    is_token,
    opaque,
)

LEVELS = ("none", "metadata", "redacted", "full")
NONE, METADATA, REDACTED, FULL = range(4)
DEFAULT_CEILING = "metadata"
# AEP-0003 §9.1: RECOMMENDED default override, so attention prompts stay readable.
DEFAULT_OVERRIDES: dict[str, str] = {"attention": "redacted"}
ANNOTATIONS_FILE = Path(__file__).with_name("annotations.json")

# Hints a mapping leaves for the capture processor; every other `_` key belongs to later components.
CAPTURE_HINTS = ("_capture", "_structural", "_fields")
TWIN_SUFFIX = "_redacted"
DIGEST_SUFFIX = "_digest"
VALUES_TYPES = ("attention.answered", "control.attention.respond")
_OVERRIDE_KEY = re.compile(r"^(x\.[a-z0-9_-]+|[a-z0-9_]+)(\.[a-z0-9_]+)*(\.\*)?$")

Annotations = Mapping[str, str]


_RANK = {level: i for i, level in enumerate(LEVELS)}
# A `token` path is gated like a metadata one, and its value is checked (structure.py).
_CLASS_RANK = {**_RANK, TOKEN: METADATA}


def rank(level: str) -> int:
    """Position of a capture level in ``none < metadata < redacted < full``."""
    return _RANK[level]


def check_level(level: Any, what: str) -> str:
    """``level`` if it is a capture level, else a ``ValueError`` naming ``what``."""
    if level not in LEVELS:
        raise ValueError(f"{what}: unknown capture level {level!r} (expected one of {', '.join(LEVELS)})")
    return level


@cache
def load_annotations() -> dict[str, dict[str, str]]:
    """The committed ``{type: {dotted.path: level}}`` table."""
    return json.loads(ANNOTATIONS_FILE.read_text(encoding="utf-8"))


def category_of(event_type: str) -> str:
    """The category of a type: its first segment, or the third for ``x.{vendor}.{category}...``."""
    parts = event_type.split(".")
    if parts[0] == "x" and len(parts) >= 3:
        return parts[2]
    return parts[0]


@dataclass(frozen=True)
class CapturePolicy:
    """The configured ceiling plus per-category, per-glob or per-type overrides (AEP-0003 §9.1).

    Immutable (the overrides too): its levels are memoized here and its decisions kept by the
    capture processor, so a different policy is a new one, never an edit of one in use.
    """

    ceiling: str = DEFAULT_CEILING
    overrides: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_OVERRIDES))

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))
        check_level(self.ceiling, "capture ceiling")
        for key, level in self.overrides.items():
            if not isinstance(key, str) or not _OVERRIDE_KEY.match(key):
                raise ValueError(
                    f"capture override {key!r}: expected a category (attention), a glob (attention.*) "
                    "or an exact type (tool.requested)"
                )
            check_level(level, f"capture override {key!r}")

    def level_for(self, event_type: str) -> str:
        """The level events of ``event_type`` are gated at: the most specific override, else the ceiling."""
        # Memoized per type (hot path); the policy cannot change under its memo.
        levels = self.__dict__.get("_memo")
        if levels is None:
            levels = self.__dict__["_memo"] = {}
        level = levels.get(event_type)
        if level is None:
            level = self._level_for(event_type)
            if len(levels) < 4096:
                levels[event_type] = level
        return level

    def _level_for(self, event_type: str) -> str:
        if event_type in self.overrides:
            return self.overrides[event_type]
        best: tuple[int, str] | None = None
        category = category_of(event_type)
        for key, level in self.overrides.items():
            if key.endswith(".*"):
                prefix = key[:-2]
                hit = event_type.startswith(prefix + ".") or ("." not in prefix and prefix == category)
                weight = len(prefix) + 1
            else:
                hit = "." not in key and key == category
                weight = 0  # a bare category is the least specific form
            if hit and (best is None or weight > best[0]):
                best = (weight, level)
        return self.ceiling if best is None else best[1]


# --- form values (AEP-0006) -------------------------------------------------------------------


def _choice_ids(spec: Mapping[str, Any]) -> set[str]:
    return {c["id"] for c in spec.get("choices") or [] if isinstance(c, dict) and isinstance(c.get("id"), str)}


def _is_number(value: Any) -> bool:
    # bool is an int in Python; AEP-0002 §5.3 keeps booleans and numbers apart, so test it first.
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _structural_value(spec: Mapping[str, Any], value: Any) -> bool:
    """True when the value of this field is structural (survives at metadata), false when text."""
    kind = spec.get("type")
    # A value whose JSON type contradicts its field is not structural: text typed into a
    # `number` field would otherwise ride at metadata (hardening beyond the reference stack).
    if kind == "number":
        return _is_number(value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "select":
        ids = _choice_ids(spec)
        items = value if isinstance(value, list) else [value]
        return all(isinstance(item, str) and item in ids for item in items)
    return False  # string fields, and anything unknown, are user-authored text


def cap_form_values(fields: list[dict[str, Any]], values: Mapping[str, Any], ceiling: str) -> dict[str, Any]:
    """Emitter-side gating of ``answer.values`` against the request's field specs (AEP-0006).

    Keys with no field spec are dropped at any level (conservative; capture-gating corpus). At
    ceiling ``none`` structural values still pass: dropping ``data`` is the envelope's job.
    """
    content_ok = rank(check_level(ceiling, "form values ceiling")) >= REDACTED
    if not isinstance(values, Mapping) or not isinstance(fields, list):
        return {}  # not a form answer: nothing in it can be classified, so nothing passes
    by_id = {f["id"]: f for f in fields if isinstance(f, dict) and isinstance(f.get("id"), str)}
    out: dict[str, Any] = {}
    for key, value in values.items():
        spec = by_id.get(key)
        if spec is None:
            continue
        if content_ok or _structural_value(spec, value):
            out[key] = copy.deepcopy(value)
    return out


def hop_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Hop-side gating of ``answer.values`` with no field specs: numbers and booleans only."""
    return {k: v for k, v in values.items() if isinstance(v, bool) or _is_number(v)}


# --- the walk ---------------------------------------------------------------------------------


def _class_at(ann: Annotations, path: str) -> str:
    """The class of a path: its own entry, else the table's wildcard, else ``metadata`` (schema default)."""
    return ann.get(path) or ann.get(WILDCARD, "metadata")


def _level_at(ann: Annotations, path: str, inherited: int) -> int:
    # A child can never be shown where its parent may not be: effective level is the max.
    level = _CLASS_RANK[_class_at(ann, path)]
    return level if level > inherited else inherited


def _stricter(new: str, old: str) -> bool:
    """True when class ``new`` gates harder than ``old`` (``token`` refines ``metadata``)."""
    a, b = _CLASS_RANK[new], _CLASS_RANK[old]
    return a > b or (a == b and new == TOKEN and old != TOKEN)


Screen = Callable[[str, bool], Any]
"""(a string kept as structure, whether its path is token-classed) -> what may leave in its place."""


_ATOMS = (str, int, float, bool, type(None))


def _foreign(value: Any, limit: int) -> Any:
    """A value no JSON decoder makes (a plug-in's bytes, set or object): the walk cannot see what it
    holds, so below ``full`` it fails the draft closed rather than pass it unscreened."""
    if limit >= FULL:
        return copy.deepcopy(value)
    raise TypeError(f"a {type(value).__name__} value cannot be gated below full")
_CREDENTIAL_KEYS: dict[Any, bool] = {}


def _credential(key: Any) -> bool:
    """``is_credential_key``, cached: the same few key names come by on every event."""
    hit = _CREDENTIAL_KEYS.get(key)
    if hit is None:
        hit = is_credential_key(key)
        if len(_CREDENTIAL_KEYS) < 8192 and isinstance(key, str):
            _CREDENTIAL_KEYS[key] = hit
    return hit


def _prune(value: Any, path: str, ann: Annotations, limit: int, inherited: int,
           on_redacted: Callable[[Any], Any] | None, scrub: bool = False, screen: Screen | None = None) -> Any:
    """``value`` without the parts gated above ``limit``; redacted-gated subtrees pass ``on_redacted``.

    Always returns fresh containers (callers then edit the result in place), sharing only
    immutable leaves; with ``scrub``, credential-named keys lose their values on the way; with
    ``screen``, every string kept at metadata level passes it (structure or its stand-in).
    """
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            digest_key = isinstance(key, str) and key.endswith(DIGEST_SUFFIX)
            if digest_key:
                level = max(inherited, METADATA)  # AEP-0003 §9.3: digests are structural
            else:
                level = _level_at(ann, sub, inherited)
            if level > limit:
                continue
            if scrub and item is not None and _credential(key):
                out[key] = SECRET  # below full a credential-named key never carries its value
                continue
            kept = _prune(item, sub, ann, limit, level, on_redacted, scrub, None if digest_key else screen)
            if on_redacted is not None and level == REDACTED and inherited < REDACTED:
                kept = on_redacted(kept)
            out[key] = kept
        return out
    if isinstance(value, (list, tuple)):  # a plug-in's tuple is an array on the wire: gated as one
        sub = path + "[]"
        level = _level_at(ann, sub, inherited)
        if level > limit:
            return []
        items = [_prune(item, sub, ann, limit, level, on_redacted, scrub, screen) for item in value]
        if on_redacted is not None and level == REDACTED and inherited < REDACTED:
            items = [on_redacted(item) for item in items]
        return items
    if isinstance(value, str) and screen is not None and inherited <= METADATA:
        return screen(value, _class_at(ann, path) == TOKEN)
    return value if isinstance(value, _ATOMS) else _foreign(value, limit)


# --- the compiled plan ------------------------------------------------------------------------
#
# ``_prune`` decides each field from (annotations, dotted path, inherited level) only: never from
# the value. A ``_Plan`` node caches those decisions per key, so the hot path (``cap_draft``)
# builds no path strings and looks nothing up in the annotations for a key it has seen before:
# the schema is walked once per (type, hint), the data still once per event. ``_prune`` stays the
# reference (and serves ``downlevel``); tests/test_capture_plan.py holds the two equal.

_PLAN_NODES = 20_000
"""Nodes one plan may cache (vendor payloads have open key sets); beyond, decisions are not kept."""


class _Plan:
    """The decisions under one dotted path reached at one inherited level."""

    __slots__ = ("ann", "path", "inherited", "token", "keys", "items", "budget")

    def __init__(self, ann: Annotations, path: str, inherited: int, budget: list[int]) -> None:
        self.ann, self.path, self.inherited, self.budget = ann, path, inherited, budget
        self.token = _class_at(ann, path) == TOKEN
        self.keys: dict[Any, tuple[int, _Plan, bool, bool, bool | None]] = {}
        self.items: tuple[int, _Plan] | None = None
        budget[0] -= 1

    def key(self, key: Any) -> tuple[int, _Plan, bool, bool, bool | None]:
        """(level, plan of the value, is a digest key, names a credential, screen) for ``key`` of a
        dict here; screen: None when a string value is kept as it is, else whether the screen
        takes it as token-classed (a string kept at metadata, not a digest, passes the screen)."""
        sub = f"{self.path}.{key}" if self.path else key
        digest_key = isinstance(key, str) and key.endswith(DIGEST_SUFFIX)
        if digest_key:
            level = max(self.inherited, METADATA)  # AEP-0003 §9.3: digests are structural
        else:
            level = _level_at(self.ann, sub, self.inherited)
        child = _Plan(self.ann, sub, level, self.budget)
        entry = (level, child, digest_key, _credential(key),
                 child.token if level <= METADATA and not digest_key else None)
        if self.budget[0] > 0:
            self.keys[key] = entry
        return entry

    def item(self) -> tuple[int, _Plan]:
        """(level, plan) of the items of a list at this path."""
        if self.items is None:
            sub = self.path + "[]"
            level = _level_at(self.ann, sub, self.inherited)
            self.items = (level, _Plan(self.ann, sub, level, self.budget))
        return self.items


def _plan_for(ann: Annotations) -> _Plan:
    return _Plan(ann, "", NONE, [_PLAN_NODES])


def _apply(value: Any, plan: _Plan, limit: int, on_redacted: Callable[[Any], Any] | None,
           scrub: bool, screen: Screen | None) -> Any:
    """``_prune(value, plan.path, ann, limit, plan.inherited, ...)``, decided by the plan."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        wrap = on_redacted is not None and plan.inherited < REDACTED
        keys = plan.keys
        for key, item in value.items():
            entry = keys.get(key)
            if entry is None:
                entry = plan.key(key)
            level, child, digest_key, credential, token = entry
            if level > limit:
                continue
            if credential and scrub and item is not None:
                out[key] = SECRET  # below full a credential-named key never carries its value
                continue
            # Leaves decided here, as the call below would decide them, without the call (most
            # values are strings and numbers): a string kept at metadata passes the screen.
            kind = item.__class__
            if kind is str:
                kept = item if token is None or screen is None else screen(item, token)
            elif item is None or kind is int or kind is bool or kind is float:
                kept = item
            else:
                kept = _apply(item, child, limit, on_redacted, scrub, None if digest_key else screen)
            if wrap and level == REDACTED:
                kept = on_redacted(kept)  # type: ignore[misc]  # wrap implies on_redacted
            out[key] = kept
        return out
    if isinstance(value, (list, tuple)):  # as in ``_prune``
        level, child = plan.items or plan.item()
        if level > limit:
            return []
        items = [_apply(item, child, limit, on_redacted, scrub, screen) for item in value]
        if on_redacted is not None and level == REDACTED and plan.inherited < REDACTED:
            items = [on_redacted(item) for item in items]
        return items
    if isinstance(value, str) and screen is not None and plan.inherited <= METADATA:
        return screen(value, plan.token)
    return value if isinstance(value, _ATOMS) else _foreign(value, limit)


def _declares_twins(ann: Annotations) -> bool:
    """True when some path is ``full`` with its ``_redacted`` twin at ``redacted`` (what ``_twins`` looks for)."""
    return any(cls == "full" and ann.get(path + TWIN_SUFFIX) == "redacted" for path, cls in ann.items())


def _twins(value: Any, path: str, ann: Annotations, make: Callable[[Any], Any]) -> Any:
    """Add ``X_redacted`` beside every full-gated ``X`` whose twin the schema declares (at redacted)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            out[key] = _twins(item, sub, ann, make)
        for key, item in value.items():
            if not isinstance(key, str):
                continue
            sub = f"{path}.{key}" if path else key
            twin = key + TWIN_SUFFIX
            if (ann.get(sub) == "full" and ann.get(sub + TWIN_SUFFIX) == "redacted"
                    and twin not in value and item is not None):
                out[twin] = make(copy.deepcopy(item))
        return out
    if isinstance(value, list):
        return [_twins(item, path + "[]", ann, make) for item in value]
    return value


# --- [metadata*] fields (AEP-0002 §5.3, AEP-0003 §9.2) -------------------------------------------


def synthesized_prompt(agent: Any, kind: Any, subject: Any) -> str:
    """``"{agent} requests {kind}: {subject}"``, or without ``: {subject}`` when there is none."""
    who = agent if isinstance(agent, str) and agent else "agent"
    what = kind if isinstance(kind, str) and kind else "attention"
    if subject is None or subject == "":
        return f"{who} requests {what}"
    return f"{who} requests {what}: {subject}"


def _labels_to_ids(items: Any) -> None:
    """Replace every ``label`` of a list of ``{id, label}`` objects by its id (1-based index if none)."""
    if not isinstance(items, list):
        return
    for index, item in enumerate(items, start=1):
        if isinstance(item, dict) and "label" in item:
            ident = item.get("id")
            item["label"] = str(ident) if ident is not None and ident != "" else str(index)


def _degrade_request(data: dict[str, Any]) -> None:
    _labels_to_ids(data.get("options"))
    fields = data.get("fields")
    _labels_to_ids(fields)
    if isinstance(fields, list):
        for spec in fields:
            if isinstance(spec, dict):
                _labels_to_ids(spec.get("choices"))


def _redact_request(data: dict[str, Any], redactor: Redactor) -> None:
    if isinstance(data.get("prompt"), str):
        data["prompt"] = redactor.text(data["prompt"])
    lists = [data.get("options")]
    for spec in data.get("fields") or []:
        if isinstance(spec, dict):
            lists.append([spec])
            lists.append(spec.get("choices"))
    for items in lists:
        for item in items or []:
            if isinstance(item, dict) and isinstance(item.get("label"), str):
                item["label"] = redactor.text(item["label"])


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted dict path whose parent exists (``_structural`` never creates objects)."""
    parts = path.split(".")
    node: Any = data
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node[parts[-1]] = copy.deepcopy(value)


# --- the emitter-side cap -------------------------------------------------------------------


@cache
def default_redactor() -> Redactor:
    """The pipeline ``cap_draft`` runs when given none: no configured secrets, PII on, user's home."""
    return Redactor()


_MERGED: dict[tuple[str, Any], tuple[dict[str, str], _Plan]] = {}


def _merged(event_type: str, hint: Any, data: Mapping[str, Any]) -> tuple[dict[str, str], _Plan]:
    """The type's annotations with the draft's ``_capture`` hint merged in, and their plan.

    Cached per (type, hint): on the hot path both are built once.
    """
    if event_type.startswith("message."):
        ann = _merge(event_type, hint, data)  # depends on the data's keys: not cacheable
        return ann, _plan_for(ann)
    try:
        key = (event_type, tuple(sorted(hint.items())) if isinstance(hint, dict) else None)
        cached = _MERGED.get(key)
    except TypeError:  # an unhashable hint value: merge uncached (it still fails closed inside)
        ann = _merge(event_type, hint, data)
        return ann, _plan_for(ann)
    if cached is None:
        ann = _merge(event_type, hint, data)
        cached = (ann, _plan_for(ann))
        if len(_MERGED) < 4096:
            _MERGED[key] = cached
    return cached


def _merge(event_type: str, hint: Any, data: Mapping[str, Any]) -> dict[str, str]:
    table = load_annotations()
    ann = dict(table.get(event_type, {}))
    if event_type not in table and event_type.startswith("message."):
        # AEP-0002 §4.3: the reserved message sub-profile is content-bearing, redacted minimum;
        # with no schema to say which field is which, every field is treated as content.
        ann.update({key: "redacted" for key in data if isinstance(key, str)})
    if event_type.startswith("x."):
        # AEP-0001 §6 extension types have no schema: a string is structure only as a token.
        ann.setdefault(WILDCARD, EXTENSION_DEFAULT)
    for path, cls in FIELD_CLASSES.get(event_type, {}).items():
        if _stricter(cls, _class_at(ann, path)):
            ann[path] = cls
    if isinstance(hint, dict):
        base = ann.get(WILDCARD, "metadata")
        for path, level in hint.items():
            if level not in _CLASS_RANK:
                level = "full"  # a mapping bug must fail closed: an unreadable minimum is the highest
            if path == WILDCARD:
                continue
            current = ann.get(path, base)
            # A hint can raise a schema minimum, never lower it: that would smuggle content. Naming
            # an unnamed path at the default class declares it, so the hint's own `*` leaves it be.
            if _stricter(level, current) or (path not in ann and level == current):
                ann[path] = level
        wildcard = hint.get(WILDCARD)
        if wildcard is not None:
            wildcard = wildcard if wildcard in _CLASS_RANK else "full"
            if _stricter(wildcard, base):
                ann[WILDCARD] = wildcard
    return ann


def cap_draft(draft: dict[str, Any], policy: CapturePolicy, redactor: Redactor | None = None) -> dict[str, Any]:
    """Cap one draft at the level its type gets under ``policy``; returns a new draft.

    Fields above the level are dropped per the annotations merged with the draft's ``_capture``
    hint; at ``redacted`` every kept redacted-gated value and the ``[metadata*]`` text pass the
    §9.4 pipeline; below it the ``[metadata*]`` fields become structural. ``capture`` is set to the
    level honoured and the capture hints are removed.
    """
    return apply_cap(draft, policy, redactor or default_redactor(), None)


Route = list[Any]
"""What capping a draft of one (type, declared level, hint) needs: ``[level, screen, (ann, plan) or
None, whether the annotations declare any ``_redacted`` twin (None: not asked yet)]``. Kept under
the type alone for a draft with neither a declared level nor a hint (most), else under
``(type, declared, hint items)``."""
_ROUTES_LIMIT = 4096


def apply_cap(draft: dict[str, Any], policy: CapturePolicy, detector: Redactor,
               routes: dict[Any, Route] | None) -> dict[str, Any]:
    """``cap_draft`` with its per-type decisions kept in ``routes`` (the processor's; None: decide anew).

    A route holds the level, the screen and the merged annotations with their plan: everything
    that depends on the draft's type, declared level and hint but not on its values. ``routes``
    assumes the policy and the detector no longer change (the processor builds both once).
    """
    # Shallow: ``data`` is rebuilt by _apply, so the input is never mutated. ``copy`` of a plain
    # dict is the same dict as ``dict(draft)`` without the constructor's call.
    out = draft.copy() if draft.__class__ is dict else dict(draft)
    hint = out.pop("_capture") if "_capture" in out else None
    structural = out.pop("_structural") if "_structural" in out else None
    fields = out.pop("_fields") if "_fields" in out else None
    event_type = out.get("type")
    if not isinstance(event_type, str):
        event_type = ""
    declared = out["capture"] if "capture" in out else None  # most drafts declare no level
    key: Any = None
    route = None
    if routes is not None and not event_type.startswith("message."):  # message.*: data-dependent
        if hint is None and declared is None:
            key = event_type  # a str never equals the tuple keys below
            route = routes.get(key)
        else:
            try:
                key = (event_type, declared, tuple(hint.items()) if isinstance(hint, dict) else None)
                route = routes.get(key)
            except TypeError:  # an unhashable hint value: decided anew (it still fails closed inside)
                key = None
    if route is None:
        level = rank(policy.level_for(event_type))
        if declared in LEVELS and rank(declared) < level:
            level = rank(declared)  # a draft already at a lower level is never up-levelled
        route = [level, _screen(level, detector), None, None]
        if key is not None and len(routes) < _ROUTES_LIMIT:  # type: ignore[arg-type]
            routes[key] = route  # type: ignore[index]
    level, screen, merged, twins = route
    out["capture"] = LEVELS[level]
    if screen is not None:
        # The envelope's free-form attributes under the same rule as ``data`` (structure.py),
        # before `none` returns: the envelope always leaves. Identifiers keep their shape; only a
        # detector hit is replaced, by the same stand-in at every level below full, so the stream
        # still correlates.
        # ENVELOPE_TOKEN and ENVELOPE_IDS spelled out, each a membership test before any read (a
        # draft carries few of them): the loops over the two tuples cost more than these tests.
        # ``left`` counts the keys not accounted for, taking type, agent, capture and data as there
        # (checked below: a draft without data or type is checked whole; one without an agent is
        # never stamped); a containment test on every draft would cost ~1,300 instructions.
        left = len(out) - 4
        if "subject" in out:
            left -= 1
            value = out["subject"]
            if isinstance(value, str):
                out["subject"] = screen(value, True)
            elif value is not None:  # the stamper writes str() of it: screen what it will write
                out["subject"] = screen(str(value), True)
        if "session" in out:  # ``_screen_id`` without its call: nearly every draft has a session
            left -= 1
            value = out["session"]
            if isinstance(value, str):
                hit = detector.verdicts.get(value)
                if hit or (hit is None and detector.sensitive(value)):
                    out["session"] = opaque(value)
            elif value is not None:
                _screen_id(out, "session", detector)
        if "run" in out:
            left -= 1
            _screen_id(out, "run", detector)
        if "step" in out:
            left -= 1
            _screen_id(out, "step", detector)
    data = out.get("data")
    if screen is not None and (left or data is None or not event_type) and not _SCREENED_ALL(out):
        _screen_extensions(out, out.keys() - _ENVELOPE_SCREENED, screen)  # rare: `_` keys, cause, extensions
    if level == NONE or not isinstance(data, dict):
        out.pop("data", None)  # ceiling none: envelope only; a non-object data is not a payload
        return out
    if merged is None:
        merged = _merged(event_type, hint, data)
        if key is not None:
            route[2] = merged
    ann, plan = merged
    red = detector if level == REDACTED else None
    if red is not None:
        if twins is None:
            twins = _declares_twins(ann)
            if key is not None:
                route[3] = twins
        if twins:  # else ``_twins`` adds nothing: its copy of ``data`` equals ``data``
            data = _twins(data, "", ann, red.value)
    # An empty payload gates to a fresh empty one: no walk needed (a sixth of the hook events).
    data = _apply(data, plan, level, red.value if red is not None else None, level < FULL, screen) if data else {}
    if event_type == "attention.requested":
        if level >= REDACTED and red is not None:
            _redact_request(data, red)
        elif level < REDACTED:
            _degrade_request(data)
            data["prompt"] = synthesized_prompt(out.get("agent"), data.get("kind"), out.get("subject"))
    if event_type in VALUES_TYPES:
        _cap_answer_values(data, fields, level, red)
    if level < REDACTED and isinstance(structural, dict):
        for path, value in structural.items():
            # A mapping's structural value may still quote its vendor: it passes the screen too.
            _set_path(data, path, screen(value, False) if screen is not None and isinstance(value, str) else value)
    out["data"] = data
    return out


# What apply_cap spells out: a change to structure.py's tuples must change it too.
assert ENVELOPE_TOKEN == ("subject",) and ENVELOPE_IDS == ("session", "run", "step")


_ENVELOPE_SCREENED = frozenset({"aep", "id", "type", "subject", "time", "source", "agent", "session", "run",
                                "step", "seq", "epoch", "severity", "capture", "data"})
"""Envelope keys the capture processor screens above, or that the pipeline sets (id, time, source,
seq, epoch) or that are closed enums and names a mapping chooses (type, agent, severity)."""
_SCREENED_ALL = _ENVELOPE_SCREENED.issuperset


def _screen_extensions(out: dict[str, Any], keys: set[str], screen: Screen) -> None:
    """``cause``, ``traceparent`` and extension attributes (the stamper copies scalar ones into
    the envelope): an id-like token passes, anything else leaves as what the screen makes of it,
    like every string an ``x.*`` payload carries. Private ``_`` keys never leave (the stamper
    drops them)."""
    for key in keys:
        if isinstance(key, str) and key[:1] == "_":
            continue
        value = out[key]
        if isinstance(value, str):
            out[key] = screen(value, True)


def _screen_envelope(out: dict[str, Any], screen: Screen, detector: Redactor) -> None:
    """``apply_cap``'s envelope rule, for the hop (``downlevel``, ``honest_claim``): the subject as a
    token, the ids by the detector, ``cause``, ``traceparent`` and extension attributes as tokens.
    ``apply_cap`` spells the same out inline, on every draft's path."""
    value = out.get("subject")
    if value is not None:
        out["subject"] = screen(value if isinstance(value, str) else str(value), True)
    replaced = []
    for name in _HOP_IDS:
        if name in out:
            before = out[name]
            _screen_id(out, name, detector)
            if isinstance(before, str) and out[name] != before:
                replaced.append((before, out[name]))
    if isinstance(out.get("source"), str):
        out["source"] = _screen_source(out["source"], replaced, detector)
    if not _SCREENED_ALL(out):
        _screen_extensions(out, out.keys() - _ENVELOPE_SCREENED, screen)


_HOP_IDS = (*ENVELOPE_IDS, "id", "agent")
"""What a hop screens as identifiers: the emitter's ids, and ``id`` and ``agent``, which the
collector's own stamper and mappings set but another emitter chooses freely."""


def _screen_source(source: str, replaced: list[tuple[str, str]], detector: Redactor) -> str:
    """``source`` embeds the session (``aep://{host}/agent/{agent}/session/{session}``): every id
    the hop replaced is replaced in it too, percent-encoded or not, so it keeps naming the screened
    session. A source still holding content after that (a host or a path of another emitter's
    choosing) leaves as a URI made of its digest."""
    screened = source
    for raw, stand_in in replaced:
        screened = screened.replace(quote(raw, safe=""), stand_in).replace(raw, stand_in)
    if detector.sensitive(screened) or ("%" in screened and detector.sensitive(unquote(screened))):
        return "urn:aep:" + opaque(source)
    return screened


def _screen_id(out: dict[str, Any], name: str, detector: Redactor) -> None:
    """An envelope identifier keeps its shape; a detector hit in it leaves as the opaque digest."""
    value = out[name]
    if value is not None and not isinstance(value, str):
        value = out[name] = str(value)  # what the stamper writes for it: screened as that
    if isinstance(value, str):
        hit = detector.verdicts.get(value)  # the detector's memo first: ids repeat on every event
        if hit or (hit is None and detector.sensitive(value)):
            out[name] = opaque(value)


_SCREEN_MEMO_LIMIT = 4096
_SCREEN_VALUE_LIMIT = 256


@lru_cache(maxsize=64)  # per (level, detector): built once, not per event
def _screen(level: int, detector: Redactor) -> Screen | None:
    """What a string kept as structure becomes at ``level`` (None at ``full``: verbatim is allowed).

    Content found in a structural place (a detector hit anywhere, or a token-classed value that
    is not a token) becomes its opaque digest below ``redacted`` and passes the §9.4 pipeline at
    ``redacted``, exactly like any other redacted-gated text.
    """
    if level >= FULL:
        return None
    stand_in = detector.text if level == REDACTED else opaque
    # What each string became, by whether its path is token-classed (bounded like the detector's
    # own memo): the same tool names, models and ids come by on every event.
    memos: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    plain_run, shape_literal = PLAIN_RUN.fullmatch, SHAPE_LITERAL.search  # redact.PLAIN_ID in two passes

    def to_structure(value: str, token: bool) -> Any:
        memo = memos[token]
        out = memo.get(value)
        if out is None:
            if plain_run(value) is not None and shape_literal(value) is None and not detector.secret_values:
                out = value  # a token the detector clears (redact.PLAIN_ID): the usual new call id
            else:
                out = stand_in(value) if (token and not is_token(value)) or detector.sensitive(value) else value
            if len(memo) < _SCREEN_MEMO_LIMIT and len(value) <= _SCREEN_VALUE_LIMIT:
                memo[value] = out
        return out
    return to_structure


def _cap_answer_values(data: dict[str, Any], fields: Any, level: int, red: Redactor | None) -> None:
    answer = data.get("answer")
    if not isinstance(answer, dict) or not isinstance(answer.get("values"), dict):
        return
    values = answer["values"]
    if isinstance(fields, list):
        kept = cap_form_values(fields, values, LEVELS[level])
        if red is not None:
            by_id = {f.get("id"): f for f in fields if isinstance(f, dict)}
            text = {k: v for k, v in kept.items() if not _structural_value(by_id[k], v)}
            kept.update(red.value(text))
        answer["values"] = kept
    elif level < REDACTED:
        answer["values"] = hop_values(values)
    elif red is not None:
        answer["values"] = red.value(values)


# --- the hop ----------------------------------------------------------------------------------


_HOP_DETECTOR: list[Redactor] = []


def _hop_detector() -> Redactor:
    """One detector for every hop (its memo is what makes a screen cheap): no configured secrets,
    PII on, this user's home; a hop does not know any capture processor's configuration."""
    if not _HOP_DETECTOR:
        _HOP_DETECTOR.append(default_redactor())
    return _HOP_DETECTOR[0]


def downlevel(event: dict[str, Any], ceiling: str, annotations: Mapping[str, Annotations] | None = None,
              source: str | None = None) -> dict[str, Any]:
    """Down-level an event to ``ceiling`` at a fan-out hop (AEP-0001 §8.2); never mutates ``event``.

    ``source`` overrides the level the event claims (``honest_claim``: an event from another
    emitter whose content exceeds its claim is taken as ``full``). Beyond the spec's field pruning,
    what the hop keeps is screened as the emitter screens it below ``redacted``: a claim of
    ``redacted`` or ``full`` may have left free text or a secret in a metadata-annotated field
    (a vendor's prose in ``tool.denied.rule``), which the emitter at ``metadata`` would never have
    let out, so credential-named keys lose their values and content in a structural place,
    envelope ids included, leaves as its opaque digest.
    """
    target = rank(check_level(ceiling, "downlevel ceiling"))
    declared = event.get("capture", "metadata") if source is None else source
    source_rank = rank(declared) if declared in LEVELS else FULL  # an unreadable claim is the worst case
    out = copy.deepcopy(event)
    if target >= source_rank:
        return out  # never up-level (DL7); a redacted source passes a redacted ceiling (DL12)
    if target == REDACTED and source_rank == FULL:
        target = METADATA  # §8.2(e): a mechanical hop cannot mint the redacted provenance claim
    out["capture"] = LEVELS[target]
    detector = _hop_detector()
    screen = _screen(target, detector)
    if screen is not None:  # target is none or metadata here: the envelope leaves either way
        _screen_envelope(out, screen, detector)
    table = load_annotations() if annotations is None else annotations
    event_type = event.get("type")
    ann = table.get(event_type) if isinstance(event_type, str) else None
    if target == NONE or ann is None or not isinstance(event.get("data"), dict):
        out.pop("data", None)  # DL9; DL8: a type without annotations loses data wholesale
        return out
    if annotations is None:  # the emitter's token classes too: prose in a token field is content
        ann = _merge(event_type, None, event["data"])  # type: ignore[arg-type]  # a str when ann is set
    data = _prune(event["data"], "", ann, target, NONE, None, scrub=True, screen=screen)
    if target < REDACTED:
        if event_type == "attention.requested":
            _degrade_request(data)
            if "prompt" in data:
                data["prompt"] = synthesized_prompt(out.get("agent"), data.get("kind"), out.get("subject"))
        if event_type in VALUES_TYPES:
            _cap_answer_values(data, None, target, None)
    out["data"] = data
    return out


def honest_claim(event: Mapping[str, Any]) -> str:
    """The level an event from another emitter may be trusted at: its ``capture`` when its content
    keeps that claim, else ``full`` (the worst case), for ``downlevel``'s ``source``.

    An emitter's claim is what every hop trusts (AEP-0001 §8.2(a)), so a claim its own data breaks
    (an operator's free-text reason on a command that claims nothing, i.e. ``metadata``; a secret in
    a structural field; a ``redacted`` claim over text the §9.4 pipeline would still change) would
    carry that content to every subscriber whose ceiling is at or above the claim. Only for events
    the collector did not gate itself: its own pipeline's claims are honest by construction.
    """
    declared = event.get("capture", "metadata")
    if declared not in LEVELS:
        return "full"
    level = rank(declared)
    if level == FULL:
        return declared
    detector = _hop_detector()
    screen = _screen(level, detector)
    assert screen is not None  # below full
    envelope = {k: v for k, v in event.items() if k != "data"}
    _screen_envelope(envelope, screen, detector)
    if any(envelope[k] != event[k] for k in envelope):
        return "full"
    data = event.get("data")
    if level == NONE:
        return declared if data is None else "full"
    if not isinstance(data, dict):
        return declared if data is None else "full"
    event_type = event.get("type")
    ann = _merge(event_type if isinstance(event_type, str) else "", None, data)
    red = detector if level == REDACTED else None
    kept = _prune(data, "", ann, level, NONE, red.value if red is not None else None, scrub=True, screen=screen)
    if event_type == "attention.requested" and level < REDACTED and isinstance(data.get("prompt"), str):
        # A [metadata*] field: at metadata only the synthesized prompt is structure.
        if data["prompt"] != synthesized_prompt(event.get("agent"), data.get("kind"), event.get("subject")):
            return "full"
    return declared if kept == data else "full"
