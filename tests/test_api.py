"""The plug-in API exports what a plug-in needs, and its typed helpers build the right factories."""

from dataclasses import dataclass

import aep_collector.api as api
from aep_collector.pipeline.component import Kind
from aep_collector.pipeline.registry import build_registry


@dataclass
class _Cfg:
    n: int = 1


def test_every_exported_name_exists():
    missing = [name for name in api.__all__ if not hasattr(api, name)]
    assert missing == []


def test_each_helper_makes_a_factory_of_its_kind_that_registers_and_creates():
    made = []
    rf = api.receiver_factory("t_recv", _Cfg, lambda s, c, nxt: made.append(("r", c.n, nxt)) or object())
    pf = api.processor_factory("t_proc", _Cfg, lambda s, c: (lambda batch: batch))
    ef = api.exporter_factory("t_exp", _Cfg, lambda s, c: made.append(("e", c.n)) or object(),
                              description="d", stability="alpha")
    assert (rf.kind, pf.kind, ef.kind) == (Kind.RECEIVER, Kind.PROCESSOR, Kind.EXPORTER)
    assert (ef.description, ef.stability) == ("d", "alpha")
    registry, _ = build_registry(load_plugins=False)
    for f in (rf, pf, ef):
        registry.register(f, origin="test")
        assert registry.get(f.kind, f.type) is f
    rf.create(api.CreateSettings("t_recv"), rf.default_config(), "next")
    ef.create(api.CreateSettings("t_exp"), _Cfg(n=3))
    assert made == [("r", 1, "next"), ("e", 3)]
    assert pf.create(api.CreateSettings("t_proc"), _Cfg())([1, 2]) == [1, 2]
