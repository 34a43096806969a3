"""receivers/ imports nothing from processors/ but the vendor registry lookup (issue #14).

A receiver answers the vendor (what it gets back lives with the receiver); a mapping turns a
signal into drafts. The walk reads every module of receivers/ with ``ast`` and fails on any
other import from ``aep_collector.processors``. Keys both sides build are ``pipeline.control``
functions; what a mapping alone knows (Claude Code's forms, the hook names, the OpenCode family's
identity rule and cards) is read through ``load_vendor``; decoding what a vendor sent (the
OpenCode family's ``bus_moments``) and every reply live in ``receivers/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECEIVERS = ROOT / "receivers"
ALLOWED = {("aep_collector.processors.mapping", "load_vendor")}
"""The vendor registry lookup: the one thing a receiver may take from processors/."""


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
    assert not seen, f"receivers/ must not import from processors/ (reply side lives here): {seen}"


def test_no_mapping_reads_untyped_receiver_context() -> None:
    # What a mapping reads of a receiver is a typed Signal field (hold, respond_via, mode, deltas, ...);
    # ``Signal.attrs`` is receiver-private. Any ``.attrs`` read under processors/ fails here.
    reads = []
    for path in sorted((ROOT / "processors").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "attrs":
                reads.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}")
    assert not reads, f"mappings read Signal.attrs (make it a typed Signal field): {reads}"
