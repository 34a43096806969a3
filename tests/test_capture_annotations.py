"""annotations.json is derived data: it must equal what the builder makes from the corpus schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aep_collector.processors.capture.build_annotations import OUTPUT, build, render


def test_committed_annotations_match_the_corpus_schemas(aep_dir: Path) -> None:
    schemas = aep_dir / "schemas" / "types"
    assert schemas.is_dir(), f"corpus schemas not found at {schemas}; set AEP_CONFORMANCE_DIR"
    assert OUTPUT.read_text(encoding="utf-8") == render(build(schemas)), (
        "processors/capture/annotations.json drifted from the schemas: rerun "
        "`python -m aep_collector.processors.capture.build_annotations <schemas/types>`"
    )


def test_every_schema_file_becomes_a_type(aep_dir: Path) -> None:
    files = {p.name.removesuffix(".schema.json") for p in (aep_dir / "schemas" / "types").glob("*.schema.json")}
    assert set(json.loads(OUTPUT.read_text(encoding="utf-8"))) == files


@pytest.mark.parametrize(
    ("event_type", "path", "level"),
    [
        ("attention.answered", "answer.text", "redacted"),
        ("attention.answered", "answer.values", "metadata"),
        ("tool.failed", "error.message", "redacted"),
        ("tool.failed", "error.type", "metadata"),
        ("control.rejected", "detail", "redacted"),
        ("attention.requested", "context", "full"),
        ("attention.requested", "fields[].choices[].label", "metadata"),
        ("resource.retrieval.returned", "documents[].content", "full"),
        ("resource.citation.recorded", "citations[].source.uri", "redacted"),
        ("tool.requested", "args", "full"),
        ("tool.requested", "args_redacted", "redacted"),
    ],
)
def test_digest_examples_are_in_the_table(event_type: str, path: str, level: str) -> None:
    assert json.loads(OUTPUT.read_text(encoding="utf-8"))[event_type][path] == level


def _write(directory: Path, name: str, schema: dict) -> None:
    (directory / name).write_text(json.dumps(schema), encoding="utf-8")


def test_builder_follows_refs_defs_branches_and_arrays(tmp_path: Path) -> None:
    _write(tmp_path, "_common.schema.json", {"$defs": {"error_info": {"type": "object", "properties": {
        "type": {"type": "string", "x-aep-capture": "metadata"},
        "message": {"type": "string", "x-aep-capture": "redacted"}}}}})
    _write(tmp_path, "demo.thing.schema.json", {
        "$defs": {"doc": {"type": "object", "x-aep-capture": "metadata", "properties": {
            "content": {"type": "string", "x-aep-capture": "full"}}}},
        "properties": {
            "error": {"$ref": "_common.schema.json#/$defs/error_info", "x-aep-capture": "metadata"},
            "docs": {"type": "array", "items": {"$ref": "#/$defs/doc"}, "x-aep-capture": "metadata"},
            "grid": {"type": "array", "items": {"type": "array", "items": {"properties": {
                "cell": {"x-aep-capture": "redacted"}}}}},
        },
        "allOf": [{"properties": {"note": {"x-aep-capture": "redacted"}}}],
        "oneOf": [{"properties": {"note": {"x-aep-capture": "full"}}}],
    })
    assert build(tmp_path) == {"demo.thing": {
        "docs": "metadata", "docs[]": "metadata", "docs[].content": "full",
        "error": "metadata", "error.message": "redacted", "error.type": "metadata",
        "grid[][].cell": "redacted",
        "note": "full",  # two branches disagree: the stricter minimum wins
    }}


def test_builder_survives_a_recursive_ref(tmp_path: Path) -> None:
    _write(tmp_path, "demo.tree.schema.json", {
        "$defs": {"node": {"properties": {"label": {"x-aep-capture": "redacted"},
                                          "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "properties": {"root": {"$ref": "#/$defs/node"}},
    })
    assert build(tmp_path)["demo.tree"]["root.label"] == "redacted"


def test_builder_rejects_an_unknown_level(tmp_path: Path) -> None:
    _write(tmp_path, "demo.bad.schema.json", {"properties": {"x": {"x-aep-capture": "secretish"}}})
    with pytest.raises(ValueError, match="secretish"):
        build(tmp_path)
