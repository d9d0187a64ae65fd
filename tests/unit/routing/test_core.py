"""Blame only who failed (issue 28, item 3): a request the gateway refuses before any attempt (here
the substitution policy, at a ratio that leaves no side serving the model) is logged as the
gateway's row, never the provider's it would have started on; no provider's breaker, attempt error
rate or incident counts it, and the Overview's reading names the gateway and why. Through the
gateway's RoutingClient on the shipped gateway.toml and the built-in simulator."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from app.monitor.figures import live_figures
from app.monitor.incidents import GATEWAY, current_incidents, gateway_refusals, refusals_text
from app.routing.substitution import SubstitutionRefused
from db.canary import set_ratio
from db.models import RequestLog

ONLY_PRIMARY = "deepseek-chat-v3.2"  # gateway.toml: served by holysheep only


def test_a_refusal_before_any_attempt_is_the_gateways_not_a_providers(client_factory, sqlite_url) -> None:
    client = client_factory(sqlite_url)
    set_ratio(client.engine, 0.0, expected_version=None, actor="test", reason="drill")
    client.refresh()
    for i in range(10):
        with pytest.raises(SubstitutionRefused):
            client.chat([{"role": "user", "content": "hi"}], model=ONLY_PRIMARY, session_id=f"r{i}")
    for i in range(5):
        client.chat([{"role": "user", "content": "hi"}], model="gpt-4.1", session_id=f"ok{i}")
    client.flush()
    with client.engine.connect() as conn:
        rows = conn.execute(select(RequestLog.provider, RequestLog.status, RequestLog.error_class)).all()
    refused = [r for r in rows if r.error_class == "refused_by_policy"]
    assert len(refused) == 10 and {r.provider for r in refused} == {GATEWAY}
    assert {r.provider for r in rows if r.status == "ok"} == {"direct"}
    # No breaker heard of them: direct's breaker counted only its five answers.
    assert client.breaker_states()["direct"].failures == 0

    now = time.time()
    figures = live_figures(client.engine, now=now, window_s=900)
    direct = figures.provider("direct", last_minute=True)
    assert (direct.attempts, direct.attempt_errors) == (5, 0)
    found = current_incidents(
        client.engine, ["holysheep", "direct"], now=now, last_minute=figures.providers_last_minute
    )
    assert found == []
    refusals = gateway_refusals(client.engine, now=now, last_minute=figures.providers_last_minute)
    assert refusals is not None and refusals.requests == 10
    assert refusals.classes == (("refused_by_policy", 10),)
    text = refusals_text(refusals)
    assert text.startswith("**Gateway: 10 requests refused before any attempt in the last 60 s**")
    assert "no provider was asked" in text and "refused\\_by\\_policy (10)" in text


def test_no_refusals_no_line(client_factory, sqlite_url) -> None:
    client = client_factory(sqlite_url)
    client.chat([{"role": "user", "content": "hi"}], model="gpt-4.1")
    client.flush()
    now = time.time()
    figures = live_figures(client.engine, now=now, window_s=900)
    assert gateway_refusals(client.engine, now=now, last_minute=figures.providers_last_minute) is None


# -- the retry/fallback loop with plain data -------------------------------------------------------
# RoutingCore.attempts() driven as a driver drives it, with no driver: each failure is a plain
# Failure, each Wait advances a fake clock, nothing is sent. Every failure class of the policy
# table, on a route with a fallback and on one without.

from contextlib import nullcontext  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from random import Random  # noqa: E402

from app.config import load_settings  # noqa: E402
from app.routing.core import Attempt, NoRoute, RoutingCore, Wait  # noqa: E402
from app.routing.errors import GATEWAY_OVERLOADED, Failure, status_failure  # noqa: E402
from app.routing.options import RouteOptions  # noqa: E402
from tests.configs import two_providers  # noqa: E402

MAX_ATTEMPTS = 2  # [retry] max_attempts below: a retryable failure is tried twice per provider


@dataclass
class FixedRatio:
    value: float

    def age_s(self) -> float:
        return 0.0


class Sink:
    def __init__(self) -> None:
        self.records: list = []

    def submit_many(self, records) -> None:
        self.records.extend(records)

    def flush(self) -> None:
        pass


def not_called(exc: BaseException, *, sent_hints: bool) -> Failure:
    raise AssertionError("attempts() classifies nothing: it is handed failures")


def plain_core(tmp_path, ratio: float = 1.0, extra: str = "") -> tuple[RoutingCore, list[float]]:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(two_providers() + f"\n[retry]\nmax_attempts = {MAX_ATTEMPTS}\nretry_after_cap_s = 5\n" + extra)
    settings = load_settings(cfg, env={"DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}"})
    now = [1000.0]
    core = RoutingCore(
        settings,
        telemetry=Sink(),
        ratio=FixedRatio(ratio),
        clock=lambda: now[0],
        wall_clock=lambda: 1.7e9 + now[0],
        rng=Random(7),
        source="test",
        env={},
        secrets={},
        classify=not_called,
        new_lock=nullcontext,
    )
    return core, now


def drive(core: RoutingCore, now: list[float], outcomes, **plan_kw) -> tuple[list[tuple], NoRoute | None]:
    """Run the loop: ``outcomes`` gives each attempt's Failure (None: success). Returns the steps
    taken (``("try", provider, with_hints, is_fallback)`` or ``("wait",)``) and how it ended."""
    plan = core.plan(
        "chat", {"messages": [{"role": "user", "content": "hi"}]}, RouteOptions(model="gpt-4.1", **plan_kw)
    )
    core.start(plan)
    steps = core.attempts(plan)
    seen: list[tuple] = []
    outcome = outcomes if callable(outcomes) else iter(outcomes).__next__
    try:
        step = next(steps)
        while True:
            if isinstance(step, Wait):
                assert step.seconds > 0
                now[0] += step.seconds  # the driver sleeps
                seen.append(("wait",))
                step = steps.send(None)
                continue
            assert isinstance(step, Attempt)
            seen.append(("try", step.provider, step.with_hints, step.is_fallback))
            now[0] += 0.01  # the attempt takes a moment
            step = steps.send(outcome(step) if callable(outcomes) else outcome())
    except StopIteration:
        return seen, None
    except NoRoute as stop:
        return seen, stop


def always(failure: Failure | None):
    while True:
        yield failure


RETRIED = [  # retry on the same provider with a backoff, then fall over
    Failure("timeout", "no answer in time", retryable=True, fallback=True),
    Failure("connection", "ConnectError: refused", retryable=True, fallback=True),
    Failure("bad_response", "not a completion", retryable=True, fallback=True),
    Failure("api_error", "stream error", retryable=True, fallback=True),
    status_failure(500, "boom"),
    status_failure(503, "busy"),
    status_failure(408, "request timeout"),
    status_failure(409, "conflict"),
    status_failure(429, "slow down"),
    status_failure(429, "slow down", retry_after_s=0.5),
]
FAILED_OVER = [  # no retry: the next route at once
    status_failure(401, "bad key"),
    status_failure(403, "forbidden"),
    status_failure(402, "pay up"),
    status_failure(404, "no such model"),
    status_failure(302, "moved"),
    status_failure(400, "Invalid model name passed"),
    status_failure(400, "No connected db."),
    status_failure(429, "no", detail="insufficient_quota"),
    status_failure(429, "slow down", retry_after_s=60.0),  # beyond retry_after_cap_s
    Failure("not_configured", "HOLYSHEEP_API_KEY is not set", fallback=True),
]
REFUSED = [  # the request's own fault, or the gateway's saturation: no retry, no fallback
    status_failure(400, "context length exceeded"),
    status_failure(413, "too large"),
    status_failure(422, "bad param"),
    Failure(GATEWAY_OVERLOADED, "all connections busy", retry_after_s=1),
]
PRIMARY = ("try", "holysheep", False, False)
FALLBACK = ("try", "direct", False, True)


def _id(f: Failure) -> str:
    return f"{f.error_class}-{f.http_status}" + (f"-ra{f.retry_after_s:g}" if f.retry_after_s else "")


@pytest.mark.parametrize("failure", RETRIED, ids=_id)
def test_a_retryable_failure_is_retried_then_fails_over(tmp_path, failure: Failure) -> None:
    core, now = plain_core(tmp_path)
    seen, stop = drive(core, now, always(failure))
    assert seen == [PRIMARY, ("wait",), PRIMARY, FALLBACK, ("wait",), FALLBACK]
    assert stop is not None and stop.error_class == "no_route"


@pytest.mark.parametrize("failure", RETRIED, ids=_id)
def test_a_retryable_failure_on_a_forced_route_is_retried_and_stops_there(tmp_path, failure: Failure) -> None:
    core, now = plain_core(tmp_path)
    seen, stop = drive(core, now, always(failure), route="primary")
    assert seen == [PRIMARY, ("wait",), PRIMARY]
    assert stop is not None and stop.error_class == "no_route"


@pytest.mark.parametrize("failure", FAILED_OVER, ids=_id)
def test_a_route_failure_fails_over_at_once(tmp_path, failure: Failure) -> None:
    core, now = plain_core(tmp_path)
    seen, stop = drive(core, now, always(failure))
    assert seen == [PRIMARY, FALLBACK]
    assert stop is not None and stop.error_class == "no_route"


@pytest.mark.parametrize("failure", FAILED_OVER, ids=_id)
def test_a_route_failure_with_no_fallback_route_ends_the_request(tmp_path, failure: Failure) -> None:
    core, now = plain_core(tmp_path, ratio=0.0)  # every request on the fallback side: no route after it
    seen, stop = drive(core, now, always(failure))
    assert seen == [("try", "direct", False, False)]
    assert stop is not None and stop.error_class == "no_route"


@pytest.mark.parametrize("failure", REFUSED, ids=_id)
@pytest.mark.parametrize("route", [None, "primary"])
def test_a_request_fault_is_neither_retried_nor_failed_over(tmp_path, failure: Failure, route) -> None:
    core, now = plain_core(tmp_path)
    seen, stop = drive(core, now, always(failure), route=route)
    assert seen == [PRIMARY]
    assert stop is not None and stop.error_class is None and "refused by holysheep" in str(stop)


@pytest.mark.parametrize("failure", RETRIED + FAILED_OVER, ids=_id)
def test_the_fallback_answering_ends_the_loop(tmp_path, failure: Failure) -> None:
    core, now = plain_core(tmp_path)
    seen, stop = drive(core, now, lambda attempt: None if attempt.provider == "direct" else failure)
    assert stop is None and seen[-1] == FALLBACK and seen.count(FALLBACK) == 1


def test_a_rejection_of_the_cache_hints_is_resent_once_without_them(tmp_path) -> None:
    core, now = plain_core(tmp_path)
    rejected = status_failure(400, "unknown header x-session-id", sent_hints=True)
    assert rejected.hint_rejection
    seen, stop = drive(core, now, iter([rejected, None]), session_id="s1")
    assert stop is None
    assert seen == [("try", "holysheep", True, False), ("try", "holysheep", False, False)]
    # rejected again without hints, it is an ordinary request fault
    seen, stop = drive(core, now, always(rejected), session_id="s2")
    assert seen == [("try", "holysheep", True, False), ("try", "holysheep", False, False)]
    assert stop is not None and "refused by holysheep" in str(stop)


def test_an_open_breaker_skips_its_provider_and_names_it(tmp_path) -> None:
    core, now = plain_core(tmp_path)
    for _ in range(20):
        core.breakers["holysheep"].record(False, now[0])
    seen, stop = drive(core, now, always(status_failure(503, "busy")))
    assert seen[0] == FALLBACK  # the primary is skipped without an attempt
    for _ in range(20):
        core.breakers["direct"].record(False, now[0])
    seen, stop = drive(core, now, always(None))
    assert seen == [] and stop is not None and stop.error_class == "breaker_open"


def test_a_passed_request_deadline_ends_the_loop_before_the_next_attempt(tmp_path) -> None:
    core, now = plain_core(tmp_path, extra="request_deadline_s = 1\n")
    slow = iter([status_failure(503, "busy")])

    def outcomes():
        yield next(slow)
        now[0] += 5  # the first attempt used the whole deadline
        while True:
            yield status_failure(503, "busy")

    seen, stop = drive(core, now, outcomes())
    assert stop is not None and stop.error_class == "deadline"
    assert seen[0] == PRIMARY and FALLBACK not in seen


def test_each_attempt_gets_at_most_what_is_left_of_the_request_deadline(tmp_path) -> None:
    core, now = plain_core(tmp_path, extra="request_deadline_s = 2\n")
    plan = core.plan("chat", {"messages": [{"role": "user", "content": "hi"}]}, RouteOptions(model="gpt-4.1"))
    core.start(plan)
    steps = core.attempts(plan)
    first = next(steps)
    assert isinstance(first, Attempt) and first.timeout == pytest.approx(2.0)
    now[0] += 1.5
    step = steps.send(Failure("connection", "reset", retryable=True, fallback=True))
    while isinstance(step, Wait):
        step = steps.send(None)
    assert isinstance(step, Attempt) and step.timeout <= 0.5
