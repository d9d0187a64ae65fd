"""Issue 17 (one live picture): the named figures have one definition, counted from the log with
requests refused before any attempt included; the incident start survives a cycling breaker; the
banner names the provider, the start (UTC), the error classes and what the breaker and guardrail
did; breaker markers stay in the top strip of a chart."""

from __future__ import annotations

import math
import re

import pytest
from sqlalchemy import text as sql

from app import monitor as m
from app.dashboard.providers import provider_statuses, status_rows
from app.display.fmt import pct
from app.monitor.charts import TOP_TICK_Y0, add_event_markers, request_rate_figure
from app.monitor.figures import (
    ATTEMPT_ERROR_RATE,
    FALLBACK_RATE,
    FINAL_FAILURE_RATE,
    Counts,
    figure_label,
    live_figures,
    span_label,
)
from app.monitor.incidents import (
    QUIET_S,
    Incident,
    banner_text,
    breaker_incident_start,
    build_incidents,
    current_incidents,
    failing_since,
)
from app.monitor.series import window_series
from app.monitor.view import monitor_view
from core.records import AttemptRecord
from db import canary
from db.breakers import ReportedBreaker, beat
from db.events import Event, record_breaker_change
from db.requests import insert_batch

T0 = 1_700_006_400 + 12 * 3600 + 30 * 60  # 12:30:00 UTC, a whole minute


def rec(ts: float, provider: str = "holysheep", **kw) -> AttemptRecord:
    base = dict(
        request_id=f"r{ts}",
        attempt=1,
        ts=ts,
        provider=provider,
        model="gpt-4.1",
        requested_model="auto",
        intent="general",
        side="primary",
        status="ok",
        latency_ms=100.0,
    )
    base.update(kw)
    return AttemptRecord(**base)


def failed(ts: float, provider: str = "holysheep", error_class: str = "server_error", **kw) -> AttemptRecord:
    return rec(ts, provider, status="error", error_class=error_class, **kw)


def refused(ts: float, error_class: str = "breaker_open", **kw) -> AttemptRecord:
    """A request refused before any attempt: its one final row, zero latency (app.routing.core.no_route)."""
    return rec(ts, status="error", error_class=error_class, latency_ms=0.0, attempt=0, **kw)


def mixed(start: float) -> list[AttemptRecord]:
    """Ten requests: 4 answered first time, 3 failed over (holysheep fails, direct answers), 2
    refused before any attempt (breaker_open, no_route) and 1 that failed on both routes."""
    out = [rec(start + k, request_id=f"ok{k}") for k in range(4)]
    for k in range(3):
        rid = f"fo{k}"
        out += [failed(start + 10 + k, request_id=rid, final=False)]
        out += [rec(start + 10.5 + k, "direct", request_id=rid, attempt=2, fallback=True)]
    out += [refused(start + 20, request_id="ref1"), refused(start + 21, "no_route", request_id="ref2")]
    out += [failed(start + 30, request_id="both", final=False)]
    out += [failed(start + 30.5, "direct", request_id="both", attempt=2, fallback=True)]
    return out


MIXED_COUNTS = Counts(attempts=14, attempt_errors=7, requests=10, request_errors=3, fallbacks=4)


def shown(markdown: str) -> str:
    """Text as Streamlit shows it: untrusted text is backslash-escaped Markdown (``inert``)."""
    return re.sub(r"\\([^A-Za-z0-9\s])", r"\1", markdown).replace("\u2060", "")


def as_row(r: AttemptRecord) -> dict:
    return {"status": r.status, "final": r.final, "fallback": r.fallback}


# -- the figures ---------------------------------------------------------------------------------


def test_the_definition_counts_refused_requests_as_requests_and_failures():
    c = Counts.of_rows(as_row(r) for r in mixed(T0))
    assert c == MIXED_COUNTS
    assert c.attempt_error_rate == pytest.approx(7 / 14)
    assert c.final_failure_rate == pytest.approx(3 / 10)  # both refusals and the double failure
    assert c.fallback_rate == pytest.approx(4 / 10)
    assert Counts().attempt_error_rate is None and Counts().rate(FINAL_FAILURE_RATE) is None
    with pytest.raises(KeyError):
        c.rate("error_rate")


def test_live_figures_read_the_same_numbers_from_the_log_and_the_rollups(engine):
    m.clear_cache()
    insert_batch(engine, mixed(T0 - 50))  # all inside the last minute of T0
    insert_batch(engine, [failed(T0 - 600 + k, request_id=f"old{k}") for k in range(6)])  # 10 min ago
    f = live_figures(engine, now=T0, window_s=900)
    assert f.last_minute == MIXED_COUNTS
    assert f.window == MIXED_COUNTS + Counts(6, 6, 6, 6, 0)
    assert f.provider("holysheep", last_minute=True) == Counts(10, 6, 6, 2, 0)
    assert f.provider("direct", last_minute=True) == Counts(4, 1, 4, 1, 4)
    assert f.provider("nobody", last_minute=False) == Counts()
    labels = [label for label, _, _ in f.tiles()]
    assert labels == [
        "Attempt error rate, last 1 min",
        "Final failure rate, last 1 min",
        "Fallback rate, last 1 min",
        "Attempt error rate, last 15 min",
        "Final failure rate, last 15 min",
        "Fallback rate, last 15 min",
    ]
    rates = [rate for _, rate, _ in f.tiles()]
    assert rates[:3] == [pytest.approx(0.5), pytest.approx(0.3), pytest.approx(0.4)]
    assert rates[3] == pytest.approx(13 / 20) and rates[4] == pytest.approx(9 / 16)


def test_the_monitor_shows_the_same_figures_under_the_same_names(engine):
    m.clear_cache()
    insert_batch(engine, mixed(T0 - 50))
    view = monitor_view(engine, "1h", None, now=T0)
    tiles = {k.label: k.value for k in view.kpis}
    f = live_figures(engine, now=T0, window_s=3600)
    for label, rate, _ in f.tiles():
        if label.endswith("last 1 min") or label.endswith("last 1 h"):
            assert tiles[label] == pct(rate), label
    assert tiles["Final failure rate, last 1 h"] == "30.0 %"
    table = m.level_table((view.levels.total,), span=view.span)[0]
    assert table["Attempt error rate, last 1 h"] == pytest.approx(0.5)
    assert table["Final failure rate, last 1 min"] == pytest.approx(0.3)
    assert table["Fallback rate, last 1 h"] == pytest.approx(0.4)


def test_the_providers_table_labels_its_rates_with_their_span(engine, settings_factory):
    m.clear_cache()
    insert_batch(engine, mixed(T0 - 50))
    f = live_figures(engine, now=T0, window_s=900)
    statuses = provider_statuses(settings_factory(), env={}, figures=f)
    rows = {r["provider"]: r for r in status_rows(statuses, 900)}
    assert list(rows["holysheep"])[:2] == ["provider", "Attempt error rate, last 1 min"]
    assert rows["holysheep"]["Attempt error rate, last 1 min"] == "60.0 %"
    assert rows["holysheep"]["Attempt error rate, last 15 min"] == "60.0 %"
    assert rows["holysheep"]["state"] == "failing recently"
    assert rows["direct"]["Attempt error rate, last 1 min"] == "25.0 %"


@pytest.mark.parametrize(
    ("seconds", "label"),
    [(60, "last 1 min"), (900, "last 15 min"), (3600, "last 1 h"), (6 * 3600, "last 6 h"), (7 * 86400, "last 7 d")],
)
def test_span_labels(seconds, label):
    assert span_label(seconds) == label
    assert figure_label(ATTEMPT_ERROR_RATE, seconds) == f"Attempt error rate, {label}"


@pytest.mark.parametrize("bad", [0, -60, math.nan, math.inf, 1e400, "60", None])
def test_span_label_refuses_what_is_not_a_span(bad):
    with pytest.raises(ValueError, match="finite number of seconds"):
        span_label(bad)


def test_figure_label_knows_only_the_three_figures():
    assert figure_label(FALLBACK_RATE, "custom range") == "Fallback rate, custom range"
    with pytest.raises(KeyError):
        figure_label("error_rate", 60)


# -- the incident's start ------------------------------------------------------------------------


def cycling(start: float, cycles: int, period: float = 15.0) -> list[tuple[float, str]]:
    out = []
    for k in range(cycles):
        out += [(start + k * period, "open"), (start + k * period + 10, "half_open")]
    return out


def test_a_cycling_breaker_is_one_incident_from_its_first_open():
    changes = cycling(T0 - 900, 50)  # open -> half-open -> open ... for 12.5 minutes
    assert breaker_incident_start(changes, now=T0) == T0 - 900


def test_a_short_close_does_not_end_the_incident_a_long_one_does():
    short = [(T0 - 600, "open"), (T0 - 590, "half_open"), (T0 - 585, "closed"), (T0 - 500, "open")]
    assert breaker_incident_start(short, now=T0) == T0 - 600  # closed 85 s < QUIET_S
    long = [(T0 - 600, "open"), (T0 - 590, "half_open"), (T0 - 585, "closed"), (T0 - 300, "open")]
    assert breaker_incident_start(long, now=T0) == T0 - 300  # closed 285 s: a new incident
    closed = [(T0 - 600, "open"), (T0 - 590, "half_open"), (T0 - 585, "closed")]
    assert breaker_incident_start(closed, now=T0 - 585 + QUIET_S - 1) == T0 - 600  # still recovering
    assert breaker_incident_start(closed, now=T0 - 585 + QUIET_S) is None  # over
    assert breaker_incident_start([], now=T0) is None
    assert breaker_incident_start([(T0 - 5, "unknown")], now=T0) is None


def test_the_failing_stretch_starts_before_the_breaker_reacted():
    minutes = {
        T0 - 600: Counts(attempts=20, attempt_errors=1),  # healthy: the stretch stops here
        T0 - 540: Counts(attempts=20, attempt_errors=12),  # trouble starts
        T0 - 480: Counts(attempts=20, attempt_errors=14),
        # T0 - 420 .. T0 - 120: no attempts (breaker open), not an end
        T0 - 60: Counts(attempts=2, attempt_errors=2),  # probes
        T0: Counts(attempts=1, attempt_errors=1),
    }
    assert failing_since(minutes, now=T0 + 5) == T0 - 540
    assert failing_since({T0: Counts(attempts=20)}, now=T0 + 5) is None


def test_build_incidents_names_the_provider_start_openings_and_rollbacks():
    transitions = {"holysheep": cycling(T0 - 500, 30), "direct": [(T0 - 900, "open"), (T0 - 880, "closed")]}
    minutes = {"holysheep": {T0 - 540: Counts(20, 15), T0 - 480: Counts(5, 5)}}
    found = build_incidents(
        ["holysheep", "direct"],
        now=T0,
        last_minute={"holysheep": Counts(attempts=4, attempt_errors=4), "direct": Counts(attempts=30)},
        transitions=transitions,
        minutes=minutes,
        classes={"holysheep": [("server_error", 40), ("breaker_open", 12)]},
        rollbacks=[(T0 - 1000, "before"), (T0 - 400, "canary 25 % -> 0 %: primary error rate 61 %")],
        primary="holysheep",
    )
    assert [i.provider for i in found] == ["holysheep"]  # direct closed long ago and is healthy
    i = found[0]
    assert i.start == T0 - 540  # failing before its breaker first opened at T0 - 500
    assert i.breaker_state == "half_open" and i.breaker_opened == T0 - 500 and i.openings == 30
    assert i.rollbacks == ((T0 - 400, "canary 25 % -> 0 %: primary error rate 61 %"),)
    assert i.severity == "error"  # half-open but failing


def test_a_failing_provider_without_a_breaker_is_an_incident_and_one_unlucky_request_is_not():
    found = build_incidents(
        ["holysheep", "direct"],
        now=T0,
        last_minute={"holysheep": Counts(attempts=10, attempt_errors=3), "direct": Counts(1, 1)},
        transitions={},
        minutes={"holysheep": {T0 - 60: Counts(10, 3)}},
    )
    assert [(i.provider, i.start, i.breaker_state, i.severity) for i in found] == [
        ("holysheep", T0 - 60, None, "error")
    ]


def test_the_incident_ends_the_quiet_time_after_the_last_failure_unless_a_breaker_is_held_open():
    """The last minute's counts still say failing, but no attempt failed for ``quiet_s`` seconds:
    the banner ends then, not when the failure leaves the last minute (60 s plus a refresh). A
    breaker a live process holds open keeps the incident, no longer called failing."""
    from db.breakers import LiveBreaker

    minute = {"holysheep": Counts(attempts=10, attempt_errors=6)}
    common = dict(now=T0, last_minute=minute, transitions={}, minutes={"holysheep": {T0 - 60: Counts(10, 6)}})
    recent = build_incidents(["holysheep"], **common, last_failure={"holysheep": T0 - 29}, quiet_s=30, live={})
    assert [(i.provider, i.failing, i.severity) for i in recent] == [("holysheep", True, "error")]
    assert build_incidents(["holysheep"], **common, last_failure={"holysheep": T0 - 30}, quiet_s=30, live={}) == []
    held = {"holysheep": LiveBreaker("open", T0 - 40, processes=1, holding=1)}
    kept = build_incidents(["holysheep"], **common, last_failure={"holysheep": T0 - 45}, quiet_s=30, live=held)
    assert [(i.breaker_state, i.failing, i.quiet) for i in kept] == [("open", False, True)]
    assert "failing" not in banner_text(kept[0], now=T0)
    # Without the newest failure's time, the counts alone decide (as before it was read).
    assert [i.provider for i in build_incidents(["holysheep"], **common, live={})] == ["holysheep"]


def test_current_incidents_end_the_quiet_time_after_the_logged_last_failure(engine):
    """Read from the log: the newest failed attempt of the last minute comes with its counts, and
    the banner is gone once it is ``quiet_s`` old, while the failures are still in the last minute."""
    insert_batch(engine, [rec(T0 - 50 + k, status="error", error_class="server_error") for k in range(8)])
    insert_batch(engine, [rec(T0 - 45 + k, request_id=f"ok{k}") for k in range(2)])
    f = live_figures(engine, now=T0, window_s=900)
    assert f.providers_last_failure == {"holysheep": T0 - 43}
    assert f.providers_last_minute["holysheep"].attempt_errors == 8  # still failing by the counts

    def found(quiet_s: float) -> list[str]:
        return [
            i.provider
            for i in current_incidents(
                engine,
                ["holysheep", "direct"],
                now=T0,
                last_minute=f.providers_last_minute,
                last_failure=f.providers_last_failure,
                quiet_s=quiet_s,
            )
        ]

    assert found(60) == ["holysheep"]
    assert found(43) == []


# -- the banner ----------------------------------------------------------------------------------


def test_the_banner_says_who_since_when_what_failed_and_what_was_done():
    i = Incident(
        provider="holysheep",
        start=T0 - 780,  # 12:17:00 UTC
        last_minute=Counts(attempts=8, attempt_errors=5),
        breaker_state="open",
        breaker_since=T0 - 12,
        breaker_opened=T0 - 700,
        openings=17,
        error_classes=(("server_error", 120), ("timeout", 8), ("breaker_open", 3)),
        rollbacks=((T0 - 720, "canary 25 % -> 0 %: primary error rate 61 %"),),
    )
    text = shown(banner_text(i, now=T0))
    assert "**holysheep: incident since 12:17:00 UTC** (13 min, breaker open, failing)" in text
    assert "Attempt error rate, last 1 min: 62 % of 8 attempts" in text
    assert "Errors seen since the start: server_error (120), timeout (8), breaker_open (3)" in text
    assert "Breaker: open since 12:29:48 UTC; first opened at 12:18:20 UTC, opened 17 times since" in text
    assert "Guardrail: rolled back at 12:18:00 UTC (canary 25 % -> 0 %: primary error rate 61 %)" in text


def test_a_provider_whose_requests_are_only_refused_is_not_called_failing():
    i = Incident("direct", T0 - 60, Counts(10, 4), error_classes=(("refused_by_policy", 4),))
    head = shown(banner_text(i, now=T0)).split("\n")[0]
    assert head == "**direct: incident since 12:29:00 UTC** (1 min, requests refused before any attempt)  "
    real = Incident("direct", T0 - 60, Counts(10, 4), error_classes=(("refused_by_policy", 2), ("timeout", 2)))
    assert "(1 min, failing)" in shown(banner_text(real, now=T0))


def test_a_breaker_that_opened_once_is_said_once():
    i = Incident("holysheep", T0 - 60, Counts(4, 4), "open", T0 - 30, T0 - 30, 1)
    text = shown(banner_text(i, now=T0))
    assert "Breaker: open since 12:29:30 UTC" in text and "first opened" not in text


def test_the_banner_of_a_provider_nobody_acted_on_says_so_and_inerts_untrusted_text():
    i = Incident(
        provider="holysheep",
        start=T0 - 30,
        last_minute=Counts(attempts=0),
        error_classes=(("![x](https://evil/?q)", 2),),
    )
    text = banner_text(i, now=T0)
    assert "no attempts" in text and "Neither the breaker nor the guardrail has acted yet" in text
    assert "![" not in text and "](" not in text


def test_current_incidents_reads_the_log_and_the_breaker_events(engine):
    m.clear_cache()
    start = T0 - 300
    insert_batch(engine, [failed(start + 7 + k, request_id=f"f{k}") for k in range(0, 60, 2)])
    insert_batch(engine, [refused(T0 - 30 + k, request_id=f"x{k}") for k in range(5)])
    for k in range(15):  # open, half-open, open, ... open: 8 openings
        old, new = ("half_open", "open") if k % 2 == 0 else ("open", "half_open")
        record_breaker_change(engine, "holysheep", old, new, "failing")
    # record_breaker_change stamps the wall clock; move the rows to known times, 15 s apart
    with engine.begin() as conn:
        ids = [r[0] for r in conn.execute(sql("select id from ops_event order by id"))]
        for n, id_ in enumerate(ids):
            conn.execute(sql("update ops_event set ts = :ts where id = :id"), {"ts": start + 60 + 15 * n, "id": id_})
    canary.ensure_setting(engine, 0.25)
    st = canary.get_state(engine)
    canary.set_ratio(engine, 0.0, expected_version=st.version, actor="guardrail", reason="primary error rate 100 %")
    with engine.begin() as conn:
        conn.execute(sql("update canary_audit set ts = :ts"), {"ts": start + 90})
    # A live process holds the breaker open (its heartbeat: db.breakers); the transitions date it.
    beat(
        engine,
        process="p1",
        breakers={"holysheep": ReportedBreaker("open", start + 60 + 15 * 14)},
        now=T0,
        pid=1,
        host="h",
        source="api",
    )
    f = live_figures(engine, now=T0, window_s=900)
    found = current_incidents(
        engine, ["holysheep", "direct"], now=T0, last_minute=f.providers_last_minute, primary="holysheep"
    )
    assert [i.provider for i in found] == ["holysheep"]
    i = found[0]
    assert i.start == start + 7  # the first failed row, before the breaker's first open
    assert i.breaker_state == "open" and i.openings == 8 and i.breaker_opened == start + 60
    assert dict(i.error_classes) == {"server_error": 30, "breaker_open": 5}
    assert [ts for ts, _ in i.rollbacks] == [start + 90]
    assert "primary error rate 100 %" in shown(banner_text(i, now=T0))
    assert current_incidents(engine, ["direct"], now=T0, last_minute=f.providers_last_minute) == []


# -- breaker markers ---------------------------------------------------------------------------


def test_breaker_markers_stay_in_the_top_strip_other_events_cross_the_chart(engine):
    insert_batch(engine, [rec(T0 - 3000 + k * 10, request_id=f"q{k}") for k in range(300)])
    series = window_series(engine, since=T0 - 3600, until=T0)
    events = [
        Event(T0 - 3000 + 15 * k, "breaker", "holysheep", "open -> half_open: probe", "breaker") for k in range(200)
    ]
    events.append(Event(T0 - 100, "guardrail", None, "canary 25 % -> 0 %", "guardrail"))
    fig = add_event_markers(request_rate_figure(series), events)
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    breaker_lines = [s for s in lines if s.line.color == "#E69F00"]
    assert len(breaker_lines) == 200
    assert all(s.y0 >= TOP_TICK_Y0 and s.y1 == 1 for s in breaker_lines)  # the data below stays clear
    assert not any(s.type == "rect" for s in fig.layout.shapes)
    assert [s.y0 for s in lines if s.line.color != "#E69F00"] == [0]
