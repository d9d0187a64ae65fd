"""AsyncRoutingClient: the async driver of the one routing policy (issue 9).

It owns only the I/O: ``openai.AsyncOpenAI`` clients on ``httpx2.AsyncClient``, ``await`` for the
backoff, ``asyncio`` deadlines and cancellation. Everything else is the :class:`RoutingClient` it is
built from, shared and not copied: planning (canary split, intent rules, substitution), the
retry/fallback decision loop (:meth:`RoutingClient._attempts`, which yields the backoff to its
driver instead of sleeping), the circuit breakers, failure classification, the attempt records and
the telemetry hand-off. A request routed here is logged exactly as the sync client logs it.

Deadlines are the sync driver's :class:`~app.routing.deadline.AttemptDeadline`, enforced with
``asyncio.timeout``: a non-streamed attempt ends at its budget (capped by the request deadline); a
stream must send its headers and first text by the first-token deadline, then each chunk within the
idle gap, all by the request deadline. A passed deadline is an ordinary ``httpx2`` timeout to the
classifier. Cancellation (a server's client went away) cancels the upstream request: httpx closes
the connection of a cancelled request, the attempt is logged as ``cancelled`` and the records are
committed. Streams (:meth:`AsyncRoutingClient.chat_stream`) share the chunk handling, the
broken-stream rule (no fallback once text was delivered) and the records with the sync driver.

Transports: a provider the sync client reaches through a (sync) transport of its own (the built-in
simulator, a test's mock) is reached here through that same transport run in a worker thread
(:class:`ThreadedTransport`), so the simulator's latency sleeps never block the event loop; other
providers use ``httpx2.AsyncHTTPTransport``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any

import anyio.to_thread
import httpx2
import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from app.routing import deadline as deadlines
from app.routing.body_limit import AsyncBodyLimitTransport
from app.routing.canary import Side
from app.routing.client import (
    RoutingClient,
    StreamState,
    _completion_parts,
    _Plan,
    _Stop,
    _StreamAttempt,
    _Try,
    _Wait,
)
from app.routing.errors import ClientClosedError, Failure
from app.routing.result import AllRoutesFailed, ChatResult

log = logging.getLogger(__name__)

__all__ = ["AsyncChatStream", "AsyncRoutingClient", "ThreadedTransport"]


class _ThreadedStream(httpx2.AsyncByteStream):
    """A sync response body read chunk by chunk in a worker thread."""

    def __init__(self, inner: httpx2.SyncByteStream):
        self._inner = inner
        self._it = iter(inner)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        done = object()
        while True:
            chunk = await anyio.to_thread.run_sync(next, self._it, done)
            if chunk is done:
                return
            yield chunk  # type: ignore[misc]  # not the sentinel

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._inner.close)


class ThreadedTransport(httpx2.AsyncBaseTransport):
    """A sync transport (the simulator's mock transport) behind an async client: each request, and
    each chunk of a streamed body, runs in a worker thread so its sleeps never block the loop."""

    def __init__(self, inner: httpx2.BaseTransport):
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        await request.aread()
        # abandon_on_cancel: a cancelled request releases its caller at once; the thread runs out alone.
        response = await anyio.to_thread.run_sync(self.inner.handle_request, request, abandon_on_cancel=True)
        stream = response.stream
        if isinstance(stream, httpx2.SyncByteStream) and not isinstance(stream, httpx2.ByteStream):
            response.stream = _ThreadedStream(stream)
        return response

    async def aclose(self) -> None:
        self.inner.close()


class AsyncChatStream(StreamState):
    """``async for piece in stream``: the text chunks; afterwards ``.result`` holds the
    :class:`ChatResult`. ``aclose()`` (or leaving ``async with``) before the end cancels the
    upstream stream and logs the attempt as ``cancelled``. The async twin of :class:`ChatStream`."""

    def __init__(self, plan: _Plan):
        super().__init__(plan)
        self._gen: AsyncGenerator[str, None] | None = None

    def __aiter__(self) -> AsyncIterator[str]:
        assert self._gen is not None
        return self._gen

    async def __anext__(self) -> str:
        assert self._gen is not None
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        if self._gen is not None:
            await self._gen.aclose()

    async def __aenter__(self) -> AsyncChatStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncRoutingClient:
    """``await AsyncRoutingClient(client).chat(messages, ...)``: the routing of ``client`` (a
    :class:`RoutingClient`), with async I/O. ``aclose()`` closes only the async HTTP clients; the
    sync client (its gateway, telemetry, breakers) stays its owner's to close.

    ``transports`` overrides a provider's async transport (tests); ``sleep`` is the backoff wait."""

    def __init__(
        self,
        client: RoutingClient,
        *,
        transports: Mapping[str, httpx2.AsyncBaseTransport] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.sync = client
        self.settings = client.settings
        self._sleep = sleep
        self._transports = dict(transports or {})
        self._clients: dict[str, openai.AsyncOpenAI] = {}
        self._http_clients: list[httpx2.AsyncClient] = []
        self._closed = False

    async def __aenter__(self) -> AsyncRoutingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        clients, self._http_clients = self._http_clients, []
        self._clients.clear()
        for http_client in clients:
            await http_client.aclose()

    @property
    def closed(self) -> bool:
        return self._closed or self.sync.closed

    async def chat(
        self,
        messages: Sequence[dict],
        model: str = "auto",
        *,
        session_id: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        source: str | None = None,
        route: Side | None = None,
        cache_hints: bool = True,
        key_name: str | None = None,
    ) -> ChatResult:
        """One non-streamed chat request, routed as :meth:`RoutingClient.chat` routes it."""
        plan = self._new_plan(messages, model, session_id, False, temperature, max_tokens, source, route, cache_hints)
        plan.key_name = key_name
        return await self._run(plan)

    def chat_stream(
        self,
        messages: Sequence[dict],
        model: str = "auto",
        *,
        session_id: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        source: str | None = None,
        route: Side | None = None,
        cache_hints: bool = True,
        key_name: str | None = None,
    ) -> AsyncChatStream:
        """One streamed chat request, routed as ``RoutingClient.chat(..., stream=True)`` routes it.
        Invalid input raises here, before any network I/O; the request starts at the first read."""
        plan = self._new_plan(messages, model, session_id, True, temperature, max_tokens, source, route, cache_hints)
        plan.key_name = key_name
        stream = AsyncChatStream(plan)
        stream._gen = self._run_stream(plan, stream)
        return stream

    def _new_plan(self, *args: Any) -> _Plan:
        """:meth:`RoutingClient._plan` (validation, canary side, intent, routes) for this driver."""
        if self.closed:
            raise ClientClosedError("this AsyncRoutingClient is closed: build a new one")
        return self.sync._plan(*args)

    # -- I/O -----------------------------------------------------------------------------------
    def _client(self, name: str) -> openai.AsyncOpenAI:
        client = self._clients.get(name)
        if client is not None:
            return client
        if self.closed:
            raise ClientClosedError("this AsyncRoutingClient is closed")
        c = self.sync
        sdk = c._sdk_settings(name)  # ProviderNotConfigured if its key is unset
        transport = self._transports.get(name)
        if transport is None:
            sync_transport = c._transports.get(name)
            transport = ThreadedTransport(sync_transport) if sync_transport is not None else httpx2.AsyncHTTPTransport()
        transport = AsyncBodyLimitTransport(transport, self.settings.retry.max_response_bytes)
        http_client = httpx2.AsyncClient(transport=transport, follow_redirects=False)
        client = openai.AsyncOpenAI(**sdk, http_client=http_client)
        self._http_clients.append(http_client)
        self._clients[name] = client
        return client

    async def _advance(self, steps: Generator[_Try | _Wait, Failure | None, None], outcome: Failure | None) -> _Try:
        """The async driver's step (the sync one is :meth:`RoutingClient._advance`)."""
        step = steps.send(outcome)
        while isinstance(step, _Wait):
            await self._sleep(step.seconds)
            step = steps.send(None)
        return step

    async def _send(self, plan: _Plan, attempt: _Try, deadline: deadlines.AttemptDeadline) -> Any:
        """The SDK call, under the attempt's deadline (non-streamed: the whole answer; streamed:
        until the response headers, at most the first-token deadline)."""
        client = self._client(attempt.provider)
        body, options = self.sync._request(plan, attempt)
        try:
            async with _timeout(deadline.time_left(deadline.clock())):
                return await client.post(
                    "/chat/completions",
                    body=body,
                    options=options,
                    cast_to=ChatCompletion,
                    stream=plan.stream,
                    stream_cls=openai.AsyncStream[ChatCompletionChunk],
                )
        except TimeoutError:
            raise deadlines.DeadlineExceeded("the attempt's deadline passed") from None

    async def _run(self, plan: _Plan) -> ChatResult:
        c = self.sync
        started = c._start(plan)
        steps = c._attempts(plan)
        try:
            attempt = await self._advance(steps, None)
            while True:
                attempt = attempt.begin(c._wall(), c._clock())
                try:
                    resp = await self._send(plan, attempt, c._deadline(plan, attempt))
                    text, finish, usage = _completion_parts(resp)
                except asyncio.CancelledError:
                    c._record(plan, attempt, failure=Failure("cancelled", "the caller went away"))
                    raise
                except Exception as exc:  # noqa: BLE001 - _failed() re-raises what is not an upstream fault
                    attempt = await self._advance(steps, c._failed(plan, attempt, exc))
                    continue
                return c._succeed(plan, attempt, started, text, usage, None, finish)
        except _Stop as stop:
            raise AllRoutesFailed(plan.request_id, plan.infos, str(stop)) from None
        finally:
            steps.close()
            c._commit(plan)

    async def _run_stream(self, plan: _Plan, holder: AsyncChatStream) -> AsyncGenerator[str, None]:
        """:meth:`RoutingClient._run_stream` with async I/O: every read of the upstream stream
        waits at most until the first-token deadline (before the first text), the idle gap and
        the request's deadline; a passed deadline is an ordinary timeout to the classifier."""
        c = self.sync
        started = c._start(plan)
        steps = c._attempts(plan)
        try:
            attempt = await self._advance(steps, None)
            while True:
                attempt = attempt.begin(c._wall(), c._clock())
                holder._attempting(attempt, len(plan.records) + 1)
                acc = _StreamAttempt(started, attempt.t0, c._clock)
                try:
                    deadline = c._deadline(plan, attempt)
                    stream = await self._send(plan, attempt, deadline)
                    async with stream:
                        chunks = stream.__aiter__()
                        while True:
                            try:
                                async with _timeout(deadline.time_left(deadline.clock(), body=True)):
                                    chunk = await chunks.__anext__()
                            except StopAsyncIteration:
                                break
                            except TimeoutError:
                                deadline.check()  # the first-token or request deadline, by name
                                raise deadlines.DeadlineExceeded("no chunk within the stream's idle timeout") from None
                            for piece in acc.take(chunk, deadline):
                                yield piece
                    acc.check_finished()
                except (GeneratorExit, asyncio.CancelledError):
                    c._stream_cancelled(plan, attempt, acc, "the caller stopped reading the stream")
                    raise
                except Exception as exc:  # noqa: BLE001 - _stream_failed() re-raises what is not an upstream fault
                    attempt = await self._advance(steps, c._stream_failed(plan, attempt, acc, exc))
                    continue
                holder.result = c._stream_succeeded(plan, attempt, started, acc)
                return
        except _Stop as stop:
            raise AllRoutesFailed(plan.request_id, plan.infos, str(stop)) from None
        finally:
            steps.close()
            c._commit(plan)


def _timeout(seconds: float) -> asyncio.Timeout:
    """``asyncio.timeout`` after ``seconds`` (at least 1 ms: a passed deadline still fails by timing out)."""
    return asyncio.timeout(max(seconds, 0.001))
