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


# -- routes: every failure class x every strategy x the fallback kinds, with plain data -------------
# Route "gpt-4.1" has two deployments, on providers a and b, and one fallback route of each kind,
# each on a provider of its own: "claude-sonnet-4-20250514" (fallbacks, on fb), "gemini-2.5-flash"
# (context_window_fallbacks, on cw) and "deepseek-chat-v3.2" (content_policy_fallbacks, on cp).
# Each strategy is given plain state that decides its order (weights, in-flight counts, measured
# latencies, catalog prices), so every case says which deployment is tried first and which next.
# Each attempt is recorded as a driver records it (core.record), so the rows and the health they
# leave behind are the core's, not the test's.

ROUTE_MAX_ATTEMPTS = 3  # [retry] max_attempts: up to three tries per deployment ...
ALLOWED_FAILS = 2  # ... but two health failures in a row put a deployment of gpt-4.1 out
COOLDOWN_S = 30.0
FALLBACK_ALLOWED_FAILS = 5  # the fallback routes never cool within one request

ROUTE_TOML = """
[routing]
primary = "a"
fallback = "b"

[breaker]
enabled = false

[retry]
max_attempts = {max_attempts}
retry_after_cap_s = 5

[providers.a]
base_url = "sim://a"
models = ["gpt-4.1"]
default_model = "gpt-4.1"

[providers.b]
base_url = "sim://b"
models = ["gpt-4.1"]
default_model = "gpt-4.1"

[providers.fb]
base_url = "sim://fb"
models = ["claude-sonnet-4-20250514"]
default_model = "claude-sonnet-4-20250514"

[providers.cw]
base_url = "sim://cw"
models = ["gemini-2.5-flash"]
default_model = "gemini-2.5-flash"

[providers.cp]
base_url = "sim://cp"
models = ["deepseek-chat-v3.2"]
default_model = "deepseek-chat-v3.2"

[routes."gpt-4.1"]
strategy = "{strategy}"
# a is priced as claude (200k window, $18/M), b as deepseek (128k window, $0.70/M)
deployments = [
  {{ provider = "a", weight = 1, price_as = "claude-sonnet-4-20250514" }},
  {{ provider = "b", weight = 3, price_as = "deepseek-chat-v3.2" }},
]
fallbacks = ["claude-sonnet-4-20250514"]
context_window_fallbacks = ["gemini-2.5-flash"]
content_policy_fallbacks = ["deepseek-chat-v3.2"]
allowed_fails = {allowed_fails}
cooldown_s = {cooldown_s}

[routes."claude-sonnet-4-20250514"]
deployments = [{{ provider = "fb" }}]
allowed_fails = {fallback_fails}

[routes."gemini-2.5-flash"]
deployments = [{{ provider = "cw" }}]
allowed_fails = {fallback_fails}

[routes."deepseek-chat-v3.2"]
deployments = [{{ provider = "cp" }}]
allowed_fails = {fallback_fails}
"""


class Middle(Random):
    """Every draw 0.5: backoffs are half their cap, lowest_latency never explores, and the weighted
    order after its round-robin pick is by weight. The strategies' own state decides the order."""

    def random(self) -> float:
        return 0.5


def _prep_least_busy(core: RoutingCore) -> None:
    a = core.route_table.routes["gpt-4.1"].deployments[0]
    for _ in range(2):  # two requests of other callers in flight on a
        core.route_table.started(a, 0.0, 10)


def _prep_lowest_latency(core: RoutingCore) -> None:
    a, b = core.route_table.routes["gpt-4.1"].deployments
    core.route_table.finished(a, 0.0, health=True, cooldown_s=30, allowed_fails=2, latency_ms=180.0)
    core.route_table.finished(b, 0.0, health=True, cooldown_s=30, allowed_fails=2, latency_ms=420.0)


# strategy -> (what sets its state, the order it then tries a and b in, how its reason starts)
STRATEGIES = {
    "weighted": (None, ("b", "a"), "weighted: 3 of 4"),  # smooth round-robin: b (3) before a (1)
    "ordered": (None, ("a", "b"), "ordered: priority 1"),
    "least_busy": (_prep_least_busy, ("b", "a"), "least_busy: in flight b 0, a 2"),
    "lowest_latency": (_prep_lowest_latency, ("a", "b"), "lowest_latency: a 180 ms < b 420 ms"),
    "cheapest": (None, ("b", "a"), "cheapest: b $0.7/M < a $18/M"),
}
DEPLOYMENT = {"a": "a/gpt-4.1", "b": "b/gpt-4.1"}
FB, CW, CP = "fb/claude-sonnet-4-20250514", "cw/gemini-2.5-flash", "cp/deepseek-chat-v3.2"


def route_core(tmp_path, strategy: str, *, allowed_fails: int = ALLOWED_FAILS) -> tuple[RoutingCore, list[float]]:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(
        ROUTE_TOML.format(
            strategy=strategy,
            max_attempts=ROUTE_MAX_ATTEMPTS,
            allowed_fails=allowed_fails,
            cooldown_s=COOLDOWN_S,
            fallback_fails=FALLBACK_ALLOWED_FAILS,
        )
    )
    settings = load_settings(cfg, env={"DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}"})
    now = [1000.0]
    core = RoutingCore(
        settings,
        telemetry=Sink(),
        ratio=FixedRatio(1.0),
        clock=lambda: now[0],
        wall_clock=lambda: 1.7e9 + now[0],
        rng=Middle(),
        source="test",
        env={},
        secrets={},
        classify=not_called,
        new_lock=nullcontext,
    )
    prep = STRATEGIES[strategy][0]
    if prep is not None:
        prep(core)
    return core, now


def drive_route(
    core: RoutingCore, now: list[float], outcome, text: str = "hi"
) -> tuple[list[str], NoRoute | None, list]:
    """One request to route gpt-4.1, driven as a driver drives it: ``outcome(deployment key)``
    gives each attempt's Failure (None: it answered), which is recorded (core.record) before the
    loop hears it. Returns the steps (a deployment key per attempt, ``"wait"`` per backoff), how
    it ended, and the request's rows."""
    plan = core.plan("chat", {"messages": [{"role": "user", "content": text}]}, RouteOptions(model="gpt-4.1"))
    core.start(plan)
    steps = core.attempts(plan)
    seen: list[str] = []
    stop = None
    try:
        step = next(steps)
        while True:
            if isinstance(step, Wait):
                assert step.seconds > 0
                now[0] += step.seconds
                seen.append("wait")
                step = steps.send(None)
                continue
            assert isinstance(step, Attempt) and step.target is not None
            key = step.target.deployment.key
            seen.append(key)
            attempt = step.begin(1.7e9 + now[0], now[0])
            now[0] += 0.01
            failure = outcome(key)
            if failure is None:
                core.record(plan, attempt, final=True)
            else:
                failure = core.record(plan, attempt, failure=failure)
            step = steps.send(failure)
    except StopIteration:
        pass
    except NoRoute as exc:
        stop = exc
        core.no_route(plan, exc)
    core.commit(plan)
    return seen, stop, plan.records


def retried_steps(key: str, failure: Failure) -> list[str]:
    """A retryable failure on one deployment of gpt-4.1: retried with a backoff until it has
    failed ROUTE_MAX_ATTEMPTS times, or (a health failure) ALLOWED_FAILS times in a row, which puts
    it out: the next deployment then, with no wait for a retry that would not be made."""
    tries = ALLOWED_FAILS if failure.provider_health else ROUTE_MAX_ATTEMPTS
    return [s for _ in range(tries) for s in (key, "wait")][:-1]


def fallback_steps(key: str, failure: Failure) -> list[str]:
    return [s for _ in range(ROUTE_MAX_ATTEMPTS) for s in (key, "wait")][:-1]


def fails(failure: Failure | None, *, except_on: tuple[str, ...] = (), then: Failure | None = None):
    """``failure`` on every deployment but those of ``except_on``, which get ``then``."""
    return lambda key: then if key in except_on else failure


def _in_flight(core: RoutingCore) -> list[int]:
    return [core.route_table.stat(d).in_flight for d in core.route_table.routes["gpt-4.1"].deployments]


def _health_left(core: RoutingCore, short: str):
    d = core.route_table.routes["gpt-4.1"].deployments[0 if short == "a" else 1]
    s = core.route_table.stat(d)
    return s.fails_in_row, s.cooling_until > 0


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("failure", RETRIED, ids=_id)
def test_route_retryable_failure_every_strategy(tmp_path, strategy: str, failure: Failure) -> None:
    core, now = route_core(tmp_path, strategy)
    _, (first, second), why = STRATEGIES[strategy]
    in_flight = _in_flight(core)
    seen, stop, rows = drive_route(core, now, fails(failure))
    expected = retried_steps(DEPLOYMENT[first], failure) + retried_steps(DEPLOYMENT[second], failure)
    expected += fallback_steps(FB, failure)
    assert seen == expected
    assert stop is not None and stop.error_class == "no_route"
    # What is recorded: one row per attempt, each naming its route, deployment and why, and the
    # last one closing the request.
    assert [r.deployment for r in rows] == [s for s in seen if s != "wait"]
    assert all(r.status == "error" and r.error_class == failure.error_class for r in rows)
    assert {r.route for r in rows if not r.fallback} == {"gpt-4.1"}
    assert {r.route for r in rows if r.fallback} == {"claude-sonnet-4-20250514"}
    assert rows[0].route_why.startswith(why)
    assert all(r.route_why.startswith("fallback: weighted: 1 of 1") for r in rows if r.fallback)
    assert [r.final for r in rows] == [False] * (len(rows) - 1) + [True]
    # Health: a health failure puts both deployments out for cooldown_s; another (409) says nothing.
    for short in "ab":
        assert _health_left(core, short) == ((0, True) if failure.provider_health else (0, False))
    fb = core.route_table.stat(core.route_table.routes["claude-sonnet-4-20250514"].deployments[0])
    assert fb.fails_in_row == (ROUTE_MAX_ATTEMPTS if failure.provider_health else 0) and fb.cooling_until == 0
    # Attempts in flight went up and down again, even though the request ended in NoRoute.
    assert _in_flight(core) == in_flight


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("failure", FAILED_OVER, ids=_id)
def test_route_failure_fails_over_at_once_every_strategy(tmp_path, strategy: str, failure: Failure) -> None:
    core, now = route_core(tmp_path, strategy)
    _, (first, second), _ = STRATEGIES[strategy]
    seen, stop, rows = drive_route(core, now, fails(failure))
    assert seen == [DEPLOYMENT[first], DEPLOYMENT[second], FB]
    assert stop is not None and stop.error_class == "no_route"
    assert [(r.deployment, r.fallback, r.error_class) for r in rows] == [
        (DEPLOYMENT[first], False, failure.error_class),
        (DEPLOYMENT[second], False, failure.error_class),
        (FB, True, failure.error_class),
    ]
    # One failure in a row is below allowed_fails: nobody cools; only a health class counts it.
    for short in "ab":
        assert _health_left(core, short) == (int(failure.provider_health), False)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("failure", REFUSED, ids=_id)
def test_route_request_fault_stops_at_the_first_deployment_every_strategy(
    tmp_path, strategy: str, failure: Failure
) -> None:
    core, now = route_core(tmp_path, strategy)
    _, (first, _second), _ = STRATEGIES[strategy]
    seen, stop, rows = drive_route(core, now, fails(failure))
    assert seen == [DEPLOYMENT[first]]
    assert stop is not None and stop.error_class is None and str(stop) == f"request refused by {first}"
    assert [(r.deployment, r.error_class, r.final) for r in rows] == [(DEPLOYMENT[first], failure.error_class, True)]
    for short in "ab":  # the request's own fault and the gateway's saturation never count
        assert _health_left(core, short) == (0, False)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("failure", RETRIED + FAILED_OVER, ids=_id)
def test_route_second_deployment_answering_ends_the_loop_every_strategy(
    tmp_path, strategy: str, failure: Failure
) -> None:
    core, now = route_core(tmp_path, strategy)
    _, (first, second), _ = STRATEGIES[strategy]
    seen, stop, rows = drive_route(core, now, fails(failure, except_on=(DEPLOYMENT[second],)))
    retried = failure in RETRIED  # FAILED_OVER holds a 429 whose Retry-After is beyond the cap
    tried_first = retried_steps(DEPLOYMENT[first], failure) if retried else [DEPLOYMENT[first]]
    assert stop is None and seen == [*tried_first, DEPLOYMENT[second]]
    assert rows[-1].deployment == DEPLOYMENT[second] and rows[-1].status == "ok" and rows[-1].final
    assert not any(r.fallback for r in rows)


# The fallback kinds: which refusal sends the request where.
CONTEXT = status_failure(400, "This model's maximum context length is 128000 tokens", detail="")
CONTENT = status_failure(400, "The response was filtered due to the prompt triggering content_filter")
ALL_FAILED = status_failure(503, "busy")
KINDS = {  # what the first deployment answers -> where the request goes next, skipping the second
    "context_window": (CONTEXT, CW, "gemini-2.5-flash"),
    "content_policy": (CONTENT, CP, "deepseek-chat-v3.2"),
}


def test_the_kind_markers_are_request_faults_the_loop_would_otherwise_stop_on() -> None:
    for failure in (CONTEXT, CONTENT):
        assert failure.error_class == "bad_request" and not failure.fallback and not failure.provider_health


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_refusal_of_its_kind_goes_to_that_kinds_fallbacks_every_strategy(tmp_path, strategy: str, kind: str) -> None:
    core, now = route_core(tmp_path, strategy)
    _, (first, _second), _ = STRATEGIES[strategy]
    refusal, target, route = KINDS[kind]
    seen, stop, rows = drive_route(core, now, fails(refusal, except_on=(target,)))
    # the second deployment is not asked: it would refuse the same prompt for the same reason
    assert stop is None and seen == [DEPLOYMENT[first], target]
    assert [(r.deployment, r.route, r.fallback, r.status) for r in rows] == [
        (DEPLOYMENT[first], "gpt-4.1", False, "error"),
        (target, route, True, "ok"),
    ]
    assert rows[1].route_why == "fallback: weighted: 1 of 1"
    assert _health_left(core, first) == (0, False)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_refusal_of_its_kind_after_a_health_failure_every_strategy(tmp_path, strategy: str, kind: str) -> None:
    core, now = route_core(tmp_path, strategy)
    _, (first, second), _ = STRATEGIES[strategy]
    refusal, target, _route = KINDS[kind]
    outcomes = {DEPLOYMENT[first]: ALL_FAILED, DEPLOYMENT[second]: refusal, target: None}
    seen, stop, _ = drive_route(core, now, outcomes.__getitem__)
    assert stop is None
    assert seen == [DEPLOYMENT[first], "wait", DEPLOYMENT[first], DEPLOYMENT[second], target]
    assert _health_left(core, first) == (0, True) and _health_left(core, second) == (0, False)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_kind_fallback_refusing_too_ends_the_request_every_strategy(tmp_path, strategy: str, kind: str) -> None:
    core, now = route_core(tmp_path, strategy)
    _, (first, _second), _ = STRATEGIES[strategy]
    refusal, target, _route = KINDS[kind]
    seen, stop, rows = drive_route(core, now, fails(refusal))
    assert seen == [DEPLOYMENT[first], target]  # the kind's own fallbacks are empty: no further
    assert stop is not None and stop.error_class is None
    # named: the last upstream that refused it, the kind's fallback
    assert str(stop) == f"request refused by {target.split('/')[0]}, and no fallback of its kind served it"
    assert [r.final for r in rows] == [False, True]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_deployment_failing_goes_down_the_ordered_fallbacks_every_strategy(tmp_path, strategy: str) -> None:
    core, now = route_core(tmp_path, strategy)
    _, (first, second), _ = STRATEGIES[strategy]
    seen, stop, rows = drive_route(core, now, fails(ALL_FAILED, except_on=(FB,)))
    assert stop is None
    assert seen == retried_steps(DEPLOYMENT[first], ALL_FAILED) + retried_steps(DEPLOYMENT[second], ALL_FAILED) + [FB]
    assert (rows[-1].deployment, rows[-1].route, rows[-1].fallback, rows[-1].status) == (
        FB, "claude-sonnet-4-20250514", True, "ok",
    )  # fmt: skip


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_prompt_no_deployment_can_hold_goes_to_the_context_window_fallbacks_unsent(tmp_path, strategy: str) -> None:
    core, now = route_core(tmp_path, strategy)
    long_prompt = "x" * (4 * 250_000)  # ~250k tokens: over a's 200k window and b's 128k
    seen, stop, rows = drive_route(core, now, fails(None), text=long_prompt)
    assert stop is None and seen == [CW]
    assert [(r.deployment, r.fallback) for r in rows] == [(CW, True)]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_prompt_only_one_deployment_holds_skips_the_other(tmp_path, strategy: str) -> None:
    core, now = route_core(tmp_path, strategy)
    medium = "x" * (4 * 150_000)  # ~150k tokens: fits a's 200k window, not b's 128k
    seen, stop, _ = drive_route(core, now, fails(ALL_FAILED, except_on=(FB,)), text=medium)
    assert stop is None and seen == [*retried_steps(DEPLOYMENT["a"], ALL_FAILED), FB]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_cooled_deployment_sits_out_the_next_request_then_comes_back_every_strategy(tmp_path, strategy: str) -> None:
    core, now = route_core(tmp_path, strategy)
    _, (first, second), _ = STRATEGIES[strategy]
    seen, stop, _ = drive_route(core, now, fails(ALL_FAILED, except_on=(DEPLOYMENT[second],)))
    assert stop is None and seen == [DEPLOYMENT[first], "wait", DEPLOYMENT[first], DEPLOYMENT[second]]
    cooled_at = now[0]
    seen, stop, rows = drive_route(core, now, fails(None))
    assert seen == [DEPLOYMENT[second]]  # the first choice is cooling: not asked at all
    assert stop is None and [(r.deployment, r.status, r.fallback) for r in rows] == [(DEPLOYMENT[second], "ok", False)]
    now[0] = cooled_at + COOLDOWN_S + 1  # its cooldown is over
    seen, stop, _ = drive_route(core, now, fails(status_failure(401, "bad key")))
    assert set(seen[:2]) == {DEPLOYMENT["a"], DEPLOYMENT["b"]} and seen[2:] == [FB]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_with_both_deployments_cooling_the_route_goes_straight_to_its_fallbacks(tmp_path, strategy: str) -> None:
    core, now = route_core(tmp_path, strategy)
    drive_route(core, now, fails(ALL_FAILED))  # both deployments of gpt-4.1 cool down (and fb fails)
    seen, stop, rows = drive_route(core, now, fails(None))
    assert stop is None and seen == [FB] and rows[0].fallback
