"""What a failed attempt means for the router: retry it, fall back, resend without hints, or stop.

This is the single table of the retry and fallback policy:

| cause                                   | retry same provider | fall back |
|-----------------------------------------|---------------------|-----------|
| 408, 409, 429, 5xx, timeout, connection | yes (backoff)       | yes       |
| malformed / invalid response body       | yes (backoff)       | yes       |
| 401, 403 (auth), key not configured     | no                  | yes       |
| 404 (model not served there)            | no                  | yes       |
| 400 rejecting the cache hints           | once, without hints | -         |
| 400, 413, 422 and other 4xx             | no                  | no        |
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx2
import openai

from app.config import ProviderNotConfigured
from core.errors import UpstreamError

RETRYABLE_STATUS = frozenset({408, 409, 429})
REQUEST_FAULT_STATUS = frozenset({400, 413, 422})


@dataclass(frozen=True)
class Failure:
    error_class: str  # short machine name: timeout, connection, rate_limited, server_error, ...
    message: str
    http_status: int | None = None
    retryable: bool = False
    fallback: bool = False
    hint_rejection: bool = False
    retry_after_s: float | None = None

    def describe(self) -> str:
        status = f" {self.http_status}" if self.http_status else ""
        return f"{self.error_class}{status}: {self.message}"


class StreamBrokenError(UpstreamError):
    """A streamed answer failed after text had been delivered; the answer is incomplete."""


def retry_after_seconds(headers: httpx2.Headers | None) -> float | None:
    """The server's requested wait: ``retry-after-ms`` first (more precise), then ``retry-after``."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        try:
            return max(float(value), 0.0)
        except ValueError:
            # An HTTP date is allowed too; treat it as "unknown" rather than guess a clock skew.
            return None
    return None


def _error_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(exc.message)


def _is_hint_rejection(exc: openai.APIStatusError) -> bool:
    text = json.dumps(exc.body, default=str).lower() if exc.body is not None else str(exc.message).lower()
    return any(marker in text for marker in ("x-session-id", "x-cache-controls", "cache hint", "cache_hint"))


def classify(exc: BaseException, *, sent_hints: bool) -> Failure:
    if isinstance(exc, ProviderNotConfigured):
        return Failure("not_configured", str(exc), fallback=True)
    if isinstance(exc, openai.APITimeoutError):
        return Failure("timeout", "no answer before the timeout", retryable=True, fallback=True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f"{type(cause).__name__}: {cause}" if cause else str(exc)
        return Failure("connection", detail, retryable=True, fallback=True)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        msg = _error_message(exc)
        if status == 400 and sent_hints and _is_hint_rejection(exc):
            return Failure("cache_hints_rejected", msg, status, hint_rejection=True)
        if status in RETRYABLE_STATUS or status >= 500:
            name = {408: "request_timeout", 409: "conflict", 429: "rate_limited"}.get(status, "server_error")
            return Failure(
                name,
                msg,
                status,
                retryable=True,
                fallback=True,
                retry_after_s=retry_after_seconds(exc.response.headers),
            )
        if status in (401, 403):
            return Failure("auth", msg, status, fallback=True)
        if status == 404:
            return Failure("not_found", msg, status, fallback=True)
        return Failure("bad_request", msg, status)
    if isinstance(exc, (openai.APIResponseValidationError, json.JSONDecodeError, ValueError)):
        return Failure("bad_response", f"malformed response from upstream: {exc}", retryable=True, fallback=True)
    if isinstance(exc, (httpx2.TransportError, OSError)):
        return Failure("connection", f"{type(exc).__name__}: {exc}", retryable=True, fallback=True)
    if isinstance(exc, openai.APIError):
        return Failure("api_error", str(exc), retryable=True, fallback=True)
    raise exc
