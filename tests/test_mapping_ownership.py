"""The mapping processor hands downstream only lists and drafts it owns.

A plug-in mapping may return the same list (or the same draft) on every call; a later stage that
extends its batch in place, or sets a key on a draft (``runs`` sets ``run``), must then change
neither the plug-in's module state nor another batch.
"""

from __future__ import annotations

from typing import Any

from aep_collector.pipeline.model import Signal
from aep_collector.processors.mapping import MappingConfig, MappingProcessor
from aep_collector.processors.runs import RunsProcessor

from tests import shared_list_mapping as plugin
from tests.test_mapping_fastpath import workload


def processor() -> MappingProcessor:
    return MappingProcessor(MappingConfig(extra_vendors={plugin.AGENT: "tests.shared_list_mapping"}))


def signal(name: str) -> Signal:
    return Signal(plugin.AGENT, name, {})


def test_a_batch_extended_downstream_does_not_grow_the_plugins_empty_list() -> None:
    mapping = processor()
    first: list[Any] = mapping([signal("Other")])
    first.append({"type": "progress.note", "session": "s1", "data": {}})  # a stage adding an event in place
    assert mapping([signal("Other")]) == [] and plugin.NOTHING == []


def test_a_draft_changed_downstream_does_not_reach_the_next_batch() -> None:
    mapping, runs = processor(), RunsProcessor()
    runs([{"type": "run.started", "agent": plugin.AGENT, "session": "s1", "run": "r1", "data": {}}])
    first = runs(mapping([signal("Ping")]))
    assert first[0]["run"] == "r1"  # runs set the open run on the draft it was handed
    runs([{"type": "run.finished", "agent": plugin.AGENT, "session": "s1", "run": "r1", "data": {}}])
    second = mapping([signal("Ping")])
    assert "run" not in second[0] and second[0] is not first[0]
    assert plugin.PING == [{"type": "progress.note", "session": "s1", "data": {"note": "ping"}}]  # untouched


def test_two_signals_of_one_batch_get_two_lists_worth_of_drafts() -> None:
    batch = processor()([signal("Ping"), signal("Ping")])
    assert len(batch) == 2 and batch[0] is not batch[1]  # two events, not one event twice


def test_the_packages_own_mappings_return_new_lists_of_new_drafts_every_call() -> None:
    """The processor takes a built-in mapping's list as it is: each call's must be new, its drafts
    and their ``data`` too (the corpus hook inputs of the hook vendors, each mapped twice)."""
    seen: dict[int, Any] = {}  # id -> the object, kept alive so no id is reused
    mapping = MappingProcessor()
    for signal in workload(rounds=2):
        route = mapping._routes.get(signal.agent) or mapping._route(signal.agent)
        assert not route[3]
        drafts = route[0](signal, route[1])
        for obj in [drafts, *drafts, *(d["data"] for d in drafts if isinstance(d.get("data"), dict))]:
            assert id(obj) not in seen, f"{signal.agent} {signal.name}: an object handed back again: {obj!r}"
            seen[id(obj)] = obj
