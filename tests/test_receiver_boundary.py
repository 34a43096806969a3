"""receivers/ imports nothing from processors/ but the vendor registry lookup (issue #14).

A receiver answers the vendor (what it gets back lives with the receiver); a mapping turns a
signal into drafts. The walk reads every module of receivers/ with ``ast`` and fails on any
other import from ``aep_collector.processors``. ``NOT_YET`` names the imports still to move (the
bus family's moment parsing); it only shrinks: an entry that is gone must be deleted here too.
The hook family (Claude Code and ``hook_vendors/``) is off it: keys both sides build are
``pipeline.control`` functions, and what a mapping alone draws (Claude Code's forms, the hook
names) is read through ``load_vendor``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECEIVERS = ROOT / "receivers"
ALLOWED = {("aep_collector.processors.mapping", "load_vendor")}
"""The vendor registry lookup: the one thing a receiver may take from processors/."""
NOT_YET: dict[str, set[tuple[str, str]]] = {
    "plugin_vendors/bus.py": {("aep_collector.processors.mapping", "plugin_bus")},
}


def _package(path: Path) -> list[str]:
    """The dotted package ``path`` is in (what a relative import is resolved against)."""
    return ["aep_collector", *path.relative_to(ROOT).parent.parts]


def processors_imports(path: Path) -> set[tuple[str, str]]:
    """(module, name) of every import in ``path`` that reaches into aep_collector.processors."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {(alias.name, "") for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolve against the file's own package
                package = _package(path)
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            found |= {(module, alias.name) for alias in node.names}
    hits = {(m, n) for m, n in found if m == "aep_collector.processors" or m.startswith("aep_collector.processors.")}
    hits |= {(m, n) for m, n in found if m == "aep_collector" and n == "processors"}
    return hits


def test_the_walk_sees_a_processors_import() -> None:
    # The walk itself: a module that imports a mapping is caught, relative or absolute.
    hits = processors_imports(RECEIVERS / "otlp" / "receiver.py")
    assert ("aep_collector.processors.mapping", "load_vendor") in hits


def test_receivers_import_from_processors_only_the_vendor_registry_lookup() -> None:
    seen: dict[str, set[tuple[str, str]]] = {}
    for path in sorted(RECEIVERS.rglob("*.py")):
        extra = processors_imports(path) - ALLOWED
        if extra:
            seen[path.relative_to(RECEIVERS).as_posix()] = extra
    unexpected = {f: sorted(v - NOT_YET.get(f, set())) for f, v in seen.items() if v - NOT_YET.get(f, set())}
    assert not unexpected, f"receivers/ must not import from processors/ (reply side lives here): {unexpected}"
    moved = {f: sorted(v - seen.get(f, set())) for f, v in NOT_YET.items() if v - seen.get(f, set())}
    assert not moved, f"these imports are gone: delete them from NOT_YET: {moved}"
