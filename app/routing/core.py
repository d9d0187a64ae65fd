"""The routing core, sans I/O: plain data and decisions that both drivers share.

One request becomes a :class:`Plan` (API kind, the caller's body, canary side, intent, routes);
:meth:`RoutingCore.attempts` is the retry/fallback loop as a generator that yields what to try next
(:class:`Attempt`) or how long to wait (:class:`Wait`) and learns each outcome; it raises
:class:`NoRoute` when nothing is left. :meth:`RoutingCore.request` builds an attempt's HTTP request
(an :class:`UpstreamRequest`: method, path, headers, body, timeout), :meth:`RoutingCore.read` reads
a non-streamed answer (its body bytes and headers) and
:class:`StreamAccount` a streamed one chunk by chunk, only as far as accounting and validation need
(usage, finish reason, first-output time, tool calls, text). Records, breakers and the telemetry
hand-off are here too. Nothing in this module sends a byte, sleeps, reads a clock or takes a thread
lock of its own: clocks, randomness, locks and the mapping of a client's exceptions to failures are
handed in, and the sync driver (:class:`app.routing.io.client.RoutingClient`) and the async one
(:class:`app.routing.io.async_client.AsyncRoutingClient`) each perform only the I/O this decides
(h11's sans-I/O design; httpcore's one design for sync and async). ``tests/unit/test_import_graph.py``
holds this module and the core modules it imports to no HTTP client, SDK, event loop, thread or
clock import.

The gateway is a transparent proxy: the caller's body is forwarded as sent except what
the gateway owns (``model``, the session/cache hint headers, ``stream_options.include_usage``,
and a provider's explicit ``drop_params`` / ``rename_params``); the upstream's answer is kept
whole, with only ``model`` set to the model routed to.

Hostile input: every text from an upstream or a caller is cleaned once
(:func:`core.text.clean`, provider keys scrubbed) before it is stored, logged or shown; a 200 that
is not an answer of the API asked is a ``bad_response`` failure; each attempt runs under a
deadline and the whole request under ``request_deadline_s``; a circuit breaker per provider skips a
provider that is down. The decisions themselves are the pure functions of :mod:`app.routing.policy`.
"""

from __future__ import annotations

import logging
import random
import re
from collections import OrderedDict
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from app import catalog
from app.config import ProviderConfig, Settings, lookup
from app.routing import routes as routes_mod
from app.routing.answers import Answer, StreamAccount, StreamedAnswer, Truncated, read_answer, responses_finish
from app.routing.breaker import BreakerPolicy, BreakerSnapshot, CircuitBreaker, State
from app.routing.bridge import EventBridge, NotBridgeable, PassThrough, chat_request, response_body
from app.routing.canary import PlanSide, Side, assign_side
from app.routing.errors import BadResponse, Failure, StreamBrokenError
from app.routing.inputs import encodable, input_messages, sendable_message
from app.routing.intent import classify as classify_intent
from app.routing.intent import message_text
from app.routing.options import RouteOptions
from app.routing.policy import (
    AttemptDeadline,
    Deadline,
    attempt_budget_s,
    breaker_outcome,
    max_attempts_for,
    next_step,
    wants_retry,
)
from app.routing.result import AttemptInfo, ChatResult, Deferred, Usage
from app.routing.retry import Backoff, attempt_timeout_s
from app.routing.substitution import Policy, SubstitutionRefused, chat_offers, decide, model_on
from core.errors import InvalidRequest
from core.ids import IdSource
from core.messages import estimate_tokens
from core.quality import NONE as NO_QUALITY
from core.quality import AnswerQuality, chat_quality, requested_schema
from core.records import AttemptRecord
from core.session import session_header_value, validate_session_id
from core.text import clean, storable

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # what no header value may carry (a tab may)

log = logging.getLogger(__name__)

PROMPT_STORE_LIMIT = 20_000
ERROR_TEXT_LIMIT = 500  # the width of request_log.error_message
MAX_SESSION_ID = 128  # the width of request_log.session_id
MAX_SOURCE = 32
NO_DEADLINE = Deadline(0.0, float("inf"))
DEFAULT_OPTIONS = RouteOptions()
GATEWAY = "gateway"  # the provider name of a request the gateway refused itself (no upstream was asked)
ADJUSTED_MAX = 256  # the width of request_log.adjusted_params
DEPLOYMENT_MAX = 200  # the width of request_log.deployment
ROUTE_WHY_MAX = 200  # the width of request_log.route_why
#: A caller's header (any value but empty, 0, false or no) that forbids copying its request to a
#: rollout's candidate in a shadow phase: for requests whose duplicates would cost or act twice.
NO_SHADOW_HEADER = "x-gateway-no-shadow"
RESPONSE_HOMES = 100_000  # Responses API ids remembered (which provider holds each), per process

#: The APIs the gateway routes, and the upstream path of each (under the provider's base URL).
API_PATHS: dict[str, str] = {
    "chat": "/chat/completions",
    "responses": "/responses",
    "embeddings": "/embeddings",
    "completions": "/completions",
}
API_NAMES = {
    "chat": "chat completions API",
    "responses": "Responses API",
    "embeddings": "embeddings API",
    "completions": "completions API",
}
#: Body fields the gateway owns: never taken from the caller as they are (``stream: true`` is the
#: gateway's to send; a caller's ``stream: false`` passes as sent).
OWNED_FIELDS = frozenset({"model"})


def serves(p: ProviderConfig, api: str) -> bool:
    """Whether a provider can answer ``api``: it serves it, or (the Responses API) it serves chat
    completions, which :mod:`app.routing.bridge` translates to and from."""
    return api in p.apis or (api == "responses" and "chat" in p.apis)


def upstream_base_url(p: ProviderConfig) -> str:
    """Where the SDK sends a provider's requests: the simulator's in-process host for ``sim://``
    providers (its transport answers them), else the configured URL. Both drivers use this."""
    return f"http://{p.sim_name}.sim/v1" if p.is_simulated else p.base_url


@dataclass(frozen=True)
class UpstreamRequest:
    """One attempt's HTTP request as plain data: what a driver sends, however it sends it.
    ``path`` is under the provider's base URL; ``headers`` are the gateway's additions (forwarded
    caller headers, cache hints), the key and content type being the driver's; ``timeout`` is the
    attempt's budget in seconds."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    timeout: float


class Classifier(Protocol):
    """Which :class:`Failure` an exception raised while sending or reading an attempt stands for
    (:func:`app.routing.io.classify.classify`); it re-raises what is no upstream's fault."""

    def __call__(self, exc: BaseException, *, sent_hints: bool) -> Failure: ...


class RatioSource(Protocol):
    """The canary ratio as last loaded (:class:`app.refresh.Refreshed`): a plain attribute read."""

    value: float

    def age_s(self) -> float: ...


class RouteRatioSource(Protocol):
    """Every route's canary ratio as last loaded: a plain attribute read."""

    value: Mapping[str, float]


class _NoRouteRatios:
    value: Mapping[str, float] = {}


class TelemetrySink(Protocol):
    """Where a request's attempt records go (:class:`app.telemetry.writer.TelemetryWriter`)."""

    def submit_many(self, records: Sequence[AttemptRecord]) -> None: ...

    def flush(self) -> None: ...


@dataclass
class Plan:
    """One request, planned: what to send and where to try it, and what happened so far."""

    request_id: str
    api: str  # chat | responses | embeddings | completions
    body: dict[str, Any]  # the caller's body, less what the gateway owns (model, stream)
    messages: list[dict]  # chat-like view of the input, for intent and estimates
    requested_model: str
    model: str
    intent: str
    side: PlanSide
    routes: list[tuple[str, bool]]  # (provider name, is a fallback route)
    prompt_tokens_est: int
    session_id: str | None
    source: str
    cache_hints: bool
    stream: bool
    caller_usage: bool = False  # a streaming caller asked for the usage chunk itself
    session_header: str | None = None  # the session id as the ASCII header value sent upstream
    prompt_text: str | None = None  # cleaned, when store_prompts is on
    headers: dict[str, str] = field(default_factory=dict)  # the caller's headers that may be forwarded
    deadline: Deadline = NO_DEADLINE  # set when the request starts
    records: list[AttemptRecord] = field(default_factory=list)
    key_name: str | None = None  # the server's gateway key, carried into the records
    infos: list[AttemptInfo] = field(default_factory=list)
    route: str | None = None  # a [routes] name: its deployments are tried, not ``routes``
    route_home: str | None = None  # the provider holding the request's previous_response_id
    route_providers: frozenset[str] = frozenset()  # the providers that may answer its API
    canary: bool = False  # the route's canary deployment goes first (the request drew its share)
    canary_only: bool = False  # the route's canary deployment alone, no fallback (a shadow copy)
    no_shadow: bool = False  # the caller asked that the request never be duplicated (NO_SHADOW_HEADER)


@dataclass(frozen=True)
class Attempt:
    """One attempt: where it goes and how, and when it started (set by :meth:`begin`)."""

    provider: str
    model: str
    is_fallback: bool
    substituted: bool
    with_hints: bool
    timeout: float
    ts: float = 0.0  # wall-clock start, for the log
    t0: float = 0.0  # monotonic start, for latency
    bridged: bool = False  # a Responses API request sent as chat completions (app.routing.bridge)
    target: routes_mod.Target | None = None  # the route's deployment this attempt is on, and why

    @property
    def priced_as(self) -> str:
        """The catalog model this attempt's cost is computed as."""
        return self.target.deployment.priced_as if self.target is not None else self.model

    def begin(self, wall: float, clock: float) -> Attempt:
        return replace(self, ts=wall, t0=clock)


@dataclass(frozen=True)
class Wait:
    """The backoff before a retry: the driver sleeps ``seconds`` (its own way) and sends ``None``."""

    seconds: float


class NoRoute(Exception):
    """The retry/fallback loop has nothing more to try (the drivers raise AllRoutesFailed).
    ``error_class`` names why when that happened before any attempt (the request's own row)."""

    def __init__(self, message: str, error_class: str | None = None):
        super().__init__(message)
        self.error_class = error_class


class NoProvider(InvalidRequest):
    """No provider on the request's route serves its API (or embedding model); raised while
    planning, before any network call. ``param``: the request field that needs such a provider."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class StreamState:
    """What a stream's caller can know while it runs (both drivers' streams): the request's id,
    intent and side, the attempt being streamed right now (the server names it in its response
    headers) and its account, the upstream's passed headers, and ``result`` once the stream has
    ended. The async driver writes it as the stream runs; the sync client's stream is one too."""

    def __init__(self, plan: Plan):
        self.result: ChatResult | None = None
        self.request_id = plan.request_id
        self.api = plan.api
        self.intent = plan.intent
        self.side = plan.side
        self.caller_usage = plan.caller_usage
        self.provider: str | None = None
        self.model: str | None = None
        self.priced_as: str | None = None  # the catalog model the attempt is priced as
        self.attempts = 0
        self.upstream_headers: dict[str, str] = {}
        self.account: StreamAccount | None = None  # the attempt streaming now

    def attempting(self, attempt: Attempt, number: int) -> None:
        self.provider, self.model, self.attempts = attempt.provider, attempt.model, number
        self.priced_as = attempt.priced_as

    def delivered_text(self) -> str:
        """The text of the attempt streaming now, as far as it was handed on (for what a cut
        stream cost); empty when it cannot be read."""
        try:
            return self.account.text() if self.account is not None else ""
        except BadResponse:
            return ""


# ------------------------------------------------------------------------------------- the core


def _no_shadow(headers: Mapping[str, str] | None) -> bool:
    """Whether the caller asked that the request never be duplicated (:data:`NO_SHADOW_HEADER`)."""
    return any(
        k.lower() == NO_SHADOW_HEADER and v.strip().lower() not in ("", "0", "false", "no")
        for k, v in (headers or {}).items()
    )


class RoutingCore:
    """The routing policy's state and decisions, shared by the sync and async drivers.

    It holds the settings, the canary ratio source, the circuit breakers, the request-id counter,
    the provider keys to scrub, which provider holds each Responses API id, and the telemetry sink;
    clock, wall clock and randomness are injected so tests of timing take milliseconds, and so are
    ``classify`` (exceptions to failures, the I/O layer's) and ``new_lock`` (the drivers hand
    ``threading.Lock``: a core shared by threads guards its breakers and Responses ids with it)."""

    def __init__(
        self,
        settings: Settings,
        *,
        telemetry: TelemetrySink,
        ratio: RatioSource,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        rng: random.Random,
        source: str,
        env: Mapping[str, str] | None,
        secrets: Mapping[str, str] | None,
        classify: Classifier,
        new_lock: Callable[[], AbstractContextManager[object]],
    ):
        self.settings = settings
        self.classify = classify
        self.telemetry = telemetry
        self.ratio = ratio
        self.clock = clock
        self.wall = wall_clock
        self.rng = rng
        self.source = source
        self.env = env
        self.secrets = secrets
        # The gateway's own refusal messages, each cleaned once: a flood of refusals repeats a few.
        self._refusal_texts: dict[str, str] = {}
        # Provider keys, scrubbed from every upstream text before it is stored, logged or shown.
        self.secret_values = tuple(
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
        #: Called as ``hook(route, why)`` when a route's deployment starts cooling down, on the
        #: request's thread: keep hooks quick.
        self.on_cooldown: list[Callable[[str, str], None]] = []
        #: Called as ``hook(plan)`` with each two-sided request once planned, on the request's thread
        #: before any attempt: keep hooks quick (a draw, a non-blocking enqueue: the shadow phase).
        self.on_plan: list[Callable[[Plan], None]] = []
        self.breakers = {
            name: CircuitBreaker(name, policy, on_change=self._breaker_changed, lock=new_lock())
            for name in settings.providers
        }
        self.offers = chat_offers(settings.providers)
        self.route_table = routes_mod.build(settings.routes, rng)
        #: Each route's canary share as last read (:func:`db.canary.read_route_ratios` through the
        #: gateway's refresher); a route without a row: 0.
        self.route_ratios: RouteRatioSource = _NoRouteRatios()
        # Caller headers some provider may receive (the union of the allow-lists), read once.
        self.forwardable = frozenset(h for p in settings.providers.values() for h in p.forward_headers)
        # Set by a server whose shutdown grace period ran out: what it cuts from then on is logged
        # "shutdown", not "cancelled" (which says the caller went away).
        self.shutting_down = False
        # Request ids: a random per-client prefix and a counter (unique, and far cheaper than uuid4).
        self._new_id = IdSource()
        self._homes: OrderedDict[str, str] = OrderedDict()
        self._homes_lock = new_lock()

    def _breaker_changed(self, provider: str, old: State, new: State, why: str) -> None:
        log.warning("circuit breaker for %s: %s -> %s (%s)", provider, old, new, why)
        for hook in list(self.on_breaker_change):
            try:
                hook(provider, old, new, why)
            except Exception:  # a listener's bug must not break routing
                log.exception("breaker change hook %r failed", hook)

    def route_ratio(self, route: str) -> float:
        return self.route_ratios.value.get(route, 0.0)

    def breaker_states(self) -> dict[str, BreakerSnapshot]:
        now = self.clock()
        return {name: b.snapshot(now) for name, b in self.breakers.items()}

    def cooldowns(self) -> dict[str, float]:
        """The route deployments cooling down in this process, with the seconds each has left."""
        return self.route_table.cooling_left(self.clock())

    # -- planning ------------------------------------------------------------------------------
    def plan(self, api: str, body: Mapping[str, Any], options: RouteOptions = DEFAULT_OPTIONS) -> Plan:
        """Validate what the gateway reads of a request and decide its side, model and routes;
        :class:`InvalidRequest` (before any network call) when it cannot be routed."""
        model, session_id, stream, source = options.model, options.session_id, options.stream, options.source
        route, cache_hints, key_name, headers = options.route, options.cache_hints, options.key_name, options.headers
        if api not in API_PATHS:
            raise InvalidRequest(f"unknown API {api!r}")
        body = {k: encodable(v) for k, v in body.items() if k not in OWNED_FIELDS and not (k == "stream" and v)}
        msgs = input_messages(api, body)
        if api == "chat":
            msgs = [sendable_message(m) for m in msgs]
            body["messages"] = msgs
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
        caller_usage = False
        if stream:
            opts = body.get("stream_options")
            caller_usage = isinstance(opts, Mapping) and opts.get("include_usage") is True
        temperature = body.get("temperature")
        if temperature is not None and (
            isinstance(temperature, bool)
            or not isinstance(temperature, (int, float))
            or not 0.0 <= temperature <= 2.0  # compared as it is: float() of a huge int overflows
        ):
            raise InvalidRequest("temperature must be between 0 and 2")
        for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            v = body.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidRequest(f"{name} must be a positive integer")

        to_route = self._route_for(api, model, msgs) if route is None else None
        if options.canary_only:
            canaried = [n for n, r in self.route_table.routes.items() if r.canary is not None]
            if to_route is None or self.route_table.routes[to_route[0]].canary is None:
                raise InvalidRequest(
                    f"canary_only: model {model!r} names no route with a canary deployment "
                    f"(routes with one: {', '.join(canaried) or 'none'})"
                )
        if to_route is not None:
            name, intent, est = to_route
            return self._planned(
                self._route_plan(
                    name, api, body, msgs, model, header, session_id, source, stream, caller_usage, cache_hints,
                    key_name, headers, intent=intent, est=est, canary_only=options.canary_only,
                )
            )  # fmt: skip
        r = self.settings.routing
        if route is not None:
            if route not in ("primary", "fallback"):
                raise InvalidRequest("route must be 'primary' or 'fallback'")
            side: Side = route
            routes = [(getattr(r, route), False)]
        else:
            side = assign_side(self.ratio.value, session_id, self.rng)
            routes = [(r.primary, False)] if side == "primary" else [(r.fallback, False)]
            if side == "primary" and r.fallback_enabled and r.fallback != r.primary:
                routes.append((r.fallback, True))
        try:
            routes = self._serving(api, routes, forced=route is not None)

            if api == "embeddings":
                chosen, intent, requested = self._embedding_model(model, routes)
                routes = [(p, fb) for p, fb in routes if chosen in self.settings.providers[p].models]
                if not routes:
                    raise NoProvider(f"no provider on this route serves the embedding model {chosen!r}")
                est = estimate_tokens(len(message_text(msgs)), self.settings.intents.chars_per_token)
            elif model in (None, "", "auto"):
                decision = classify_intent(msgs, self.settings.intents)
                chosen, intent, est = decision.model, decision.intent, decision.estimated_tokens
                requested = "auto"
            else:
                info = catalog.get(model)  # UnknownModelError before any network call
                if info.kind != "chat":
                    raise InvalidRequest(f"{model!r} is an embedding model; use it with the embeddings API")
                chosen, intent, requested = model, "explicit", model
                est = estimate_tokens(len(message_text(msgs)), self.settings.intents.chars_per_token)
            if api != "embeddings":  # an embedding model is never substituted: its routes all serve it
                routes = self._cost_safe_routes(chosen, routes, forced=route is not None, by_intent=requested == "auto")
            if api == "responses":
                routes = self._responses_routes(body, routes)
        except (NoProvider, SubstitutionRefused) as exc:
            self._refused(api, body, msgs, model, side, routes, session_id, source, stream, key_name, exc)
            raise
        forwarded = self._forwarded(headers)
        planned = Plan(
            request_id=self._new_id(),
            api=api,
            body=body,
            messages=msgs,
            requested_model=requested,
            model=chosen,
            intent=intent,
            side=side,
            routes=routes,
            prompt_tokens_est=est,
            session_id=session_id,
            source=source,
            cache_hints=cache_hints,
            stream=stream,
            caller_usage=caller_usage,
            session_header=header,
            prompt_text=self._stored_prompt(msgs),
            headers=forwarded,
            key_name=key_name,
            no_shadow=_no_shadow(headers),
        )
        return self._planned(planned)

    def _planned(self, planned: Plan) -> Plan:
        """``planned``, after every plan hook saw it (the shadow phase's mirror)."""
        for hook in self.on_plan:
            try:
                hook(planned)
            except Exception:  # a listener's bug must not fail the request
                log.exception("plan hook %r failed", hook)
        return planned

    def _stored_prompt(self, msgs: list[dict]) -> str | None:
        """The prompt as the log keeps it: cleaned, keys scrubbed, and only with store_prompts."""
        if not self.settings.telemetry.store_prompts:
            return None
        return clean(message_text(msgs), PROMPT_STORE_LIMIT, self.secret_values)

    def _forwarded(self, headers: Mapping[str, str] | None) -> dict[str, str]:
        forwarded: dict[str, str] = {}
        for k, v in (headers or {}).items():
            name = k.lower()
            if name in self.forwardable:
                if name in forwarded:
                    raise InvalidRequest(f"header {name} was sent more than once; send it once")
                if _CONTROL.search(v):
                    raise InvalidRequest(f"header {name}: its value has a control character (NUL, DEL, CR, LF, ...)")
                forwarded[name] = v
        return forwarded

    def _route_for(self, api: str, model: str | None, msgs: list[dict]) -> tuple[str, str, int | None] | None:
        """The ``[routes]`` name a request goes to, with its intent and prompt estimate: the model
        it names, or (``auto``, not embeddings) the model its intent rule picks, when a route has
        that name; else None (the two-sided routing)."""
        table = self.route_table
        if not table.routes:
            return None
        if model not in (None, "", "auto"):
            return (model, "explicit", None) if model in table else None
        if api == "embeddings":
            return None
        decision = classify_intent(msgs, self.settings.intents)
        if decision.model in table:
            return decision.model, decision.intent, decision.estimated_tokens
        return None

    def _route_plan(
        self,
        name: str,
        api: str,
        body: dict[str, Any],
        msgs: list[dict],
        model: str | None,
        header: str | None,
        session_id: str | None,
        source: str,
        stream: bool,
        caller_usage: bool,
        cache_hints: bool,
        key_name: str | None,
        headers: Mapping[str, str] | None,
        *,
        intent: str = "explicit",
        est: int | None = None,
        canary_only: bool = False,
    ) -> Plan:
        """A request to a route: its canary draw (the session's fixed one, else random), and the
        providers that may answer its API; the deployments themselves are ordered when it starts.
        ``canary_only``: the route's canary deployment alone, with no fallback."""
        providers = self.settings.providers
        serving = {p for p, c in providers.items() if serves(c, api)}
        home = None
        if api == "responses":
            home = self._home_of(body.get("previous_response_id"))
            try:
                chat_request(body)
            except NotBridgeable as exc:
                native = {p for p in serving if "responses" in providers[p].apis}
                if not any(d.provider in native for d in self.route_table.routes[name].every_deployment):
                    raise NoProvider(str(exc), param=exc.param) from None
                serving = native
        if not any(d.provider in serving for d in self.route_table.routes[name].every_deployment):
            raise NoProvider(f"no deployment of route {name!r} serves the {API_NAMES[api]}")
        if est is None:
            est = estimate_tokens(len(message_text(msgs)), self.settings.intents.chars_per_token)
        ratio = self.route_ratio(name)
        draw = routes_mod.session_draw(name, session_id) if session_id is not None else self.rng.random()
        canary = canary_only or (self.route_table.routes[name].canary is not None and draw < ratio)
        return Plan(
            request_id=self._new_id(),
            api=api,
            body=body,
            messages=msgs,
            requested_model=model or "auto",
            model=name,
            intent="embedding" if api == "embeddings" else intent,
            side="route_canary" if canary else "route",
            routes=[],
            prompt_tokens_est=est,
            session_id=session_id,
            source=source,
            cache_hints=cache_hints,
            stream=stream,
            caller_usage=caller_usage,
            session_header=header,
            prompt_text=self._stored_prompt(msgs),
            headers=self._forwarded(headers),
            key_name=key_name,
            route=name,
            route_home=home,
            route_providers=frozenset(serving),
            canary=canary,
            canary_only=canary_only,
            no_shadow=_no_shadow(headers),
        )

    def _refused(
        self,
        api: str,
        body: dict[str, Any],
        msgs: list[dict],
        model: str | None,
        side: Side,
        routes: list[tuple[str, bool]],
        session_id: str | None,
        source: str,
        stream: bool,
        key_name: str | None,
        exc: InvalidRequest,
    ) -> None:
        """A request the routing policy refused before any attempt (no provider serves its API or
        model, the substitution policy) still gets its one final row, so every rate counts it."""
        requested = model if model not in (None, "") else "auto"
        plan = Plan(
            request_id=self._new_id(),
            api=api,
            body=body,
            messages=msgs,
            requested_model=requested,
            model=requested,
            intent="refused",
            side=side,
            routes=routes,
            prompt_tokens_est=0,
            session_id=session_id,
            source=source,
            cache_hints=False,
            stream=stream,
            key_name=key_name,
        )
        error_class = "refused_by_policy" if isinstance(exc, SubstitutionRefused) else "no_route"
        self.no_route(plan, NoRoute(str(exc), error_class))
        self.commit(plan)

    def _serving(self, api: str, routes: list[tuple[str, bool]], *, forced: bool) -> list[tuple[str, bool]]:
        """The routes whose provider serves ``api``; when the assigned side serves none, the other
        side does (an API served by one side only); :class:`InvalidRequest` when no provider does."""
        providers = self.settings.providers
        kept = [(p, fb) for p, fb in routes if serves(providers[p], api)]
        if kept:
            return kept
        r = self.settings.routing
        others = [name for name in (r.primary, r.fallback) if serves(providers[name], api)]
        if others and not forced:
            return [(others[0], False)]
        serving = sorted(name for name, p in providers.items() if serves(p, api))
        where = f" (only {', '.join(serving)} does, which is not routed here)" if serving else ""
        raise NoProvider(f"no provider on this route serves the {API_NAMES[api]}{where}")

    def _embedding_model(self, model: str | None, routes: list[tuple[str, bool]]) -> tuple[str, str, str]:
        if model in (None, "", "auto"):
            for provider, _ in routes:
                for m in self.settings.providers[provider].models:
                    if catalog.get(m).kind == "embedding":
                        return m, "embedding", "auto"
            raise InvalidRequest("no embedding model is configured on this route; name one in 'model'")
        info = catalog.get(model)
        if info.kind != "embedding":
            raise InvalidRequest(f"{model!r} is not an embedding model")
        return model, "embedding", model

    def _responses_routes(self, body: dict[str, Any], routes: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
        """A ``previous_response_id`` goes back to the provider that holds it; a request the
        bridge cannot translate keeps only providers that serve the Responses API themselves."""
        home = self._home_of(body.get("previous_response_id"))
        if home is not None:
            return [(home, False)]  # only the provider that holds the conversation can continue it
        native = [(p, fb) for p, fb in routes if "responses" in self.settings.providers[p].apis]
        if len(native) == len(routes):
            return routes
        try:
            chat_request(body)
        except NotBridgeable as exc:
            if native:
                return native
            raise NoProvider(str(exc), param=exc.param) from None
        return routes

    def _home_of(self, response_id: object) -> str | None:
        if not isinstance(response_id, str):
            return None
        with self._homes_lock:
            return self._homes.get(response_id)

    def remember_response(self, response_id: str | None, provider: str) -> None:
        """Note which provider holds a Responses API id (a ``previous_response_id`` goes back there)."""
        if not response_id:
            return
        with self._homes_lock:
            self._homes[response_id] = provider
            self._homes.move_to_end(response_id)
            while len(self._homes) > RESPONSE_HOMES:
                self._homes.popitem(last=False)

    def _cost_safe_routes(
        self, model: str, routes: list[tuple[str, bool]], *, forced: bool, by_intent: bool
    ) -> list[tuple[str, bool]]:
        """The planned routes under ``[routing.substitution]`` (see :mod:`app.routing.substitution`);
        raises :class:`SubstitutionRefused` before any network call when none is left."""
        r = self.settings.routing
        policy = Policy.of(r.substitution.mode, r.substitution.max_price_factor)
        # The canary ratio means what it says: a side the operator gave no traffic (0 % or 100 %)
        # is never where a request is moved to because of its model; only fail-over reaches it.
        ratio = self.ratio.value
        closed = {r.primary} if ratio <= 0 else {r.fallback} if ratio >= 1 else set()
        alternatives = [a for a in (r.primary, r.fallback) if a not in closed or a in {p for p, _ in routes}]
        try:
            decision = decide(
                model,
                routes,
                self.offers,
                policy,
                alternatives=alternatives,
                forced=forced,
                by_intent=by_intent,
            )
        except SubstitutionRefused as exc:
            shut = [a for a in (r.primary, r.fallback) if a in closed and a not in {p for p, _ in routes}]
            if not shut or not any(model in self.offers[a].models for a in shut):
                raise
            raise SubstitutionRefused(
                model,
                f"{exc} {shut[0]} serves {model} but gets no traffic at a canary ratio of {ratio:.0%}: "
                f"raise the ratio to send such requests there",
            ) from None
        for v in decision.dropped:
            log.info(
                "%s not used for %s: %s would cost %.2fx (routing.substitution)", v.provider, model, v.model, v.factor
            )
        if decision.rerouted:
            log.info("%s routed to %s, which serves it (routing.substitution)", model, decision.routes[0][0])
        return decision.routes

    # -- requests ------------------------------------------------------------------------------
    def request(self, plan: Plan, attempt: Attempt) -> UpstreamRequest:
        """One attempt's HTTP request. The body is the caller's, as sent, with the routed ``model``;
        streamed, ``stream`` and ``stream_options.include_usage`` (the gateway's accounting);
        then the provider's ``drop_params`` and ``rename_params``."""
        api = "chat" if attempt.bridged else plan.api
        sent = chat_request(plan.body) if attempt.bridged else plan.body
        body: dict[str, Any] = {"model": attempt.model, **sent}
        if plan.stream:
            body["stream"] = True
            if api != "responses":
                opts = plan.body.get("stream_options")
                body["stream_options"] = {**(opts if isinstance(opts, Mapping) else {}), "include_usage": True}
        p = self.settings.providers[attempt.provider]
        for name in p.drop_params:
            body.pop(name, None)
        for old, new in p.rename_params.items():
            if old in body:
                body[new] = body.pop(old)
        return UpstreamRequest("POST", API_PATHS[api], self._headers(plan, attempt), body, attempt.timeout)

    def adjusted_params(self, plan: Plan, provider: str) -> list[str]:
        """What ``drop_params`` / ``rename_params`` changed in a request to ``provider`` (for the
        attempt's record and the drill-down)."""
        p = self.settings.providers[provider]
        out = [f"-{n}" for n in p.drop_params if n in plan.body]
        out += [f"{o}->{n}" for o, n in p.rename_params.items() if o in plan.body]
        return out

    def _headers(self, plan: Plan, attempt: Attempt) -> dict[str, str]:
        headers: dict[str, str] = {}
        if plan.headers:
            allowed = self.settings.providers[attempt.provider].forward_headers
            headers.update({k: v for k, v in plan.headers.items() if k in allowed})
        if attempt.with_hints:
            headers["x-session-id"] = plan.session_header or ""
            headers["x-cache-controls"] = "session_scope"
        return headers

    def read(self, plan: Plan, attempt: Attempt, content: bytes, headers: Mapping[str, str]) -> Answer:
        """A non-streamed 2xx answer (its body bytes and headers), read (:class:`BadResponse` when
        it is not an answer)."""
        if not attempt.bridged:
            return read_answer(plan.api, content, headers, attempt.model)
        chat = read_answer("chat", content, headers, attempt.model)
        body = response_body(chat.body, plan.body, attempt.model, now=attempt.ts)
        return Answer(body, chat.text, responses_finish(body), chat.usage, chat.tool_calls, chat.headers)

    def feed(self, plan: Plan, attempt: Attempt) -> EventBridge | PassThrough:
        """What turns an attempt's upstream chunks into the caller's: a chat stream into the
        Responses API's events when bridged, else each chunk as it is."""
        return EventBridge(plan.body, attempt.model, now=attempt.ts) if attempt.bridged else PassThrough()

    def stream_account(self, plan: Plan, attempt: Attempt, started: float) -> StreamAccount:
        return StreamAccount(plan.api, attempt.model, started, attempt.t0, self.clock)

    # -- the attempt loop ----------------------------------------------------------------------
    def start(self, plan: Plan) -> float:
        started = self.clock()
        plan.deadline = Deadline.after(started, self.settings.retry.request_deadline_s)
        return started

    def deadline(self, plan: Plan, attempt: Attempt) -> AttemptDeadline:
        """An attempt's deadlines: non-streamed, its whole budget; streamed, its budget until the
        first token, then the idle gap and the request's deadline."""
        budget_end = attempt.t0 + attempt.timeout
        if not plan.stream:
            return AttemptDeadline(self.clock, budget_end)
        return AttemptDeadline(
            self.clock,
            plan.deadline.end,
            first_token_by=budget_end,
            idle_s=self.settings.retry.stream_idle_timeout_s,
        )

    def attempts(self, plan: Plan) -> Generator[Attempt | Wait, Failure | None, None]:
        """Drive the retry/fallback loop; yields what to try next and learns each outcome.

        The caller sends back ``None`` on success (the loop ends) or the (cleaned) :class:`Failure`;
        for a :class:`Wait` it sleeps that long and sends ``None``. The decisions are
        :mod:`app.routing.policy`'s (and, for a route, :mod:`app.routing.routes`'); this only reads
        the clock, draws the backoff and asks the breakers. No I/O and no sleeping happen here.
        """
        backoff = Backoff(self.settings.retry, self.rng)
        skipped: list[str] = []
        if plan.route is not None:
            yield from self._route_attempts(plan, backoff, skipped)
            return
        for provider, is_fallback in plan.routes:
            model, substituted = (
                (plan.model, False) if plan.api == "embeddings" else model_on(self.offers[provider], plan.model)
            )
            outcome, _ = yield from self._on(plan, backoff, skipped, provider, model, substituted, is_fallback, None)
            if outcome == "ok":
                return
            if outcome == "stop":
                raise NoRoute(f"request refused by {provider}")
        if skipped:
            raise NoRoute(f"all routes failed (circuit open: {', '.join(skipped)})", "breaker_open")
        raise NoRoute("all routes failed", "no_route")

    def _route_attempts(
        self, plan: Plan, backoff: Backoff, skipped: list[str]
    ) -> Generator[Attempt | Wait, Failure | None, None]:
        """A route's deployments in its strategy's order, then its fallbacks: the general ones when
        every deployment failed, the context-window or content-policy ones when an upstream refused
        the request for that reason (or the prompt fits no deployment's window)."""
        table = self.route_table
        queue: list[tuple[str, bool]] = [(plan.route, False)]  # type: ignore[list-item]
        seen: set[str] = set()
        left_out: list[str] = []
        refused: tuple[str, Failure | None] | None = None
        while queue:
            name, via_fallback = queue.pop(0)
            if name in seen:
                continue
            seen.add(name)
            route = table.routes[name]
            targets, out = table.order(
                name,
                now=self.clock(),
                prompt_tokens=plan.prompt_tokens_est,
                session_id=plan.session_id,
                canary_ratio=(1.0 if plan.canary_only else self.route_ratio(name))
                if plan.canary and name == plan.route
                else 0.0,
                draw=0.0,
                is_fallback=via_fallback,
                providers=plan.route_providers,
            )
            if plan.canary_only:
                targets = [t for t in targets if t.canary]
            if plan.route_home is not None:  # a previous_response_id: only its provider holds it
                targets = [t for t in targets if t.provider == plan.route_home]
            left_out += out
            kind: str | None = None
            if not targets and any("context window" in why for why in out):
                kind = routes_mod.CONTEXT_WINDOW
            for target in targets:
                d = target.deployment
                outcome, failure = yield from self._on(
                    plan, backoff, skipped, d.provider, d.model, False, via_fallback or target.is_fallback, target
                )
                if outcome == "ok":
                    return
                if outcome == "stop":
                    assert failure is not None
                    kind = routes_mod.fallback_kind(
                        failure.error_class, failure.http_status, f"{failure.message} {failure.body or ''}"
                    )
                    if kind is None:
                        raise NoRoute(f"request refused by {d.provider}")
                    refused = (d.provider, failure)
                    break
            if plan.canary_only:
                break  # a copy for the canary alone: no other deployment, no fallback
            if kind == routes_mod.CONTEXT_WINDOW:
                queue = [(n, True) for n in route.context_window_fallbacks]
            elif kind == routes_mod.CONTENT_POLICY:
                queue = [(n, True) for n in route.content_policy_fallbacks]
            else:
                queue += [(n, True) for n in route.fallbacks]
        if refused is not None:
            raise NoRoute(f"request refused by {refused[0]}, and no fallback of its kind served it")
        if skipped:
            raise NoRoute(f"all deployments failed (circuit open: {', '.join(skipped)})", "breaker_open")
        if left_out and not plan.records:
            raise NoRoute(f"no deployment of {plan.route} could take the request: {'; '.join(left_out)}", "no_route")
        raise NoRoute("all deployments failed", "no_route")

    def _on(
        self,
        plan: Plan,
        backoff: Backoff,
        skipped: list[str],
        provider: str,
        model: str,
        substituted: bool,
        is_fallback: bool,
        target: routes_mod.Target | None,
    ) -> Generator[Attempt | Wait, Failure | None, tuple[str, Failure | None]]:
        """The attempts on one provider (one deployment of a route): retries with backoff, one
        resend without cache hints. Returns ``("ok" | "fail_over" | "skipped" | "stop", failure)``."""
        cfg = self.settings.retry
        p = self.settings.providers[provider]
        base_timeout = attempt_timeout_s(p.timeout_s, plan.prompt_tokens_est, cfg)
        max_attempts = max_attempts_for(p.max_attempts, cfg.max_attempts)
        breaker = self.breakers[provider]
        with_hints = plan.cache_hints and plan.session_header is not None
        hints_dropped = False
        made = 0
        while True:
            now = self.clock()
            remaining = plan.deadline.remaining(now)
            if remaining <= 0:
                raise NoRoute(f"the request deadline of {cfg.request_deadline_s:g} s passed", "deadline")
            if not breaker.allow(now):
                log.info("%s: circuit open, skipped (request %s)", provider, plan.request_id)
                skipped.append(provider)
                return "skipped", None
            if target is not None and made and self.route_table.cooling(target.deployment, now):
                return "fail_over", None  # it began cooling down while this request waited
            timeout = attempt_budget_s(base_timeout, remaining)
            bridged = plan.api == "responses" and "responses" not in p.apis
            attempt = Attempt(
                provider, model, is_fallback, substituted, with_hints, timeout, bridged=bridged, target=target
            )
            if target is None:
                failure = yield attempt
            else:
                self.route_table.started(target.deployment, now, plan.prompt_tokens_est)
                try:
                    failure = yield attempt
                finally:
                    self.route_table.stat(target.deployment).in_flight -= 1
            if failure is None:
                return "ok", None
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
                remaining_s=plan.deadline.remaining(self.clock()),
            )
            if step.action == "resend_without_hints":
                log.info("%s rejected cache hints; retrying without (request %s)", provider, plan.request_id)
                with_hints, hints_dropped = False, True
                continue
            made += 1
            if (
                step.action == "retry"
                and target is not None
                and self.route_table.cooling(target.deployment, self.clock())
            ):
                # This request's own failures put the deployment out: the next deployment now,
                # not a backoff sleep before a retry that would not be made.
                return "fail_over", failure
            if step.action == "retry":
                log.info(
                    "%s: %s; retry in %.2fs (request %s)",
                    provider,
                    failure.describe(),
                    step.delay_s,
                    plan.request_id,
                )
                backoff.commit(step.delay_s)
                yield Wait(step.delay_s)
                continue
            if step.action == "fail_over":
                log.info(
                    "%s: %s; %s; trying the next route (request %s)",
                    provider,
                    failure.describe(),
                    step.reason,
                    plan.request_id,
                )
                return "fail_over", failure
            return "stop", failure

    # -- records -------------------------------------------------------------------------------
    def clean(self, text: str) -> str:
        return clean(text, ERROR_TEXT_LIMIT, self.secret_values) or ""

    def record(
        self,
        plan: Plan,
        attempt: Attempt,
        *,
        ttft_ms: float | None = None,
        attempt_ttft_ms: float | None = None,
        failure: Failure | None = None,
        usage: Usage | None = None,
        cost: float = 0.0,
        final: bool = False,
        answer: str | None = None,
        finish_reason: str | None = None,
        tool_calls: int = 0,
        quality: AnswerQuality = NO_QUALITY,
        chunk_gap_ms: float | None = None,
    ) -> Failure | None:
        """Log one attempt (and tell its provider's breaker); returns ``failure`` with its text
        cleaned, which is the only form of it that goes further (logs, retries, the caller)."""
        if failure is not None:
            failure = replace(failure, message=self.clean(failure.message), body=self._clean_body(failure.body))
        outcome = breaker_outcome(failure)
        breaker = self.breakers.get(attempt.provider)
        if outcome is not None and breaker is not None:
            breaker.record(outcome, self.clock())
        usage = usage or Usage()
        adjusted = self.adjusted_params(plan, attempt.provider) if attempt.provider in self.settings.providers else []
        number = len(plan.records) + 1
        latency_ms = (self.clock() - attempt.t0) * 1000.0
        target = attempt.target
        if target is not None:
            route = self.route_table.routes[target.route]
            cooled = self.route_table.finished(
                target.deployment,
                self.clock(),
                health=outcome,
                cooldown_s=route.cooldown_s,
                allowed_fails=route.allowed_fails,
                latency_ms=latency_ms if failure is None else None,
                ttft_ms=attempt_ttft_ms if failure is None else None,
            )
            if cooled:
                log.warning("route %s: %s", target.route, cooled)
                for hook in list(self.on_cooldown):
                    try:
                        hook(target.route, cooled)
                    except Exception:  # a listener's bug must not break routing
                        log.exception("cooldown hook %r failed", hook)
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
                api=plan.api,
                finish_reason=finish_reason,
                tool_calls=tool_calls,
                reasoning_tokens=usage.reasoning_tokens,
                adjusted_params=",".join(adjusted)[:ADJUSTED_MAX] or None,
                route=target.route if target else None,
                deployment=target.deployment.key[:DEPLOYMENT_MAX] if target else None,
                route_why=f"{'fallback: ' if target.is_fallback else ''}{target.why}"[:ROUTE_WHY_MAX]
                if target
                else None,
                refused=quality.refused,
                tool_json_bad=quality.tool_json_bad,
                schema_bad=quality.schema_bad,
                chunk_gap_ms=chunk_gap_ms,
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
                adjusted_params=tuple(adjusted),
                upstream_error=failure.body if failure else None,
                retry_after_s=failure.retry_after_s if failure else None,
            )
        )
        return failure

    def _clean_body(self, body: object) -> dict | None:
        """An upstream's error object with every text cleaned (keys scrubbed), for the caller."""
        if not isinstance(body, Mapping):
            return None

        def scrub(v: object) -> object:
            if isinstance(v, str):
                return clean(v, ERROR_TEXT_LIMIT * 4, self.secret_values)
            if isinstance(v, Mapping):
                return {str(k)[:64]: scrub(x) for k, x in list(v.items())[:32]}
            if isinstance(v, list):
                return [scrub(x) for x in v[:32]]
            return v if isinstance(v, (int, float, bool)) or v is None else None

        out = scrub(body)
        return out if isinstance(out, dict) else None

    def failed(self, plan: Plan, attempt: Attempt, exc: Exception, **kw: Any) -> Failure:
        """Classify and log a failed attempt. An exception that is not an upstream fault (our own
        bug) is logged as ``internal_error`` and raised to the caller."""
        try:
            failure = self.classify(exc, sent_hints=attempt.with_hints)
        except BaseException:
            self.record(plan, attempt, failure=Failure("internal_error", f"{type(exc).__name__}: {exc}"), **kw)
            raise
        cleaned = self.record(plan, attempt, failure=failure, **kw)
        assert cleaned is not None
        return cleaned

    def log_refusal(
        self,
        api: str,
        model: str | None,
        *,
        error_class: str,
        message: str,
        http_status: int,
        key_name: str | None = None,
        source: str | None = None,
        stream: bool = False,
    ) -> None:
        """A request the gateway itself refused before routing it (a key, a rate limit or a budget,
        the gateway's own database): its one final row, provider ``gateway``, zero latency."""
        name = (model or "-")[:128]
        record = AttemptRecord(
            request_id=self._new_id(),
            attempt=1,
            ts=self.wall(),
            provider=GATEWAY,
            model=name,
            requested_model=name,
            intent="refused",
            side="none",
            status="error",
            latency_ms=0.0,
            http_status=http_status,
            error_class=error_class,
            error_message=self._refusal_text(message),
            final=True,
            stream=stream,
            source=storable(source or self.source, MAX_SOURCE) or "api",
            key_name=key_name,
            api=api if api in API_PATHS else "chat",
        )
        self.telemetry.submit_many([record])

    def _refusal_text(self, message: str) -> str:
        text = self._refusal_texts.get(message)
        if text is None:
            if len(self._refusal_texts) >= 256:  # bounded, whatever the messages
                self._refusal_texts.clear()
            text = self._refusal_texts[message] = self.clean(message)
        return text

    def no_route(self, plan: Plan, stop: NoRoute) -> None:
        """The request ended with nothing more to try. When no attempt was made at all (every
        breaker open, the deadline gone, the substitution policy refused it), the request still
        gets its one final row, of its own error class and zero latency, so every rate counts it.
        That row is the gateway's (provider :data:`GATEWAY`), like an admission refusal's: no
        provider was asked, so none is blamed for it."""
        if plan.records or stop.error_class is None:
            return
        attempt = Attempt(GATEWAY, plan.model, False, False, False, 0.0, ts=self.wall(), t0=self.clock())
        self.record(plan, attempt, failure=Failure(stop.error_class, str(stop)), final=True)

    def commit(self, plan: Plan) -> None:
        if not plan.records:
            return
        if not plan.records[-1].final:  # a failed request: its last attempt closes it
            plan.records[-1] = replace(plan.records[-1], final=True)
        self.telemetry.submit_many(plan.records)

    def succeed(
        self,
        plan: Plan,
        attempt: Attempt,
        started: float,
        answer: Answer | StreamedAnswer,
        *,
        ttft_ms: float | None = None,
        attempt_ttft_ms: float | None = None,
        chunk_gap_ms: float | None = None,
    ) -> ChatResult:
        """Record the successful attempt and build the caller's result."""
        usage = answer.usage
        cost = catalog.cost_usd(attempt.priced_as, usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)
        if attempt.target is not None and answer.headers:
            self.route_table.learn_limits(attempt.target.deployment, self.clock(), answer.headers)
        if isinstance(answer, StreamedAnswer):
            quality = answer.quality
        else:
            quality = chat_quality(answer.body, plan.body) if plan.api == "chat" else NO_QUALITY
        # The answer is stored only with store_prompts, cleaned like the prompt (keys scrubbed).
        stored = None
        if self.settings.telemetry.store_prompts:
            text = answer.text() if isinstance(answer, StreamedAnswer) else answer.text
            stored = clean(text, PROMPT_STORE_LIMIT, self.secret_values)
        self.record(
            plan,
            attempt,
            ttft_ms=ttft_ms,
            attempt_ttft_ms=attempt_ttft_ms,
            usage=usage,
            cost=cost,
            final=True,
            answer=stored,
            finish_reason=answer.finish_reason,
            tool_calls=answer.tool_calls,
            quality=quality,
            chunk_gap_ms=chunk_gap_ms,
        )
        if plan.api == "responses" and not attempt.bridged and isinstance(answer, Answer):
            rid = answer.body.get("id")  # a bridged answer holds no conversation; a stream's was remembered
            self.remember_response(rid if isinstance(rid, str) else None, attempt.provider)
        if isinstance(answer, StreamedAnswer):  # read when the result's text or raw is (ChatResult)
            text_of, raw_of = cast(str, answer.text), cast("dict | None", answer.body)
        else:
            text_of, raw_of = answer.text, (answer.body or None)
        return ChatResult(
            text=text_of,
            provider=attempt.provider,
            model=attempt.model,
            requested_model=plan.requested_model,
            intent=plan.intent,
            side=plan.side,
            fallback_used=attempt.is_fallback,
            attempts=len(plan.records),
            latency_ms=(self.clock() - started) * 1000.0,
            ttft_ms=ttft_ms,
            usage=usage,
            cost_usd=cost,
            request_id=plan.request_id,
            session_id=plan.session_id,
            substituted_model=attempt.substituted,
            finish_reason=answer.finish_reason,
            attempt_log=list(plan.infos),
            api=plan.api,
            tool_call_count=answer.tool_calls,
            raw=raw_of,
            upstream_headers=answer.headers,
        )

    # -- stream outcomes -----------------------------------------------------------------------
    def begin_shutdown(self) -> None:
        self.shutting_down = True

    def cancelled(self, why: str) -> Failure:
        """The failure of an attempt stopped before its end: the caller's doing (``why``), or the
        server's own shutdown."""
        if self.shutting_down:
            return Failure("shutdown", "the gateway shut down before the answer was complete")
        return Failure("cancelled", why)

    def stream_cancelled(self, plan: Plan, attempt: Attempt, acc: StreamAccount, why: str) -> None:
        self.record(plan, attempt, failure=self.cancelled(why), **acc.record_kw())

    def stream_failed(self, plan: Plan, attempt: Attempt, acc: StreamAccount, exc: Exception) -> Failure:
        """A streamed attempt failed. Before anything reached the caller: the failure for the
        retry/fallback loop. After: :class:`StreamBrokenError` (an answer cannot be taken back);
        an exception that is not an upstream fault is logged and raised as it is."""
        kw = acc.record_kw()
        if isinstance(exc, Truncated):
            exc = BadResponse(exc.args[0])
        if not acc.released:
            return self.failed(plan, attempt, exc, **kw)
        try:
            self.classify(exc, sent_hints=attempt.with_hints)  # only to tell our bugs apart
        except BaseException:
            self.record(plan, attempt, failure=Failure("internal_error", f"{type(exc).__name__}: {exc}"), **kw)
            raise
        n = acc.released
        cause = self.clean(f"{type(exc).__name__}: {exc}" if not isinstance(exc, BadResponse) else str(exc))
        self.record(plan, attempt, failure=Failure("stream_broken", f"stream broke after {n} chunks: {cause}"), **kw)
        raise StreamBrokenError(
            f"{attempt.provider}/{attempt.model} stream broke after {n} chunks "
            f"(request {plan.request_id}): {cause}; the answer is incomplete"
        ) from exc

    def stream_succeeded(
        self, plan: Plan, attempt: Attempt, started: float, acc: StreamAccount, headers: Mapping[str, str]
    ) -> ChatResult:
        if plan.api == "responses" and not attempt.bridged:
            self.remember_response(acc.response_id, attempt.provider)
        # The text and the assembled answer are read only by whoever asks for them (the server
        # forwards the chunks and never does, unless it stores answers).
        quality = NO_QUALITY
        if plan.api == "chat":
            schema = requested_schema(plan.body) is not None
            quality = chat_quality(acc.assembled(with_text=schema) or {}, plan.body, refused=acc.refused)
        answer = StreamedAnswer(
            Deferred(acc.assembled), Deferred(acc.text), acc.finish, acc.usage or Usage(),
            acc.tool_calls, dict(headers), quality,
        )  # fmt: skip
        return self.succeed(
            plan, attempt, started, answer, ttft_ms=acc.ttft_ms, attempt_ttft_ms=acc.attempt_ttft_ms,
            chunk_gap_ms=acc.chunk_gap_ms,
        )  # fmt: skip
