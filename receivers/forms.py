"""AEP-0006 form answers: validate ``answer.values`` against the request's field specs.

A failing answer is nacked ``invalid`` and the request stays pending (the router does that with
the message returned here). Legacy ``{option}``/``{text}`` answers are accepted for a one-field
form, as an operator replying to a single question naturally would; an option must name one of
its choices (free words go as text).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def _choice_ids(spec: dict[str, Any]) -> list[str]:
    return [str(c.get("id")) for c in spec.get("choices") or [] if isinstance(c, dict)]


def _legacy_value(answer: dict[str, Any], spec: dict[str, Any]) -> Any:
    option, text = answer.get("option"), answer.get("text")
    if spec.get("type") == "select":
        ids = _choice_ids(spec)
        word = option if isinstance(option, str) else text if isinstance(text, str) else None
        if word is None:
            return None
        w = word.strip()
        if w in ids:
            return w
        for c in spec.get("choices") or []:
            if str(c.get("label", "")).strip().lower() == w.lower() or str(c.get("id")).lower() == w.lower():
                return str(c["id"])
        return w  # free text: only valid where the select allows ``other``
    if spec.get("type") == "boolean" and isinstance(text, str):
        return {"true": True, "yes": True, "false": False, "no": False}.get(text.strip().lower(), text)
    if spec.get("type") == "number" and isinstance(text, str):
        try:
            n = float(text.strip())
        except ValueError:
            return text
        if not math.isfinite(n):  # "1e999", "nan": no JSON number; left as text, refused as one
            return text
        return int(n) if n.is_integer() else n
    return text if text is not None else option


def form_values(answer: dict[str, Any], fields: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer as ``{field id: value}`` (legacy one-field answers converted)."""
    values = answer.get("values")
    if isinstance(values, dict):
        return dict(values)
    if len(fields) == 1:
        value = _legacy_value(answer, fields[0])
        return {} if value is None else {str(fields[0]["id"]): value}
    return {}


def field_problem(spec: dict[str, Any], value: Any) -> str | None:
    fid, kind = spec.get("id"), spec.get("type")
    if kind == "select":
        ids = _choice_ids(spec)
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not spec.get("multi"):
            return f"field {fid!r} takes one choice, not a list"
        for item in items:
            if not isinstance(item, str):
                return f"field {fid!r} takes choice ids (strings)"
            if item not in ids and not spec.get("other"):
                # Not quoted: what an operator typed is content, and this detail is logged.
                return f"field {fid!r} takes only its choices {ids}"
        return None
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"field {fid!r} takes a number"
        if isinstance(spec.get("min"), (int, float)) and value < spec["min"]:
            return f"field {fid!r} must be at least {spec['min']}"
        if isinstance(spec.get("max"), (int, float)) and value > spec["max"]:
            return f"field {fid!r} must be at most {spec['max']}"
        return None
    if kind == "boolean":
        return None if isinstance(value, bool) else f"field {fid!r} takes true or false"
    if kind == "string":
        return None if isinstance(value, str) else f"field {fid!r} takes a string"
    return None


def _option_problem(option: Any, spec: dict[str, Any]) -> str | None:
    """Why ``option`` cannot answer a one-field form: an option names one of the field's choices
    (by id, or by label as AEP-0008 reads text); words for a string field or an "other" go as text."""
    if spec.get("type") != "select":
        return f"field {spec.get('id')!r} is answered with text or values, not an option"
    ids = _choice_ids(spec)
    labels = [str(c.get("label", "")).strip().lower() for c in spec.get("choices") or [] if isinstance(c, dict)]
    word = option.strip().lower() if isinstance(option, str) else None
    if word is None or (word not in [i.lower() for i in ids] and word not in labels):
        return f"option must be one of the choices {ids} of field {spec.get('id')!r} (other answers go as text)"
    return None


def form_validator(fields: list[dict[str, Any]], legacy: bool = False) -> Callable[[dict[str, Any]], str | None]:
    """A validator for the control router: ``None`` if the answer is acceptable, else why not."""
    specs = {str(f.get("id")): f for f in fields if isinstance(f, dict)}

    def validate(answer: dict[str, Any]) -> str | None:
        if "values" in answer:
            if not isinstance(answer["values"], dict):
                return "answer.values must be an object"
        elif not (legacy and ("option" in answer or "text" in answer)):
            return "this form takes answer.values" + (" (or option/text for its one field)" if legacy else "")
        elif answer.get("option") is not None:
            problem = _option_problem(answer["option"], fields[0])
            if problem:
                return problem
        values = form_values(answer, fields)
        for key in values:
            if key not in specs:
                return f"unknown field {key!r} (fields: {sorted(specs)})"
        for fid, spec in specs.items():
            value = values.get(fid)
            if value is None or value == "" or value == []:
                if spec.get("required"):
                    return f"required field {fid!r} is missing"
                continue
            problem = field_problem(spec, value)
            if problem:
                return problem
        return None

    return validate
