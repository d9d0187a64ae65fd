"""The gateway's error hierarchy: one base, :class:`GatewayError`, so the CLI and the pages catch
one type, and a few kinds under it that say what the caller should do.

The concrete errors live beside the code that raises them (``app.config.ConfigError``,
``app.catalog.UnknownModelError``, ``app.routing.AllRoutesFailed``, ``db.canary.StaleCanaryError``,
...) and derive from one of these. Errors about the caller's input are also ``ValueError`` and
the others ``RuntimeError``, as they were before the hierarchy existed, so ``except ValueError``
in existing callers keeps working.
"""

from __future__ import annotations

# Failure classes that say something about the provider's health: they count in its circuit breaker
# and in the canary guardrail; the others (the caller went away, a request refused for its own
# content, the gateway's own pool saturated) count in neither.
HEALTH_CLASSES = frozenset(
    {"timeout", "connection", "server_error", "rate_limited", "request_timeout", "bad_response", "redirect",
     "stream_broken", "api_error"}
)  # fmt: skip


class GatewayError(Exception):
    """Any error the gateway raises on purpose, phrased for the operator."""


class InvalidRequest(GatewayError, ValueError):
    """The caller's input is wrong (a message, a model name, a ratio, a setting): fix it and retry."""


class ConfigurationError(GatewayError):
    """The gateway's configuration (file, environment, secrets) is wrong or incomplete."""


class ConflictError(GatewayError, RuntimeError):
    """Someone else changed the same thing first; nothing was written: reload and try again."""


class UpstreamError(GatewayError, RuntimeError):
    """The upstream providers could not produce a (complete) answer."""
