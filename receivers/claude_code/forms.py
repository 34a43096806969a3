"""Claude Code's two questions as AEP-0006 forms (fixture ``mappings/claude-code.json``).

An AskUserQuestion ``PermissionRequest`` (1-4 questions) and an MCP ``Elicitation`` (a requested
schema) are decoded here, once, into the ``Form`` the receiver puts on the ``Signal``: the mapping
draws the card from it, the receiver checks an operator's answer against its fields and builds
Claude Code's reply from them. ``content_ok`` false gives the structural form (labels are ids).
"""

from __future__ import annotations

from typing import Any

from aep_collector.pipeline.model import Form
from aep_collector.pipeline.payload import get_dict, get_str

AGENT = "claude-code"
ASK_USER_QUESTION = "AskUserQuestion"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def ask_user_question_form(tool_input: Any, content_ok: bool) -> dict[str, Any]:
    """AskUserQuestion input -> ``{prompt, fields}``; labels are ids when ``content_ok`` is false."""
    questions = tool_input.get("questions") if isinstance(tool_input, dict) else None
    fields: list[dict[str, Any]] = []
    for i, q in enumerate(questions if isinstance(questions, list) else [], start=1):
        if not isinstance(q, dict):
            continue
        fid = str(i)  # fixture: 1-based index ids keep answer.values structural at any ceiling
        header, text = get_str(q, "header"), get_str(q, "question") or ""
        choices = []
        options = q.get("options")
        for j, opt in enumerate(options if isinstance(options, list) else [], start=1):
            label = get_str(opt, "label") if isinstance(opt, dict) else opt if isinstance(opt, str) else None
            choices.append({"id": str(j), "label": (label or str(j)) if content_ok else str(j)})
        spec: dict[str, Any] = {
            "id": fid,
            "type": "select",
            "label": (f"{header}: {text}" if header else text or fid) if content_ok else fid,
            "required": True,
            "other": True,  # Claude Code always offers a free-text "Other" answer
            "choices": choices,
        }
        if q.get("multiSelect") is True:  # fixture: `multi` only when true, key omitted otherwise
            spec["multi"] = True
        fields.append(spec)
    # Fixture: the same structural prompt at both ceilings.
    return {"prompt": f"{AGENT} asks {_plural(len(fields), 'question')}", "fields": fields}


def _schema_of(payload: Any) -> dict[str, Any]:
    # The fixture spells the MCP name (`requestedSchema`); the hook payload sends `requested_schema`.
    return get_dict(payload, "requested_schema") or get_dict(payload, "requestedSchema")


def _enum_choices(prop: dict[str, Any], content_ok: bool) -> list[dict[str, str]] | None:
    """Closed choices of an MCP enum property (``enum`` + ``enumNames``, or titled consts: ``oneOf``
    on a single select, ``anyOf`` on a multi-select's ``items``)."""
    if isinstance(prop.get("enum"), list):
        names = prop.get("enumNames") if isinstance(prop.get("enumNames"), list) else []
        out = []
        for i, value in enumerate(prop["enum"]):
            name = names[i] if i < len(names) and isinstance(names[i], str) else None
            out.append({"id": str(value), "label": (name or str(value)) if content_ok else str(value)})
        return out
    titled = prop.get("oneOf") if isinstance(prop.get("oneOf"), list) else prop.get("anyOf")
    if isinstance(titled, list):
        out = []
        for item in titled:
            if isinstance(item, dict) and "const" in item:
                title = get_str(item, "title")
                out.append({"id": str(item["const"]),
                            "label": (title or str(item["const"])) if content_ok else str(item["const"])})
        return out or None
    return None


def elicitation_form(payload: Any, content_ok: bool) -> dict[str, Any]:
    """Elicitation payload -> ``{prompt, fields}`` from the MCP requested schema (property order kept)."""
    schema = _schema_of(payload)
    props = get_dict(schema, "properties")
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    fields: list[dict[str, Any]] = []
    for key, prop in props.items():
        prop = prop if isinstance(prop, dict) else {}
        spec: dict[str, Any] = {"id": key}
        items = get_dict(prop, "items")
        choices = _enum_choices(prop, content_ok)
        if choices is None and prop.get("type") == "array":
            choices = _enum_choices(items, content_ok)
            if choices is not None:
                spec["multi"] = True
        if choices is not None:
            spec["type"] = "select"  # fixture: MCP enums are closed, so no `other`
            spec["choices"] = choices
        elif prop.get("type") in ("integer", "number"):
            spec["type"] = "number"
            for src, dst in (("minimum", "min"), ("maximum", "max")):
                if isinstance(prop.get(src), (int, float)) and not isinstance(prop.get(src), bool):
                    spec[dst] = prop[src]
        elif prop.get("type") == "boolean":
            spec["type"] = "boolean"
        else:
            spec["type"] = "string"
        title = get_str(prop, "title")
        spec["label"] = (title or key) if content_ok else key
        spec["required"] = key in required  # fixture: the key is always present
        fields.append(spec)
    message = get_str(payload, "message")
    structural = f"{AGENT} requests input ({_plural(len(fields), 'field')})"
    return {"prompt": message if content_ok and message else structural, "fields": fields}


def schema_properties(payload: Any) -> dict[str, dict[str, Any]]:
    """An Elicitation's requested schema properties, by field id (its form's fields carry the same ids)."""
    props = get_dict(_schema_of(payload), "properties")
    return {key: prop for key, prop in props.items() if isinstance(prop, dict)}


def _bound(prop: dict[str, Any], key: str) -> int | float | None:
    value = prop.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def schema_problem(fid: str, prop: dict[str, Any], value: Any) -> str | None:
    """What the MCP server would refuse in the answer ``value`` for property ``prop`` that the form
    field cannot say (AEP-0006 has no integer type and no lengths): a fraction for an integer, a
    string's length, how many choices a multi-select takes. None when it would take it."""
    if prop.get("type") == "integer" and isinstance(value, float) and not value.is_integer():
        return f"field {fid!r} takes a whole number"
    if prop.get("type") == "array":
        count, what = len(value) if isinstance(value, list) else 1, "choices"
        low, high = _bound(prop, "minItems"), _bound(prop, "maxItems")
    elif isinstance(value, str):
        count, what = len(value), "characters"
        low, high = _bound(prop, "minLength"), _bound(prop, "maxLength")
    else:
        return None
    if low is not None and count < low:
        return f"field {fid!r} takes at least {low:g} {what}"
    if high is not None and count > high:
        return f"field {fid!r} takes at most {high:g} {what}"
    return None


def form_of(name: str, payload: dict[str, Any]) -> Form | None:
    """The form a hook asks (an AskUserQuestion PermissionRequest, an Elicitation), or None."""
    if name == "PermissionRequest" and get_str(payload, "tool_name") == ASK_USER_QUESTION:
        tool_input = payload.get("tool_input")
        full, bare = ask_user_question_form(tool_input, True), ask_user_question_form(tool_input, False)
    elif name == "Elicitation":
        full, bare = elicitation_form(payload, True), elicitation_form(payload, False)
    else:
        return None
    return Form(full["prompt"], full["fields"], bare["prompt"])
