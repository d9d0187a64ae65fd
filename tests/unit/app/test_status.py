"""``python -m app status`` and the Overview's log counters (issue 7): the ratio and its age,
providers (with breaker state when the client keeps breakers), the writer's counters and what
the journals of the database hold on disk."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.__main__ import main
from app.dashboard.log_health import log_counters
from app.status import gateway_status, status_lines
from app.telemetry.location import claim_journal, journal_dir_for
from app.telemetry.writer import WriterStats, record_to_row
from core.records import AttemptRecord
from tests.support import paths

REPO = paths.REPO


def _env(tmp_path, monkeypatch) -> str:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text((REPO / "gateway.toml").read_text() + "\n[simulator]\nlatency_scale = 0\n")
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    monkeypatch.setenv("GATEWAY_CONFIG", str(cfg))
    monkeypatch.setenv("DATABASE_URL", url)
    return url


def test_status_json_reports_ratio_age_providers_log_and_a_journal_left_on_disk(tmp_path, monkeypatch, capsys):
    url = _env(tmp_path, monkeypatch)
    directory = journal_dir_for(url)
    assert directory is not None
    left = claim_journal(directory)  # a process that died with 3 records in its journal
    rec = AttemptRecord("x1", 1, 1.0, "holysheep", "m", "auto", "general", "primary", "ok", 1.0)
    left.journal.append([record_to_row(rec)] * 3)
    left.journal.dead_letter(record_to_row(rec), "DataError: too long")
    left.release()

    assert main(["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["ratio"]["value"] == 0.1 and status["ratio"]["age_s"] >= 0 and status["ratio"]["error"] is None
    assert [(p["name"], p["role"]) for p in status["providers"]] == [("holysheep", "primary"), ("direct", "fallback")]
    assert [p["breaker"]["state"] for p in status["providers"]] == ["closed", "closed"]
    assert {"queued", "spilled", "replayed", "rejected", "journal_depth", "last_error"} <= set(status["log"])
    assert status["journal"]["records"] == 3 and status["journal"]["dead_letters"] == 1
    assert status["journal"]["dir"] == str(directory)

    # The first status run's gateway adopted that journal and replayed it into the database.
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "canary ratio 10 %" in out and "0 records waiting, 1 dead letters" in out
    from db.engine import dispose_all, get_engine
    from db.requests import count_rows

    assert count_rows(get_engine(url)) == 1  # three copies of one record: written once
    dispose_all()


def test_status_with_an_unreachable_database_is_one_clear_line(tmp_path, monkeypatch, capsys):
    _env(tmp_path, monkeypatch)
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://ci:ci@127.0.0.1:9/nowhere?connect_timeout=1")
    assert main(["status"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: database error:") and "\n" not in err


def _stats(**kw) -> WriterStats:
    base = dict(
        queued=0,
        accepted=10,
        written=10,
        spilled=0,
        replayed=0,
        rejected=0,
        journal_depth=0,
        write_failures=0,
        database_ok=True,
        last_error=None,
        last_error_at=None,
        journal_dir=None,
    )
    base.update(kw)
    return WriterStats(**base)


def test_breaker_states_are_shown_when_the_client_keeps_them() -> None:
    from app.config import load_settings

    # Settings only: the file is never opened (in-memory SQLite URLs are refused by the config).
    settings = load_settings(REPO / "gateway.toml", env={"DATABASE_URL": "sqlite:///never-opened.db"})
    state = SimpleNamespace(value=0.25, age_s=1.5, last_error="OperationalError: locked")
    client = SimpleNamespace(breaker_states=lambda: {"holysheep": "open"})
    gateway = SimpleNamespace(
        settings=settings,
        client=client,
        snapshot=lambda: {"canary_ratio": state},
        telemetry=SimpleNamespace(stats=lambda: _stats(spilled=4, journal_depth=4, database_ok=False)),
    )
    status = gateway_status(gateway)
    assert status["providers"][0]["breaker"] == "open" and status["providers"][1]["breaker"] is None
    lines = status_lines(status)
    assert "holysheep (primary, breaker open)" in lines[1]
    assert lines[0] == "canary ratio 25 % (loaded 1.5 s ago); refresh failing: OperationalError: locked"
    # The journal's folder is named after the database file; reading the status creates nothing.
    assert "never-opened.db" in status["journal"]["dir"]
    assert not Path(status["journal"]["dir"]).exists()


def test_overview_counters_warn_while_the_database_refuses_writes() -> None:
    healthy = log_counters(SimpleNamespace(telemetry=SimpleNamespace(stats=lambda: _stats(spilled=2, replayed=2))))
    assert healthy is not None and healthy.warning is None
    assert [(label, value) for label, value, _ in healthy.metrics()] == [
        ("Log queue", "0"),
        ("Spilled", "2"),
        ("Replayed", "2"),
        ("Rejected", "0"),
    ]
    down = log_counters(
        SimpleNamespace(
            telemetry=SimpleNamespace(
                stats=lambda: _stats(spilled=1500, journal_depth=1500, database_ok=False, last_error="locked")
            )
        )
    )
    assert down is not None and down.warning is not None and "1,500 records" in down.warning
    assert log_counters(SimpleNamespace()) is None


def test_status_shows_a_breaker_another_live_process_holds_open(tmp_path) -> None:
    import time

    from app.config import load_settings
    from db.breakers import LIVE_S, ReportedBreaker, beat
    from db.engine import dispose_all, get_engine
    from db.events import record_breaker_change

    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    settings = load_settings(REPO / "gateway.toml", env={"DATABASE_URL": url})
    engine = get_engine(url)
    now = time.time()
    report = dict(pid=1, host="h", source="loadgen")
    try:
        assert record_breaker_change(engine, "holysheep", "closed", "open", "10/10 attempts failed in 30 s")
        beat(engine, process="p-live", breakers={"holysheep": ReportedBreaker("open", now - 30)}, now=now, **report)
        # A process that stopped reporting (killed with its breaker open) no longer counts.
        gone = {"holysheep": ReportedBreaker("open", now - 900), "direct": ReportedBreaker("open", now - 900)}
        beat(engine, process="p-dead", breakers=gone, now=now - LIVE_S - 1, **report)
        state = SimpleNamespace(value=0.1, age_s=0.2, last_error=None)
        gateway = SimpleNamespace(
            settings=settings,
            engine=engine,
            client=SimpleNamespace(breaker_states=lambda: {}),  # this process's breakers: all closed
            snapshot=lambda: {"canary_ratio": state},
            telemetry=SimpleNamespace(stats=lambda: _stats()),
        )
        status = gateway_status(gateway, slots=[])
        holysheep = next(p for p in status["providers"] if p["name"] == "holysheep")
        assert holysheep["breaker_recorded"]["state"] == "open" and holysheep["breaker_recorded"]["processes"] == 1
        assert holysheep["breaker_recorded"]["ts"] == pytest.approx(now - 30)
        assert "holysheep (primary, breaker open (held by 1 live gateway process since" in status_lines(status)[1]
        assert next(p for p in status["providers"] if p["name"] == "direct")["breaker_recorded"] is None
        assert status["cooling"] == [] and not any("cooling" in line for line in status_lines(status))
        # A route deployment cooling down in a live serve process; a dead process's no longer counts.
        beat(engine, process="p-live", breakers={}, cooldowns={"azure-eu/gpt-4.1": now + 25}, now=now,
             pid=4242, host="h", source="server")  # fmt: skip
        beat(engine, process="p-dead", breakers={}, cooldowns={"direct/gpt-4.1": now + 25}, now=now - LIVE_S - 1,
             **report)  # fmt: skip
        status = gateway_status(gateway, slots=[])
        assert [(c["deployment"], c["pid"], c["source"]) for c in status["cooling"]] == [
            ("azure-eu/gpt-4.1", 4242, "server")
        ]
        assert 20 < status["cooling"][0]["left_s"] <= 25
        assert status_lines(status)[2].startswith("route deployments cooling down: azure-eu/gpt-4.1 (")
        assert status_lines(status)[2].endswith(" s left in server pid 4242)")
    finally:
        dispose_all()


def test_ratio_freshness_says_when_the_database_stopped_answering() -> None:
    from app.dashboard.log_health import RatioFreshness, ratio_freshness

    fresh = RatioFreshness(age_s=0.3, refresh_s=0.5)
    assert not fresh.stale and fresh.text() == "Routing re-reads the ratio every 0.5 s (last read 0.3 s ago)."
    assert not RatioFreshness(age_s=2.0, refresh_s=0.5).stale  # exactly two missed reads plus a second
    stale = RatioFreshness(age_s=42.0, refresh_s=0.5)
    assert stale.stale and "42 s ago" in stale.text() and "last known ratio is served" in stale.text()
    client = SimpleNamespace(
        ratio_age_s=lambda: 7.0, settings=SimpleNamespace(routing=SimpleNamespace(ratio_refresh_s=1))
    )
    assert ratio_freshness(client) == RatioFreshness(7.0, 1.0)
    assert ratio_freshness(SimpleNamespace()) is None  # no refresher: nothing to say
