"""The README's promises: its two fresh-machine commands, and its code examples run as written."""

from __future__ import annotations

import re

from tests.helpers import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_first_lines_give_the_two_commands():
    head = README.split("\n## ", 1)[0]
    assert "# install and run the collector on the default config" in head
    assert "# install the test extras and run the tests" in head
    assert ".venv/bin/pip install . && .venv/bin/aep-collector\n" in head and "pytest" in head
    ci = (ROOT / ".ci" / "run").read_text()
    assert "# install the test extras and run the tests" in ci  # CI runs exactly that line


def test_the_processor_example_runs():
    section = README.split("## Testing one processor in isolation", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - our own documentation


def test_the_plugin_examples_run_on_the_api_alone():
    # Issue #14: a plug-in imports only the typed API, and the README's examples say so by running.
    section = README.split("## Writing a plug-in component", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 2, "the exporter and the vendor example"
    for code in blocks:
        imports = re.findall(r"^from (aep_collector[\w.]*) import", code, re.M)
        assert imports and set(imports) == {"aep_collector.api"}, imports
        scope: dict = {}
        exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - our own documentation
        assert scope["FACTORY"].type in ("my_exporter", "quill")


def test_every_receiver_type_is_documented():
    from aep_collector.pipeline.component import Kind
    from aep_collector.pipeline.registry import build_registry

    registry, _ = build_registry(load_plugins=False)
    for kind in Kind:
        for t in registry.types(kind):
            assert f"`{t}`" in README, f"{kind.value} {t} is not in the README"
