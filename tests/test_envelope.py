"""Envelope stamping: ids, time, source, seq, epoch, scope rules, identifiers."""

from __future__ import annotations

import json
import re
import threading
from datetime import datetime

import pytest
from aep_collector.pipeline.envelope import EpochStore, Stamper, StampError, Ulid, rfc3339_ms, source_uri

ULID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")


def stamper(tmp_path, host="Host.Example"):
    return Stamper(tmp_path, host)


def test_session_event_gets_full_envelope(tmp_path):
    ev = stamper(tmp_path).stamp({"type": "tool.requested", "agent": "claude-code", "session": "s1",
                                  "run": "r1", "subject": "Bash", "data": {"tool": {"name": "Bash"}}})
    assert ev["aep"] == "0.1" and ULID.match(ev["id"])
    assert ev["source"] == "aep://host.example/agent/claude-code/session/s1"
    assert ev["seq"] == 0 and ev["epoch"] == 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ev["time"])
    datetime.fromisoformat(ev["time"])
    assert ev["run"] == "r1" and ev["subject"] == "Bash"
    assert None not in ev.values()


def test_seq_is_per_session_and_monotonic(tmp_path):
    s = stamper(tmp_path)
    seqs = [s.stamp({"type": "run.started", "agent": "a", "session": sid})["seq"]
            for sid in ("x", "x", "y", "x", "y")]
    assert seqs == [0, 1, 0, 2, 1]


def test_agent_scoped_events_carry_no_session_run_step_seq(tmp_path):
    ev = stamper(tmp_path).stamp({"type": "agent.idle", "agent": "claude-code", "session": "s",
                                  "run": "r", "step": "1", "data": {}})
    for key in ("session", "run", "step", "seq", "epoch"):
        assert key not in ev
    assert ev["source"] == "aep://host.example/agent/claude-code"


def test_commands_carry_session_but_no_seq(tmp_path):
    ev = stamper(tmp_path).stamp({"type": "attention.routed", "agent": "x", "session": "s", "data": {}})
    assert ev["session"] == "s" and "seq" not in ev


def test_absent_optionals_are_omitted_and_internal_hints_dropped(tmp_path):
    ev = stamper(tmp_path).stamp({"type": "run.finished", "agent": "a", "session": "s", "run": None,
                                  "subject": "", "_hold": "h", "_capture": {}, "data": {}})
    assert "run" not in ev and "subject" not in ev
    assert not any(k.startswith("_") for k in ev)


def test_missing_session_goes_to_unknown_lane(tmp_path):
    ev = stamper(tmp_path).stamp({"type": "session.started", "agent": "vscode", "data": {}})
    assert ev["session"] == "unknown" and ev["source"].endswith("/session/unknown")


@pytest.mark.parametrize("session", ["../../etc/passwd", "a b/c", "%2F", "ü", "x?y#z", "\x00"])
def test_unsafe_session_ids_are_kept_verbatim_but_encoded_in_source(tmp_path, session):
    ev = stamper(tmp_path).stamp({"type": "run.started", "agent": "a", "session": session})
    assert ev["session"] == session
    tail = ev["source"].rsplit("/session/", 1)[1]
    assert "/" not in tail and "?" not in tail and "#" not in tail and " " not in tail


def test_bad_type_is_refused(tmp_path):
    with pytest.raises(StampError):
        stamper(tmp_path).stamp({"type": "x.vendor.verb", "agent": "a", "session": "s"})
    with pytest.raises(StampError):
        stamper(tmp_path).stamp({"type": "run.started", "session": "s"})


def test_already_stamped_event_passes_through_byte_identical(tmp_path):
    s = stamper(tmp_path)
    ev = s.stamp({"type": "control.accepted", "agent": "a", "session": "s", "cause": "c1", "data": {}})
    again = s.stamp(dict(ev))
    assert json.dumps(again) == json.dumps(ev)


def test_epoch_is_persisted_and_bumped_per_start(tmp_path):
    assert EpochStore(tmp_path).epoch("claude-code") == 0
    assert EpochStore(tmp_path).epoch("claude-code") == 1
    third = EpochStore(tmp_path)
    assert third.epoch("claude-code") == 2
    assert third.epoch("claude-code") == 2  # once per start, not per event
    assert third.epoch("codex") == 2  # one epoch per process, whatever the agent
    assert EpochStore(tmp_path).epoch("codex") == 3


def test_epochs_continue_above_the_per_agent_ones_older_versions_kept(tmp_path):
    (tmp_path / "epochs").mkdir()
    (tmp_path / "epochs" / "codex.json").write_text(json.dumps({"agent": "codex", "epoch": 41}))
    (tmp_path / "epochs" / "qwen-code.json").write_text(json.dumps({"agent": "qwen-code", "epoch": 7}))
    assert EpochStore(tmp_path).epoch("qwen-code") == 42


def test_a_corrupt_epoch_file_seeds_the_epoch_from_the_clock(tmp_path):
    assert EpochStore(tmp_path).epoch("a") == 0
    (tmp_path / "epochs" / "@generation.json").write_text("{not json")
    seeded = EpochStore(tmp_path).epoch("a")  # restarts safely; never crashes, never reuses 0
    assert seeded > 10**9  # milliseconds since 2026
    assert EpochStore(tmp_path).epoch("a") == seeded + 1


def test_a_damaged_per_agent_file_of_an_older_version_seeds_the_epoch_from_the_clock(tmp_path):
    """The first start after the upgrade: a damaged agent file hid how far that agent had gone, so
    the highest readable one is no floor (codex may have been at 40 when qwen-code was at 7)."""
    (tmp_path / "epochs").mkdir()
    (tmp_path / "epochs" / "codex.json").write_text('{"agent": "codex", "ep')
    (tmp_path / "epochs" / "qwen-code.json").write_text(json.dumps({"agent": "qwen-code", "epoch": 7}))
    assert EpochStore(tmp_path).epoch("codex") > 10**9


def test_an_epoch_file_holding_an_infinite_number_is_damage_not_a_crash(tmp_path):
    """JSON's 1e999 reads as inf, which int() refuses with OverflowError."""
    (tmp_path / "epochs").mkdir()
    (tmp_path / "epochs" / "@generation.json").write_text('{"epoch": 1e999}')
    store = EpochStore(tmp_path)
    store.check()
    assert store.epoch("a") > 10**9


def test_concurrent_starts_take_distinct_epochs(tmp_path):
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(EpochStore(tmp_path).epoch("a")))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(8))


def test_ulids_are_unique_and_sorted_within_a_millisecond():
    gen = Ulid()
    ids = [gen.new(1_700_000_000_000) for _ in range(1000)]
    assert len(set(ids)) == 1000 and ids == sorted(ids)


def test_ulids_stay_sorted_across_milliseconds_clock_steps_back_and_carries():
    """The stamper's fast path (``new_unlocked``): a new millisecond, the same one, a clock stepping
    back, and an increment carrying out of the last 4 characters all keep ids strictly increasing."""
    gen = Ulid()
    ms, ids = 1_700_000_000_000, []
    for step in [0, 0, 1, 0, -5, -5, 1024, 0, -2000, 3, 1 << 20] * 30:
        ms += step
        ids.append(gen.new_unlocked(ms))
        if len(ids) % 7 == 0:  # next increment carries: the last id's final 20 random bits all ones
            gen._last_id, gen._low = gen._last_id[:22] + "ZZZZ", -1
            ids[-1] = gen._last_id
    assert ids == sorted(ids) and len(set(ids)) == len(ids) and all(len(i) == 26 for i in ids)


def test_rfc3339_ms():
    assert rfc3339_ms(0.5) == "1970-01-01T00:00:00.500Z"


def test_source_uri_encodes_agent_and_session():
    assert source_uri("h", "a/b", "s s") == "aep://h/agent/a%2Fb/session/s%20s"


def test_seq_state_is_bounded_and_never_goes_backwards(tmp_path):
    s = Stamper(tmp_path, "h", max_sessions=2)
    seen: dict[str, list[int]] = {}
    for sid in ["a", "a", "b", "c", "a", "b", "d", "a"]:
        seen.setdefault(sid, []).append(s.stamp({"type": "run.started", "agent": "x", "session": sid})["seq"])
    assert s.sessions == 2
    for seqs in seen.values():
        assert seqs == sorted(set(seqs))  # strictly increasing per session, gaps allowed


def test_session_ended_releases_the_counter_and_late_events_resume_above(tmp_path):
    s = Stamper(tmp_path, "h")
    first = [s.stamp({"type": t, "agent": "x", "session": "z"})["seq"]
             for t in ("run.started", "session.ended")]
    assert s.sessions == 0
    late = s.stamp({"type": "tool.completed", "agent": "x", "session": "z", "data": {}})["seq"]
    assert late > max(first)


def test_new_sessions_start_at_zero_even_after_evictions(tmp_path):
    s = Stamper(tmp_path, "h", max_sessions=1)
    for sid in ("a", "b", "c"):
        s.stamp({"type": "run.started", "agent": "x", "session": sid})
    assert s.stamp({"type": "run.started", "agent": "x", "session": "fresh"})["seq"] == 0
    assert s.stamp({"type": "run.started", "agent": "x", "session": "a"})["seq"] > 0  # evicted, resumes above


def test_ulid_encoding_matches_the_bit_by_bit_definition():
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    for ms in (0, 1, 1_700_000_000_000, (1 << 48) - 1):
        gen = Ulid()
        got = gen.new(ms)
        value, chars = (ms << 80) | gen._last_rand, []
        for _ in range(26):
            chars.append(alphabet[value & 31])
            value >>= 5
        assert got == "".join(reversed(chars))


def test_float_extension_values_are_not_copied(tmp_path):
    ev = stamper(tmp_path).stamp({"type": "run.started", "agent": "a", "session": "s", "acmeregion": "eu",
                                  "acmeratio": 1.5, "Bad": "x", "toolongextensionname123": "x"})
    assert ev["acmeregion"] == "eu"
    assert "acmeratio" not in ev and "Bad" not in ev and "toolongextensionname123" not in ev


def test_a_draft_that_knows_its_time_keeps_it_on_either_path(tmp_path):
    s = stamper(tmp_path)
    when = "2026-07-03T10:15:04.310Z"
    usual = {"type": "tool.completed", "agent": "vscode", "session": "s", "capture": "metadata", "data": {},
             "time": when}
    other = {**usual, "severity": "warning"}  # not a usual draft: the general path
    assert s.stamp(usual)["time"] == when and s.stamp(other)["time"] == when
    for draft in (usual, other):
        for odd in ("", None, 5):  # what a buggy processor may leave: the stamper's own time
            assert s.stamp({**draft, "time": odd})["time"] != when
