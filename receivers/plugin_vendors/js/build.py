"""Generates the shipped plug-in files from the one template in ``src/``.

``python -m aep_collector.receivers.plugin_vendors.js.build`` writes them; ``--check`` exits 1 when a shipped
file differs from what the template gives (``tests/test_plugin_vendors_js.py`` runs that check).
Each shipped file stands alone, because each is copied to a different place by its host.

Template syntax, line-based: ``// @include NAME`` inserts ``src/NAME``; lines between
``// @only VARIANT`` and ``// @end`` are kept for that variant alone; ``@@KEY@@`` is replaced.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"

TARGETS: dict[str, tuple[str, str, dict[str, str]]] = {
    "opencode-plugin.js": ("bus-plugin.js", "opencode", {
        "TITLE": "OpenCode", "TITLE_SHORT": "OpenCode", "AGENT": "opencode", "FLUSH_EXTRA": ""}),
    "kilocode-plugin.js": ("bus-plugin.js", "kilocode", {
        "TITLE": "Kilo Code", "TITLE_SHORT": "Kilo", "AGENT": "kilocode", "FLUSH_EXTRA": ', "session.drained"'}),
    "pi-extension.js": ("pi-extension.js", "pi", {}),
}
"""Shipped file -> (template in ``src/``, variant = the vendor's agent, substitutions). ``PORT`` and
``PREFIX`` come from the vendor's declaration (``declared``)."""


def declared(agent: str) -> dict[str, str]:
    """The substitutions a vendor's declaration gives: its default port and environment prefix."""
    from aep_collector.receivers.plugin_vendors.install import env_prefix
    from aep_collector.receivers.registration import declaration

    return {"PORT": str(declaration(agent).port), "PREFIX": env_prefix(agent)}

_ONLY = re.compile(r"^\s*// @only (\S+)\s*$")
_END = re.compile(r"^\s*// @end\s*$")
_INCLUDE = re.compile(r"^\s*// @include (\S+)\s*$")
_KEY = re.compile(r"@@([A-Z_]+)@@")


def render(name: str) -> str:
    """The text of shipped file ``name`` as the template gives it."""
    template, variant, own = TARGETS[name]
    values = {**declared(variant), **own}
    out: list[str] = []
    keep: list[bool] = []
    for line in (SRC / template).read_text(encoding="utf-8").splitlines():
        if m := _ONLY.match(line):
            keep.append(m.group(1) == variant)
            continue
        if _END.match(line):
            keep.pop()
            continue
        if not all(keep):
            continue
        if m := _INCLUDE.match(line):
            out.extend((SRC / m.group(1)).read_text(encoding="utf-8").splitlines())
            continue
        out.append(line)
    if keep:
        raise ValueError(f"{template}: an '// @only' block is not closed")
    text = "\n".join(out) + "\n"

    def value(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise KeyError(f"{template}: no value for @@{m.group(1)}@@ in {name}")
        return values[m.group(1)]

    return _KEY.sub(value, text)


def stale() -> list[str]:
    """Shipped files that differ from the template's output."""
    return [n for n in TARGETS if not (HERE / n).exists() or (HERE / n).read_text(encoding="utf-8") != render(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report files that differ; exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for n in bad:
            print(f"{n} differs from its template; run python -m aep_collector.receivers.plugin_vendors.js.build", file=sys.stderr)
        return 1 if bad else 0
    for n in TARGETS:
        (HERE / n).write_text(render(n), encoding="utf-8")
        print(f"wrote {HERE / n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
