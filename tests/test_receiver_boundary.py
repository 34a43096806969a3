"""receivers/ imports nothing from processors/ but the vendor registry lookup (issue #14).

A receiver answers the vendor (what it gets back lives with the receiver); a mapping turns a
signal into drafts. The walk reads every module of receivers/ with ``ast`` and fails on any
other import from ``aep_collector.processors``, on a mapping module loaded by name, and on any
use of the registry lookup but one: ``receivers/registration.py`` reads a mapping's published
``HOOKS`` list (what a registration wires). Nothing else of a mapping runs on a receiver's data
path: what the mapping needs that only the receiver decodes (a form, a session by the vendor's
identity rule, the options a card offers) rides on the ``Signal`` as a typed field.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECEIVERS = ROOT / "receivers"
LOOKUP = ("aep_collector.processors.mapping", "load_vendor")
ALLOWED = {"registration.py": {LOOKUP}}
"""The vendor registry lookup: the one thing a receiver may take from processors/, in one module."""
CLAIM_RULE = {"nats/__init__.py": {("aep_collector.processors.capture.ceiling", "honest_claim")}}
"""The capture rule for events of other emitters, a pure function of the event: the NATS receiver
is where stamped events from other collectors enter, and judges their capture claim by that one
rule (no reply side, no mapping)."""
PUBLISHED = frozenset({"HOOKS"})
"""What the lookup's result may be read for: published data, never a function of the mapping."""


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


def lookup_reads(source: str) -> list[str]:
    """How each ``load_vendor`` reference in ``source`` is used: the attribute read off its call's
    result (``HOOKS``), or ``<line>: <what>`` for any other use (a bound module, a bare call)."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    uses: list[str] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == "load_vendor"):
            continue
        call = parents.get(node)
        read = parents.get(call) if isinstance(call, ast.Call) and call.func is node else None
        if isinstance(read, ast.Attribute) and read.value is call:
            uses.append(read.attr)
        else:
            uses.append(f"{node.lineno}: {type(call).__name__} of load_vendor")
    return uses


def loads_by_name(path: Path) -> list[str]:
    """Lines of ``path`` that import a module by a computed name (the registry lookup's back door)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name in ("import_module", "__import__"):
            hits.append(f"{path.relative_to(RECEIVERS).as_posix()}:{node.lineno}")
    return hits


def test_the_walk_sees_a_processors_import() -> None:
    # The walk itself: a module that imports a mapping is caught, relative or absolute.
    assert LOOKUP in processors_imports(RECEIVERS / "registration.py")


def test_the_walk_sees_a_mapping_function_read_through_the_lookup() -> None:
    # The checks themselves, on the shapes the data path used before issue #14.
    assert lookup_reads("x = load_vendor(a).HOOKS") == ["HOOKS"]
    assert lookup_reads("m = load_vendor(a)\nm.session_of(x)") == ["1: Call of load_vendor"]
    assert lookup_reads("load_vendor(a).canonical_hook(n)") == ["canonical_hook"]
    assert lookup_reads("f(load_vendor)") == ["1: Call of load_vendor"]


def test_receivers_import_from_processors_only_the_registry_lookup_in_registration() -> None:
    seen: dict[str, set[tuple[str, str]]] = {}
    for path in sorted(RECEIVERS.rglob("*.py")):
        where = path.relative_to(RECEIVERS).as_posix()
        extra = processors_imports(path) - ALLOWED.get(where, set()) - CLAIM_RULE.get(where, set())
        if extra:
            seen[where] = extra
    assert not seen, f"receivers/ must not import from processors/ (reply side lives here): {seen}"


def test_the_registry_lookup_reads_only_published_data() -> None:
    for where in ALLOWED:
        uses = lookup_reads((RECEIVERS / where).read_text(encoding="utf-8"))
        assert uses, f"{where}: the lookup is allowed here but not used (drop it from ALLOWED)"
        assert set(uses) <= PUBLISHED, f"{where}: a mapping's functions run on a receiver's path: {uses}"


def test_no_receiver_loads_a_module_by_name() -> None:
    hits = [hit for path in sorted(RECEIVERS.rglob("*.py")) for hit in loads_by_name(path)]
    assert not hits, f"receivers/ import a module by a computed name (use the registry lookup): {hits}"


def test_no_mapping_reads_untyped_receiver_context() -> None:
    # What a mapping reads of a receiver is a typed Signal field (hold, respond_via, mode, form, ...);
    # ``Signal.attrs`` is receiver-private. Any ``.attrs`` read under processors/ fails here.
    reads = []
    for path in sorted((ROOT / "processors").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "attrs":
                reads.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}")
    assert not reads, f"mappings read Signal.attrs (make it a typed Signal field): {reads}"
