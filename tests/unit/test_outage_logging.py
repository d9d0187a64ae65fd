"""Issue 18 point 11: while the database is down, the guardrail and the refresher log one line
when the outage starts and one when it ends, never a traceback every tick (was: a full traceback
every 2 s). A real gateway on PostgreSQL behind a TCP switch of the test's own; the timers' ticks
are driven by the test (their threads are stopped before they start), so nothing sleeps."""

from __future__ import annotations

import logging
import threading

import pytest

from app.gateway import build_gateway
from app.refresh import OutageLog
from tests.support.db_switch import DbSwitch

OUTAGE_TICKS = 6


@pytest.mark.postgres
def test_an_outage_is_one_line_per_timer_and_its_end_another(pg_url, settings_factory, caplog):
    switch, url = DbSwitch.in_front_of(pg_url)
    stop = threading.Event()
    stop.set()  # the timers' own threads end at once: the test ticks them
    gateway = build_gateway(settings_factory(database_url=url), stop=stop)
    assert gateway.guardrail is not None
    try:
        caplog.set_level(logging.WARNING)
        switch.off()
        for _ in range(OUTAGE_TICKS):
            gateway.refresher.tick()
            gateway.guardrail.run_once()
        assert gateway.guardrail.failures == OUTAGE_TICKS  # the checks did fail, every one
        assert gateway.snapshot()["canary_ratio"].last_error is not None
        switch.on()
        for _ in range(3):
            gateway.refresher.tick()
            gateway.guardrail.run_once()
    finally:
        switch.on()
        gateway.close()
        switch.close()
    lines = [r for r in caplog.records if r.name == "app.refresh"]
    assert all(r.exc_info is None for r in lines)  # no traceback at the default level
    messages = [r.getMessage() for r in lines]
    failing = [m for m in messages if " failing: " in m]
    recovered = [m for m in messages if " recovered after " in m]
    assert len(failing) == 2 and len(recovered) == 2, messages  # refresher + guardrail, once each
    assert len(messages) == 4, messages
    assert all("\n" not in m and "OperationalError" in m for m in failing), failing
    assert all(f"after {OUTAGE_TICKS} failed runs" in m for m in recovered), recovered


def test_a_second_outage_is_logged_again(caplog):
    now = [0.0]
    outage = OutageLog("job", clock=lambda: now[0])
    caplog.set_level(logging.DEBUG)
    for _ in range(2):
        for _ in range(3):
            outage.failed("OperationalError: connection refused", 2.0, RuntimeError("x"))
            now[0] += 2
        outage.ok()
        outage.ok()  # nothing to say while it works
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        warnings
        == [
            "job failing: OperationalError: connection refused; retrying every 2 s, logged again when it recovers",
            "job recovered after 3 failed runs over 6.0 s",
        ]
        * 2
    )
    assert sum(1 for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info) == 6  # tracebacks: DEBUG
