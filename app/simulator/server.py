"""The simulated OpenAI-compatible upstream: one ``SimulatedProvider`` per configured provider.

``SimulatedProvider.handle`` turns an ``httpx2.Request`` into an ``httpx2.Response`` the way an
OpenAI-compatible server would, so the real SDK code path (request building, error mapping,
SSE parsing) runs against it through a mock transport. It serves the OpenAI surface a gateway
proxies: ``POST /v1/chat/completions``, ``/v1/responses`` (and ``GET``/``DELETE
/v1/responses/{id}``), ``/v1/embeddings`` and ``/v1/completions``, streamed where OpenAI
streams, plus ``GET /v1/models`` and ``/v1/models/{id}``. This module owns what every endpoint
shares: routing, the ``apis`` a provider serves, fault injection, the latency profile and its
pacing, the rate-limit and request-id headers; the endpoint modules (``chat``, ``responses``,
``embeddings``, ``completions``) own their request checks and answer shapes.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import httpx2

# The canned-text composer, read from this module per request: a test or a demo may rebind
# ``app.simulator.server.compose_answer`` to make the simulator say something else.
from app.simulator.answers import compose_answer
from app.simulator.chat import plan_chat
from app.simulator.completions import plan_completions
from app.simulator.degrade import DRAWS, degrade
from app.simulator.embeddings import plan_embeddings
from app.simulator.errors import BadRequest, error_body
from app.simulator.generation import Reply
from app.simulator.prefix_cache import PrefixCache
from app.simulator.profiles import LatencyProfile, load_profiles, profile_for
from app.simulator.ratelimits import RateWindow
from app.simulator.responses import ResponseStore, plan_response
from app.simulator.wire import Frame, Pace, Planned
from core.faults import FaultSettings

__all__ = ["ALL_APIS", "CACHE_HINT_HEADERS", "MAX_HOLD_S", "SimulatedProvider", "UpstreamTimeout"]

# The APIs a simulated provider can serve (``apis=``); a provider without one answers its
# routes 404, like an upstream that does not implement it.
ALL_APIS = frozenset({"chat", "responses", "embeddings", "completions"})
_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
    "/v1/completions": "completions",
}

# Headers the gateway's router adds for sticky sessions / cache control; some real upstreams
# reject unknown headers, which ``reject_cache_hints`` reproduces.
CACHE_HINT_HEADERS = ("x-session-id", "x-cache-controls")

# Longest a timed-out request is held: bounded so a client without a timeout cannot hang forever.
MAX_HOLD_S = 120.0

# Models listing shows a fixed creation time: the simulator has no real model history.
_MODELS_CREATED = 1_700_000_000


class UpstreamTimeout(Exception):
    """The timeout fault fired: the request must get no answer.

    ``SimulatedProvider.respond`` raises it so each front end can "not answer" its own way:
    the mock transport sleeps and raises ``httpx2.ReadTimeout``, the HTTP server holds the
    connection open.
    """

    def __init__(self, request: httpx2.Request) -> None:
        super().__init__("simulated upstream timeout")
        self.request = request


@dataclass(frozen=True, slots=True)
class _Draws:
    """Random numbers of one request, drawn together under the RNG lock."""

    timeout: float
    rate_limit: float
    error: float
    stream_break: float
    jitter: float  # uniform in [0, 1)


_Planner = Callable[[dict[str, Any], Pace, FaultSettings], Planned]  # body, pacing, the request's faults


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_json(content: bytes) -> dict[str, Any]:
    try:
        body = json.loads(content.decode("utf-8") or "null", parse_constant=_no_constants)
        # A lone surrogate (\ud800) parses but cannot be encoded: refuse it here, not later. Valid
        # UTF-8 bytes cannot hold one, so only a body with a \\uD8xx-\\uDFxx escape needs the check.
        if b"\\ud" in content or b"\\uD" in content:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeError, RecursionError):
        raise BadRequest(400, "We could not parse the JSON body of your request.", "invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "The request body must be a JSON object.", "invalid_json")
    return body


class SimulatedProvider:
    """An in-process OpenAI-compatible upstream named ``name`` that serves ``models``.

    ``faults`` is called once per generation request (chat, responses, embeddings, completions),
    so runtime changes apply to the next request. ``latency_scale`` multiplies every sleep (0
    never sleeps: tests, benchmarks); ``sleep`` is injectable so tests can record the requested
    delays; ``seed`` makes fault draws and jitter repeatable. ``apis`` is the subset of
    :data:`ALL_APIS` served (default all); ``clock`` drives the rate-limit headers' window;
    ``response_store`` keeps the stored responses ``previous_response_id`` continues.
    """

    def __init__(
        self,
        name: str,
        models: Sequence[str],
        *,
        faults: Callable[[], FaultSettings] = lambda: FaultSettings(),
        profiles: Mapping[str, LatencyProfile] | None = None,
        latency_scale: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        seed: int | None = None,
        prefix_cache: PrefixCache | None = None,
        apis: Iterable[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        response_store: ResponseStore | None = None,
    ) -> None:
        if latency_scale < 0 or not math.isfinite(latency_scale):
            raise ValueError("latency_scale must be a finite number >= 0")
        served = ALL_APIS if apis is None else frozenset(apis)
        if not served <= ALL_APIS:
            unknown = ", ".join(sorted(served - ALL_APIS))
            raise ValueError(f"unknown apis: {unknown} (known: {', '.join(sorted(ALL_APIS))})")
        self.name = name
        self.models: tuple[str, ...] = tuple(models)
        self.apis: frozenset[str] = served
        self.latency_scale = latency_scale
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache()
        self.responses = response_store if response_store is not None else ResponseStore()
        self._faults = faults
        self._profiles = dict(profiles) if profiles is not None else load_profiles()
        if "default" not in self._profiles:
            raise ValueError("profiles need a 'default' entry")
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._quality_rng = random.Random(None if seed is None else seed + 1)
        self._rng_lock = threading.Lock()
        self._rate_window = RateWindow(clock=clock)

    def __repr__(self) -> str:
        return f"SimulatedProvider(name={self.name!r}, models={list(self.models)!r})"

    # ---- entry points -------------------------------------------------------------------

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        """The whole OpenAI-compatible surface, for ``httpx2.MockTransport``."""
        try:
            return self.respond(request)
        except UpstreamTimeout:
            self._pause(self._timeout_hold_s(request))
            raise httpx2.ReadTimeout("simulated upstream timeout", request=request) from None

    def respond(self, request: httpx2.Request) -> httpx2.Response:
        """Like ``handle``, but a timeout fault raises ``UpstreamTimeout`` without waiting."""
        request_id = request.headers.get("x-request-id") or f"req-sim-{uuid.uuid4().hex}"
        path = request.url.path.rstrip("/") or "/"
        api = _ROUTES.get(path)
        if api is not None and api in self.apis:
            if request.method != "POST":
                return self._method_not_allowed(request, request_id)
            return self._generate(request, request_id, self._planner(api))
        if path == "/v1/models":
            if request.method not in ("GET", "HEAD"):
                return self._method_not_allowed(request, request_id)
            return self._json(200, self._models_list(), request_id)
        if path.startswith("/v1/models/"):
            if request.method not in ("GET", "HEAD"):
                return self._method_not_allowed(request, request_id)
            return self._model(unquote(path.removeprefix("/v1/models/")), request_id)
        if path.startswith("/v1/responses/") and "responses" in self.apis:
            return self._stored_response(request, path.removeprefix("/v1/responses/"), request_id)
        return self._json(
            404,
            error_body(f"Unknown request URL: {request.method} {path}.", "invalid_request_error", "unknown_url"),
            request_id,
        )

    # ---- endpoints ----------------------------------------------------------------------

    def _models_list(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._model_object(model) for model in self.models]}

    def _model_object(self, model: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": _MODELS_CREATED, "owned_by": self.name}

    def _model(self, model: str, request_id: str) -> httpx2.Response:
        if model in self.models:
            return self._json(200, self._model_object(model), request_id)
        return self._json(
            404,
            error_body(f"The model '{model}' does not exist", "invalid_request_error", "model_not_found", "model"),
            request_id,
        )

    def _stored_response(self, request: httpx2.Request, response_id: str, request_id: str) -> httpx2.Response:
        if request.method not in ("GET", "DELETE"):
            return self._method_not_allowed(request, request_id)
        stored = self.responses.get(response_id)
        if stored is None:
            message = f"No response found with id '{response_id}'."
            return self._json(404, error_body(message, "invalid_request_error", None, None), request_id)
        if request.method == "DELETE":
            self.responses.delete(response_id)
            return self._json(200, {"id": response_id, "object": "response", "deleted": True}, request_id)
        return self._json(200, stored.response, request_id)

    def _planner(self, api: str) -> _Planner:
        compose = compose_answer  # the module global at request time (see the import)
        if api == "chat":
            return lambda body, pace, faults: plan_chat(
                body,
                provider=self.name,
                models=self.models,
                prefix_cache=self.prefix_cache,
                pace=pace,
                compose=compose,
                degrade=self._degrader(faults),
            )
        if api == "completions":
            return lambda body, pace, faults: plan_completions(
                body,
                provider=self.name,
                models=self.models,
                prefix_cache=self.prefix_cache,
                pace=pace,
                compose=compose,
            )
        if api == "embeddings":
            return lambda body, pace, faults: plan_embeddings(body, models=self.models, pace=pace)
        return lambda body, pace, faults: plan_response(
            body,
            provider=self.name,
            models=self.models,
            prefix_cache=self.prefix_cache,
            store=self.responses,
            pace=pace,
            compose=compose,
        )

    def _generate(self, request: httpx2.Request, request_id: str, plan: _Planner) -> httpx2.Response:
        """One generation request: faults first (as an overloaded upstream fails before reading
        the body), then the endpoint's planned answer, paced by the model's latency profile."""
        faults = self._faults()
        draws = self._draw()

        hint = next((header for header in CACHE_HINT_HEADERS if header in request.headers), None)
        if faults.reject_cache_hints and hint is not None:
            return self._json(
                400,
                error_body(
                    f"unsupported header: {hint} (cache hints)", "invalid_request_error", "unsupported_cache_hints"
                ),
                request_id,
            )
        if draws.timeout < faults.timeout_rate:
            raise UpstreamTimeout(request)
        if draws.rate_limit < faults.rate_limit_rate:
            return self._rate_limited(faults.retry_after_s, request_id)
        if draws.error < faults.error_rate:
            return self._json(
                500,
                error_body("The simulated upstream had an error (injected fault).", "server_error", "simulated_error"),
                request_id,
            )

        try:
            body = _parse_json(request.content)
            planned = plan(body, self._pace(body.get("model"), faults, draws), faults)
        except BadRequest as bad:
            return self._json(bad.status, bad.body(), request_id, self._rate_window.record(0))

        headers = self._headers(request_id, content_type="application/json")
        headers.update(self._rate_window.record(planned.tokens))
        headers["openai-processing-ms"] = str(planned.processing_ms)
        if planned.frames is not None:
            headers["content-type"] = "text/event-stream; charset=utf-8"
            broken = draws.stream_break < faults.stream_break_rate
            return httpx2.Response(200, headers=headers, content=self._paced(request, planned.frames, broken))
        self._pause(planned.delay_s)
        return httpx2.Response(200, headers=headers, content=json.dumps(planned.body).encode())

    def _pace(self, model: Any, faults: FaultSettings, draws: _Draws) -> Pace:
        profile = profile_for(self._profiles, model if isinstance(model, str) else "")
        jitter = 1.0 + profile.jitter * (2.0 * draws.jitter - 1.0)
        factor = jitter * faults.latency_multiplier * self.latency_scale
        ttft = profile.ttft_ms / 1000.0 * factor * faults.ttft_multiplier
        return Pace(ttft_s=ttft, per_token_s=factor / profile.tokens_per_s)

    def _degrader(self, faults: FaultSettings) -> Callable[[Reply, Mapping[str, Any] | None], Reply] | None:
        """The request's answer-quality faults, with its draws (from a generator of their own, so a
        seed gives the same outage faults whatever the quality faults are)."""
        if all(getattr(faults, f) == FaultSettings.model_fields[f].default for f in FaultSettings.QUALITY):
            return None
        with self._rng_lock:
            draws = [self._quality_rng.random() for _ in range(DRAWS)]
        return lambda reply, text_format: degrade(reply, faults, draws, text_format)

    def _paced(self, request: httpx2.Request, frames: Sequence[Frame], broken: bool) -> Iterator[bytes]:
        """The planned stream, each frame after its wait. A generator, so the sleeps happen while
        the client iterates, as over a real network; the stream-break fault drops it after the
        first frame (the first token)."""
        for index, frame in enumerate(frames):
            self._pause(frame.delay_s)
            yield frame.data
            if broken and index == 0:
                raise httpx2.RemoteProtocolError(
                    "simulated upstream dropped the stream (injected fault)", request=request
                )

    # ---- faults and pacing --------------------------------------------------------------

    def _draw(self) -> _Draws:
        # Always the same number of draws per request, so a seed gives the same fault sequence
        # whatever the fault rates are.
        with self._rng_lock:
            values = [self._rng.random() for _ in range(5)]
        return _Draws(*values)

    def _rate_limited(self, retry_after_s: float, request_id: str) -> httpx2.Response:
        headers = self._headers(request_id, content_type="application/json")
        headers.update(self._rate_window.record(0))
        # Retry-After is whole seconds by RFC 9110; retry-after-ms carries the exact value.
        headers["retry-after"] = str(math.ceil(retry_after_s))
        headers["retry-after-ms"] = str(round(retry_after_s * 1000))
        headers["x-ratelimit-remaining-requests"] = "0"
        return httpx2.Response(
            429,
            headers=headers,
            json=error_body(
                "Rate limit reached for requests on the simulated upstream (injected fault).",
                "requests",
                "rate_limit_exceeded",
            ),
        )

    def _timeout_hold_s(self, request: httpx2.Request) -> float:
        if self.latency_scale == 0:
            return 0.0
        timeout = request.extensions.get("timeout")
        read = timeout.get("read") if isinstance(timeout, Mapping) else None
        return MAX_HOLD_S if read is None else min(float(read), MAX_HOLD_S)

    def _pause(self, seconds: float) -> None:
        # One bound for every simulated wait: a huge latency_scale x latency_multiplier (or an
        # overflow to inf) holds a request at most MAX_HOLD_S instead of raising from sleep().
        if seconds > 0:
            self._sleep(min(seconds, MAX_HOLD_S))

    # ---- responses ----------------------------------------------------------------------

    def _headers(self, request_id: str, *, content_type: str) -> dict[str, str]:
        return {"content-type": content_type, "x-request-id": request_id, "x-simulated-upstream": self.name}

    def _json(self, status: int, body: Any, request_id: str, extra: Mapping[str, str] | None = None) -> httpx2.Response:
        headers = self._headers(request_id, content_type="application/json")
        if extra:
            headers.update(extra)
        return httpx2.Response(status, headers=headers, content=json.dumps(body).encode())

    def _method_not_allowed(self, request: httpx2.Request, request_id: str) -> httpx2.Response:
        return self._json(
            405,
            error_body(
                f"Method {request.method} is not allowed on {request.url.path}.",
                "invalid_request_error",
                "method_not_allowed",
            ),
            request_id,
        )
