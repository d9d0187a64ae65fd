"""The server's chat handler: one validated OpenAI request in, the shared routing policy, one OpenAI
answer out.

The policy is :class:`app.routing.io.client.RoutingClient`'s (canary split, intent rules,
retry/fallback, breakers, telemetry), driven on the event loop by its async driver
(:class:`app.routing.io.async_client.AsyncRoutingClient`): nothing of it is copied here. This module
only adds what a server needs around it: key admission (rate limits and budgets, settled with the
real cost), mapping outcomes to HTTP statuses and ``x-gateway-*`` headers, and OpenAI's SSE framing.

Cancellation: a client that disconnects cancels its request's task (see :mod:`app.server.asgi`).
For a non-streamed request that cancels the pending upstream call; for a stream, the upstream
stream is closed at once, between or during reads. Either way httpx closes the upstream connection,
the attempt is logged as ``cancelled``, and a key's reservation is settled with what was spent: the
prompt and the text delivered for a cut stream, nothing for a cut non-streamed answer (the upstream
never finished it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from app import catalog
from app.config import priced_as
from app.routing.core import MAX_SESSION_ID, NO_SHADOW_HEADER
from app.routing.errors import GATEWAY_OVERLOADED
from app.routing.inputs import input_messages
from app.routing.intent import classify as classify_intent
from app.routing.io.async_client import AsyncChatStream, AsyncRoutingClient
from app.routing.io.client import RoutingClient
from app.routing.options import RouteOptions
from app.routing.result import AllRoutesFailed, ChatResult
from app.server import wire
from app.server.admission import Admission
from app.server.asgi import ChatReply, ChatStreamReply
from app.server.metrics import GatewayMetrics
from core import fastjson
from core.errors import InvalidRequest
from core.messages import estimate_prompt_tokens, estimate_tokens
from db.keys import KeyRecord

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 128  # threads for blocking work (key lookups, admission, the simulator's transport)
SOURCE = "server"
# Failure classes that mean "nobody could answer" (503) rather than "an upstream answered badly" (502).
UNAVAILABLE = frozenset({"connection", "not_configured", "circuit_open", "breaker_open", "unavailable"})
TIMEOUTS = frozenset({"timeout", "request_timeout", "deadline", "deadline_exceeded"})
REQUEST_FAULTS = frozenset({"bad_request"})
DEFAULT_EST_COMPLETION = 256  # completion tokens assumed for admission when max_tokens is absent


def status_for(exc: AllRoutesFailed) -> wire.WireError:
    """The HTTP answer for a request no route could serve: the upstream's own status and error
    object when it refused the request itself (400, 404, 422: context length, content policy, an
    invalid parameter), a 429 with its Retry-After when the last upstream was rate limited and
    nothing was left to fail over to, 504 when every attempt timed out, 503 when every attempt
    found nobody to answer (or timed out), 502 otherwise."""
    attempts = exc.attempts
    rid = exc.request_id
    last = attempts[-1] if attempts else None
    refused = last is not None and (
        last.error_class in REQUEST_FAULTS or (last.http_status in (404, 422) and last.upstream_error is not None)
    )
    if last is not None and refused:
        detail = (last.error or "").split(": ", 1)[-1]
        status = last.http_status if last.http_status and 400 <= last.http_status < 500 else 400
        return wire.WireError(
            status,
            f"The upstream provider refused the request: {detail} (request id {rid}).",
            upstream=last.upstream_error,
        )
    if last is not None and last.http_status == 429 and last.error_class in ("rate_limited", "quota"):
        wait = last.retry_after_s
        retry_after = str(max(1, math.ceil(wait))) if wait is not None and math.isfinite(wait) else "1"
        return wire.WireError(
            429,
            f"The upstream provider is rate limiting this request ({last.provider}; request id {rid}).",
            type="requests",
            code="rate_limit_exceeded" if last.error_class == "rate_limited" else "insufficient_quota",
            headers={"Retry-After": retry_after},
            upstream=last.upstream_error,
        )
    if last is not None and last.error_class == GATEWAY_OVERLOADED:
        wait = last.retry_after_s
        return wire.WireError(
            503,
            f"The gateway's connections to {last.provider} are all busy; retry shortly (request id {rid}).",
            type="service_unavailable",
            code=wire.OVERLOADED,
            headers={"Retry-After": str(max(1, math.ceil(wait))) if wait is not None and math.isfinite(wait) else "1"},
        )
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


def refusal_class(err: wire.WireError) -> str:
    """The log's error class for a refusal by the gateway itself."""
    if err.code == wire.STORE_UNAVAILABLE:
        return "key_store_unavailable"
    if err.code == wire.OVERLOADED:
        return "gateway_overloaded"
    if err.status == 401:
        return "key_refused"
    if err.code == "failed_keys_throttled":
        return "failed_keys_throttled"
    if err.status == 403:
        return "model_not_allowed"
    if err.code in ("budget_exceeded", "budget_reserved"):
        return err.code
    if err.status == 429:
        return "gateway_rate_limited"
    return "gateway_refused"


def result_headers(result: ChatResult | AsyncChatStream) -> dict[str, str]:
    """The headers of an answer, or of a stream (the attempt streaming now): the upstream's
    rate-limit and processing-time headers, then the gateway's own ``x-gateway-*``."""
    return {
        **result.upstream_headers,
        "x-gateway-request-id": result.request_id,
        "x-gateway-provider": result.provider or "",
        "x-gateway-model": result.model or "",
        "x-gateway-intent": result.intent,
        "x-gateway-canary-side": result.side,
        "x-gateway-attempts": str(result.attempts),
    }


@dataclass
class _Admitted:
    reservation_id: str | None


class ChatHandler:
    """``await handler(request, key)`` -> :class:`ChatReply` or :class:`ChatStreamReply`.

    ``client`` is the gateway's :class:`RoutingClient` (the policy, its breakers and telemetry);
    ``driver`` routes with it on the event loop (by default an :class:`AsyncRoutingClient` of it,
    closed by :meth:`aclose`); ``engine`` holds the keys' limits and spend.
    """

    def __init__(
        self,
        client: RoutingClient,
        *,
        engine: Any,
        metrics: GatewayMetrics | None = None,
        workers: int = DEFAULT_WORKERS,
        clock: Callable[[], float] = time.time,
        driver: AsyncRoutingClient | None = None,
    ):
        self.client = client
        self.driver = driver if driver is not None else AsyncRoutingClient(client)
        self.engine = engine
        self.metrics = metrics
        self.workers = workers
        self.clock = clock
        self._admission = Admission(engine, metrics, clock=clock)
        self._forwarded = client.core.forwardable  # caller headers some provider may receive
        self._threads_sized = False

    async def aclose(self) -> None:
        """Close the driver's upstream connections (at server shutdown, after the last request)."""
        await self.driver.aclose()

    def _size_threads(self) -> None:
        if not self._threads_sized:  # on the event loop's first request
            # The default limiter runs key lookups, admissions and simulated upstreams' reads.
            default = anyio.to_thread.current_default_thread_limiter()
            default.total_tokens = max(default.total_tokens, self.workers)
            self._threads_sized = True

    async def __call__(self, req: wire.ChatRequest, key: KeyRecord | None) -> ChatReply | ChatStreamReply:
        self._size_threads()
        options = self._route_options(req, key)  # before admission: a refused header reserves nothing
        admitted = await self._admit(req, key)
        if req.stream:
            return await self._stream(req, key, admitted, options)
        return await self._complete(req, key, admitted, options)

    # ------------------------------------------------------------------------------ admission

    def _estimate(self, req: wire.ChatRequest) -> tuple[int, float, float, str]:
        """(tokens for tpm, the request's worst-case cost, its model's worst-case cost, what the
        worst case counts, in words for a budget's refusal).

        The worst case counts the request's own output limit (``max_tokens``,
        ``max_completion_tokens`` or ``max_output_tokens``) times ``n``, or the model's output
        limit from the catalog when it sets none; the model's worst case always counts the
        catalog's limit (an upstream may bill past ``max_tokens``: reasoning tokens, providers that
        ignore it). The prompt is the rough estimate of :func:`estimate_prompt_tokens`. tpm keeps
        the smaller estimate (``DEFAULT_EST_COMPLETION`` without a ``max_tokens``) so that a key
        with a modest tpm still serves requests that set no limit; settle corrects it."""
        messages = _prompt_messages(req)
        prompt = estimate_prompt_tokens(messages)
        model = req.model
        if model == "auto":
            model = classify_intent(messages, self.client.settings.intents).model
        model = priced_as(self.client.settings, model)
        what = f"its prompt, about {prompt:,} tokens"
        if req.api == "embeddings":
            asked = ceiling = tpm_completion = 0
        else:
            n = req.body.get("n")
            choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
            try:
                limit = catalog.output_limit(model)
            except InvalidRequest:
                limit = req.max_tokens or DEFAULT_EST_COMPLETION
            asked = (req.max_tokens or limit) * choices
            ceiling = max(limit, req.max_tokens or 0) * choices
            tpm_completion = (req.max_tokens or DEFAULT_EST_COMPLETION) * choices
            output = (
                "its max_tokens" if req.max_tokens else f"{model}'s output limit, as the request sets no max_tokens"
            )
            what += f", plus {asked:,} output tokens ({output}{f', times n={choices}' if choices > 1 else ''})"
        try:
            cost = catalog.cost_usd(model, prompt, 0, asked)
            ceiling_cost = catalog.cost_usd(model, prompt, 0, ceiling)
        except InvalidRequest:
            cost = ceiling_cost = 0.0
        return prompt + tpm_completion, cost, ceiling_cost, what

    async def _admit(self, req: wire.ChatRequest, key: KeyRecord | None) -> _Admitted:
        # A key without limits or budget needs no database write per request.
        if key is None or (key.rpm is None and key.tpm is None and key.budget_micro_usd is None):
            return _Admitted(None)
        tokens, cost, ceiling, what = self._estimate(req)
        # The one admission rule (limits, budget, the 429 it answers, the denial metric).
        try:
            return _Admitted(
                await self._admission.admit(
                    key, est_tokens=tokens, est_cost_usd=cost, ceiling_cost_usd=ceiling, worst_case=what
                )
            )
        except wire.WireError as err:
            self.log_refusal(req.api, req.model, key, err, stream=req.stream)
            raise

    def log_refusal(self, api: str, model: str | None, key: Any, err: wire.WireError, *, stream: bool = False) -> None:
        """A request the gateway refused itself (key, limit, budget, its own database) gets its one
        row in the request log, so every rate counts it."""
        self.client.core.log_refusal(
            api,
            model,
            error_class=refusal_class(err),
            message=err.message,
            http_status=err.status,
            key_name=getattr(key, "name", None),
            source=SOURCE,
            stream=stream,
        )

    async def _settle(
        self, key: KeyRecord | None, admitted: _Admitted, result: ChatResult | None, partial: float
    ) -> None:
        """Settle a reservation with the real tokens and cost (``partial`` when a stream was cut);
        shielded, so a request cancelled by its client still settles."""
        if key is None or admitted.reservation_id is None:
            return
        tokens, cost = 0, partial
        if result is not None:
            tokens, cost = result.usage.prompt_tokens + result.usage.completion_tokens, result.cost_usd
        await asyncio.shield(self._admission.settle(key, admitted.reservation_id, tokens=tokens, cost_usd=cost))

    # ------------------------------------------------------------------------------ routing

    def _route_options(self, req: wire.ChatRequest, key: KeyRecord | None) -> RouteOptions:
        headers: dict[str, str] | None = None
        if req.headers:
            headers = {}
            for k, v in req.headers:
                name = k.decode("latin-1").lower()
                # Forwarded fields, and the caller's wish that its request never be copied to a
                # shadow candidate (read by the router, never sent upstream).
                if name in self._forwarded or name == NO_SHADOW_HEADER:
                    if name in headers:
                        # Two values of one forwarded field: which one the upstream should act on is
                        # not the gateway's to guess.
                        raise wire.bad_request(f"header {name} was sent more than once; send it once")
                    headers[name] = v.decode("latin-1")
            headers = headers or None
        return RouteOptions(
            model=req.model,
            # OpenAI's `user` names the end user: the gateway keeps their canary side sticky with it
            # (one longer than a log session id still routes, without stickiness). It is forwarded too.
            session_id=req.user if req.user and len(req.user) <= MAX_SESSION_ID else None,
            source=SOURCE,
            key_name=key.name if key is not None else None,
            headers=headers,
        )

    async def _complete(
        self, req: wire.ChatRequest, key: KeyRecord | None, admitted: _Admitted, options: RouteOptions
    ) -> ChatReply:
        result: ChatResult | None = None
        try:
            result = await self.driver.request(req.api, req.body, options)
        except AllRoutesFailed as exc:
            raise self._counted(status_for(exc)) from None
        except InvalidRequest as exc:
            raise _invalid(exc) from None
        finally:
            await self._settle(key, admitted, result, 0.0)
        assert result.raw is not None
        return ChatReply(wire.dumps(result.raw), result_headers(result))

    def _counted(self, err: wire.WireError) -> wire.WireError:
        """``err``, counted among the overload refusals when it is one (a provider's pool was full)."""
        if err.code == wire.OVERLOADED and self.metrics is not None:
            self.metrics.overloads.inc()
        return err

    async def _stream(
        self, req: wire.ChatRequest, key: KeyRecord | None, admitted: _Admitted, options: RouteOptions
    ) -> ChatStreamReply:
        """Wait for the first output (or the end) before answering: until then a failure is still
        an HTTP status, and the headers name the provider that is really streaming."""
        stream: AsyncChatStream | None = None
        first: list[dict | bytes] | None = None
        try:
            stream = self.driver.stream(req.api, req.body, options)
            try:
                first = await stream.batches().__anext__()
            except StopAsyncIteration:  # finished without any chunk
                first = None
        except BaseException as exc:
            if stream is not None:
                await stream.aclose()
            await self._settle(key, admitted, stream.result if stream is not None else None, 0.0)
            if isinstance(exc, Exception):
                raise self._counted(_map_error(exc)) from None
            raise
        return ChatStreamReply(self._events(stream, first, req, key, admitted), result_headers(stream))

    async def _events(
        self,
        stream: AsyncChatStream,
        first: list[dict | bytes] | None,
        req: wire.ChatRequest,
        key: KeyRecord | None,
        admitted: _Admitted,
    ) -> AsyncIterator[bytes]:
        """The upstream's chunks as SSE, in order and unmerged, one write per read of the upstream.
        Chat: the usage chunk (and the ``usage`` key of the others) only for a caller that asked
        for it; ``[DONE]`` at the end, in the same write as the last chunks (the Responses API's
        events end with ``response.completed``)."""
        encode = wire.sse_event if req.api == "responses" else wire.sse_data
        keep_usage = req.api == "responses" or stream.caller_usage
        done = req.api == "responses"  # nothing more to send after the last event

        def write(batch: list[dict | bytes]) -> bytes:
            nonlocal done
            if len(batch) == 1 and stream.result is None:  # the common read: one chunk passed as bytes
                chunk = batch[0]
                if type(chunk) is bytes and (keep_usage or b'"usage"' not in chunk):
                    return b"data: " + chunk + b"\n\n"
            parts = []
            for chunk in batch:
                if isinstance(chunk, bytes):
                    if not keep_usage and b'"usage"' in chunk:
                        chunk = _without_null_usage(chunk)
                    parts.append(b"data: " + chunk + b"\n\n")
                    continue
                if not keep_usage:
                    if not chunk.get("choices") and chunk.get("usage") is not None:
                        continue  # the usage chunk the gateway asked for itself
                    chunk.pop("usage", None)
                parts.append(encode(chunk))
            if stream.result is not None and not done:
                parts.append(wire.SSE_DONE)
                done = True
            return b"".join(parts)

        try:
            if first is not None:
                if event := write(first):
                    yield event
                async for batch in stream.batches():
                    if event := write(batch):
                        yield event
            if stream.result is None:
                raise wire.upstream_failed("The upstream stream ended without an answer.")
            if not done:
                yield wire.SSE_DONE
        except wire.WireError:
            raise
        except Exception as exc:  # noqa: BLE001 - becomes an error event in the stream
            raise _map_error(exc, started=True) from None
        finally:
            await stream.aclose()  # the normal end: a no-op; a disconnect: closes the upstream stream
            partial = 0.0
            if stream.result is None and stream.model:
                delivered = len(stream.delivered_text())
                if delivered:
                    partial = _partial_cost(stream.priced_as or stream.model, req, delivered)
            await self._settle(key, admitted, stream.result, partial)


_NULL_USAGE_LAST = b',"usage":null}'


def _without_null_usage(chunk: bytes) -> bytes:
    """A chunk passed on unparsed without the ``"usage":null`` the gateway's own ``include_usage``
    added (its top-level ``usage`` is ``null``: :meth:`StreamAccount.pass_raw`)."""
    if chunk.endswith(_NULL_USAGE_LAST) and chunk.count(b'"usage"') == 1:
        return chunk[: -len(_NULL_USAGE_LAST)] + b"}"  # the last top-level key, as upstreams write it
    obj = fastjson.loads(chunk)  # anywhere else: the parser says where it is
    obj.pop("usage", None)
    return fastjson.dumps(obj)


def _partial_cost(model: str, req: wire.ChatRequest, delivered_chars: int) -> float:
    """A cut stream's cost as far as it went: the prompt plus the characters delivered."""
    try:
        return catalog.cost_usd(
            model, estimate_prompt_tokens(_prompt_messages(req)), 0, estimate_tokens(delivered_chars)
        )
    except InvalidRequest:
        return 0.0


def _prompt_messages(req: wire.ChatRequest) -> list[dict]:
    """The request's input as chat messages, for the estimates (none when it cannot be read)."""
    if req.api == "chat":
        return req.messages
    try:
        return input_messages(req.api, req.body)
    except InvalidRequest:
        return []


def _invalid(exc: InvalidRequest) -> wire.WireError:
    if isinstance(exc, catalog.UnknownModelError):
        return wire.WireError(404, str(exc), param="model", code="model_not_found")
    return wire.bad_request(str(exc), param=getattr(exc, "param", None))


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
