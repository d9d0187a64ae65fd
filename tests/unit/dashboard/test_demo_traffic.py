"""Demo traffic job (background loadgen with progress) and the canary page's charts."""

from __future__ import annotations

import time

from app.dashboard import demo_traffic
from app.dashboard.charts import audit_frame, ratio_history, ratio_step_figure, split_figure
from app.monitor import observed_split
from db.canary import audit_log, get_state, set_ratio
from db.monitor import has_requests
from db.requests import count_rows


def test_demo_job_runs_in_background_with_progress(client_factory, sqlite_url):
    client = client_factory(sqlite_url)
    assert demo_traffic.simulated_only(client)
    seen = []
    job = demo_traffic.start_job(sqlite_url, client, rps=50.0, duration_s=0.4)
    assert demo_traffic.start_job(sqlite_url, client) is job  # not started twice while running
    assert job.wait(30)
    seen.append(job.done)
    assert job.done == job.planned == 20 and job.fraction == 1.0
    assert job.report is not None and job.report.sent == 20 and job.error is None
    assert "Demo traffic done" in job.label()
    assert has_requests(client.engine) and count_rows(client.engine) >= 20
    from sqlalchemy import text

    with client.engine.connect() as conn:
        sources = {r[0] for r in conn.execute(text("select distinct source from request_log"))}
    assert sources == {"loadgen"}
    assert demo_traffic.current_job(sqlite_url) is job
    demo_traffic.forget_job(sqlite_url)
    assert demo_traffic.current_job(sqlite_url) is None


def test_demo_job_reports_errors_instead_of_raising(client_factory, sqlite_url):
    client = client_factory(sqlite_url)
    job = demo_traffic.DemoTrafficJob(client, rps=-1, duration_s=1).start()
    assert job.wait(10)
    assert job.error and "rps" in job.error and "failed" in job.label()


def test_ratio_history_and_figures(client_factory, sqlite_url):
    client = client_factory(sqlite_url)
    eng = client.engine
    t0 = time.time() - 600
    set_ratio(eng, 0.5, expected_version=None, actor="a", reason="r1", now=t0)
    set_ratio(eng, 0.0, expected_version=None, actor="guardrail", reason="auto", now=t0 + 300)
    entries, state = audit_log(eng), get_state(eng)
    now = time.time()
    xs, ys = ratio_history(entries, state, now)
    assert ys == [10.0, 50.0, 0.0, 0.0] and xs[-1] == now and xs == sorted(xs)
    frame = audit_frame(entries)
    assert list(frame["actor"]) == ["guardrail", "a"] and list(frame["new %"]) == [0.0, 50.0]
    assert list(frame.columns)[:6] == ["time (UTC)", "canary", "old %", "new %", "actor", "reason"]
    fig = ratio_step_figure(entries, state, now)
    assert fig.data[0].line.shape == "hv" and list(fig.data[0].y) == ys

    client.chat([{"role": "user", "content": "hi"}], session_id="x")
    client.flush()
    points = observed_split(eng, now=time.time(), minutes=15)
    fig = split_figure(points, entries, state, time.time(), 15)
    target, observed = fig.data
    assert target.name == "target" and observed.name == "observed"
    assert any(v is not None for v in observed.y)
    assert all(0 <= v <= 100 for v in target.y)
