"""RoutingClient: one chat call in, the canary split, intent routing, retries, fallback, cache hints,
streaming, cost and telemetry out.

Each provider is a real ``openai.OpenAI`` client with the SDK's own retries off (``max_retries=0``);
its ``httpx2.Client`` gets the transport it was handed (:func:`app.gateway.build_gateway` hands it
the built-in simulator's mock transport for ``sim://`` providers, or a test's transport), the
network otherwise. The retry and fallback policy lives here and in :mod:`app.routing.errors`; clock,
sleep and randomness are injectable so tests of timing take milliseconds. The request path does no
database I/O: the canary ratio is the last value the gateway's background refresher loaded, and the
attempt records go to the telemetry writer in one hand-off.

Incident behaviour (issue 7): every text from an upstream or a caller is cleaned once
(:func:`core.text.clean`, provider keys scrubbed) before it is stored, logged or shown; a 200 that
is not a completion is a ``bad_response`` failure; each attempt runs under a deadline enforced at
the transport (:mod:`app.routing.deadline`) and the whole request under ``request_deadline_s``; a
circuit breaker per provider skips a provider that is down. The decisions themselves are the pure
functions of :mod:`app.routing.policy`.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

import httpx2
import openai
from openai import RequestOptions
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice as CompletionChoice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from sqlalchemy import Engine

from app import catalog
from app.config import ProviderConfig, Settings, load_settings, lookup, resolve_api_key
from app.routing import deadline as deadlines
from app.routing.body_limit import BodyLimitTransport
from app.routing.breaker import BreakerPolicy, BreakerSnapshot, CircuitBreaker, State
from app.routing.canary import Side, assign_side
from app.routing.errors import BadResponse, ClientClosedError, Failure, StreamBrokenError, classify
from app.routing.intent import classify as classify_intent
from app.routing.intent import estimate_tokens, message_text
from app.routing.policy import Deadline, attempt_budget_s, breaker_outcome, max_attempts_for, next_step, wants_retry
from app.routing.result import AllRoutesFailed, AttemptInfo, ChatResult, Usage
from app.routing.retry import Backoff, attempt_timeout_s
from app.routing.substitution import Offer, Policy, decide, model_on
from core.errors import InvalidRequest
from core.records import AttemptRecord
from core.session import session_header_value, validate_session_id
from core.text import clean, storable

if TYPE_CHECKING:
    from app.gateway import Gateway

log = logging.getLogger(__name__)
VALID_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
PROMPT_STORE_LIMIT = 20_000
ERROR_TEXT_LIMIT = 500  # the width of request_log.error_message
MAX_SESSION_ID = 128  # the width of request_log.session_id
MAX_SOURCE = 32
NO_DEADLINE = Deadline(0.0, float("inf"))


def upstream_base_url(p: ProviderConfig) -> str:
    """Where the SDK sends a provider's requests: the simulator's in-process host for ``sim://``
    providers (its transport answers them), else the configured URL. Both drivers use this."""
    return f"http://{p.sim_name}.sim/v1" if p.is_simulated else p.base_url


class RatioSource(Protocol):
    """The canary ratio as last loaded (:class:`app.refresh.Refreshed`): a plain attribute read."""

    value: float

    def age_s(self) -> float: ...


class TelemetrySink(Protocol):
    """Where a request's attempt records go (:class:`app.telemetry.writer.TelemetryWriter`)."""

    def submit_many(self, records: Sequence[AttemptRecord]) -> None: ...

    def flush(self) -> None: ...


def validate_messages(messages: object) -> list[dict]:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise InvalidRequest("messages must be a non-empty list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidRequest(f"messages[{i}] must be a mapping with 'role' and 'content'")
        role = m.get("role")
        if role not in VALID_ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(sorted(VALID_ROLES))}, got {role!r}")
        if not isinstance(m.get("content"), (str, list)):
            raise InvalidRequest(f"messages[{i}].content must be text")
        out.append(dict(m))
    return out


@dataclass
class _Plan:
    request_id: str
    messages: list[dict]
    requested_model: str
    model: str
    intent: str
    side: Side
    routes: list[tuple[str, bool]]  # (provider name, is a fallback route)
    prompt_tokens_est: int
    session_id: str | None
    source: str
    params: dict[str, Any]
    cache_hints: bool
    stream: bool
    session_header: str | None = None  # the session id as the ASCII header value sent upstream
    prompt_text: str | None = None  # cleaned, when store_prompts is on
    deadline: Deadline = NO_DEADLINE  # set when the request starts
    records: list[AttemptRecord] = field(default_factory=list)
    key_name: str | None = None  # the server's gateway key, carried into the records
    infos: list[AttemptInfo] = field(default_factory=list)


@dataclass(frozen=True)
class _Try:
    """One attempt: where it goes and how, and when it started (set by :meth:`begin`)."""

    provider: str
    model: str
    is_fallback: bool
    substituted: bool
    with_hints: bool
    timeout: float
    ts: float = 0.0  # wall-clock start, for the log
    t0: float = 0.0  # monotonic start, for latency

    def begin(self, wall: float, clock: float) -> _Try:
        return replace(self, ts=wall, t0=clock)


@dataclass(frozen=True)
class _Wait:
    """The backoff before a retry: the driver sleeps ``seconds`` (its own way) and sends ``None``."""

    seconds: float


class StreamState:
    """What a stream's caller can know while it runs (both drivers' streams): the request's id,
    intent and side, the attempt being streamed right now (the server names it in its response
    headers), and ``result`` once the stream has ended."""

    def __init__(self, plan: _Plan):
        self.result: ChatResult | None = None
        self.request_id = plan.request_id
        self.intent = plan.intent
        self.side = plan.side
        self.provider: str | None = None
        self.model: str | None = None
        self.attempts = 0

    def _attempting(self, attempt: _Try, number: int) -> None:
        self.provider, self.model, self.attempts = attempt.provider, attempt.model, number


class ChatStream(StreamState):
    """Iterate for text chunks; afterwards ``.result`` holds the :class:`ChatResult`."""

    def __init__(self, gen_factory: Callable[[ChatStream], Generator[str, None, None]], plan: _Plan):
        super().__init__(plan)
        self._gen = gen_factory(self)

    def __iter__(self) -> Iterator[str]:
        return self._gen

    def __next__(self) -> str:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()


class RoutingClient:
    """Routes chat calls; built by :func:`app.gateway.build_gateway` (or :meth:`from_config`).

    The constructor only stores what it is given: the settings, where each provider's HTTP goes
    (``transports``; a provider without one uses the network), the telemetry sink, and the canary
    ratio as a value the gateway's background refresher keeps current (read here without a lock or
    I/O). ``reload`` re-reads the ratio and fault settings synchronously (see :meth:`refresh`).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        telemetry: TelemetrySink,
        ratio: RatioSource,
        transports: Mapping[str, httpx2.BaseTransport] | None = None,
        reload: Callable[[], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        source: str = "api",
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
    ):
        self.settings = settings
        self.telemetry = telemetry
        self.source = source
        self._ratio = ratio
        self._reload = reload
        self._sleep = sleep
        self._clock = clock
        self._wall = wall_clock
        self._rng = rng or random.Random()
        self._env = env
        self._secrets = secrets
        self._transports = dict(transports or {})
        self._clients: dict[str, openai.OpenAI] = {}
        self._http_clients: list[httpx2.Client] = []
        self._clients_lock = threading.Lock()
        self._gateway: Gateway | None = None
        self._closed = False
        # Provider keys, scrubbed from every upstream text before it is stored, logged or shown.
        self._secret_values = tuple(
            v
            for p in settings.providers.values()
            if not p.is_simulated and p.api_key_env
            if (v := lookup(p.api_key_env, env, secrets))
        )
        b = settings.breaker
        policy = BreakerPolicy(
            window_s=b.window_s,
            min_attempts=b.min_attempts,
            failure_rate=b.failure_rate,
            cooldown_s=b.cooldown_s,
            enabled=b.enabled,
        )
        #: Called as ``hook(provider, old_state, new_state, why)`` on every breaker state change, on
        #: the request's thread and under that breaker's lock: keep hooks quick (enqueue, count).
        self.on_breaker_change: list[Callable[[str, State, State, str], None]] = []
        self._breakers = {
            name: CircuitBreaker(name, policy, on_change=self._breaker_changed) for name in settings.providers
        }
        # Request ids: a random per-client prefix and a counter (unique, and far cheaper than uuid4).
        self._id_prefix = os.urandom(8).hex()
        self._ids = itertools.count(1)

    @classmethod
    def from_config(cls, path: str | None = None, **kwargs: Any) -> RoutingClient:
        """A client on its own gateway, from ``GATEWAY_CONFIG`` (or ``path``) and ``DATABASE_URL``;
        ``close()`` closes the gateway (timers, telemetry flush, HTTP clients). ``kwargs`` go to
        :func:`app.gateway.build_gateway`."""
        from app.gateway import build_gateway

        return build_gateway(load_settings(path, env=kwargs.get("env")), **kwargs).client

    def attach(self, gateway: Gateway) -> None:
        """Called by the gateway that built this client: ``close()`` then closes the gateway."""
        self._gateway = gateway

    @property
    def gateway(self) -> Gateway:
        if self._gateway is None:
            raise AttributeError("this RoutingClient was constructed directly, not by build_gateway()")
        return self._gateway

    @property
    def engine(self) -> Engine:
        return self.gateway.engine

    # -- public API ----------------------------------------------------------------------------
    def current_ratio(self) -> float:
        """The last canary ratio the refresher loaded (no database read)."""
        return self._ratio.value

    def ratio_age_s(self) -> float:
        """Seconds since the canary ratio was last loaded from the database."""
        return self._ratio.age_s()

    def breaker_states(self) -> dict[str, BreakerSnapshot]:
        """Each provider's circuit breaker now (times on the router's monotonic clock)."""
        now = self._clock()
        return {name: b.snapshot(now) for name, b in self._breakers.items()}

    @property
    def closed(self) -> bool:
        return self._closed

    def _breaker_changed(self, provider: str, old: State, new: State, why: str) -> None:
        log.warning("circuit breaker for %s: %s -> %s (%s)", provider, old, new, why)
        for hook in list(self.on_breaker_change):
            try:
                hook(provider, old, new, why)
            except Exception:  # a listener's bug must not break routing
                log.exception("breaker change hook %r failed", hook)

    @overload
    def chat(
        self,
        messages: Sequence[dict],
        model: str = "auto",
        *,
        session_id: str | None = None,
        stream: Literal[False] = False,
        temperature: float | None = None,
        max_tokens: int | None = None,
        source: str | None = None,
        route: Side | None = None,
        cache_hints: bool = True,
        key_name: str | None = None,
    ) -> ChatResult: ...

    @overload
    def chat(
        self,
        messages: Sequence[dict],
        model: str = "auto",
        *,
        session_id: str | None = None,
        stream: Literal[True],
        temperature: float | None = None,
        max_tokens: int | None = None,
        source: str | None = None,
        route: Side | None = None,
        cache_hints: bool = True,
        key_name: str | None = None,
    ) -> ChatStream: ...

    @overload
    def chat(
        self,
        messages: Sequence[dict],
        model: str = "auto",
        *,
        session_id: str | None = None,
        stream: bool = False,
        temperature: float | None = None,
        max_tokens: int | None = None,
        source: str | None = None,
        route: Side | None = None,
        cache_hints: bool = True,
        key_name: str | None = None,
    ) -> ChatResult | ChatStream: ...

    def chat(
        self,
        messages: Sequence[dict],
        model: str = "auto",
        *,
        session_id: str | None = None,
        stream: bool = False,
        temperature: float | None = None,
        max_tokens: int | None = None,
        source: str | None = None,
        route: Side | None = None,
        cache_hints: bool = True,
        key_name: str | None = None,
    ) -> ChatResult | ChatStream:
        """Send one chat request through the router.

        ``route`` forces one side with no fallback (the playground's compare mode). Raises
        :class:`ClientClosedError` at once, without any network I/O, once ``close()`` has begun.
        """
        if self._closed:
            raise ClientClosedError("this RoutingClient is closed: build a new one (RoutingClient.from_config())")
        plan = self._plan(messages, model, session_id, stream, temperature, max_tokens, source, route, cache_hints)
        plan.key_name = key_name
        if stream:
            return ChatStream(lambda s: self._run_stream(plan, s), plan)
        return self._run(plan)

    def refresh(self) -> None:
        """Re-read the canary ratio and fault settings now instead of within ``ratio_refresh_s``
        (for a process that has just changed them itself)."""
        if self._reload is not None:
            self._reload()

    def flush(self) -> None:
        self.telemetry.flush()

    def close(self) -> None:
        """Flush telemetry and close the HTTP clients; a client built by a gateway closes it.
        ``chat()`` raises :class:`ClientClosedError` from the moment this begins."""
        self._closed = True
        if self._gateway is not None:
            self._gateway.close()  # calls close_http() and closes the telemetry writer
            return
        self.telemetry.flush()
        self.close_http()

    def close_http(self) -> None:
        self._closed = True
        with self._clients_lock:
            for hc in self._http_clients:
                hc.close()
            self._http_clients.clear()
            self._clients.clear()

    def __enter__(self) -> RoutingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- planning ------------------------------------------------------------------------------
    def _plan(
        self,
        messages: Sequence[dict],
        model: str,
        session_id: str | None,
        stream: bool,
        temperature: float | None,
        max_tokens: int | None,
        source: str | None,
        route: Side | None,
        cache_hints: bool,
    ) -> _Plan:
        msgs = [_sendable_message(m) for m in validate_messages(messages)]
        header = None
        if session_id is not None:
            if not (isinstance(session_id, str) and 0 < len(session_id) <= MAX_SESSION_ID):
                got = f"{len(session_id)} characters" if isinstance(session_id, str) else type(session_id).__name__
                raise InvalidRequest(f"session_id must be 1 to {MAX_SESSION_ID} characters, got {got}")
            try:
                header = session_header_value(validate_session_id(session_id))
            except ValueError as exc:
                raise InvalidRequest(str(exc)) from None
        source = source or self.source
        if not (isinstance(source, str) and 0 < len(source) <= MAX_SOURCE):
            raise InvalidRequest(f"source must be 1 to {MAX_SOURCE} characters")
        source = storable(source, MAX_SOURCE) or "api"  # a caller's label: NUL or a lone surrogate cannot be stored
        if model in (None, "", "auto"):
            decision = classify_intent(msgs, self.settings.intents)
            chosen, intent, est = decision.model, decision.intent, decision.estimated_tokens
            requested = "auto"
        else:
            catalog.get(model)  # UnknownModelError before any network call
            chosen, intent, requested = model, "explicit", model
            est = estimate_tokens(message_text(msgs), self.settings.intents.chars_per_token)
        if temperature is not None and not 0.0 <= float(temperature) <= 2.0:
            raise InvalidRequest("temperature must be between 0 and 2")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise InvalidRequest("max_tokens must be a positive integer")
        r = self.settings.routing
        if route is not None:
            if route not in ("primary", "fallback"):
                raise InvalidRequest("route must be 'primary' or 'fallback'")
            side: Side = route
            routes = [(getattr(r, route), False)]
        else:
            side = assign_side(self._ratio.value, session_id, self._rng)
            routes = [(r.primary, False)] if side == "primary" else [(r.fallback, False)]
            if side == "primary" and r.fallback_enabled and r.fallback != r.primary:
                routes.append((r.fallback, True))
        routes = self._cost_safe_routes(chosen, routes, forced=route is not None, by_intent=requested == "auto")
        params: dict[str, Any] = {}
        if temperature is not None:
            params["temperature"] = float(temperature)
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        return _Plan(
            request_id=f"{self._id_prefix}{next(self._ids):016x}",
            messages=msgs,
            requested_model=requested,
            model=chosen,
            intent=intent,
            side=side,
            routes=routes,
            prompt_tokens_est=est,
            session_id=session_id,
            source=source,
            params=params,
            cache_hints=cache_hints,
            stream=stream,
            session_header=header,
            prompt_text=clean(message_text(msgs), PROMPT_STORE_LIMIT, self._secret_values)
            if self.settings.telemetry.store_prompts
            else None,
        )

    # -- provider clients ----------------------------------------------------------------------
    def _client(self, name: str) -> openai.OpenAI:
        with self._clients_lock:
            client = self._clients.get(name)
            if client is not None:
                return client
            if self._closed:
                raise ClientClosedError("this RoutingClient is closed")
            sdk = self._sdk_settings(name)  # ProviderNotConfigured if its key is unset
            # Deadlines and the response size limit are enforced at the transport (see
            # app.routing.deadline and app.routing.body_limit).
            inner = BodyLimitTransport(
                self._transports.get(name) or httpx2.HTTPTransport(), self.settings.retry.max_response_bytes
            )
            transport = deadlines.DeadlineTransport(inner)
            http_client = httpx2.Client(transport=transport, follow_redirects=False)
            client = openai.OpenAI(**sdk, http_client=http_client)
            self._http_clients.append(http_client)
            self._clients[name] = client
            return client

    def _sdk_settings(self, name: str) -> dict[str, Any]:
        """How both drivers configure a provider's SDK client: its key (raises
        :class:`ProviderNotConfigured` when unset), its base URL, its timeout, and no SDK retries
        (the routing policy retries). Their HTTP clients never follow redirects, so the key never
        leaves the configured host (a 3xx is a failure that fails over)."""
        p = self.settings.providers[name]
        return {
            "api_key": resolve_api_key(name, p, self._env, self._secrets),
            "base_url": upstream_base_url(p),
            "max_retries": 0,
            "timeout": p.timeout_s,
        }

    def _model_for(self, provider: str, model: str) -> tuple[str, bool]:
        return model_on(self._offers[provider], model)

    @cached_property
    def _offers(self) -> dict[str, Offer]:
        return {name: Offer(frozenset(p.models), p.default_model) for name, p in self.settings.providers.items()}

    def _cost_safe_routes(
        self, model: str, routes: list[tuple[str, bool]], *, forced: bool, by_intent: bool
    ) -> list[tuple[str, bool]]:
        """The planned routes under ``[routing.substitution]`` (see :mod:`app.routing.substitution`);
        raises :class:`SubstitutionRefused` before any network call when none is left."""
        r = self.settings.routing
        policy = Policy.of(r.substitution.mode, r.substitution.max_price_factor)
        decision = decide(
            model,
            routes,
            self._offers,
            policy,
            alternatives=(r.primary, r.fallback),
            forced=forced,
            by_intent=by_intent,
        )
        for v in decision.dropped:
            log.info(
                "%s not used for %s: %s would cost %.2fx (routing.substitution)", v.provider, model, v.model, v.factor
            )
        if decision.rerouted:
            log.info("%s routed to %s, which serves it (routing.substitution)", model, decision.routes[0][0])
        return decision.routes

    # -- attempts ------------------------------------------------------------------------------
    def _clean(self, text: str) -> str:
        return clean(text, ERROR_TEXT_LIMIT, self._secret_values) or ""

    def _record(
        self,
        plan: _Plan,
        attempt: _Try,
        *,
        ttft_ms: float | None = None,
        attempt_ttft_ms: float | None = None,
        failure: Failure | None = None,
        usage: Usage | None = None,
        cost: float = 0.0,
        final: bool = False,
        answer: str | None = None,
    ) -> Failure | None:
        """Log one attempt (and tell its provider's breaker); returns ``failure`` with its text
        cleaned, which is the only form of it that goes further (logs, retries, the caller)."""
        if failure is not None:
            failure = replace(failure, message=self._clean(failure.message))
        outcome = breaker_outcome(failure)
        if outcome is not None:
            self._breakers[attempt.provider].record(outcome, self._clock())
        usage = usage or Usage()
        number = len(plan.records) + 1
        latency_ms = (self._clock() - attempt.t0) * 1000.0
        plan.records.append(
            AttemptRecord(
                request_id=plan.request_id,
                attempt=number,
                ts=attempt.ts,
                provider=attempt.provider,
                model=attempt.model,
                requested_model=plan.requested_model,
                intent=plan.intent,
                side=plan.side,
                status="ok" if failure is None else "error",
                latency_ms=latency_ms,
                http_status=failure.http_status if failure else 200,
                error_class=failure.error_class if failure else None,
                error_message=failure.message if failure else None,
                ttft_ms=ttft_ms,
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.cached_tokens,
                completion_tokens=usage.completion_tokens,
                cost_usd=cost,
                fallback=attempt.is_fallback,
                final=final,
                substituted=attempt.substituted,
                stream=plan.stream,
                source=plan.source,
                session_id=plan.session_id,
                prompt_text=plan.prompt_text,
                key_name=plan.key_name,
                answer_text=answer,
            )
        )
        plan.infos.append(
            AttemptInfo(
                number=number,
                provider=attempt.provider,
                model=attempt.model,
                status="ok" if failure is None else "error",
                latency_ms=latency_ms,
                error_class=failure.error_class if failure else None,
                http_status=failure.http_status if failure else None,
                error=failure.describe() if failure else None,
                with_hints=attempt.with_hints,
                ttft_ms=ttft_ms,
                attempt_ttft_ms=attempt_ttft_ms,
            )
        )
        return failure

    def _failed(self, plan: _Plan, attempt: _Try, exc: Exception, **kw: Any) -> Failure:
        """Classify and log a failed attempt. An exception that is not an upstream fault (our own
        bug) is logged as ``internal_error`` and raised to the caller."""
        try:
            failure = classify(exc, sent_hints=attempt.with_hints)
        except BaseException:
            self._record(plan, attempt, failure=Failure("internal_error", f"{type(exc).__name__}: {exc}"), **kw)
            raise
        cleaned = self._record(plan, attempt, failure=failure, **kw)
        assert cleaned is not None
        return cleaned

    def _commit(self, plan: _Plan) -> None:
        if not plan.records:
            return
        if not plan.records[-1].final:  # a failed request: its last attempt closes it
            plan.records[-1] = replace(plan.records[-1], final=True)
        self.telemetry.submit_many(plan.records)

    def _headers(self, plan: _Plan, with_hints: bool) -> dict[str, str] | None:
        if not with_hints:
            return None
        return {"x-session-id": plan.session_header or "", "x-cache-controls": "session_scope"}

    def _request(self, plan: _Plan, attempt: _Try) -> tuple[dict[str, Any], RequestOptions]:
        """The body and request options of one attempt's ``POST /chat/completions``, for the SDK's
        ``client.post`` (both drivers). This is what ``chat.completions.create`` sends, less its
        parameter transform: that walks every message against the SDK's TypedDicts (0.3 ms a call
        here) and is the identity for the validated plain-JSON messages we send (a test holds the
        SDK to that: tests/unit/test_sdk_request.py)."""
        body: dict[str, Any] = {"model": attempt.model, "messages": plan.messages, **plan.params}
        if plan.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        options: RequestOptions = {"timeout": attempt.timeout, "security": {"bearer_auth": True}}
        headers = self._headers(plan, attempt.with_hints)
        if headers is not None:
            options["headers"] = headers
        return body, options

    def _attempts(self, plan: _Plan) -> Generator[_Try | _Wait, Failure | None, None]:
        """Drive the retry/fallback loop; yields what to try next and learns each outcome.

        The caller sends back ``None`` on success (the loop ends) or the (cleaned) :class:`Failure`;
        for a :class:`_Wait` it sleeps that long and sends ``None``. The decisions are
        :mod:`app.routing.policy`'s; this only reads the clock, draws the backoff and asks the
        breakers. No I/O and no sleeping happen here, so the sync driver (:meth:`_advance`) and the
        async one (:class:`app.routing.async_client.AsyncRoutingClient`) share it.
        """
        cfg = self.settings.retry
        backoff = Backoff(cfg, self._rng)
        skipped: list[str] = []
        for provider, is_fallback in plan.routes:
            p = self.settings.providers[provider]
            model, substituted = self._model_for(provider, plan.model)
            base_timeout = attempt_timeout_s(p.timeout_s, plan.prompt_tokens_est, cfg)
            max_attempts = max_attempts_for(p.max_attempts, cfg.max_attempts)
            breaker = self._breakers[provider]
            with_hints = plan.cache_hints and plan.session_header is not None
            hints_dropped = False
            made = 0
            while True:
                now = self._clock()
                remaining = plan.deadline.remaining(now)
                if remaining <= 0:
                    raise _Stop(f"the request deadline of {cfg.request_deadline_s:g} s passed")
                if not breaker.allow(now):
                    log.info("%s: circuit open, skipped (request %s)", provider, plan.request_id)
                    skipped.append(provider)
                    break
                timeout = attempt_budget_s(base_timeout, remaining)
                failure = yield _Try(provider, model, is_fallback, substituted, with_hints, timeout)
                if failure is None:
                    return
                delay = None
                if wants_retry(failure, made + 1, max_attempts, cfg.retry_after_cap_s):
                    delay = backoff.propose(made, failure.retry_after_s)
                step = next_step(
                    failure,
                    attempts_made=made + 1,
                    max_attempts=max_attempts,
                    hints_dropped=hints_dropped,
                    retry_after_cap_s=cfg.retry_after_cap_s,
                    delay_s=delay,
                    remaining_s=plan.deadline.remaining(self._clock()),
                )
                if step.action == "resend_without_hints":
                    log.info("%s rejected cache hints; retrying without (request %s)", provider, plan.request_id)
                    with_hints, hints_dropped = False, True
                    continue
                made += 1
                if step.action == "retry":
                    log.info(
                        "%s: %s; retry in %.2fs (request %s)",
                        provider,
                        failure.describe(),
                        step.delay_s,
                        plan.request_id,
                    )
                    backoff.commit(step.delay_s)
                    yield _Wait(step.delay_s)
                    continue
                if step.action == "fail_over":
                    log.info(
                        "%s: %s; %s; trying the next route (request %s)",
                        provider,
                        failure.describe(),
                        step.reason,
                        plan.request_id,
                    )
                    break
                raise _Stop(f"request refused by {provider}")
        if skipped:
            raise _Stop(f"all routes failed (circuit open: {', '.join(skipped)})")
        raise _Stop("all routes failed")

    def _advance(self, steps: Generator[_Try | _Wait, Failure | None, None], outcome: Failure | None) -> _Try:
        """The sync driver's step: send ``outcome`` to the decision loop, sleeping through its waits,
        until it names the next attempt (or raises :class:`_Stop`)."""
        step = steps.send(outcome)
        while isinstance(step, _Wait):
            self._sleep(step.seconds)
            step = steps.send(None)
        return step

    def _succeed(
        self,
        plan: _Plan,
        attempt: _Try,
        started: float,
        text: str,
        usage: Usage,
        ttft_ms: float | None,
        finish_reason: str | None,
        attempt_ttft_ms: float | None = None,
    ) -> ChatResult:
        """Record the successful attempt and build the caller's result."""
        cost = catalog.cost_usd(attempt.model, usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)
        # The answer is stored only with store_prompts, cleaned like the prompt (keys scrubbed).
        answer = clean(text, PROMPT_STORE_LIMIT, self._secret_values) if self.settings.telemetry.store_prompts else None
        self._record(
            plan,
            attempt,
            ttft_ms=ttft_ms,
            attempt_ttft_ms=attempt_ttft_ms,
            usage=usage,
            cost=cost,
            final=True,
            answer=answer,
        )
        return ChatResult(
            text=text,
            provider=attempt.provider,
            model=attempt.model,
            requested_model=plan.requested_model,
            intent=plan.intent,
            side=plan.side,
            fallback_used=attempt.is_fallback,
            attempts=len(plan.records),
            latency_ms=(self._clock() - started) * 1000.0,
            ttft_ms=ttft_ms,
            usage=usage,
            cost_usd=cost,
            request_id=plan.request_id,
            session_id=plan.session_id,
            substituted_model=attempt.substituted,
            finish_reason=finish_reason,
            attempt_log=list(plan.infos),
        )

    def _deadline(self, plan: _Plan, attempt: _Try) -> deadlines.AttemptDeadline:
        """An attempt's deadlines: non-streamed, its whole budget; streamed, its budget until the
        first token, then the idle gap and the request's deadline."""
        budget_end = attempt.t0 + attempt.timeout
        if not plan.stream:
            return deadlines.AttemptDeadline(self._clock, budget_end)
        return deadlines.AttemptDeadline(
            self._clock,
            plan.deadline.end,
            first_token_by=budget_end,
            idle_s=self.settings.retry.stream_idle_timeout_s,
        )

    def _send(self, plan: _Plan, attempt: _Try, deadline: deadlines.AttemptDeadline) -> Any:
        client = self._client(attempt.provider)
        body, options = self._request(plan, attempt)
        token = deadlines.activate(deadline)
        try:
            return client.post(
                "/chat/completions",
                body=body,
                options=options,
                cast_to=ChatCompletion,
                stream=plan.stream,
                stream_cls=openai.Stream[ChatCompletionChunk],
            )
        finally:
            deadlines.deactivate(token)

    def _start(self, plan: _Plan) -> float:
        started = self._clock()
        plan.deadline = Deadline.after(started, self.settings.retry.request_deadline_s)
        return started

    def _run(self, plan: _Plan) -> ChatResult:
        started = self._start(plan)
        steps = self._attempts(plan)
        try:
            attempt = self._advance(steps, None)
            while True:
                attempt = attempt.begin(self._wall(), self._clock())
                try:
                    resp = self._send(plan, attempt, self._deadline(plan, attempt))
                    text, finish, usage = _completion_parts(resp)
                except Exception as exc:  # noqa: BLE001 - _failed() re-raises what is not an upstream fault
                    attempt = self._advance(steps, self._failed(plan, attempt, exc))
                    continue
                return self._succeed(plan, attempt, started, text, usage, None, finish)
        except _Stop as stop:
            raise AllRoutesFailed(plan.request_id, plan.infos, str(stop)) from None
        finally:
            steps.close()
            self._commit(plan)

    def _run_stream(self, plan: _Plan, holder: ChatStream) -> Generator[str, None, None]:
        started = self._start(plan)
        steps = self._attempts(plan)
        try:
            attempt = self._advance(steps, None)
            while True:
                attempt = attempt.begin(self._wall(), self._clock())
                holder._attempting(attempt, len(plan.records) + 1)
                acc = _StreamAttempt(started, attempt.t0, self._clock)
                try:
                    deadline = self._deadline(plan, attempt)
                    stream = self._send(plan, attempt, deadline)
                    with stream:
                        for chunk in stream:
                            yield from acc.take(chunk, deadline)
                    acc.check_finished()
                except GeneratorExit:
                    self._stream_cancelled(plan, attempt, acc, "the caller stopped reading the stream")
                    raise
                except Exception as exc:  # noqa: BLE001 - _stream_failed() re-raises what is not an upstream fault
                    attempt = self._advance(steps, self._stream_failed(plan, attempt, acc, exc))
                    continue
                holder.result = self._stream_succeeded(plan, attempt, started, acc)
                return
        except _Stop as stop:
            raise AllRoutesFailed(plan.request_id, plan.infos, str(stop)) from None
        finally:
            steps.close()
            self._commit(plan)

    # -- stream attempts (shared by both drivers) ----------------------------------------------
    def _stream_cancelled(self, plan: _Plan, attempt: _Try, acc: _StreamAttempt, why: str) -> None:
        self._record(plan, attempt, failure=Failure("cancelled", why), **acc.record_kw())

    def _stream_failed(self, plan: _Plan, attempt: _Try, acc: _StreamAttempt, exc: Exception) -> Failure:
        """A streamed attempt failed. Before its first text: the failure for the retry/fallback loop
        (the caller has seen nothing yet). After: :class:`StreamBrokenError` (an answer cannot be
        taken back); an exception that is not an upstream fault is logged and raised as it is."""
        kw = acc.record_kw()
        if isinstance(exc, _Truncated):
            exc = BadResponse(exc.args[0])
        if not acc.pieces:
            return self._failed(plan, attempt, exc, **kw)
        try:
            classify(exc, sent_hints=attempt.with_hints)  # only to tell our bugs apart
        except BaseException:
            self._record(plan, attempt, failure=Failure("internal_error", f"{type(exc).__name__}: {exc}"), **kw)
            raise
        n = len(acc.pieces)
        cause = self._clean(f"{type(exc).__name__}: {exc}" if not isinstance(exc, BadResponse) else str(exc))
        self._record(plan, attempt, failure=Failure("stream_broken", f"stream broke after {n} chunks: {cause}"), **kw)
        raise StreamBrokenError(
            f"{attempt.provider}/{attempt.model} stream broke after {n} chunks "
            f"(request {plan.request_id}): {cause}; the answer is incomplete"
        ) from exc

    def _stream_succeeded(self, plan: _Plan, attempt: _Try, started: float, acc: _StreamAttempt) -> ChatResult:
        return self._succeed(
            plan,
            attempt,
            started,
            "".join(acc.pieces),
            acc.usage or Usage(),
            acc.ttft_ms,
            acc.finish,
            acc.attempt_ttft_ms,
        )


class _StreamAttempt:
    """What one streamed attempt has delivered so far: text pieces, first-token times, usage and
    finish reason, taken chunk by chunk (the same way by both drivers)."""

    __slots__ = ("attempt_ttft_ms", "clock", "finish", "pieces", "started", "t0", "ttft_ms", "usage")

    def __init__(self, started: float, t0: float, clock: Callable[[], float]):
        self.started = started  # when the caller's request started (TTFT is what the caller waited)
        self.t0 = t0  # when this attempt started
        self.clock = clock
        self.pieces: list[str] = []
        self.ttft_ms: float | None = None
        self.attempt_ttft_ms: float | None = None
        self.usage: Usage | None = None
        self.finish: str | None = None

    def take(self, chunk: object, deadline: deadlines.AttemptDeadline) -> list[str]:
        """The text pieces of one chunk (:class:`BadResponse` when it is not a chunk)."""
        choices = _chunk_choices(chunk)
        u = getattr(chunk, "usage", None)
        if u is not None:
            self.usage = _usage(u)
        out: list[str] = []
        for choice in choices:
            if choice.finish_reason:
                self.finish = choice.finish_reason
            content = choice.delta.content if choice.delta else None
            if content:
                if self.ttft_ms is None:
                    now = self.clock()
                    deadline.first_token()
                    self.ttft_ms = (now - self.started) * 1000.0
                    self.attempt_ttft_ms = (now - self.t0) * 1000.0
                self.pieces.append(content)
                out.append(content)
        return out

    def check_finished(self) -> None:
        if self.finish is None:
            raise _Truncated("the stream ended without a finish reason")

    def record_kw(self) -> dict[str, Any]:
        return {"ttft_ms": self.ttft_ms, "attempt_ttft_ms": self.attempt_ttft_ms, "usage": self.usage}


class _Stop(Exception):
    """Internal: the retry/fallback loop has nothing more to try."""


class _Truncated(Exception):
    """Internal: a stream ended cleanly at the transport level but without a finish reason."""


def _int(v: object) -> int:
    """A token count from an upstream: a finite non-negative number, else 0 (never raises)."""
    if type(v) is int:
        return v if v > 0 else 0
    if type(v) is float and math.isfinite(v):
        return int(v) if v > 0 else 0
    return 0


def _usage(u: Any) -> Usage:
    if u is None:
        return Usage()
    details = getattr(u, "prompt_tokens_details", None)
    return Usage(
        prompt_tokens=_int(getattr(u, "prompt_tokens", 0)),
        cached_tokens=_int(getattr(details, "cached_tokens", 0)) if details is not None else 0,
        completion_tokens=_int(getattr(u, "completion_tokens", 0)),
    )


def _kind(value: object) -> str:
    if isinstance(value, str):
        return f"text, not a JSON object: {value[:80]!r}"
    return f"JSON {type(value).__name__}, not a completion object"


def _completion_parts(resp: object) -> tuple[str, str | None, Usage]:
    """(text, finish reason, usage) of a completion, or :class:`BadResponse` when the 200 is not one
    (the SDK hands back a ``str`` for a text/html body and a ``list`` for a JSON array)."""
    if not isinstance(resp, ChatCompletion):
        raise BadResponse(f"malformed response from upstream: {_kind(resp)}")
    choices = resp.choices
    if not isinstance(choices, list) or not choices:
        raise BadResponse(f"malformed response from upstream: choices is {choices!r}, expected at least one")
    first = choices[0]
    message = getattr(first, "message", None) if isinstance(first, CompletionChoice) else None
    if not isinstance(message, ChatCompletionMessage):
        raise BadResponse("malformed response from upstream: the first choice has no message")
    content = message.content
    if content is not None and not isinstance(content, str):
        raise BadResponse(f"malformed response from upstream: message content is {type(content).__name__}")
    return content or "", first.finish_reason, _usage(resp.usage)


def _chunk_choices(chunk: object) -> list[ChunkChoice]:
    """A stream chunk's choices, or :class:`BadResponse` when the chunk is not a chunk object."""
    if not isinstance(chunk, ChatCompletionChunk):
        raise BadResponse(f"malformed stream chunk from upstream: {_kind(chunk)}")
    choices = chunk.choices
    if not isinstance(choices, list) or not all(isinstance(c, ChunkChoice) for c in choices):
        raise BadResponse(f"malformed stream chunk from upstream: choices is {choices!r:.80}")
    return choices


def _sendable_message(m: dict) -> dict:
    """A validated message whose text can be encoded and stored: lone surrogates replaced, NUL and
    other C0 controls (except tab and newlines) removed."""
    content = m["content"]
    if isinstance(content, str):
        m["content"] = storable(content, max(len(content), 1))
    else:
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                part = {**part, "text": storable(part["text"], max(len(part["text"]), 1))}
            parts.append(part)
        m["content"] = parts
    return m
