"""The wheel installs one top-level package, aep_collector, and every source folder is in it.

setuptools' auto-discovery does not follow the package-dir mapping that puts the checkout's
folders under aep_collector, so pyproject lists every package; a folder left out would install
without its modules and fail only for users.
"""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("pipeline", "receivers", "processors", "exporters")
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def installed_name(folder: Path) -> str:
    dotted = "aep_collector." + ".".join(folder.relative_to(ROOT).parts)
    return "aep_collector.api" if dotted == "aep_collector.pipeline.api" else dotted


def test_every_package_folder_is_listed_and_nothing_else():
    folders = {installed_name(init.parent) for top in TOPS for init in (ROOT / top).rglob("__init__.py")
               if "__pycache__" not in init.parts}
    assert set(CONFIG["packages"]) == folders


def test_the_mapping_puts_everything_under_one_top_level_name():
    assert CONFIG["package-dir"] == {"aep_collector": ".", "aep_collector.api": "pipeline/api"}
    assert {name.split(".")[0] for name in CONFIG["packages"]} == {"aep_collector"}


def test_no_module_imports_the_old_top_level_names():
    offenders = []
    for top in (*TOPS, "tests", "bench"):
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" in path.parts or ".venv" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in TOPS]
    assert offenders == []
