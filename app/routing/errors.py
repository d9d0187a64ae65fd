"""What a failed attempt means for the router: retry it, fall back, resend without hints, or stop.

This is the single table of the retry and fallback policy (the data is :data:`STATUS_CLASSES` and
:data:`ROUTE_MARKERS` below; :mod:`app.routing.policy` turns a :class:`Failure` into the next step):

| cause                                               | class                | retry        | fall back |
|-----------------------------------------------------|----------------------|--------------|-----------|
| 408, 409, 429, 5xx, timeout, connection             | (by status) / timeout| yes, backoff | yes       |
| 429 whose Retry-After is beyond retry_after_cap_s   | rate_limited         | no           | at once   |
| 200 that is not a completion (HTML, array, no       | bad_response         | yes, backoff | yes       |
|   choices, no message, bad JSON, bad stream chunk)  |                      |              |           |
| 3xx (never followed: the key stays on its host)     | redirect             | no           | yes       |
| 401, 403 (auth), key not configured                 | auth, not_configured | no           | yes       |
| 402, 429 insufficient_quota (quota, billing)        | quota                | no           | yes       |
| 404 (model not found or not served there)           | not_found            | no           | yes       |
| 400 about the route: LiteLLM 'Invalid model name',  | model_not_served,    | no           | yes       |
|   'No connected db.', model_not_found, quota        | gateway_misconfigured|              |           |
| 400 rejecting the cache hints                       | cache_hints_rejected | once, no hints | -       |
| 400, 413, 422 and other 4xx about the request       | bad_request          | no           | no        |
|   (context length, invalid parameter, policy)       |                      |              |           |
| no connection slot free within pool_timeout_s       | gateway_overloaded   | no           | no (503)  |
| an exception from our own code                      | internal_error       | raised to the caller      |

Per-provider attempt counts: ``[providers.NAME] max_attempts`` (1 for a provider that is itself a
retrying gateway such as a LiteLLM proxy), else ``[retry] max_attempts``.

Sans I/O: this module reads plain data (a status, an error body, header values). Which exception
of the HTTP client or the SDK stands for which failure is :mod:`app.routing.io.classify`'s.

Failure texts here are raw upstream text; the client cleans them (:func:`core.text.clean`, keys
scrubbed) before they are stored, logged or shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from core.errors import HEALTH_CLASSES, GatewayError, UpstreamError

# status -> (error_class, retryable, fallback). 5xx and 3xx are ranges, handled in status_failure().
STATUS_CLASSES: dict[int, tuple[str, bool, bool]] = {
    401: ("auth", False, True),
    402: ("quota", False, True),
    403: ("auth", False, True),
    404: ("not_found", False, True),
    408: ("request_timeout", True, True),
    409: ("conflict", True, True),
    429: ("rate_limited", True, True),
}
SERVER_ERROR = ("server_error", True, True)
REDIRECT = ("redirect", False, True)
REQUEST_FAULT = ("bad_request", False, False)  # 400, 413, 422 and any other 4xx

# A 4xx (usually 400, or 429 for quota) whose message, code or type holds one of these (lower case)
# is about the route, not the request: the next provider may well serve the same request.
ROUTE_MARKERS: tuple[tuple[str, str], ...] = (
    ("invalid model name", "model_not_served"),  # LiteLLM proxy: the model is not in its model_list
    ("model_not_found", "not_found"),
    ("no connected db", "gateway_misconfigured"),  # LiteLLM proxy: virtual keys without a database
    ("no_db_connection", "gateway_misconfigured"),
    ("insufficient_quota", "quota"),
    ("billing_hard_limit", "quota"),
    ("invalid_api_key", "auth"),
)
HINT_MARKERS = ("x-session-id", "x-cache-controls", "cache hint", "cache_hint")

GATEWAY_OVERLOADED = "gateway_overloaded"  # every connection slot of the provider stayed busy


@dataclass(frozen=True)
class Failure:
    error_class: str  # short machine name: timeout, connection, rate_limited, server_error, ...
    message: str
    http_status: int | None = None
    retryable: bool = False
    fallback: bool = False
    hint_rejection: bool = False
    retry_after_s: float | None = None
    # The upstream's own error object (``{"error": {...}}``) when it refused with one: a request
    # fault reaches the caller with it (cleaned by the router first).
    body: dict | None = None

    def describe(self) -> str:
        status = f" {self.http_status}" if self.http_status else ""
        return f"{self.error_class}{status}: {self.message}"

    @property
    def provider_health(self) -> bool:
        """Whether this failure counts against the provider in its circuit breaker."""
        return self.error_class in HEALTH_CLASSES


class StreamBrokenError(UpstreamError):
    """A streamed answer failed after text had been delivered; the answer is incomplete."""


class BadResponse(UpstreamError):
    """An upstream answered 200 with something that is not a valid completion (or stream chunk)."""


class ClientClosedError(GatewayError, RuntimeError):
    """``chat()`` was called on a RoutingClient that is closing or closed."""


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """The server's requested wait: ``retry-after-ms`` first (more precise), then ``retry-after``.
    ``headers`` looks names up in lower case (an HTTP client's headers, or a plain dict of them)."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            value_ms = float(ms)
            if value_ms == value_ms:  # not NaN
                return max(value_ms / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        try:
            seconds = float(value)
            return max(seconds, 0.0) if seconds == seconds else None
        except ValueError:
            # An HTTP date is allowed too; treat it as "unknown" rather than guess a clock skew.
            return None
    return None


def error_fields(body: object, fallback_message: str) -> tuple[str, str]:
    """(message, lower-case text of message + code + type) from an OpenAI-style error body."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            message = str(inner.get("message") or fallback_message)
            extra = " ".join(str(inner.get(k) or "") for k in ("code", "type", "param"))
            return message, f"{message} {extra}".lower()
        if isinstance(inner, str) and inner:
            return inner, inner.lower()
    return fallback_message, fallback_message.lower()


def error_object(body: object) -> dict | None:
    """The OpenAI-shaped error object of an upstream's error body (the SDK hands over the inner
    ``error``), or None when it has none."""
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return {"error": inner}
    return None


def status_failure(
    status: int,
    message: str,
    *,
    detail: str = "",
    sent_hints: bool = False,
    retry_after_s: float | None = None,
) -> Failure:
    """The failure for an HTTP ``status`` with its error ``message`` (``detail``: lower-case message,
    code and type, for the marker table). Pure: the async driver uses it as it is."""
    detail = detail or message.lower()
    if 300 <= status < 400:
        name, retryable, fallback = REDIRECT
        return Failure(name, message or "redirect not followed", status, retryable, fallback)
    if status >= 500:
        name, retryable, fallback = SERVER_ERROR
        return Failure(name, message, status, retryable, fallback, retry_after_s=retry_after_s)
    if status == 400 and sent_hints and any(m in detail for m in HINT_MARKERS):
        return Failure("cache_hints_rejected", message, status, hint_rejection=True)
    if 400 <= status < 500 and status not in (401, 403, 404, 402):
        for marker, name in ROUTE_MARKERS:
            if marker in detail:
                return Failure(name, message, status, fallback=True)
    name, retryable, fallback = STATUS_CLASSES.get(status, REQUEST_FAULT)
    return Failure(name, message, status, retryable, fallback, retry_after_s=retry_after_s if retryable else None)
