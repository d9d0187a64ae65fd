"""The routing decisions as pure functions (app.routing.policy, app.routing.errors): no I/O, no clock."""

from __future__ import annotations

import pytest

from app.routing.errors import Failure, status_failure
from app.routing.policy import (
    Deadline,
    attempt_budget_s,
    breaker_outcome,
    max_attempts_for,
    next_step,
    wants_retry,
)

RETRYABLE = Failure("server_error", "boom", 503, retryable=True, fallback=True)
ROUTE = Failure("auth", "no", 401, fallback=True)
REQUEST = Failure("bad_request", "too long", 400)


def step(failure: Failure, **kw):
    args = {
        "attempts_made": 1,
        "max_attempts": 3,
        "hints_dropped": False,
        "retry_after_cap_s": 10.0,
        "delay_s": 0.5,
        "remaining_s": 100.0,
    }
    args.update(kw)
    return next_step(failure, **args)


def test_retryable_failure_retries_with_the_drawn_delay_until_attempts_run_out():
    assert step(RETRYABLE).action == "retry" and step(RETRYABLE).delay_s == 0.5
    assert step(RETRYABLE, attempts_made=3).action == "fail_over"


def test_route_failure_fails_over_and_request_failure_stops():
    assert step(ROUTE).action == "fail_over"
    assert step(REQUEST).action == "stop"


def test_retry_after_beyond_the_cap_fails_over_at_once():
    f = Failure("rate_limited", "slow down", 429, retryable=True, fallback=True, retry_after_s=3600)
    s = step(f)
    assert s.action == "fail_over" and "Retry-After" in s.reason
    assert not wants_retry(f, 1, 3, 10.0)
    within = Failure("rate_limited", "slow down", 429, retryable=True, fallback=True, retry_after_s=2)
    assert wants_retry(within, 1, 3, 10.0) and step(within).action == "retry"


def test_a_retry_that_would_outlast_the_request_deadline_fails_over():
    s = step(RETRYABLE, delay_s=5.0, remaining_s=4.0)
    assert s.action == "fail_over" and "deadline" in s.reason
    assert step(RETRYABLE, delay_s=None).action == "fail_over"  # the total wait budget is spent


def test_hint_rejection_resends_once_without_hints():
    f = Failure("cache_hints_rejected", "unsupported header x-session-id", 400, hint_rejection=True)
    assert step(f).action == "resend_without_hints"
    assert step(f, hints_dropped=True).action == "stop"


def test_deadline_arithmetic():
    d = Deadline.after(100.0, 30.0)
    assert d.remaining(110.0) == 20.0 and not d.passed(129.9) and d.passed(130.0)
    assert attempt_budget_s(45.0, d.remaining(110.0)) == 20.0
    assert attempt_budget_s(5.0, 20.0) == 5.0
    assert attempt_budget_s(5.0, -1.0) == 0.0


def test_per_provider_attempts_override_the_default():
    assert max_attempts_for(None, 3) == 3
    assert max_attempts_for(1, 3) == 1


def test_only_provider_health_failures_count_against_the_breaker():
    assert breaker_outcome(None) is True
    assert breaker_outcome(RETRYABLE) is False
    assert breaker_outcome(Failure("bad_response", "html", retryable=True, fallback=True)) is False
    assert breaker_outcome(REQUEST) is None
    assert breaker_outcome(ROUTE) is None
    assert breaker_outcome(Failure("cancelled", "caller left")) is None


@pytest.mark.parametrize(
    ("status", "message", "cls", "retryable", "fallback"),
    [
        (301, "", "redirect", False, True),
        (307, "", "redirect", False, True),
        (500, "oops", "server_error", True, True),
        (503, "busy", "server_error", True, True),
        (429, "Rate limit reached", "rate_limited", True, True),
        (429, "You exceeded your current quota insufficient_quota", "quota", False, True),
        (402, "payment required", "quota", False, True),
        (401, "Incorrect API key", "auth", False, True),
        (403, "forbidden", "auth", False, True),
        (404, "The model does not exist", "not_found", False, True),
        (400, "litellm.BadRequestError: Invalid model name passed in model=x", "model_not_served", False, True),
        (400, "No connected db.", "gateway_misconfigured", False, True),
        (400, "model_not_found", "not_found", False, True),
        (400, "This model's maximum context length is 128000 tokens", "bad_request", False, False),
        (400, "Invalid value for 'temperature'", "bad_request", False, False),
        (400, "Your request was rejected by the content policy", "bad_request", False, False),
        (413, "payload too large", "bad_request", False, False),
        (422, "unprocessable", "bad_request", False, False),
    ],
)
def test_status_table(status, message, cls, retryable, fallback):
    f = status_failure(status, message)
    assert (f.error_class, f.retryable, f.fallback, f.http_status) == (cls, retryable, fallback, status)


def test_hint_rejection_only_when_hints_were_sent():
    text = "unsupported header: x-session-id"
    assert status_failure(400, text, sent_hints=True).hint_rejection
    assert not status_failure(400, text, sent_hints=False).hint_rejection


def test_retry_after_is_kept_only_where_a_retry_may_follow():
    assert status_failure(429, "slow", retry_after_s=2.0).retry_after_s == 2.0
    assert status_failure(401, "no", retry_after_s=2.0).retry_after_s is None
