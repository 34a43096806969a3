"""Attention correlation in isolation: legs get the request id as subject, orphans vanish, sweeps."""

from __future__ import annotations

from aep_collector.processors.mapping.attention import AttentionBook


def d(type_, key=None, session="s", **kw):
    out = {"type": type_, "agent": "kimi-code", "session": session, "data": {}, **kw}
    if key is not None:
        out["_attention_key"] = key
    return out


def test_legs_take_the_request_id_and_cause_chain():
    book = AttentionBook()
    req, ans, res = book.apply([d("attention.requested", "k1", subject="Bash"),
                                d("attention.answered", "k1", subject="k1"),
                                d("attention.resolved", "k1", subject="k1")])
    assert req["id"] and ans["subject"] == req["id"] and res["subject"] == req["id"]
    assert ans["cause"] == req["id"] and res["cause"] == ans["id"]
    assert book.open == {}


def test_orphan_legs_are_dropped_and_counted():
    book = AttentionBook()
    assert book.apply([d("attention.answered", "nope"), d("attention.resolved", "nope")]) == []
    assert book.orphans == 2


def test_a_settled_request_turns_a_late_vendor_echo_into_an_orphan():
    book = AttentionBook()
    book.apply([d("attention.requested", "k"), d("attention.timeout", "k")])
    assert book.apply([d("attention.answered", "k", data={"via": "oob"})]) == []


def test_keys_are_scoped_by_session():
    book = AttentionBook()
    book.apply([d("attention.requested", "k", session="a")])
    assert book.apply([d("attention.resolved", "k", session="b")]) == []
    assert book.is_open("kimi-code", "a", "k")


def test_open_requests_are_swept_before_session_ended():
    book = AttentionBook()
    (req,) = book.apply([d("attention.requested", "k")])
    out = book.apply([d("session.ended")])
    assert [e["type"] for e in out] == ["attention.resolved", "session.ended"]
    assert out[0]["subject"] == req["id"] and out[0]["data"] == {"resolution": "dismissed"}
    assert book.open == {}


def test_drafts_without_keys_pass_untouched_and_book_is_bounded():
    book = AttentionBook(max_open=2)
    plain = d("tool.requested")
    assert book.apply([plain]) == [plain]
    for i in range(5):
        book.apply([d("attention.requested", f"k{i}")])
    assert len(book.open) == 2


def test_a_request_asked_again_closes_the_earlier_card():
    book = AttentionBook()
    (first,) = book.apply([d("attention.requested", "k")])
    out = book.apply([d("attention.requested", "k")])
    assert [e["type"] for e in out] == ["attention.resolved", "attention.requested"]
    assert out[0]["subject"] == first["id"] and out[0]["data"] == {"resolution": "dismissed"}
    assert book.open[("kimi-code", "s", "k")].request_id == out[1]["id"]


def test_a_session_end_sweeps_its_own_requests_in_asking_order_after_evictions_and_settles():
    book = AttentionBook(max_open=4)
    ids = {}
    for key, session in [("k1", "a"), ("k2", "b"), ("k3", "a"), ("k4", "a"), ("k5", "b"), ("k6", "a")]:
        (req,) = book.apply([d("attention.requested", key, session=session)])
        ids[key] = req["id"]
    # max_open 4 evicted k1 and k2; k3 asked again moves to the end; k4 settles.
    again = book.apply([d("attention.requested", "k3", session="a")])
    ids["k3"] = again[-1]["id"]
    book.apply([d("attention.timeout", "k4", session="a")])
    out = book.apply([d("session.ended", session="a")])
    assert [e["subject"] for e in out[:-1]] == [ids["k6"], ids["k3"]] and out[-1]["type"] == "session.ended"
    assert list(book.open) == [("kimi-code", "b", "k5")]
    assert book.by_session == {("kimi-code", "b"): {("kimi-code", "b", "k5"): None}}
    assert [e["subject"] for e in book.apply([d("session.ended", session="b")])[:-1]] == [ids["k5"]]
    assert book.open == {} and book.by_session == {}
