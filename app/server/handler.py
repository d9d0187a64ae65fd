"""The server's chat handler: one validated OpenAI request in, the shared routing policy, one OpenAI
answer out.

The policy is :class:`app.routing.client.RoutingClient` itself (canary split, intent rules,
retry/fallback, telemetry), called in a worker thread: nothing of it is copied here. This module only
adds what a server needs around it: key admission (rate limits and budgets, settled with the real
cost), the model allow-list of the key, mapping outcomes to HTTP statuses and ``x-gateway-*``
headers, and moving a sync stream's chunks onto the event loop through a bounded queue.

Cancellation, and its limits (a sync driver's): a client that disconnects from a *stream* sets a
flag the worker checks between upstream chunks; the worker then closes the :class:`ChatStream`,
which closes the upstream response (the connection to the provider is closed, the attempt is logged
as ``cancelled``). An upstream that sends nothing at all holds its worker thread until the
attempt's timeout. A *non-streamed* request's worker cannot be interrupted mid-read: the caller is
released at once, the thread finishes (or times out) in the background, and its answer is dropped;
its spend is still settled with the real cost, because settling happens in that same thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from app import catalog
from app.routing.client import MAX_SESSION_ID, ChatStream, RoutingClient
from app.routing.intent import classify as classify_intent
from app.routing.result import AllRoutesFailed, ChatResult
from app.server import wire
from app.server.admission import Admission, estimate_prompt_tokens
from app.server.asgi import ChatReply, ChatStreamReply
from app.server.metrics import GatewayMetrics
from core.errors import InvalidRequest
from db import limits
from db.keys import KeyRecord

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 128  # worker threads for routed calls: 64+ concurrent requests without queueing
STREAM_QUEUE = 64  # chunks buffered between the worker and a slow client before the worker waits
SOURCE = "server"
# Failure classes that mean "nobody could answer" (503) rather than "an upstream answered badly" (502).
UNAVAILABLE = frozenset({"connection", "not_configured", "circuit_open", "breaker_open", "unavailable"})
TIMEOUTS = frozenset({"timeout", "request_timeout", "deadline", "deadline_exceeded"})
REQUEST_FAULTS = frozenset({"bad_request"})
DEFAULT_EST_COMPLETION = 256  # completion tokens assumed for admission when max_tokens is absent


def status_for(exc: AllRoutesFailed) -> wire.WireError:
    """The HTTP answer for a request no route could serve: the upstream's own 400 when it refused
    the request itself, 504 when every attempt timed out, 503 when every attempt found nobody to
    answer (or timed out), 502 otherwise."""
    attempts = exc.attempts
    rid = exc.request_id
    if attempts and attempts[-1].error_class in REQUEST_FAULTS:
        last = attempts[-1]
        detail = (last.error or "").split(": ", 1)[-1]
        return wire.bad_request(f"The upstream provider refused the request: {detail} (request id {rid}).")
    classes = [a.error_class or "" for a in attempts]
    statuses = [a.http_status for a in attempts]
    timeouts = [c in TIMEOUTS or s == 504 for c, s in zip(classes, statuses, strict=True)]
    unavailable = [c in UNAVAILABLE or s == 503 for c, s in zip(classes, statuses, strict=True)]
    summary = "; ".join(f"{a.provider}/{a.model}: {a.error_class or 'error'}" for a in attempts) or "no attempt"
    if attempts and all(timeouts):
        return wire.upstream_timeout(f"No upstream provider answered in time ({summary}; request id {rid}).")
    if attempts and all(t or u for t, u in zip(timeouts, unavailable, strict=True)):
        return wire.unavailable(f"No upstream provider is reachable right now ({summary}; request id {rid}).")
    return wire.upstream_failed(f"All upstream providers failed for this request ({summary}; request id {rid}).")


def result_headers(result: ChatResult) -> dict[str, str]:
    return {
        "x-gateway-request-id": result.request_id,
        "x-gateway-provider": result.provider,
        "x-gateway-model": result.model,
        "x-gateway-intent": result.intent,
        "x-gateway-canary-side": result.side,
        "x-gateway-attempts": str(result.attempts),
    }


def _finish(result: ChatResult | None) -> str:
    return (result.finish_reason if result is not None else None) or "stop"


@dataclass
class _Admitted:
    reservation_id: str | None


class ChatHandler:
    """``await handler(request, key)`` -> :class:`ChatReply` or :class:`ChatStreamReply`.

    ``client`` is the gateway's :class:`RoutingClient`; ``engine`` holds the keys' limits and spend.
    """

    def __init__(
        self,
        client: RoutingClient,
        *,
        engine: Any,
        metrics: GatewayMetrics | None = None,
        workers: int = DEFAULT_WORKERS,
        clock: Callable[[], float] = time.time,
    ):
        self.client = client
        self.engine = engine
        self.metrics = metrics
        self.workers = workers
        self.clock = clock
        self._admission = Admission(engine, metrics, clock=clock)
        self._limiter: anyio.CapacityLimiter | None = None

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        if self._limiter is None:  # created on the event loop's first request
            self._limiter = anyio.CapacityLimiter(self.workers)
            # The default limiter runs the key lookups and admissions: as many as requests in flight.
            default = anyio.to_thread.current_default_thread_limiter()
            default.total_tokens = max(default.total_tokens, self.workers)
        return self._limiter

    async def __call__(self, req: wire.ChatRequest, key: KeyRecord | None) -> ChatReply | ChatStreamReply:
        admitted = await self._admit(req, key)
        kwargs = self._chat_kwargs(req, key)
        if req.stream:
            return await self._stream(req, key, admitted, kwargs)
        return await self._complete(req, key, admitted, kwargs)

    # ------------------------------------------------------------------------------ admission

    def _estimate(self, req: wire.ChatRequest) -> tuple[int, float]:
        prompt = estimate_prompt_tokens(req.messages)
        completion = req.max_tokens or DEFAULT_EST_COMPLETION
        model = req.model
        if model == "auto":
            model = classify_intent(req.messages, self.client.settings.intents).model
        try:
            cost = catalog.cost_usd(model, prompt, 0, completion)
        except InvalidRequest:
            cost = 0.0
        return prompt + completion, cost

    async def _admit(self, req: wire.ChatRequest, key: KeyRecord | None) -> _Admitted:
        # A key without limits or budget needs no database write per request.
        if key is None or (key.rpm is None and key.tpm is None and key.budget_micro_usd is None):
            return _Admitted(None)
        tokens, cost = self._estimate(req)
        # The one admission rule (limits, budget, the 429 it answers, the denial metric).
        return _Admitted(await self._admission.admit(key, est_tokens=tokens, est_cost_usd=cost))

    def _settle(self, key: KeyRecord | None, admitted: _Admitted, result: ChatResult | None, partial: float) -> None:
        """In the worker thread: the real tokens and cost (``partial`` when a stream was cut)."""
        if key is None or admitted.reservation_id is None:
            return
        tokens, cost = 0, partial
        if result is not None:
            tokens, cost = result.usage.prompt_tokens + result.usage.completion_tokens, result.cost_usd
        now = self.clock()
        try:
            limits.settle(self.engine, admitted.reservation_id, tokens=tokens, cost_usd=cost, now=now)
            if self.metrics is not None and key.budget_micro_usd is not None:
                state = limits.spend(self.engine, key, now=now)
                if state is not None:
                    self.metrics.set_key_budget_used(key.name, state.period, state.used_ratio)
        except Exception as exc:  # noqa: BLE001 - a stale reservation is settled at its estimate later
            log.warning("could not settle the spend of key %s: %s", key.name, type(exc).__name__)

    # ------------------------------------------------------------------------------ routing

    def _chat_kwargs(self, req: wire.ChatRequest, key: KeyRecord | None) -> dict[str, Any]:
        return {
            "model": req.model,
            # OpenAI's `user` names the end user: the gateway keeps their canary side sticky with it
            # (one longer than a log session id still routes, without stickiness).
            "session_id": req.user if req.user and len(req.user) <= MAX_SESSION_ID else None,
            "temperature": req.temperature,
            "max_tokens": req.max_tokens,
            "source": SOURCE,
            "key_name": key.name if key is not None else None,
        }

    async def _complete(
        self, req: wire.ChatRequest, key: KeyRecord | None, admitted: _Admitted, kwargs: dict[str, Any]
    ) -> ChatReply:
        def work() -> ChatResult:
            result: ChatResult | None = None
            try:
                result = self.client.chat(req.messages, **kwargs)
                return result
            finally:
                self._settle(key, admitted, result, 0.0)

        try:
            # abandon_on_cancel: a disconnected caller is released at once; the thread runs out alone.
            result = await anyio.to_thread.run_sync(work, limiter=self.limiter, abandon_on_cancel=True)
        except AllRoutesFailed as exc:
            raise status_for(exc) from None
        except InvalidRequest as exc:
            raise _invalid(exc) from None
        body = wire.completion_json(
            completion_id=wire.new_completion_id(),
            created=int(self.clock()),
            model=result.model,
            content=result.text,
            finish_reason=_finish(result),
            usage=wire.usage_dict(
                result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.cached_tokens
            ),
        )
        return ChatReply(body, result_headers(result))

    async def _stream(
        self, req: wire.ChatRequest, key: KeyRecord | None, admitted: _Admitted, kwargs: dict[str, Any]
    ) -> ChatStreamReply:
        pipe = _Pipe(asyncio.get_running_loop(), STREAM_QUEUE)
        stream_holder: list[ChatStream] = []

        def produce() -> None:
            delivered = 0
            result: ChatResult | None = None
            try:
                stream = self.client.chat(req.messages, stream=True, **kwargs)
                stream_holder.append(stream)
                try:
                    for piece in stream:
                        if not pipe.put(("chunk", piece, stream)):
                            break  # the client is gone: closing the stream closes the upstream response
                        delivered += len(piece)
                finally:
                    stream.close()
                result = stream.result
                if result is not None:
                    pipe.put(("end", result, stream))
            except BaseException as exc:  # noqa: BLE001 - handed to the event loop, raised there
                pipe.put(("error", exc, None))
            finally:
                partial = 0.0
                if result is None and delivered and stream_holder and stream_holder[0].model:
                    partial = _partial_cost(stream_holder[0].model, req, delivered)
                self._settle(key, admitted, result, partial)
                pipe.put(("closed", None, None))

        worker = asyncio.ensure_future(anyio.to_thread.run_sync(produce, limiter=self.limiter))
        try:
            kind, value, stream = await pipe.get()
        except BaseException:
            pipe.cancel()
            raise
        if kind == "error":
            pipe.cancel()
            raise _map_error(value)
        if kind == "closed":  # the stream ended without a result (cannot happen unless cancelled)
            raise wire.upstream_failed("The upstream stream ended without an answer.")
        assert stream is not None
        headers = {
            "x-gateway-provider": stream.provider or "",
            "x-gateway-model": stream.model or "",
            "x-gateway-intent": stream.intent,
            "x-gateway-canary-side": stream.side,
            "x-gateway-attempts": str(stream.attempts),
            "x-gateway-request-id": stream.request_id,
        }
        enc = wire.ChunkStream(
            completion_id=wire.new_completion_id(),
            created=int(self.clock()),
            model=stream.model or req.model,
            include_usage=req.include_usage,
        )
        return ChatStreamReply(_events(pipe, enc, (kind, value), worker), headers)


async def _events(
    pipe: _Pipe, enc: wire.ChunkStream, first: tuple[str, Any], worker: asyncio.Future
) -> AsyncIterator[bytes]:
    try:
        yield enc.role()
        kind, value = first
        while True:
            if kind == "chunk":
                yield enc.content(value)
            elif kind == "end":
                result: ChatResult = value
                yield enc.finish(_finish(result))
                if enc.include_usage:
                    u = result.usage
                    yield enc.usage(wire.usage_dict(u.prompt_tokens, u.completion_tokens, u.cached_tokens))
                yield enc.done()
                return
            elif kind == "error":
                raise _map_error(value, started=True)
            else:
                raise wire.upstream_failed("The upstream stream ended without an answer.")
            kind, value, _ = await pipe.get()
    finally:
        pipe.cancel()  # normal end: a no-op; a disconnect: the worker stops at its next chunk
        worker.add_done_callback(_drop_result)


def _drop_result(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved, so asyncio does not log "exception was never retrieved"


def _partial_cost(model: str, req: wire.ChatRequest, delivered_chars: int) -> float:
    """A cut stream's cost as far as it went: the prompt plus the characters delivered."""
    try:
        return catalog.cost_usd(model, estimate_prompt_tokens(req.messages), 0, -(-delivered_chars // 4))
    except InvalidRequest:
        return 0.0


def _invalid(exc: InvalidRequest) -> wire.WireError:
    if isinstance(exc, catalog.UnknownModelError):
        return wire.WireError(404, str(exc), param="model", code="model_not_found")
    return wire.bad_request(str(exc))


def _map_error(exc: BaseException, *, started: bool = False) -> wire.WireError:
    if isinstance(exc, wire.WireError):
        return exc
    if isinstance(exc, AllRoutesFailed):
        return status_for(exc)
    if isinstance(exc, InvalidRequest):
        return _invalid(exc)
    if started:
        log.warning("stream failed mid-way: %s", type(exc).__name__)
        return wire.upstream_failed("The upstream stream broke mid-way; the answer is incomplete.")
    log.error("routing failed: %s", type(exc).__name__)
    return wire.WireError(500, "Internal error in the gateway.")


class _Pipe:
    """A bounded hand-off from one worker thread to the event loop.

    ``put`` (worker) blocks while ``size`` items wait unread and returns False once the reader
    cancelled; ``get`` (loop) awaits the next item. One ``call_soon_threadsafe`` per item, no
    per-item thread round trip.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int):
        self._loop = loop
        self._items: deque[tuple[str, Any, Any]] = deque()
        self._ready = asyncio.Event()
        self._room = threading.Semaphore(size)
        self._cancelled = threading.Event()

    def put(self, item: tuple[str, Any, Any]) -> bool:
        if self._cancelled.is_set():
            return False
        if item[0] == "chunk":
            self._room.acquire()  # one producer: cancel()'s single release wakes it if it waits here
        if self._cancelled.is_set():
            return False
        try:
            self._loop.call_soon_threadsafe(self._push, item)
        except RuntimeError:  # the loop is closed: the server is gone
            return False
        return True

    def _push(self, item: tuple[str, Any, Any]) -> None:
        self._items.append(item)
        self._ready.set()

    async def get(self) -> tuple[str, Any, Any]:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if item[0] == "chunk":
            self._room.release()
        return item

    def cancel(self) -> None:
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._room.release()  # wake a worker waiting for room; it sees the flag and stops
