"""The ``cloudevents`` exporter: the B1–B5 projection against the 64 pins (and back), batched and
structured HTTP against a real loopback receiver, retry classes, and the capture ceiling."""

from __future__ import annotations

import json

import pytest
from aep_collector.exporters.cloudevents import CloudEventsConfig, CloudEventsExporter, capped
from aep_collector.exporters.cloudevents.projection import from_cloudevent, to_cloudevent
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.sending_queue import Permanent, RetryLater
from aiohttp import web

from tests.conftest import FIXTURES, corpus
from tests.helpers import redirected_elsewhere, running, serve
from tests.relay_double import wait_until


def jl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


GOLDEN = jl(FIXTURES / "golden" / "golden.jsonl")
PINS = jl(FIXTURES / "ce-roundtrip" / "ce-expected.jsonl")
INBOUND = corpus("ce-roundtrip/inbound-cases.json")["cases"]
DOWNLEVEL = corpus("downlevel/cases.json")["cases"]


def test_one_pin_per_golden_event():
    assert len(PINS) == len(GOLDEN) == 64


@pytest.mark.parametrize("i", range(len(GOLDEN)))
def test_forward_matches_the_pin_and_the_inverse_gives_the_event_back(i):
    assert to_cloudevent(GOLDEN[i]) == PINS[i]
    assert from_cloudevent(PINS[i]) == GOLDEN[i]


@pytest.mark.parametrize("case", INBOUND, ids=lambda c: c["name"])
def test_inbound_cases(case):
    assert from_cloudevent(case["ce"]) == case["expected"]


def test_a_foreign_cloudevent_is_not_aep():
    assert from_cloudevent({"specversion": "1.0", "id": "F1", "source": "s", "type": "com.example.thing"}) is None


@pytest.mark.parametrize("case", DOWNLEVEL, ids=lambda c: c["name"])
def test_the_ceiling_down_levels_as_the_corpus_says(case):
    out = capped(case["event"], case["ceiling"])
    assert out.get("capture") == case["expect_capture"]
    assert out.get("data") == case.get("expect_data")
    assert case["event"] == next(c for c in DOWNLEVEL if c["name"] == case["name"])["event"]  # not mutated


def test_events_at_or_below_the_ceiling_pass_unchanged():
    for event in GOLDEN:
        if event.get("capture", "metadata") in ("none", "metadata"):
            assert capped(event, "metadata") is event


@pytest.fixture
async def sink():
    state = {"bodies": [], "types": [], "answers": []}

    async def post(request: web.Request) -> web.Response:
        if state["answers"]:
            status, headers = state["answers"].pop(0)
            return web.Response(status=status, headers=headers)
        state["types"].append(request.headers["Content-Type"])
        state["bodies"].append(await request.read())
        return web.Response(status=202)

    app = web.Application()
    app.router.add_post("/ce", post)
    runner, port = await serve(app)
    state["url"] = f"http://127.0.0.1:{port}/ce"
    yield state
    await runner.cleanup()


async def make(**cfg):
    exp = CloudEventsExporter(CreateSettings(id="cloudevents"), CloudEventsConfig(**cfg))
    await exp.start(Host())
    return exp


async def test_batched_mode_posts_one_array(sink):
    exp = await make(endpoint=sink["url"], max_capture="full")
    try:
        await exp.deliver(GOLDEN[:10])
    finally:
        await exp.shutdown()
    assert sink["types"] == ["application/cloudevents-batch+json; charset=utf-8"]
    assert json.loads(sink["bodies"][0]) == PINS[:10]


async def test_structured_mode_posts_one_event_each_and_classifies_answers(sink):
    exp = await make(endpoint=sink["url"], mode="structured", max_capture="full")
    try:
        await exp.deliver(GOLDEN[:3])
        assert [json.loads(b) for b in sink["bodies"]] == PINS[:3]
        assert set(sink["types"]) == {"application/cloudevents+json; charset=utf-8"}
        sink["answers"] = [(429, {"Retry-After": "4"})]
        with pytest.raises(RetryLater) as later:
            await exp.deliver(GOLDEN[:1])
        assert later.value.delay == 4.0
        sink["answers"] = [(503, {})]
        with pytest.raises(ConnectionError):
            await exp.deliver(GOLDEN[:1])
        sink["answers"] = [(400, {})]
        with pytest.raises(Permanent):
            await exp.deliver(GOLDEN[:1])
    finally:
        await exp.shutdown()


async def test_nothing_above_the_ceiling_is_posted(sink):
    exp = await make(endpoint=sink["url"])  # metadata, the default
    try:
        await exp.deliver([c["event"] for c in DOWNLEVEL])
    finally:
        await exp.shutdown()
    sent = json.loads(sink["bodies"][0])
    for ce, case in zip(sent, DOWNLEVEL, strict=True):
        assert ce["aepcapture"] in ("none", "metadata")
        assert ce.get("data") == capped(case["event"], "metadata").get("data")
    assert b"SECRET free text" not in sink["bodies"][0]


async def test_in_the_service_behind_the_sending_queue(tmp_path, sink):
    import aiohttp

    sink["answers"] = [(503, {"Retry-After": "0"})]
    raw = {
        "receivers": {"claude_code": {"endpoint": "127.0.0.1:0"}},
        "processors": {"mapping": None, "runs": None, "capture": None},
        "exporters": {"jsonl": {"directory": str(tmp_path / "logs"), "fsync": "never"},
                      "cloudevents": {"endpoint": sink["url"]}},
        "service": {"state_dir": str(tmp_path / "state"), "pipelines": {"p": {
            "receivers": ["claude_code"], "processors": ["mapping", "runs", "capture"],
            "exporters": ["jsonl", "cloudevents"]}}},
    }
    async with running(raw) as service:
        url = f"http://127.0.0.1:{service.receivers['claude_code'].port}/hook"
        async with aiohttp.ClientSession() as s:
            for name in ("SessionStart", "UserPromptSubmit", "Stop"):
                async with s.post(url, json={"session_id": "ce-1", "hook_event_name": name, "prompt": "hi"}) as r:
                    assert r.status == 200
        written = jl(tmp_path / "logs" / "claude-code" / "ce-1.jsonl")
        await wait_until(lambda: sum(len(json.loads(b)) for b in sink["bodies"]) >= len(written), "every event")
    sent = [from_cloudevent(ce) for b in sink["bodies"] for ce in json.loads(b)]
    assert sent == written and not sink["answers"]


async def test_an_unprojectable_event_is_left_out_once_and_the_rest_goes(tmp_path, sink):
    """An event without an id (a damaged queue line) raised out of ``deliver``: the sending queue
    retried the whole batch for good and nothing behind it went out. Now it is left out, shown as
    ``unprojectable`` and counted ``dropped`` once, however often its batch is retried."""
    from aep_collector.pipeline.sending_queue import SendingQueue, SendingQueueConfig

    cid = "exporter/cloudevents"
    damaged = {k: v for k, v in GOLDEN[1].items() if k != "id"}
    exp = await make(endpoint=sink["url"], max_capture="full")
    health = exp.health
    sink["answers"] = [(503, {})]  # the first attempt is retried
    q = SendingQueue(cid, tmp_path / "q", SendingQueueConfig(backoff_initial=0.01, backoff_max=0.02, fsync="never"),
                     exp.deliver, health)
    q.start()
    try:
        q.put([GOLDEN[0], damaged, GOLDEN[2]])
        await wait_until(lambda: not q.pending_events, "the batch delivered after a 503")
    finally:
        await q.drain(1)
        await exp.shutdown()
    assert not sink["answers"] and [json.loads(b) for b in sink["bodies"]] == [[PINS[0], PINS[2]]]
    assert {what: n for (c, what), n in health.counters.items() if c == cid} == {
        "retried": 3, "exported": 2, "dropped": 1}
    snapshot = health.snapshot()
    assert snapshot["dropped"] == {cid: 1} and "unprojectable" in snapshot["problems"][cid]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_not_followed_and_the_batch_is_not_counted_delivered(status):
    """aiohttp followed a 301/302/303 with a GET carrying no body (and the configured headers): the
    GET's 200 returned from ``deliver``, so the queue committed a batch no receiver ever had."""
    async with redirected_elsewhere("/ce", status, lambda: web.Response(status=200)) as (url, elsewhere):
        exp = await make(endpoint=url, headers={"X-Api-Key": "k"}, max_capture="full")
        try:
            with pytest.raises(Permanent, match=f"HTTP {status}.*/elsewhere"):
                await exp.deliver(GOLDEN[:2])
        finally:
            await exp.shutdown()
    assert elsewhere == []


async def test_structured_mode_one_event_refused_for_good_does_not_take_the_rest_of_its_batch(tmp_path):
    """In structured mode the first refusal (a 400, a 413 for one large event) raised ``Permanent``
    out of ``deliver``: the queue dropped the whole batch, events never POSTed included. Now the
    refused event is counted ``failed`` and shown; the others are POSTed and counted ``exported``."""
    from aep_collector.pipeline.sending_queue import SendingQueue, SendingQueueConfig

    bad = GOLDEN[1]["id"]
    taken: list[dict] = []

    async def post(request: web.Request) -> web.Response:
        ce = json.loads(await request.read())
        if ce["id"] == bad:
            return web.Response(status=413)
        taken.append(ce)
        return web.Response(status=202)

    app = web.Application()
    app.router.add_post("/ce", post)
    runner, port = await serve(app)
    cid = "exporter/cloudevents"
    exp = await make(endpoint=f"http://127.0.0.1:{port}/ce", mode="structured", max_capture="full")
    health = exp.health
    q = SendingQueue(cid, tmp_path / "q", SendingQueueConfig(fsync="never"), exp.deliver, health)
    q.start()
    try:
        q.put(GOLDEN[:4])
        await wait_until(lambda: not q.pending_events, "the batch settled")
    finally:
        await q.drain(1)
        await exp.shutdown()
        await runner.cleanup()
    assert taken == [PINS[0], PINS[2], PINS[3]]
    assert {what: n for (c, what), n in health.counters.items() if c == cid} == {"failed": 1, "exported": 3}
    assert "export-refused" in health.snapshot()["problems"][cid]


@pytest.mark.parametrize(("headers", "message"), [
    ({"X-Key": "secret\r\nX-Other: 1"}, "header 'X-Key' has a control character"),
    ({"X-Key": "se\x00cret"}, "header 'X-Key' has a control character"),
    ({"Bad Name": "x"}, "header name 'Bad Name' is not an HTTP token"),
    ({"X-Key:": "x"}, "header name 'X-Key:' is not an HTTP token"),
])
def test_headers_that_cannot_go_on_a_request_are_refused_at_config_load_by_name(headers, message):
    """They passed validation: a newline made every POST raise (the batch retried for good, the
    queue stuck), a name with a space was answered 400 (every batch dropped). The value, often a
    secret, is never quoted."""
    with pytest.raises(ValueError, match=message) as refused:
        CloudEventsConfig(endpoint="http://127.0.0.1:9/ce", headers=headers).validate()
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize(("endpoint", "problem"), [
    ("http://127.0.0.1:99999/ce", "the port is not a number from 1 to 65535"),
    ("http://127.0.0.1:abc/ce", "the port is not a number from 1 to 65535"),
    ("http://127.0.0.1:0/ce", "the port is not a number from 1 to 65535"),
    ("http://[::1/ce", "Invalid IPv6 URL"),
    ("ftp://127.0.0.1/ce", "not an http"),
])
def test_an_endpoint_aiohttp_cannot_post_to_is_refused_at_config_load(endpoint, problem):
    """A port out of range or not a number passed validation: aiohttp refused it on every POST,
    retried for good, the sending queue stuck behind the first batch."""
    with pytest.raises(ValueError, match=r"endpoint must be an http\(s\) URL, got .*: " + problem):
        CloudEventsConfig(endpoint=endpoint).validate()


def test_an_extension_named_like_a_cloudevents_attribute_never_overwrites_it():
    """AEP extensions pass unprefixed, and ``specversion`` or ``aepcapture`` are legal AEP extension
    names: they replaced the attribute the projection wrote, so the CE claimed ``specversion`` 0.3
    (a receiver refuses the whole batch) or a capture level the event does not declare."""
    event = {**GOLDEN[0], "specversion": "0.3", "aepcapture": "full", "aepsessionid": "other",
             "datacontenttype": "text/plain", "dataschema": "x", "vendorext": "v"}
    ce = to_cloudevent(event)
    assert ce["specversion"] == "1.0" and ce["vendorext"] == "v"
    assert ce.get("aepcapture") == GOLDEN[0].get("capture") and ce.get("aepsessionid") == GOLDEN[0].get("session")
    assert ce.get("datacontenttype") == ("application/json" if "data" in GOLDEN[0] else None)
    assert "dataschema" not in ce
    assert to_cloudevent(GOLDEN[0]) == {k: v for k, v in ce.items() if k != "vendorext"}


async def test_a_batch_answered_413_is_split_and_only_an_event_too_large_alone_is_refused(tmp_path):
    """A batch over the receiver's body limit (a backlog's full batches after an outage) was
    answered 413 and dropped whole, though each event would fit. It is split until each part fits."""
    from aep_collector.pipeline.sending_queue import SendingQueue, SendingQueueConfig

    limit = 64 * 1024
    taken: list[str] = []

    async def post(request: web.Request) -> web.Response:
        body = await request.read()
        if len(body) > limit:
            return web.Response(status=413)
        taken.extend(ce["id"] for ce in json.loads(body))
        return web.Response(status=202)

    app = web.Application()
    app.router.add_post("/ce", post)
    runner, port = await serve(app)
    events = [{**GOLDEN[3], "id": f"big-{i}", "data": {"text": "x" * (100_000 if i == 7 else 20_000)}}
              for i in range(12)]
    cid = "exporter/cloudevents"
    exp = await make(endpoint=f"http://127.0.0.1:{port}/ce", max_capture="full")
    health = exp.health
    q = SendingQueue(cid, tmp_path / "q", SendingQueueConfig(fsync="never"), exp.deliver, health)
    q.start()
    try:
        q.put(events)
        await wait_until(lambda: not q.pending_events, "the batch settled")
        with pytest.raises(Permanent, match="413"):  # alone and too large: refused as before
            await exp.deliver([events[7]])
    finally:
        await q.drain(1)
        await exp.shutdown()
        await runner.cleanup()
    assert taken == [e["id"] for e in events if e["id"] != "big-7"]
    assert {what: n for (c, what), n in health.counters.items() if c == cid} == {"failed": 1, "exported": 11}


async def test_structured_mode_a_refusal_of_the_request_itself_stops_at_the_first_post():
    """401 (a wrong token) refuses every event alike: the batch is refused at the first POST, not
    after one refused POST per event of it."""
    posts = 0

    async def post(request: web.Request) -> web.Response:
        nonlocal posts
        posts += 1
        return web.Response(status=401)

    app = web.Application()
    app.router.add_post("/ce", post)
    runner, port = await serve(app)
    exp = await make(endpoint=f"http://127.0.0.1:{port}/ce", mode="structured")
    try:
        with pytest.raises(Permanent, match="401"):
            await exp.deliver(GOLDEN[:5])
    finally:
        await exp.shutdown()
        await runner.cleanup()
    assert posts == 1
