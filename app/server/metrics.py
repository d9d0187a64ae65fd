"""Prometheus metrics of the gateway server: one :class:`GatewayMetrics` per server instance, each
with its own ``CollectorRegistry`` (never the process-global one, so tests and two servers in one
process do not share counters).

Drivers report plain values (``observe_attempt`` / ``observe_request`` or ``observe_record`` for an
attempt record), so the sync client, the async server and tests can all call it without importing
each other. Names follow Prometheus conventions (``_total`` counters, base units: seconds, USD) and
the OpenTelemetry GenAI semantic conventions where one fits: ``gen_ai_client_operation_duration_seconds``,
``gen_ai_client_token_usage``, ``gen_ai_server_time_to_first_token_seconds``, with the attributes
``gen_ai.system``, ``gen_ai.request.model``, ``gen_ai.operation.name``, ``gen_ai.token.type`` and
``error.type`` as the labels ``gen_ai_system``, ``gen_ai_request_model``, ``gen_ai_operation_name``,
``gen_ai_token_type``, ``error_type``. ``gen_ai_system`` holds the gateway's provider name.

Label values are bounded: providers and models outside the configured sets become ``other``, error
classes are sanitised and capped, key names are capped; session ids, request ids and keys never
appear in labels.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
OTHER = "other"
OPERATION = "chat"
MAX_ERROR_TYPES = 32
MAX_KEY_NAMES = 200

# OpenTelemetry GenAI's advisory buckets for gen_ai.client.operation.duration, with three finer ones
# in front: the gateway's own overhead and a loopback upstream answer in milliseconds.
DURATION_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
# OpenTelemetry GenAI's advisory buckets for gen_ai.server.time_to_first_token.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
# OpenTelemetry GenAI's advisory buckets for gen_ai.client.token.usage (powers of 4).
TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))

BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
KEY_DENIAL_REASONS = (
    "unauthorized",
    "model_not_allowed",
    "rate_limit_exceeded",
    "tokens_limit_exceeded",
    "budget_exceeded",
    "budget_reserved",  # the rest of the budget is held by the key's requests in flight (429, retry)
    "store_unavailable",  # the gateway's own database did not answer (503)
    "failed_keys_throttled",  # too many invalid keys from one client address (429)
)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")

# Every metric family this module registers, by its exposition name (counters without ``_total``,
# as the parser reports them). The alert rules and the Grafana dashboard are checked against it.
METRIC_NAMES = (
    "gateway_requests",
    "gateway_attempts",
    "gen_ai_client_operation_duration_seconds",
    "gen_ai_server_time_to_first_token_seconds",
    "gen_ai_client_token_usage",
    "gateway_tokens",
    "gateway_cost_usd",
    "gateway_fallbacks",
    "gateway_in_flight_requests",
    "gateway_canary_ratio",
    "gateway_circuit_breaker_state",
    "gateway_log_queue_depth",
    "gateway_log_journal_depth",
    "gateway_key_denials",
    "gateway_key_budget_used_ratio",
    "gateway_param_adjustments",
    "gateway_overload_refusals",
    "gateway_worker_info",
    "gateway_upstream_pool_connections",
    "gateway_upstream_pool_exhausted",
)


class _Bounded:
    """Maps free-form values onto a bounded label set: known values pass, the rest become ``other``."""

    def __init__(self, known: Iterable[str], *, open_slots: int = 0):
        self._known = set(known)
        self._open_slots = open_slots
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        if not value:
            return OTHER
        value = _UNSAFE.sub("_", value)[:64]
        if value in self._known:
            return value
        with self._lock:  # first-come values take the open slots; afterwards the set is fixed
            if value in self._known:
                return value
            if self._open_slots > 0:
                self._open_slots -= 1
                self._known.add(value)
                return value
        return OTHER


class GatewayMetrics:
    """The gateway's metrics in a registry of their own; render with :meth:`exposition`."""

    def __init__(
        self,
        *,
        providers: Iterable[str] = (),
        models: Iterable[str] = (),
        registry: CollectorRegistry | None = None,
        worker: int = 0,
    ):
        # The ``_created`` timestamp series double every counter's and histogram's series count and
        # nothing here queries them. The switch is process-wide in prometheus_client; a server
        # process is where it matters.
        disable_created_metrics()
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._provider = _Bounded(providers)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._model = _Bounded([*models, "auto"])
        self._error = _Bounded((), open_slots=MAX_ERROR_TYPES)
        self._key_name = _Bounded((), open_slots=MAX_KEY_NAMES)
        r = self.registry
        base = ["gen_ai_system", "gen_ai_request_model"]
        self.requests = Counter(
            "gateway_requests",
            "Requests answered by the gateway, by serving provider, requested model and outcome.",
            [*base, "status", "error_type"],
            registry=r,
        )
        self.attempts = Counter(
            "gateway_attempts",
            "Upstream attempts (retries and fallbacks included) by provider, model and outcome.",
            [*base, "status", "error_type"],
            registry=r,
        )
        self.duration = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "End-to-end duration of gateway requests as the caller sees them, retries included.",
            ["gen_ai_operation_name", *base, "status"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from request start to the first streamed token.",
            ["gen_ai_operation_name", *base],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.token_usage = Histogram(
            "gen_ai_client_token_usage",
            "Tokens per request by type (input, output), as OpenTelemetry GenAI records them.",
            ["gen_ai_operation_name", *base, "gen_ai_token_type"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "gateway_tokens",
            "Tokens served: prompt, cached (the part of the prompt read from the provider's cache), completion.",
            [*base, "token_type"],
            registry=r,
        )
        self.cost = Counter("gateway_cost_usd", "Spend in US dollars.", base, registry=r)
        self.fallbacks = Counter(
            "gateway_fallbacks", "Requests answered by the fallback route after the primary failed.", base, registry=r
        )
        self.in_flight = Gauge("gateway_in_flight_requests", "Requests being served right now.", registry=r)
        self.canary_ratio = Gauge(
            "gateway_canary_ratio", "Share of traffic sent to the primary (canary) provider, 0 to 1.", registry=r
        )
        self.breaker_state = Gauge(
            "gateway_circuit_breaker_state",
            "Circuit breaker per provider: 0 closed, 1 half-open, 2 open.",
            ["gen_ai_system"],
            registry=r,
        )
        self.log_queue_depth = Gauge(
            "gateway_log_queue_depth", "Request-log records waiting in memory for the database.", registry=r
        )
        self.log_journal_depth = Gauge(
            "gateway_log_journal_depth",
            "Request-log records spilled to the local journal, not yet replayed.",
            registry=r,
        )
        self.key_denials = Counter(
            "gateway_key_denials", "Requests refused for their gateway key, by reason.", ["reason"], registry=r
        )
        # Which worker process of `serve --workers N` answered this scrape (its number and pid).
        self.worker_info = Gauge("gateway_worker_info", "This server process: 1.", ["worker", "pid"], registry=r)
        self.worker_info.labels(str(worker), str(os.getpid())).set(1)
        self.overloads = Counter(
            "gateway_overload_refusals",
            "Requests refused with 503 gateway_overloaded: the process at [server] max_in_flight, or a provider's "
            "connection slots all busy past pool_timeout_s (never an upstream failure).",
            registry=r,
        )
        self.pool_connections = Gauge(
            "gateway_upstream_pool_connections",
            "Upstream connection slots per provider in this process: in_use, waiting (requests queued for one), "
            "limit (max_connections).",
            ["gen_ai_system", "state"],
            registry=r,
        )
        self.pool_exhausted = Counter(
            "gateway_upstream_pool_exhausted",
            "Requests whose wait for a provider's connection slot ran out (each answered 503 gateway_overloaded).",
            ["gen_ai_system"],
            registry=r,
        )
        self._pool_exhausted_seen: dict[str, int] = {}
        self.param_adjustments = Counter(
            "gateway_param_adjustments",
            "Request fields a provider's drop_params / rename_params removed or renamed, by provider and change.",
            ["provider", "change"],
            registry=r,
        )
        self.key_budget_used = Gauge(
            "gateway_key_budget_used_ratio",
            "Spend of a gateway key in its current budget period over its budget (1 = used up).",
            ["key_name", "period"],
            registry=r,
        )
        for reason in KEY_DENIAL_REASONS:
            self.key_denials.labels(reason)  # exported at 0, so rate() works before the first refusal
        for p in providers:
            self.breaker_state.labels(self._provider(p)).set(0)

    # ------------------------------------------------------------------------------------ observe

    def _labels(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, kept: prometheus_client checks the values and takes a lock on
        every lookup, and each request makes several. Every value passed here is bounded
        (:class:`_Bounded`), so the children kept are too; none is ever removed from its metric."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def observe_attempt(
        self,
        *,
        provider: str,
        model: str,
        status: str,
        error_class: str | None = None,
    ) -> None:
        """One upstream attempt (call once per attempt, including the final one)."""
        self._labels(
            self.attempts, self._provider(provider), self._model(model), _status(status), self._err(status, error_class)
        ).inc()

    def observe_request(
        self,
        *,
        provider: str,
        model: str,
        status: str,
        latency_s: float,
        error_class: str | None = None,
        ttft_s: float | None = None,
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
        completion_tokens: int = 0,
        cost_usd: float = 0.0,
        fallback: bool = False,
    ) -> None:
        """One finished request as the caller saw it (its final attempt's provider and model)."""
        p, m, st = self._provider(provider), self._model(model), _status(status)
        self._labels(self.requests, p, m, st, self._err(status, error_class)).inc()
        self._labels(self.duration, OPERATION, p, m, st).observe(max(0.0, latency_s))
        if ttft_s is not None:
            self._labels(self.ttft, OPERATION, p, m).observe(max(0.0, ttft_s))
        if st == "ok":
            self._labels(self.token_usage, OPERATION, p, m, "input").observe(prompt_tokens)
            self._labels(self.token_usage, OPERATION, p, m, "output").observe(completion_tokens)
        for kind, n in (("prompt", prompt_tokens), ("cached", cached_tokens), ("completion", completion_tokens)):
            if n > 0:
                self._labels(self.tokens, p, m, kind).inc(n)
        if cost_usd > 0:
            self._labels(self.cost, p, m).inc(cost_usd)
        if fallback:
            self._labels(self.fallbacks, p, m).inc()

    def observe_record(self, record: Any) -> None:
        """An attempt record (``AttemptRecord`` or anything with its field names, milliseconds for
        times): every record counts as an attempt, the final one also as the request."""
        self.observe_attempt(
            provider=record.provider, model=record.model, status=record.status, error_class=record.error_class
        )
        adjusted = getattr(record, "adjusted_params", None)
        if adjusted:
            provider = self._provider(record.provider)
            for change in adjusted.split(",")[:16]:
                self.param_adjustments.labels(provider, change[:64]).inc()
        if getattr(record, "final", True):
            ttft_ms = getattr(record, "ttft_ms", None)
            self.observe_request(
                provider=record.provider,
                model=record.model,
                status=record.status,
                error_class=record.error_class,
                latency_s=record.latency_ms / 1000.0,
                ttft_s=None if ttft_ms is None else ttft_ms / 1000.0,
                prompt_tokens=record.prompt_tokens,
                cached_tokens=record.cached_tokens,
                completion_tokens=record.completion_tokens,
                cost_usd=record.cost_usd,
                fallback=getattr(record, "fallback", False),
            )

    def observe_key_denial(self, reason: str) -> None:
        self.key_denials.labels(reason if reason in KEY_DENIAL_REASONS else OTHER).inc()

    def set_key_budget_used(self, key_name: str, period: str, ratio: float) -> None:
        self.key_budget_used.labels(self._key_name(key_name), period if period in ("day", "month") else OTHER).set(
            ratio
        )

    def set_canary_ratio(self, ratio: float) -> None:
        self.canary_ratio.set(ratio)

    def set_breaker_state(self, provider: str, state: str) -> None:
        if state not in BREAKER_STATES:
            raise ValueError(f"breaker state must be one of {sorted(BREAKER_STATES)}, got {state!r}")
        self.breaker_state.labels(self._provider(provider)).set(BREAKER_STATES[state])

    def set_pool(self, provider: str, *, in_use: int, waiting: int, limit: int, exhausted: int) -> None:
        """A provider's connection slots, as its pool counts them (``exhausted``: its running total)."""
        name = self._provider(provider)
        self.pool_connections.labels(name, "in_use").set(in_use)
        self.pool_connections.labels(name, "waiting").set(waiting)
        self.pool_connections.labels(name, "limit").set(limit)
        seen = self._pool_exhausted_seen.get(provider, 0)
        counter = self.pool_exhausted.labels(name)
        if exhausted > seen:
            counter.inc(exhausted - seen)
        self._pool_exhausted_seen[provider] = max(seen, exhausted)

    def set_log_depths(self, *, queue: int, journal: int) -> None:
        self.log_queue_depth.set(queue)
        self.log_journal_depth.set(journal)

    # ------------------------------------------------------------------------------------ render

    def exposition(self) -> bytes:
        """The Prometheus text format (serve with :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def _err(self, status: str, error_class: str | None) -> str:
        return "" if _status(status) == "ok" else self._error(error_class or "unknown")


def _status(status: str) -> str:
    return "ok" if status == "ok" else "error"
