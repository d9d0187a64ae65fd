"""Which failure an exception of the HTTP client, the SDK or the gateway's own I/O stands for.

The exceptions are the I/O layer's (``httpx2``'s timeouts and transport errors, the SDK's status
errors, a full connection pool); the meanings are the core's single table
(:mod:`app.routing.errors`: :func:`~app.routing.errors.status_failure` and its data). Both drivers
hand the core this function, so the core itself never sees a client library.
"""

from __future__ import annotations

import json
from dataclasses import replace

import httpx2
import openai

from app.config import ProviderNotConfigured
from app.routing.errors import (
    GATEWAY_OVERLOADED,
    BadResponse,
    Failure,
    error_fields,
    error_object,
    retry_after_seconds,
    status_failure,
)
from app.routing.io.pool import PoolSaturated


def classify(exc: BaseException, *, sent_hints: bool) -> Failure:
    """The failure an exception from the SDK, the transport or response validation stands for.

    Anything else (a plain ``ValueError``/``TypeError``/``AttributeError`` from our own code) is
    re-raised: a bug of ours must surface, not be retried against an innocent provider."""
    if isinstance(exc, ProviderNotConfigured):
        return Failure("not_configured", str(exc), fallback=True)
    if isinstance(exc, PoolSaturated):
        # The gateway's own saturation: no retry, no fallback, nothing told to the breaker (not a
        # health class); the caller gets 503 gateway_overloaded with Retry-After.
        return Failure(GATEWAY_OVERLOADED, str(exc), retry_after_s=exc.retry_after_s)
    if isinstance(exc, BadResponse):
        return Failure("bad_response", str(exc), retryable=True, fallback=True)
    if isinstance(exc, openai.APITimeoutError):
        cause = exc.__cause__ or exc.__context__
        detail = str(cause) if isinstance(cause, httpx2.TimeoutException) and str(cause) else "no answer in time"
        return Failure("timeout", detail, retryable=True, fallback=True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, BadResponse):  # raised by our transport while the SDK read the body
            return Failure("bad_response", str(cause), retryable=True, fallback=True)
        detail = f"{type(cause).__name__}: {cause}" if cause else str(exc)
        return Failure("connection", detail, retryable=True, fallback=True)
    if isinstance(exc, openai.APIStatusError):
        message, detail = error_fields(exc.body, str(exc.message))
        failure = status_failure(
            exc.status_code,
            message,
            detail=detail,
            sent_hints=sent_hints,
            retry_after_s=retry_after_seconds(exc.response.headers),
        )
        return replace(failure, body=error_object(exc.body))
    if isinstance(exc, (openai.APIResponseValidationError, json.JSONDecodeError)):
        # The SDK raises a raw JSONDecodeError for a 200 whose JSON body does not parse.
        return Failure("bad_response", f"malformed response from upstream: {exc}", retryable=True, fallback=True)
    if isinstance(exc, httpx2.TimeoutException):
        return Failure("timeout", str(exc) or "no answer in time", retryable=True, fallback=True)
    if isinstance(exc, httpx2.TransportError):
        return Failure("connection", f"{type(exc).__name__}: {exc}", retryable=True, fallback=True)
    if isinstance(exc, openai.APIError):
        return Failure("api_error", str(exc), retryable=True, fallback=True)
    raise exc
