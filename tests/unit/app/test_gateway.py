"""The composition root: one place builds the object graph, constructors only store what they are
given, the guardrail runs on its own timer (not in the telemetry writer), and close() tears it all
down."""

from __future__ import annotations

import threading

import httpx2
import pytest
from sqlalchemy import func, select

from app.gateway import build_gateway
from app.refresh import Refresher
from app.routing import AllRoutesFailed, RoutingClient
from app.simulator import SimulatedProvider, make_transport
from core.records import AttemptRecord
from db.canary import get_state, set_guardrail, set_ratio
from db.models import RequestLog
from db.requests import insert_batch

MSG = [{"role": "user", "content": "hi"}]


class ListSink:
    def __init__(self) -> None:
        self.records: list[AttemptRecord] = []
        self.flushes = 0

    def submit_many(self, records):
        self.records.extend(records)

    def flush(self) -> None:
        self.flushes += 1


def test_routing_client_constructor_needs_no_database(settings_factory):
    """Built by hand from a sink, a fixed ratio and a transport: no engine, no thread, no writer."""
    settings = settings_factory()
    sink = ListSink()
    ratio = Refresher(1.0).add("ratio", lambda: 1.0)  # never started: a fixed value
    sim = make_transport(SimulatedProvider("holysheep", settings.primary.models, latency_scale=0.0, seed=1))
    client = RoutingClient(
        settings, telemetry=sink, ratio=ratio, transports={"holysheep": sim, "direct": sim}, sleep=lambda s: None
    )
    r = client.chat(MSG, session_id="s1")
    client.close()
    assert (r.side, r.provider) == ("primary", settings.routing.primary)
    assert [rec.request_id for rec in sink.records] == [r.request_id] and sink.records[-1].final
    assert sink.flushes == 1
    with pytest.raises(AttributeError, match="build_gateway"):
        _ = client.engine


def test_request_ids_are_unique_across_threads(settings_factory):
    settings = settings_factory()
    sim = make_transport(SimulatedProvider("x", settings.primary.models, latency_scale=0.0, seed=1))
    ratio = Refresher(1.0).add("ratio", lambda: 0.5)
    clients = [
        RoutingClient(settings, telemetry=ListSink(), ratio=ratio, transports={"holysheep": sim, "direct": sim})
        for _ in range(2)
    ]
    ids: list[str] = []
    lock = threading.Lock()

    def run(c: RoutingClient) -> None:
        got = [c.chat(MSG).request_id for _ in range(50)]
        with lock:
            ids.extend(got)

    threads = [threading.Thread(target=run, args=(c,)) for c in clients for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 300 and len(set(ids)) == 300
    assert all(len(i) == 32 for i in ids)  # the width the request log stores


def test_guardrail_rolls_back_on_its_timer_and_the_client_sees_it_at_once(db_url, settings_factory):
    stop = threading.Event()
    stop.set()  # timers never tick on their own: the test drives them
    gw = build_gateway(settings_factory(database_url=db_url), stop=stop, sleep=lambda s: None)
    try:
        primary = gw.settings.routing.primary
        set_ratio(gw.engine, 0.5, expected_version=None, actor="alice", reason="ramp")
        set_guardrail(gw.engine, enabled=True, error_rate_threshold=0.3, window_minutes=5, min_requests=10, actor="a")
        gw.refresh()
        assert gw.client.current_ratio() == 0.5
        now = gw.client.core.wall()
        insert_batch(
            gw.engine,
            [
                AttemptRecord(
                    f"g{i}",
                    1,
                    now,
                    primary,
                    "gpt-4.1",
                    "auto",
                    "general",
                    "primary",
                    "error",
                    5.0,
                    error_class="server_error",
                )
                for i in range(12)
            ],
        )
        assert gw.guardrail is not None
        gw.guardrail.run_once()
        assert get_state(gw.engine).updated_by == "guardrail"
        assert gw.client.current_ratio() == 0.0  # reloaded by the rollback, not on the next tick
    finally:
        gw.close()


def test_a_failing_guardrail_check_does_not_duplicate_log_rows(sqlite_url, settings_factory):
    """The old wiring ran the guardrail inside the writer's callback, so a failing check made the
    writer retry a batch it had already committed. Now the writer only inserts."""
    stop = threading.Event()
    stop.set()
    gw = build_gateway(settings_factory(database_url=sqlite_url), stop=stop, sleep=lambda s: None)
    try:
        set_guardrail(gw.engine, enabled=True, error_rate_threshold=0.3, window_minutes=5, min_requests=1, actor="a")
        ids = {gw.client.chat(MSG, session_id=f"s{i}").request_id for i in range(20)}
        gw.telemetry.flush()
        with gw.engine.begin() as conn:  # break the guardrail's read, then run it
            conn.exec_driver_sql("ALTER TABLE guardrail_setting RENAME TO guardrail_setting_gone")
        assert gw.guardrail is not None
        gw.guardrail.run_once()
        assert gw.guardrail.failures == 1
        ids |= {gw.client.chat(MSG, session_id=f"t{i}").request_id for i in range(5)}
        gw.telemetry.flush()
        with gw.engine.connect() as conn:
            final = conn.execute(select(func.count()).select_from(RequestLog).where(RequestLog.final.is_(True)))
            assert final.scalar_one() == len(ids) == 25
        assert gw.telemetry.write_failures == 0
    finally:
        gw.close()


def test_close_stops_every_thread_and_flushes(sqlite_url, settings_factory):
    gw = build_gateway(settings_factory(database_url=sqlite_url), sleep=lambda s: None)
    threads = [gw.refresher._timer._thread, gw.guardrail._thread, gw.telemetry._thread]  # type: ignore[union-attr]
    assert all(t.is_alive() for t in threads)
    r = gw.client.chat(MSG)
    gw.client.close()  # a gateway-built client closes its gateway
    assert not any(t.is_alive() for t in threads)
    with gw.engine.connect() as conn:
        assert conn.execute(select(RequestLog.request_id)).scalar_one() == r.request_id
    with pytest.raises(RuntimeError, match="closed"):
        gw.telemetry.submit_many([])
    gw.close()  # idempotent


def test_injected_transport_replaces_the_simulator(sqlite_url, settings_factory):
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.url.host)
        return httpx2.Response(500, json={"error": {"message": "down"}})

    gw = build_gateway(
        settings_factory(database_url=sqlite_url),
        transports={"direct": httpx2.MockTransport(handler)},
        sleep=lambda s: None,
        guardrail=False,
    )
    try:
        assert "direct" not in gw.upstreams and "holysheep" in gw.upstreams
        assert gw.guardrail is None
        set_ratio(gw.engine, 0.0, expected_version=None, actor="t", reason="all to fallback")
        gw.refresh()
        with pytest.raises(AllRoutesFailed):
            gw.client.chat(MSG)
        assert seen
    finally:
        gw.close()


# -- alert events: breaker openings and guardrail rollbacks ---------------------------------------------


def test_a_breaker_opening_and_a_guardrail_rollback_are_sent_to_the_webhooks(client_factory, sqlite_url) -> None:
    import json
    import threading

    import httpx2

    from app.alerts import Webhooks
    from core.faults import FaultSettings
    from db.canary import set_guardrail, set_ratio
    from db.faults import set_faults

    got: list[dict] = []
    both = threading.Event()

    def receiver(request: httpx2.Request) -> httpx2.Response:
        got.append(json.loads(request.content))
        if {e["event"] for e in got} >= {"breaker.open", "guardrail.rollback"}:
            both.set()
        return httpx2.Response(204)

    hooks = Webhooks(["https://hooks.example/x"], transport=httpx2.MockTransport(receiver))
    client = client_factory(sqlite_url, alerts=hooks)
    gateway = client.gateway
    set_faults(gateway.engine, "holysheep", FaultSettings(error_rate=1.0), actor="t")
    set_ratio(gateway.engine, 1.0, expected_version=None, actor="t", reason="all in")
    # The breaker takes the primary out after 10 failures: the guardrail may judge on 5.
    set_guardrail(gateway.engine, enabled=True, error_rate_threshold=0.2, window_minutes=5, min_requests=5, actor="t")
    client.refresh()
    for i in range(30):
        client.chat([{"role": "user", "content": f"hi {i}"}], session_id=f"s{i}")
    client.flush()
    assert gateway.guardrail is not None
    gateway.guardrail.run_once()  # what its timer does every few seconds
    assert both.wait(30), got
    kinds = [e["event"] for e in got]
    assert kinds.count("guardrail.rollback") == 1
    breaker = next(e for e in got if e["event"] == "breaker.open")
    assert breaker["provider"] == "holysheep" and breaker["text"].startswith("circuit breaker for holysheep opened")
    rollback = next(e for e in got if e["event"] == "guardrail.rollback")
    assert "rolled back to 0 %" in rollback["text"] and "holysheep error rate" in rollback["reason"]
