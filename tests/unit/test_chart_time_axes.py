"""Every time axis says its clock (issue 17 point 10): the Monitor's and the Overview's charts and
the Canary page's two charts title their x axis "time (UTC)", and their hover labels say UTC."""

from __future__ import annotations

import json

from app.dashboard.charts import ratio_step_figure, split_figure
from app.dashboard.overview import overview_figures
from app.monitor import charts, window_series
from app.monitor.stats import SplitPoint
from core.records import AttemptRecord
from db.canary import AuditEntry, CanaryState
from db.engine import get_engine
from db.requests import insert_batch

NOW = 1_800_000_000.0


def x_axis(fig) -> dict:
    return json.loads(fig.to_json())["layout"]["xaxis"]


def test_monitor_and_overview_time_axes_say_utc(sqlite_url):
    engine = get_engine(sqlite_url)
    insert_batch(
        engine,
        [
            AttemptRecord(
                request_id=f"r{i}",
                attempt=1,
                ts=NOW - 300 + i * 10,
                provider="alpha",
                model="gpt-4.1",
                requested_model="auto",
                intent="general",
                side="primary",
                status="ok",
                latency_ms=100.0,
            )
            for i in range(20)
        ],
    )
    figures = dict(charts.monitor_figures(window_series(engine, since=NOW - 900, until=NOW)))
    figures |= {f"overview {k}": v for k, v in overview_figures(engine, now=NOW).items()}
    for name, fig in figures.items():
        axis = x_axis(fig)
        assert axis["title"]["text"] == "time (UTC)", name
        assert axis["hoverformat"].endswith("UTC"), name


def test_canary_time_axes_say_utc():
    current = CanaryState(ratio=0.2, version=2, updated_at=NOW - 60, updated_by="alice", reason="ramp")
    audit = [AuditEntry(ts=NOW - 60, old_ratio=0.1, new_ratio=0.2, actor="alice", reason="ramp", version=2)]
    points = [SplitPoint(ts=int(NOW) - 120, step_s=60, primary=2, fallback=6)]
    for fig in (ratio_step_figure(audit, current, NOW), split_figure(points, audit, current, NOW, 15)):
        axis = x_axis(fig)
        assert axis["title"]["text"] == "time (UTC)" and axis["hoverformat"].endswith("UTC")
