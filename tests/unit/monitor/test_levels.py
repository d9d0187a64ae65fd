"""Issue 8 (Monitor): the three failure levels match an incident, last-minute rates, the previous
period, event markers, custom ranges, substitution cost deltas and the request drill-down."""

from __future__ import annotations

import itertools
import json

import plotly.io
import pytest
from sqlalchemy import text

from app import catalog
from app import monitor as m
from app.monitor.drilldown import query_from_params, request_link, search, search_link
from app.monitor.export import csv_chunks
from app.monitor.levels import breakdown, chosen_model, intent_models
from app.monitor.view import CUSTOM, RangeError, custom_range, monitor_view, table_view
from core.records import AttemptRecord
from db import canary
from db.drilldown import forget_columns, request_attempts
from db.events import events_between, record_breaker_change, record_fault_change
from db.monitor import bucket_cells, span_parts
from db.requests import insert_batch
from tests.support.records import attempt

T0 = 1_700_006_400 + 12 * 3600  # a whole hour
ROUTES = {"primary": "holysheep", "fallback": "direct"}


def rec(ts, provider="holysheep", **kw) -> AttemptRecord:
    return attempt(
        **{
            "request_id": f"r{ts}",
            "ts": ts,
            "provider": provider,
            "model": "gpt-4.1",
            "latency_ms": 100.0,
            "prompt_tokens": 100,
            "completion_tokens": 10,
            "cost_usd": 0.001,
            **kw,
        }
    )


def incident(start: float, n: int = 100, fail_every: int = 10, failing: int = 7) -> list[AttemptRecord]:
    """``n`` primary-side requests one second apart: ``failing`` of every ``fail_every`` fail on the
    primary and are answered by the fallback; plus ``n`` fallback-side requests, all fine."""
    out = []
    for k in range(n):
        ts = start + k
        rid = f"inc{start}-{k}"
        if k % fail_every < failing:
            out.append(
                rec(ts, request_id=rid, status="error", error_class="server_error", http_status=500, final=False)
            )
            out.append(rec(ts + 0.2, "direct", request_id=rid, attempt=2, fallback=True))
        else:
            out.append(rec(ts, request_id=rid))
        out.append(rec(ts + 0.5, "direct", request_id=f"fb{start}-{k}", side="fallback"))
    return out


@pytest.fixture
def eng(engine):
    m.clear_cache()
    forget_columns()
    yield engine
    m.clear_cache()


def kpi(view, label):
    return next(k for k in view.kpis if k.label == label)


def test_headline_shows_all_three_levels_mid_incident(eng):
    insert_batch(eng, incident(T0 - 100))
    view = monitor_view(eng, "15m", None, now=T0, routes=ROUTES)
    # 70 failed of 100 primary attempts; every request still answered.
    total = view.levels.total
    assert (total.attempts, total.attempt_errors) == (270, 70)
    assert (total.started, total.fallbacks) == (200, 70)
    assert total.final_failure_rate == 0.0
    rows = {r.name: r for r in view.levels.providers}
    assert rows["holysheep"].attempt_error_rate == pytest.approx(0.7)
    assert rows["holysheep"].fallback_rate == pytest.approx(0.7)  # its side's requests that failed over
    assert rows["direct"].attempt_error_rate == 0.0 and rows["direct"].fallback_rate == 0.0
    # Filtered to the failing provider, the fallback rate still counts the requests it lost.
    only = monitor_view(eng, "15m", m.MonitorFilters(providers=["holysheep"]), now=T0, routes=ROUTES)
    assert kpi(only, "Attempt error rate, last 15 min").value == "70.0 %"
    assert kpi(only, "Fallback rate, last 15 min").value == "70.0 %"
    assert kpi(only, "Final failure rate, last 15 min").value == "0.0 %"


def test_attempt_error_rate_kpi_counts_every_attempt(eng):
    insert_batch(eng, incident(T0 - 100))
    view = monitor_view(eng, "15m", None, now=T0, routes=ROUTES)
    assert kpi(view, "Attempt error rate, last 15 min").value == f"{70 / 270 * 100:.1f} %"


def test_rates_now_are_over_the_last_minute_not_the_window(eng):
    # 120 requests in the last 60 s of a one-hour window: 2/s now, 120/3600 on average.
    insert_batch(eng, [rec(T0 - 59.5 + k * 0.49, request_id=f"n{k}") for k in range(120)])
    view = monitor_view(eng, "1h", None, now=T0, routes=ROUTES)
    assert view.levels.total.now_requests_per_s == pytest.approx(2.0)
    assert "2.00/s over the last minute, 0.03/s on average" in kpi(view, "Requests").help


def test_deltas_compare_with_the_previous_period(eng):
    insert_batch(eng, [rec(T0 - 4500 + k, request_id=f"p{k}") for k in range(10)])  # previous 15 min
    insert_batch(eng, incident(T0 - 300, n=20))  # current
    view = monitor_view(eng, "15m", None, now=T0, routes=ROUTES)
    assert view.previous is not None and view.previous.total.requests == 0  # outside the previous 15 min
    view = monitor_view(eng, "1h", None, now=T0, routes=ROUTES)
    assert view.previous.total.requests == 10 and view.previous.total.attempt_error_rate == 0.0
    assert kpi(view, "Requests").delta == "+30 (+300%)"
    assert kpi(view, "Final failure rate, last 1 h").delta == "+0.0 pp"
    assert kpi(view, "Attempt error rate, last 1 h").delta == f"{14 / 54 * 100:+.1f} pp"


def test_span_parts_cover_the_range_with_aligned_pieces():
    lo, hi = T0 - 3 * 3600 - 17 * 60, T0 + 2 * 3600 + 7 * 60
    parts = span_parts(lo, hi)
    assert parts[0][1] == lo and parts[-1][2] == hi
    assert all(a % span == 0 and b % span == 0 and a < b for span, a, b in parts)
    assert all(p[2] == q[1] for p, q in itertools.pairwise(parts))
    assert {span for span, *_ in parts} == {60, 300, 3600}
    assert span_parts(T0, T0) == []


def test_breakdown_over_mixed_tables_equals_the_minute_sums(eng):
    records = [rec(T0 - 5 * 3600 + k * 97, request_id=f"s{k}", model=("a", "b")[k % 2]) for k in range(200)]
    insert_batch(eng, records)
    since, until = T0 - 5 * 3600 + 13 * 60, T0 - 600.0
    bd = breakdown(eng, since=since, until=until, cache=None)
    cells = bucket_cells(eng, since=since, until=until, step=60, filters=m.MonitorFilters())
    expected = sum(c.count("requests") for per_p, _ in cells.values() for c in per_p.values())
    assert sum(c.count("requests") for c in bd.by_provider_side.values()) == expected > 0
    assert sum(c.count("requests") for c in bd.by_model.values()) == expected


def test_events_are_recorded_read_and_marked_inertly(eng):
    canary.ensure_setting(eng, 0.1)
    st = canary.get_state(eng)
    canary.set_ratio(eng, 0.5, expected_version=st.version, actor="alice", reason="widen <b>now</b>")
    st = canary.get_state(eng)
    canary.set_ratio(eng, 0.0, expected_version=st.version, actor="guardrail", reason="primary error rate 74 %")
    assert record_fault_change(eng, "holysheep", "70 % errors <img src=x onerror=alert(1)>", actor="bob")
    assert record_breaker_change(eng, "holysheep", "closed", "open", "5 failures in 10 s")
    events = events_between(eng, since=0, until=4e9)
    assert [e.kind for e in events] == ["canary", "guardrail", "fault", "breaker"]
    assert events[3].detail == "closed -> open: 5 failures in 10 s" and events[3].actor == "breaker"

    insert_batch(eng, [rec(events[0].ts - 30, request_id="x")])
    view = monitor_view(eng, "15m", None, now=events[-1].ts + 1)
    for name, fig in view.figures.items():
        if fig.layout.xaxis.visible is False:
            continue
        spec = json.loads(plotly.io.to_json(fig, validate=False))
        markers = [t for t in spec["data"] if t.get("yaxis") == "y9"]
        assert {t["name"] for t in markers} == {
            "canary change",
            "guardrail rollback",
            "fault injection",
            "circuit breaker",
        }, name
        texts = " ".join(h for t in markers for h in t["hovertext"])
        assert "&lt;img src=x" in texts and "<img" not in texts and "<b>" not in texts
        assert len([s for s in spec["layout"]["shapes"] if s["type"] == "line"]) == 4


def test_record_event_never_raises(eng):
    with eng.begin() as conn:
        conn.execute(text("DROP TABLE ops_event"))
    assert record_breaker_change(eng, "p", "open", "half_open", "cool-down over") is False


def test_custom_range_is_bounded():
    assert custom_range(T0 - 3600, T0, now=T0 + 10) == (T0 - 3600, T0)
    assert custom_range(T0 - 3600, T0 + 99, now=T0) == (T0 - 3600, T0)  # a future end is cut to now
    with pytest.raises(RangeError, match="end must be after the start"):
        custom_range(T0, T0, now=T0 + 10)
    with pytest.raises(RangeError, match="at most 31 days"):
        custom_range(T0 - 32 * 86400, T0, now=T0 + 10)
    with pytest.raises(RangeError, match="future"):
        custom_range(T0 + 60, T0 + 120, now=T0)
    from datetime import datetime

    naive = datetime(2023, 11, 15, 12, 0)  # naive = UTC
    assert custom_range(naive, datetime(2023, 11, 15, 13, 0), now=4e9) == (1700049600.0, 1700053200.0)


def test_custom_range_view_reads_only_that_range(eng):
    insert_batch(eng, [rec(T0 - 7200 + k, request_id=f"old{k}") for k in range(5)])
    insert_batch(eng, [rec(T0 - 60 + k, request_id=f"new{k}") for k in range(3)])
    view = monitor_view(eng, CUSTOM, None, now=T0, span=(T0 - 7300, T0 - 7000))
    assert kpi(view, "Requests").value == "5"
    page = table_view(eng, window=CUSTOM, span=(T0 - 7300, T0 - 7000), now=T0)
    assert {r["request_id"] for r in page.rows} == {f"old{k}" for k in range(5)}
    with pytest.raises(RangeError):
        monitor_view(eng, CUSTOM, None, now=T0)


def test_substitution_cost_delta_uses_the_chosen_models_price(eng):
    sub = dict(substituted=True, requested_model="auto", intent="coding", model="gpt-4.1", provider="direct")
    cost = catalog.cost_usd("gpt-4.1", 1000, 0, 500)
    insert_batch(
        eng,
        [
            rec(T0 - 30, request_id="s1", prompt_tokens=1000, completion_tokens=500, cost_usd=cost, **sub),
            rec(T0 - 20, request_id="s2", prompt_tokens=1000, completion_tokens=500, cost_usd=cost, **sub),
            rec(T0 - 10, request_id="plain"),
        ],
    )
    by_intent = {"coding": "deepseek-chat-v3.2", "general": "gemini-2.5-flash"}
    view = monitor_view(eng, "15m", None, now=T0, intent_models=by_intent)
    cheap = catalog.cost_usd("deepseek-chat-v3.2", 2000, 0, 1000)
    assert view.substitutions.requests == 2
    assert view.substitutions.cost_delta_usd == pytest.approx(2 * cost - cheap, rel=1e-9)
    assert view.substitutions.by_pair[0][:3] == ("deepseek-chat-v3.2", "gpt-4.1", 2)
    assert kpi(view, "Substituted").value == "2" and "vs chosen model" in kpi(view, "Substituted").delta
    # An explicitly requested model is the chosen one, whatever the intent.
    assert chosen_model("claude-sonnet-4-20250514", "coding", by_intent) == "claude-sonnet-4-20250514"
    assert chosen_model("auto", "unknown", by_intent) is None


def test_intent_models_follow_the_configuration(settings_factory):
    s = settings_factory()
    by_intent = intent_models(s.intents)
    assert by_intent["general"] == s.intents.default_model
    assert by_intent["long_context"] == s.intents.long_context_model
    for rule in s.intents.rules:
        assert rule.intent in by_intent


def test_drilldown_finds_by_request_and_unicode_session_and_tells_the_story(eng):
    session = "세션-🦀-<script>"
    rows = [
        rec(
            T0,
            request_id="req-1",
            status="error",
            error_class="rate_limited",
            http_status=429,
            final=False,
            latency_ms=50.0,
            session_id=session,
        ),
        rec(
            T0 + 1.05,
            request_id="req-1",
            attempt=2,
            status="error",
            error_class="server_error",
            http_status=503,
            final=False,
            latency_ms=100.0,
            session_id=session,
        ),
        rec(
            T0 + 1.2,
            "direct",
            request_id="req-1",
            attempt=3,
            fallback=True,
            ttft_ms=33.0,
            latency_ms=300.0,
            session_id=session,
            substituted=True,
            intent="coding",
            model="gpt-4.1",
            prompt_text="hello ![x](http://e)",
        ),
        rec(T0 + 5, request_id="req-2", session_id=session),
        rec(T0 + 6, request_id="req-3", session_id="other"),
    ]
    insert_batch(eng, rows)
    found = search(eng, "session", session)
    assert found.error is None and [x.request_id for x in found.matches] == ["req-2", "req-1"]
    req1 = found.matches[1]
    assert (req1.attempts, req1.provider, req1.status) == (3, "direct", "ok")
    assert found.rows()[1]["open"] == "/request?id=req-1"

    story = m.load_story(eng, "req-1", {"coding": "deepseek-chat-v3.2"})
    assert [a.error_class for a in story.attempts] == ["rate_limited", "server_error", None]
    assert [a.http_status for a in story.attempts] == [429, 503, None]
    assert story.attempts[0].wait_before_ms is None
    assert story.attempts[1].wait_before_ms == pytest.approx(1000.0, abs=1e-3)  # 1.05 s after a 50 ms attempt
    assert story.attempts[2].wait_before_ms == pytest.approx(50.0, abs=1e-3)
    assert story.attempts[2].ttft_ms == 33.0 and story.side == "primary" and story.substituted
    assert story.chosen_model == "deepseek-chat-v3.2"
    expected = 0.001 - catalog.cost_usd("deepseek-chat-v3.2", 100, 0, 10)
    assert story.substitution_delta_usd == pytest.approx(expected)
    assert story.total_ms == pytest.approx(1500.0, abs=1e-3)
    assert story.prompt_text == "hello ![x](http://e)"
    assert {"field": "session id", "value": session} in story.facts()
    assert len(story.timeline_rows()) == 3
    assert m.load_story(eng, "nope") is None
    assert search(eng, "request", "req-3").matches[0].session_id == "other"


def test_key_search_without_the_column_says_so(eng):
    if "key_name" in {c for c in request_attempts.__globals__["log_columns"](eng)}:
        pytest.skip("this database already has request_log.key_name")
    result = search(eng, "key", "team-a")
    assert result.matches == () and "key names" in result.error and "Fix:" in result.error


def test_key_search_with_the_column(eng):
    with eng.begin() as conn:
        cols = (
            [c[1] for c in conn.exec_driver_sql("PRAGMA table_info(request_log)")]
            if eng.dialect.name == "sqlite"
            else None
        )
    if cols is not None and "key_name" not in cols:
        with eng.begin() as conn:
            conn.execute(text("ALTER TABLE request_log ADD COLUMN key_name VARCHAR(64)"))
    elif cols is None:
        with eng.begin() as conn:
            conn.execute(text("ALTER TABLE request_log ADD COLUMN IF NOT EXISTS key_name VARCHAR(64)"))
    forget_columns()
    insert_batch(eng, [rec(T0, request_id="k1"), rec(T0 + 1, request_id="k2")])
    with eng.begin() as conn:
        conn.execute(text("UPDATE request_log SET key_name = 'team-a' WHERE request_id = 'k2'"))
    result = search(eng, "key", "team-a")
    assert result.error is None and [x.request_id for x in result.matches] == ["k2"]
    assert m.load_story(eng, "k2").key_name == "team-a"


def test_links_round_trip_any_session_id():
    session = "s/ä b&c=d#?"
    link = search_link("session", session)
    from urllib.parse import parse_qs, urlsplit

    parsed = urlsplit(link)
    assert parsed.path == "/request"
    params = {k: v[0] for k, v in parse_qs(parsed.query).items()}
    assert query_from_params(params) == ("session", session)
    assert request_link("abc") == "/request?id=abc"
    assert query_from_params({}) is None


def test_recent_rows_link_to_their_drilldown(eng):
    insert_batch(eng, [rec(T0 - 5, request_id="linked")])
    page = table_view(eng, window="15m", now=T0)
    assert page.rows[0]["open"] == "/request?id=linked"
    csv_text = "".join(csv_chunks(eng, since=page.since, until=page.until))
    assert "open" not in csv_text.splitlines()[0].split(",") and "linked" in csv_text


def test_fault_save_and_clear_are_recorded_as_events(eng):
    from app.dashboard import canary_form
    from app.dashboard.identity import Identity

    carol = Identity("carol", "operator", "account")
    assert canary_form.save_faults(eng, "holysheep", 70, 0, 1, actor=carol).ok
    assert not canary_form.save_faults(eng, "holysheep", 150, 0, 1, actor=carol).ok  # refused: no event
    assert canary_form.reset_faults(eng, "holysheep", actor=carol).ok
    events = events_between(eng, since=0, until=4e9)
    assert [(e.kind, e.provider, e.actor) for e in events] == [("fault", "holysheep", "carol")] * 2
    assert "70" in events[0].detail and "cleared" in events[1].detail


def test_settled_pieces_are_cached_and_the_recent_end_is_reread(eng):
    from app.monitor.levels import PartCache

    insert_batch(eng, [rec(T0 - 3 * 3600 + k * 60, request_id=f"c{k}") for k in range(170)])
    cache = PartCache()
    until = T0 - 60.0
    first = breakdown(eng, since=T0 - 3 * 3600, until=until, cache=cache)
    total = sum(c.count("requests") for c in first.by_provider_side.values())
    assert total == 170
    insert_batch(eng, [rec(T0 - 2 * 3600 + 5, request_id="late"), rec(until - 5, request_id="fresh")])
    again = breakdown(eng, since=T0 - 3 * 3600, until=until, cache=cache)
    # The late write into a settled hour is not seen until the cache entry expires; the fresh one is.
    assert sum(c.count("requests") for c in again.by_provider_side.values()) == total + 1
    uncached = breakdown(eng, since=T0 - 3 * 3600, until=until, cache=None)
    assert sum(c.count("requests") for c in uncached.by_provider_side.values()) == total + 2


def test_breaker_change_can_be_recorded_off_the_request_path(eng):
    from db.events import record_breaker_change_later

    record_breaker_change_later(eng, "direct", "open", "half_open", "cool-down over").join(timeout=30)
    (event,) = events_between(eng, since=0, until=4e9)
    assert (event.kind, event.provider, event.detail) == ("breaker", "direct", "open -> half_open: cool-down over")


def test_overview_charts_carry_the_markers_too(eng):
    from app.monitor.view import overview_figures

    insert_batch(eng, [rec(T0 - 30, request_id="o")])
    record_breaker_change(eng, "holysheep", "closed", "open", "errors")
    with eng.begin() as conn:
        conn.execute(text("UPDATE ops_event SET ts = :ts"), {"ts": T0 - 20})
    figures = overview_figures(eng, now=T0)
    for fig in figures.values():
        assert [t.name for t in fig.data if t.yaxis == "y9"] == ["circuit breaker"]


def test_latest_breaker_state_per_provider_across_processes(eng):
    from db.events import breaker_state_of, latest_breaker_states, record_breaker_change, record_event

    assert record_breaker_change(eng, "holysheep", "closed", "open", "9/10 attempts failed in 30 s")
    record_event(
        eng, kind="breaker", provider="holysheep", detail="open -> half_open: cooldown over", actor="b", ts=4e9
    )
    record_event(eng, kind="breaker", provider="direct", detail="closed -> open: 5/5", actor="b", ts=1.0)
    record_event(eng, kind="fault", provider="direct", detail="faults cleared", actor="carol", ts=4e9)
    latest = latest_breaker_states(eng, since=100.0)
    assert latest == {"holysheep": ("half_open", 4e9)}  # direct's transition is older than `since`
    assert latest_breaker_states(eng, since=0.0)["direct"] == ("open", 1.0)
    assert breaker_state_of("garbage") == "unknown" and breaker_state_of("a -> nonsense: x") == "unknown"


def test_a_failed_requests_story_says_why_first(eng):
    insert_batch(
        eng,
        [
            rec(T0, request_id="f-1", status="error", error_class="timeout", http_status=504, final=False),
            rec(T0 + 1, "direct", request_id="f-1", attempt=2, status="error", error_class="server_error",
                http_status=502, error_message="bad gateway", fallback=True),
            rec(T0 + 2, "gateway", request_id="f-2", status="error", error_class="budget_exceeded", http_status=429,
                error_message="this key's daily budget of $0.01 is used up", intent="refused", side="none"),
            rec(T0 + 3, request_id="ok-1"),
        ],
    )  # fmt: skip
    why = m.load_story(eng, "f-1").why()
    assert (why.error_class, why.message, why.http_status, why.attempts, why.last) == (
        "server_error",
        "bad gateway",
        502,
        2,
        "direct / gpt-4.1",
    )
    assert not why.refused_by_gateway
    refused = m.load_story(eng, "f-2")
    assert refused.why().refused_by_gateway and refused.why().error_class == "budget_exceeded"
    assert {"field": "refused by", "value": "the gateway, before any provider was asked"} in refused.facts()
    assert m.load_story(eng, "ok-1").why() is None
