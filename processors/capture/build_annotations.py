"""Derive ``annotations.json`` (every payload type's ``x-aep-capture`` facts) from the type schemas.

Run by hand when the corpus changes::

    .venv/bin/python -m aep_collector.processors.capture.build_annotations ../shared/aep/schemas/types

The output maps ``type -> {dotted.path: level}``: nested properties are ``a.b``, array items
``a[]`` and their properties ``a[].b`` (AEP-0002 §5.1; the shape both reference runners use).
``$ref`` (local pointers and sibling files) and ``allOf``/``anyOf``/``oneOf``/``if``/``then``/``else``
branches are followed, so a field is found wherever the schema declares it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

LEVELS = ("none", "metadata", "redacted", "full")
OUTPUT = Path(__file__).with_name("annotations.json")
_SUFFIX = ".schema.json"
_TYPE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
_BRANCHES = ("allOf", "anyOf", "oneOf")
_CONDITIONALS = ("if", "then", "else")

Schema = dict[str, Any]


class _Resolver:
    """Follows ``$ref`` within one schema file and into sibling files of the same directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[str, Schema] = {}

    def document(self, name: str) -> Schema:
        if name not in self._files:
            self._files[name] = json.loads((self.directory / name).read_text(encoding="utf-8"))
        return self._files[name]

    def resolve(self, ref: str, base: str) -> tuple[Schema, str]:
        """The schema a ``$ref`` names, and the file it lives in (for refs inside it)."""
        target, _, pointer = ref.partition("#")
        name = base if not target else Path(target).name
        node: Any = self.document(name)
        for token in (t for t in pointer.split("/") if t):
            token = token.replace("~1", "/").replace("~0", "~")
            node = node[int(token)] if isinstance(node, list) else node[token]
        if not isinstance(node, dict):
            raise ValueError(f"$ref {ref!r} in {base} does not name a schema object")
        return node, name


def _merge(into: dict[str, str], path: str, level: str, where: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"{where}: x-aep-capture {level!r} at {path!r} is not one of {LEVELS}")
    # Two branches declaring one path differently: the stricter minimum is the only safe reading.
    if path not in into or LEVELS.index(level) > LEVELS.index(into[path]):
        into[path] = level


Part = tuple[Schema, str, frozenset[str]]


def _expand(node: Schema, base: str, resolver: _Resolver, seen: frozenset[str]) -> list[Part]:
    """The schema and every subschema that contributes properties at the same instance location.

    Each part carries the refs followed to reach it, so a recursive ``$ref`` stops instead of looping.
    """
    out: list[Part] = [(node, base, seen)]
    ref = node.get("$ref")
    if isinstance(ref, str):
        key = f"{base}{ref}" if ref.startswith("#") else ref
        if key not in seen:
            target, target_base = resolver.resolve(ref, base)
            out.extend(_expand(target, target_base, resolver, seen | {key}))
    for word in _BRANCHES:
        for sub in node.get(word) or []:
            if isinstance(sub, dict):
                out.extend(_expand(sub, base, resolver, seen))
    for word in _CONDITIONALS:
        sub = node.get(word)
        if isinstance(sub, dict):
            out.extend(_expand(sub, base, resolver, seen))
    return out


def _walk(node: Schema, base: str, path: str, resolver: _Resolver, into: dict[str, str],
          seen: frozenset[str], where: str) -> None:
    """Record the annotation at ``path`` (if any) and everything declared beneath it."""
    parts = _expand(node, base, resolver, seen)
    for part, _, _ in parts:
        level = part.get("x-aep-capture")
        if path and level is not None:
            _merge(into, path, level, where)
    for part, part_base, part_seen in parts:
        props = part.get("properties")
        if isinstance(props, dict):
            for key, sub in props.items():
                if isinstance(sub, dict):
                    child = f"{path}.{key}" if path else key
                    _walk(sub, part_base, child, resolver, into, part_seen, where)
        if not path:
            continue  # the payload root is an object; items there would have no name
        items = part.get("items")
        subs = [items] if isinstance(items, dict) else []
        subs += [i for i in part.get("prefixItems") or [] if isinstance(i, dict)]
        for sub in subs:
            _walk(sub, part_base, path + "[]", resolver, into, part_seen, where)


def build(schemas_dir: Path) -> dict[str, dict[str, str]]:
    """``{type: {dotted.path: level}}`` for every ``<type>.schema.json`` in ``schemas_dir``."""
    directory = Path(schemas_dir)
    resolver = _Resolver(directory)
    out: dict[str, dict[str, str]] = {}
    for file in sorted(directory.glob("*" + _SUFFIX)):
        type_name = file.name[: -len(_SUFFIX)]
        if not _TYPE.match(type_name):
            continue  # shared definition files (only $ref targets) are not payload types
        paths: dict[str, str] = {}
        _walk(resolver.document(file.name), file.name, "", resolver, paths, frozenset(), file.name)
        out[type_name] = dict(sorted(paths.items()))
    return out


def render(annotations: dict[str, dict[str, str]]) -> str:
    """The committed form: sorted, two-space indented, newline-terminated."""
    return json.dumps(annotations, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Regenerate ``annotations.json`` from the schema directory given as the only argument."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m aep_collector.processors.capture.build_annotations <schemas/types dir>", file=sys.stderr)
        return 2
    OUTPUT.write_text(render(build(Path(args[0]))), encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
