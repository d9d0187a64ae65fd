"""The client's exceptions as the core's failure classes (app.routing.io.classify): each exception
the HTTP client, the SDK or the gateway's own I/O raises maps to the class the policy table names,
and an exception of our own code is raised, never retried."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from app.config import ProviderNotConfigured
from app.routing.errors import GATEWAY_OVERLOADED, BadResponse
from app.routing.io.classify import classify
from app.routing.io.deadline import DeadlineExceeded
from app.routing.io.pool import PoolSaturated

REQUEST = httpx2.Request("POST", "http://upstream.test/v1/chat/completions")


def status_error(status: int, body: object, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    response = httpx2.Response(status, json=body, headers=headers, request=REQUEST)
    return openai.OpenAI(api_key="k", base_url="http://upstream.test/v1")._make_status_error_from_response(response)


def timeout_error() -> openai.APITimeoutError:
    try:
        raise openai.APITimeoutError(request=REQUEST) from httpx2.ReadTimeout("read timed out")
    except openai.APITimeoutError as exc:
        return exc


def connection_error(cause: BaseException) -> openai.APIConnectionError:
    try:
        raise openai.APIConnectionError(request=REQUEST) from cause
    except openai.APIConnectionError as exc:
        return exc


CASES = [
    (ProviderNotConfigured("p", "P_KEY"), "not_configured", False, True),
    (PoolSaturated("p", 8, 0.5), GATEWAY_OVERLOADED, False, False),
    (BadResponse("not a completion"), "bad_response", True, True),
    (timeout_error(), "timeout", True, True),
    (connection_error(httpx2.ConnectError("refused")), "connection", True, True),
    (connection_error(BadResponse("too large")), "bad_response", True, True),
    (status_error(500, {"error": {"message": "boom"}}), "server_error", True, True),
    (status_error(503, {"error": {"message": "busy"}}), "server_error", True, True),
    (status_error(429, {"error": {"message": "slow down"}}), "rate_limited", True, True),
    (status_error(429, {"error": {"message": "no", "code": "insufficient_quota"}}), "quota", False, True),
    (status_error(401, {"error": {"message": "bad key"}}), "auth", False, True),
    (status_error(404, {"error": {"message": "no such model"}}), "not_found", False, True),
    (status_error(400, {"error": {"message": "Invalid model name passed"}}), "model_not_served", False, True),
    (status_error(400, {"error": {"message": "context length exceeded"}}), "bad_request", False, False),
    (status_error(422, {"error": {"message": "bad param"}}), "bad_request", False, False),
    (openai.APIResponseValidationError(httpx2.Response(200, request=REQUEST), None), "bad_response", True, True),
    (json.JSONDecodeError("Expecting value", "<html>", 0), "bad_response", True, True),
    (DeadlineExceeded("the attempt's deadline passed"), "timeout", True, True),
    (httpx2.ReadTimeout("stalled"), "timeout", True, True),
    (httpx2.RemoteProtocolError("cut short"), "connection", True, True),
    (openai.APIError("stream error", REQUEST, body=None), "api_error", True, True),
]


@pytest.mark.parametrize(("exc", "error_class", "retryable", "fallback"), CASES, ids=lambda v: type(v).__name__)
def test_each_exception_has_its_failure_class(exc, error_class, retryable, fallback) -> None:
    failure = classify(exc, sent_hints=False)
    assert (failure.error_class, failure.retryable, failure.fallback) == (error_class, retryable, fallback)


def test_a_status_error_keeps_its_status_retry_after_and_error_object() -> None:
    failure = classify(status_error(429, {"error": {"message": "wait"}}, {"retry-after-ms": "1500"}), sent_hints=False)
    assert (failure.http_status, failure.retry_after_s) == (429, 1.5)
    assert failure.body == {"error": {"message": "wait"}}


def test_a_hint_rejection_is_told_apart_only_when_hints_were_sent() -> None:
    exc = status_error(400, {"error": {"message": "unknown header x-session-id"}})
    assert classify(exc, sent_hints=True).hint_rejection
    assert classify(exc, sent_hints=False).error_class == "bad_request"


def test_the_pool_saturation_failure_carries_the_wait_as_retry_after() -> None:
    assert classify(PoolSaturated("p", 8, 2.2), sent_hints=False).retry_after_s == 3


@pytest.mark.parametrize("exc", [ValueError("our bug"), TypeError("ours"), KeyError("ours")])
def test_our_own_bugs_are_raised_not_classified(exc) -> None:
    with pytest.raises(type(exc)):
        classify(exc, sent_hints=False)
