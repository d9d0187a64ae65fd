"""The simulated OpenAI-compatible upstream: one ``SimulatedProvider`` per configured provider.

``SimulatedProvider.handle`` turns an ``httpx2.Request`` into an ``httpx2.Response`` the way an
OpenAI-compatible server would, so the real SDK code path (request building, error mapping,
SSE parsing) runs against it through a mock transport. It serves
``POST /v1/chat/completions`` (streamed and not) and ``GET /v1/models``, applies the latency
profile of the model, injects the configured faults, and counts cached prompt tokens with a
per-provider prefix cache.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx2

from app.simulator.answers import Answer, compose_answer
from app.simulator.prefix_cache import PrefixCache
from app.simulator.profiles import LatencyProfile, load_profiles, profile_for
from app.simulator.tokens import prompt_tokens, token_spans, tokenize
from core.faults import FaultSettings

__all__ = ["CACHE_HINT_HEADERS", "MAX_HOLD_S", "SimulatedProvider", "UpstreamTimeout"]

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


@dataclass(frozen=True, slots=True)
class _Completion:
    completion_id: str
    created: int
    model: str
    answer: Answer
    usage: dict[str, Any]
    ttft_s: float
    per_token_s: float


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, code: str | None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def _error_body(message: str, error_type: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class SimulatedProvider:
    """An in-process OpenAI-compatible upstream named ``name`` that serves ``models``.

    ``faults`` is called once per chat request, so runtime changes apply to the next request.
    ``latency_scale`` multiplies every sleep (0 never sleeps: tests, benchmarks); ``sleep`` is
    injectable so tests can record the requested delays; ``seed`` makes fault draws and jitter
    repeatable.
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
    ) -> None:
        if latency_scale < 0 or not math.isfinite(latency_scale):
            raise ValueError("latency_scale must be a finite number >= 0")
        self.name = name
        self.models: tuple[str, ...] = tuple(models)
        self.latency_scale = latency_scale
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache()
        self._faults = faults
        self._profiles = dict(profiles) if profiles is not None else load_profiles()
        if "default" not in self._profiles:
            raise ValueError("profiles need a 'default' entry")
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()

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
        if path == "/v1/chat/completions":
            if request.method != "POST":
                return self._method_not_allowed(request, request_id)
            return self._chat_completions(request, request_id)
        if path == "/v1/models":
            if request.method not in ("GET", "HEAD"):
                return self._method_not_allowed(request, request_id)
            return self._json(200, self._models_list(), request_id)
        return self._json(
            404,
            _error_body(f"Unknown request URL: {request.method} {path}.", "invalid_request_error", "unknown_url"),
            request_id,
        )

    # ---- endpoints ----------------------------------------------------------------------

    def _models_list(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": model, "object": "model", "created": _MODELS_CREATED, "owned_by": self.name}
                for model in self.models
            ],
        }

    def _chat_completions(self, request: httpx2.Request, request_id: str) -> httpx2.Response:
        faults = self._faults()
        draws = self._draw()

        hint = next((header for header in CACHE_HINT_HEADERS if header in request.headers), None)
        if faults.reject_cache_hints and hint is not None:
            return self._json(
                400,
                _error_body(
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
                _error_body("The simulated upstream had an error (injected fault).", "server_error", "simulated_error"),
                request_id,
            )

        try:
            body = self._parse_body(request)
            completion = self._complete(body, faults, draws)
        except _BadRequest as bad:
            error = _error_body(bad.message, "invalid_request_error", bad.code, bad.param)
            return self._json(bad.status, error, request_id)

        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, Mapping) and options.get("include_usage") is True
            broken = draws.stream_break < faults.stream_break_rate
            return httpx2.Response(
                200,
                headers=self._headers(request_id, content_type="text/event-stream; charset=utf-8"),
                content=self._sse_events(request, completion, include_usage=include_usage, broken=broken),
            )

        self._pause(completion.ttft_s + completion.usage["completion_tokens"] * completion.per_token_s)
        return self._json(200, self._completion_body(completion), request_id)

    # ---- request parsing ----------------------------------------------------------------

    def _parse_body(self, request: httpx2.Request) -> dict[str, Any]:
        try:
            body = json.loads(request.content or b"null")
        except (ValueError, UnicodeDecodeError):
            raise _BadRequest(400, "We could not parse the JSON body of your request.", "invalid_json") from None
        if not isinstance(body, dict):
            raise _BadRequest(400, "The request body must be a JSON object.", "invalid_json")

        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _BadRequest(400, "You must provide a model parameter.", "missing_required_parameter", "model")
        if model not in self.models:
            raise _BadRequest(
                404, f"The model `{model}` does not exist or you do not have access to it.", "model_not_found", "model"
            )

        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
        ):
            raise _BadRequest(
                400, "'messages' must be a non-empty array of objects with a 'role'.", "invalid_value", "messages"
            )

        for param in ("max_completion_tokens", "max_tokens"):
            value = body.get(param)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise _BadRequest(400, f"'{param}' must be an integer >= 1.", "invalid_value", param)

        temperature = body.get("temperature")
        if temperature is not None and (
            isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2
        ):
            raise _BadRequest(400, "'temperature' must be a number between 0 and 2.", "invalid_value", "temperature")
        return body

    # ---- the answer ---------------------------------------------------------------------

    def _complete(self, body: Mapping[str, Any], faults: FaultSettings, draws: _Draws) -> _Completion:
        model: str = body["model"]
        messages: list[dict[str, Any]] = body["messages"]
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")

        prompt = prompt_tokens(messages)
        cached = self.prefix_cache.lookup_and_insert(prompt)
        answer = compose_answer(self.name, model, messages, prompt, max_tokens)
        completion_tokens = len(tokenize(answer.text))

        profile = profile_for(self._profiles, model)
        jitter = 1.0 + profile.jitter * (2.0 * draws.jitter - 1.0)
        factor = jitter * faults.latency_multiplier * self.latency_scale
        return _Completion(
            completion_id=f"chatcmpl-sim-{uuid.uuid4().hex[:24]}",
            created=int(time.time()),
            model=model,
            answer=answer,
            usage={
                "prompt_tokens": len(prompt),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt) + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
            },
            ttft_s=profile.ttft_ms / 1000.0 * factor,
            per_token_s=factor / profile.tokens_per_s,
        )

    def _completion_body(self, completion: _Completion) -> dict[str, Any]:
        return {
            "id": completion.completion_id,
            "object": "chat.completion",
            "created": completion.created,
            "model": completion.model,
            "system_fingerprint": "fp_simulated",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": completion.answer.text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": completion.answer.finish_reason,
                }
            ],
            "usage": completion.usage,
        }

    def _chunk(self, completion: _Completion, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        return {
            "id": completion.completion_id,
            "object": "chat.completion.chunk",
            "created": completion.created,
            "model": completion.model,
            "system_fingerprint": "fp_simulated",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    def _sse_events(
        self, request: httpx2.Request, completion: _Completion, *, include_usage: bool, broken: bool
    ) -> Iterator[bytes]:
        """The streamed answer, one token per event, paced by the latency profile.

        A generator, so the sleeps happen while the client iterates, as over a real network.
        """
        text = completion.answer.text
        ends = [end for _, end in token_spans(text)] or [len(text)]
        ends[-1] = len(text)
        pieces = [text[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=False)]

        def event(payload: Any) -> bytes:
            data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
            return f"data: {data}\n\n".encode()

        self._pause(completion.ttft_s)
        # The role event and the first token go out together: the first byte is the first token.
        yield event(self._chunk(completion, {"role": "assistant", "content": ""}, None)) + event(
            self._chunk(completion, {"content": pieces[0]}, None)
        )
        if broken:
            raise httpx2.RemoteProtocolError("simulated upstream dropped the stream (injected fault)", request=request)
        for piece in pieces[1:]:
            self._pause(completion.per_token_s)
            yield event(self._chunk(completion, {"content": piece}, None))
        yield event(self._chunk(completion, {}, completion.answer.finish_reason))
        if include_usage:
            usage_chunk = self._chunk(completion, {}, None)
            usage_chunk["choices"] = []
            usage_chunk["usage"] = completion.usage
            yield event(usage_chunk)
        yield event("[DONE]")

    # ---- faults and pacing --------------------------------------------------------------

    def _draw(self) -> _Draws:
        # Always the same number of draws per request, so a seed gives the same fault sequence
        # whatever the fault rates are.
        with self._rng_lock:
            values = [self._rng.random() for _ in range(5)]
        return _Draws(*values)

    def _rate_limited(self, retry_after_s: float, request_id: str) -> httpx2.Response:
        headers = self._headers(request_id, content_type="application/json")
        # Retry-After is whole seconds by RFC 9110; retry-after-ms carries the exact value.
        headers["retry-after"] = str(math.ceil(retry_after_s))
        headers["retry-after-ms"] = str(round(retry_after_s * 1000))
        headers["x-ratelimit-remaining-requests"] = "0"
        return httpx2.Response(
            429,
            headers=headers,
            json=_error_body(
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

    def _json(self, status: int, body: Any, request_id: str) -> httpx2.Response:
        return httpx2.Response(
            status,
            headers=self._headers(request_id, content_type="application/json"),
            content=json.dumps(body).encode(),
        )

    def _method_not_allowed(self, request: httpx2.Request, request_id: str) -> httpx2.Response:
        return self._json(
            405,
            _error_body(
                f"Method {request.method} is not allowed on {request.url.path}.",
                "invalid_request_error",
                "method_not_allowed",
            ),
            request_id,
        )
