"""The observed canary split by cause and the quick actions' stated effect (issue 17): a 10 %
setting never reads 67 % without saying why, and what the rollback says is what happens."""

from __future__ import annotations

import time

import pytest

from app.config import load_settings
from app.dashboard.canary_form import quick_effect
from app.monitor.stats import split_by_cause
from core.records import AttemptRecord
from db.canary import set_ratio
from db.requests import insert_batch

P, F = "holysheep", "direct"


def rec(i: int, side: str, provider: str, *, fallback: bool = False, attempt: int = 1, ok: bool = True):
    status = "ok" if ok else "error"
    return AttemptRecord(f"r{i}", attempt, time.time(), provider, "gpt-4.1", "auto", "general", side, status, 5.0,
                         fallback=fallback)  # fmt: skip


def test_each_request_is_counted_once_under_its_cause(engine):
    rows = [rec(i, "primary", P) for i in range(10)]  # the ratio's
    rows += [rec(i, "fallback", F, ok=i >= 14) for i in range(10, 30)]  # the ratio's, 4 of them failed
    rows += [rec(i, "fallback", P) for i in range(30, 67)]  # moved: deepseek only on the primary
    rows += [rec(i, "primary", F, fallback=True, attempt=2) for i in range(67, 70)]  # fail-over
    rows += [rec(i, "none", "gateway") for i in range(70, 72)]  # refused by the gateway
    insert_batch(engine, rows)
    s = split_by_cause(engine, primary=P, fallback=F, now=time.time(), minutes=15)
    assert (s.by_ratio, s.moved, s.fail_over, s.refused, s.total) == ({P: 10, F: 20}, {P: 37}, 3, 2, 72)
    assert s.share(P) == pytest.approx(47 / 70) and s.share(F) == pytest.approx(23 / 70)
    lines = s.sentences()
    assert lines[0] == f"{P} got 67% of requests: 10 by the ratio, 37 moved for a model only it serves."
    assert lines[1] == (
        f"{F} got 33% of requests: 20 by the ratio, 3 by fail-over, 0 moved for a model only it serves; "
        "4 of them failed or were refused."
    )
    assert "2 refused by the gateway itself" in lines[2]


def test_the_rollback_says_what_will_happen_and_the_router_does_it(client_factory, sqlite_url):
    settings = load_settings("gateway.toml", env={})
    effect = quick_effect("rollback", settings)
    assert effect.startswith(f"every new request is assigned to {F}; {P} gets none")
    assert "deepseek-chat-v3.2" in effect and "never sent to holysheep" in effect and "1.5x" in effect
    assert "except fail-over" in quick_effect("promote", settings)
    # What it says holds: after a rollback, no request reaches the primary.
    client = client_factory(sqlite_url)
    set_ratio(client.engine, 0.0, expected_version=None, actor="t", reason="rollback")
    client.refresh()
    for i, prompt in enumerate(["hello there", "Write a python function to sort a list", "hi again"]):
        try:
            result = client.chat([{"role": "user", "content": prompt}], session_id=f"s{i}")
        except ValueError:
            continue  # the deepseek prompt: refused by the substitution policy, as the text says
        assert result.provider == F
