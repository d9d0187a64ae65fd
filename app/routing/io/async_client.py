"""AsyncRoutingClient: the driver of the one routing policy, the server's on its event loop and
the sync :class:`~app.routing.io.client.RoutingClient`'s through a blocking portal
(:mod:`app.routing.io.portal`).

It owns only the I/O: the upstream HTTP clients, ``await`` for the backoff, ``asyncio`` deadlines
and cancellation. Everything else is the :class:`~app.routing.core.RoutingCore` of the sync client
it is built from: planning (canary split, intent rules, substitution), the retry/fallback decision
loop (:meth:`RoutingCore.attempts`, a generator that yields the backoff to its driver instead of
sleeping), the circuit breakers, failure classification, the attempt records and the telemetry
hand-off. A request is logged the same whichever caller routed it.

Deadlines (:mod:`app.routing.io.deadline`, the one mechanism): a non-streamed attempt ends at its
budget (capped by the request deadline) under ``asyncio.timeout``; a stream must send its headers
and first text by the first-token deadline, then each chunk within the idle gap, all by the
request deadline (:class:`~app.routing.io.deadline.ReadWatch`). A passed deadline is an ordinary
``httpx2`` timeout to the classifier. Cancellation (a server's client went away, a sync caller
stopped reading) cancels the upstream request: its connection is closed, the attempt is logged as
``cancelled`` and the records are committed. A stream that delivered text never falls back.

Upstreams (:mod:`app.routing.io.upstream_http`, the one send path): real upstreams are reached
with :class:`~app.routing.io.upstream_http.HttpUpstream`; a provider the client was handed a
transport for (the built-in simulator, a test's mock) with
:class:`~app.routing.io.upstream_http.TransportUpstream`, the same requests, size limit, decoding
and stream reading over that transport. A sync transport runs in a worker thread
(:class:`ThreadedTransport`), so the simulator's latency sleeps never block the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import anyio.to_thread
import httpx2
import openai

from app.config import ProviderNotConfigured, Settings
from app.routing.answers import chunk_text, passed_headers
from app.routing.bridge import PassThrough
from app.routing.core import DEFAULT_OPTIONS, Attempt, NoRoute, Plan, RoutingCore, StreamState, Wait
from app.routing.errors import ClientClosedError, Failure
from app.routing.io import deadline as deadlines
from app.routing.io.pool import ProviderPool
from app.routing.io.sdk import sdk_chunk, sdk_settings
from app.routing.io.upstream_http import HttpUpstream, TransportUpstream, UpstreamAnswer, UpstreamStream
from app.routing.options import RouteOptions
from app.routing.result import AllRoutesFailed, ChatResult
from core import fastjson

log = logging.getLogger(__name__)

__all__ = ["AsyncChatStream", "AsyncRoutingClient", "ThreadedTransport"]


class _ThreadedStream(httpx2.AsyncByteStream):
    """A sync response body read to its end in a thread of its own and handed to the loop as it
    comes: what arrived since the loop's last read is one piece. A body of many small chunks (the
    simulator's stream: a chunk per token) so costs the loop a wake-up per read, not a thread
    hop per chunk; a paced body still reaches the loop chunk by chunk, as each arrives.
    ``aclose()`` stops the reading at the next chunk (the thread closes the body)."""

    def __init__(self, inner: httpx2.SyncByteStream):
        self._inner = inner
        self._pieces: deque[bytes] = deque()
        self._done = False
        self._error: BaseException | None = None
        self._stop = False
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _produce(self) -> None:
        try:
            for chunk in self._inner:
                if self._stop:
                    break
                self._pieces.append(chunk)
                self._wake()
        except BaseException as exc:  # noqa: BLE001 - raised on the loop, by the reader
            self._error = exc
        finally:
            self._done = True
            try:
                self._inner.close()
            finally:
                self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(_resolve, waiter)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._produce, name="upstream-body", daemon=True).start()
        pieces = self._pieces
        while True:
            if pieces:
                parts = [pieces.popleft() for _ in range(len(pieces))]
                yield parts[0] if len(parts) == 1 else b"".join(parts)
                continue
            if self._done:
                if pieces:
                    continue
                if self._error is not None:
                    raise self._error
                return
            waiter = self._waiter = self._loop.create_future()
            if pieces or self._done:  # arrived while the waiter was being set: no wake-up comes
                self._waiter = None
                continue
            await waiter

    async def aclose(self) -> None:
        self._stop = True
        if self._loop is None:  # never read: no thread holds the body
            await anyio.to_thread.run_sync(self._inner.close)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


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
    """``async for piece in stream``: the text of choice 0; or ``events()`` for the upstream's
    chunks as JSON objects, ``chunks()`` for the SDK's chunk objects, or ``batches()`` for what
    each read of the upstream brought (what the server forwards). One of these, once. Afterwards
    ``.result`` holds the :class:`ChatResult`. ``aclose()`` (or leaving ``async with``) before the
    end cancels the upstream stream and logs the attempt as ``cancelled``. The async twin of
    :class:`~app.routing.io.client.ChatStream`."""

    def __init__(self, plan: Plan):
        super().__init__(plan)
        self._gen: AsyncGenerator[list[dict | bytes], None] | None = None

    def batches(self) -> AsyncGenerator[list[dict | bytes], None]:
        """Per read of the upstream, the chunks to hand on, in order: a chunk the gateway read as
        a JSON object (``model`` set to the routed model), or one passed on unparsed as the bytes
        of its JSON (see :meth:`StreamAccount.pass_raw`). When the stream has ended, ``result`` is
        set before its last batch is handed over. A batch is never empty."""
        assert self._gen is not None
        return self._gen

    async def events(self) -> AsyncIterator[dict]:
        async for batch in self.batches():
            for chunk in batch:
                yield chunk if isinstance(chunk, dict) else fastjson.loads(chunk)

    async def chunks(self) -> AsyncIterator[Any]:
        async for chunk in self.events():
            yield sdk_chunk(self.api, chunk)

    async def _texts(self) -> AsyncIterator[str]:
        async for chunk in self.events():
            text = chunk_text(self.api, chunk)
            if text:
                yield text

    def __aiter__(self) -> AsyncIterator[str]:
        return self._texts()

    async def aclose(self) -> None:
        if self._gen is not None:
            await self._gen.aclose()

    async def __aenter__(self) -> AsyncChatStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class RoutingOwner(Protocol):
    """What the driver is built from (a :class:`~app.routing.io.client.RoutingClient`): the
    routing core and settings it routes with, the sync transports it was handed, and whether it
    was closed."""

    core: RoutingCore
    settings: Settings
    transports: dict[str, httpx2.BaseTransport]

    @property
    def closed(self) -> bool: ...


class AsyncRoutingClient:
    """``await AsyncRoutingClient(client).chat(messages, ...)``: the routing of ``client`` (a
    :class:`RoutingClient`), with async I/O. ``aclose()`` closes only the async HTTP clients; the
    sync client (its gateway, telemetry, breakers) stays its owner's to close.

    ``transports`` overrides a provider's async transport (tests); ``sleep`` is the backoff wait."""

    def __init__(
        self,
        client: RoutingOwner,
        *,
        transports: Mapping[str, httpx2.AsyncBaseTransport] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.sync = client
        self.core = client.core
        self.settings = client.settings
        self._sleep = sleep
        self._transports = dict(transports or {})
        self._http_clients: list[httpx2.AsyncClient] = []
        self._upstreams: dict[str, HttpUpstream] = {}
        self.pools = {
            name: ProviderPool(name, p.max_connections, p.pool_timeout_s) for name, p in self.settings.providers.items()
        }
        self._closed = False
        for name, p in self.settings.providers.items():
            if not p.is_simulated and name not in self._transports and name not in client.transports:
                # Built now, not by a request's attempt: loading a trust store must not spend its budget.
                with contextlib.suppress(ProviderNotConfigured):
                    self._upstream(name)

    async def __aenter__(self) -> AsyncRoutingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        clients, self._http_clients = self._http_clients, []
        upstreams, self._upstreams = list(self._upstreams.values()), {}
        for http_client in clients:
            await http_client.aclose()
        for upstream in upstreams:
            await upstream.aclose()

    @property
    def closed(self) -> bool:
        return self._closed or self.sync.closed

    async def request(self, api: str, body: Mapping[str, Any], options: RouteOptions = DEFAULT_OPTIONS) -> ChatResult:
        """One non-streamed request of ``api``, routed as :meth:`RoutingClient.request` routes it."""
        plan = self._new_plan(api, body, replace(options, stream=False))
        return await self._run(plan)

    def stream(self, api: str, body: Mapping[str, Any], options: RouteOptions = DEFAULT_OPTIONS) -> AsyncChatStream:
        """One streamed request of ``api``. Invalid input raises here, before any network I/O;
        the request starts at the first read."""
        plan = self._new_plan(api, body, replace(options, stream=True))
        stream = AsyncChatStream(plan)
        stream._gen = self._run_stream(plan, stream)
        return stream

    async def chat(self, messages: Sequence[dict], model: str = "auto", **kwargs: Any) -> ChatResult:
        """One non-streamed chat request; ``kwargs``: the routing options
        (:class:`~app.routing.options.RouteOptions`) and any chat parameters."""
        options, rest = RouteOptions.split(kwargs, model=model)
        body = {"messages": messages, **{k: v for k, v in rest.items() if v is not None}}
        return await self.request("chat", body, options)

    def chat_stream(self, messages: Sequence[dict], model: str = "auto", **kwargs: Any) -> AsyncChatStream:
        """One streamed chat request (chunks as JSON objects)."""
        options, rest = RouteOptions.split(kwargs, model=model)
        body = {"messages": messages, **{k: v for k, v in rest.items() if v is not None}}
        return self.stream("chat", body, options)

    def _new_plan(self, api: str, body: Mapping[str, Any], options: RouteOptions) -> Plan:
        if self.closed:
            raise ClientClosedError("this AsyncRoutingClient is closed: build a new one")
        return self.core.plan(api, body, options)

    # -- I/O -----------------------------------------------------------------------------------
    def _upstream(self, name: str) -> HttpUpstream:
        """The provider's upstream, built on first use: :class:`HttpUpstream` over the network, or
        :class:`TransportUpstream` through the transport the client was handed (the simulator, a
        test's mock). Either way the one send path: the same request, limit and reading."""
        upstream = self._upstreams.get(name)
        if upstream is not None:
            return upstream
        if self.closed:
            raise ClientClosedError("this AsyncRoutingClient is closed")
        sdk = sdk_settings(self.settings, name, self.core.env, self.core.secrets)  # ProviderNotConfigured if unset
        # The SDK client gives the requests its headers and builds the status errors; it never sends.
        http_client = httpx2.AsyncClient(transport=_NEVER_SENDS, follow_redirects=False)
        client = openai.AsyncOpenAI(**sdk, http_client=http_client)
        self._http_clients.append(http_client)
        limit = self.settings.retry.max_response_bytes
        transport = self._transports.get(name)
        if transport is None:
            sync_transport = self.sync.transports.get(name)
            transport = ThreadedTransport(sync_transport) if sync_transport is not None else None
        if transport is not None:
            upstream = TransportUpstream(sdk["base_url"], sdk=client, transport=transport, max_response_bytes=limit)
        else:
            p = self.settings.providers[name]
            upstream = HttpUpstream(
                sdk["base_url"],
                sdk=client,
                max_response_bytes=limit,
                net=p.net(),
                connect_timeout_s=p.timeout_s,
                max_idle=p.max_connections,
            )
        self._upstreams[name] = upstream
        return upstream

    async def _take_slot(self, plan: Plan, attempt: Attempt) -> None:
        """A connection slot of the attempt's provider, waiting at most its ``pool_timeout_s`` and
        never past the request's deadline (:class:`PoolSaturated` when the wait runs out)."""
        await self.pools[attempt.provider].acquire(plan.deadline.remaining(self.core.clock()))

    @contextlib.asynccontextmanager
    async def _slot(self, plan: Plan, attempt: Attempt) -> AsyncIterator[None]:
        await self._take_slot(plan, attempt)
        try:
            yield
        finally:
            self.pools[attempt.provider].release()

    async def _advance(
        self, steps: Generator[Attempt | Wait, Failure | None, None], outcome: Failure | None
    ) -> Attempt:
        """Send ``outcome`` to the decision loop, awaiting its waits, until it names the next attempt."""
        step = steps.send(outcome)
        while isinstance(step, Wait):
            await self._sleep(step.seconds)
            step = steps.send(None)
        return step

    async def _send(
        self, plan: Plan, attempt: Attempt, deadline: deadlines.AttemptDeadline
    ) -> UpstreamAnswer | UpstreamStream:
        """The request sent, under the attempt's deadline (non-streamed: the whole answer;
        streamed: until the response headers, at most the first-token deadline)."""
        upstream = self._upstream(attempt.provider)
        req = self.core.request(plan, attempt)
        try:
            async with _timeout(deadline.time_left(deadline.clock())):
                return await upstream.post(
                    req.path, req.body, headers=req.headers, timeout_s=req.timeout, stream=plan.stream
                )
        except TimeoutError:
            raise deadlines.DeadlineExceeded("the attempt's deadline passed") from None

    async def _run(self, plan: Plan) -> ChatResult:
        core = self.core
        started = core.start(plan)
        steps = core.attempts(plan)
        try:
            attempt = await self._advance(steps, None)
            while True:
                attempt = attempt.begin(core.wall(), core.clock())
                try:
                    async with self._slot(plan, attempt):
                        response = await self._send(plan, attempt, core.deadline(plan, attempt))
                    assert isinstance(response, UpstreamAnswer)
                    answer = core.read(plan, attempt, response.content, response.headers)
                except asyncio.CancelledError:
                    core.record(plan, attempt, failure=core.cancelled("the caller went away"))
                    raise
                except Exception as exc:  # noqa: BLE001 - failed() re-raises what is not an upstream fault
                    attempt = await self._advance(steps, core.failed(plan, attempt, exc))
                    continue
                return core.succeed(plan, attempt, started, answer)
        except NoRoute as stop:
            core.no_route(plan, stop)
            raise AllRoutesFailed(plan.request_id, plan.infos, str(stop)) from None
        finally:
            steps.close()
            core.commit(plan)

    async def _run_stream(self, plan: Plan, holder: StreamState) -> AsyncGenerator[list[dict | bytes], None]:
        """A stream's attempts, writing its state into ``holder``, a batch per read of the upstream:
        every read waits at most until the first-token deadline (before the first output), the
        idle gap and the request's deadline; a passed deadline is an ordinary timeout to the
        classifier. From a real upstream (:class:`UpstreamStream`) the events stay bytes until
        the accounting needs one read (:meth:`StreamAccount.pass_raw`)."""
        core = self.core
        started = core.start(plan)
        steps = core.attempts(plan)
        try:
            attempt = await self._advance(steps, None)
            while True:
                attempt = attempt.begin(core.wall(), core.clock())
                holder.attempting(attempt, len(plan.records) + 1)
                acc = holder.account = core.stream_account(plan, attempt, started)
                out: list[dict | bytes] = []
                pool, held = self.pools[attempt.provider], False
                try:
                    deadline = core.deadline(plan, attempt)
                    await self._take_slot(plan, attempt)
                    held = True
                    stream = await self._send(plan, attempt, deadline)
                    assert isinstance(stream, UpstreamStream)
                    holder.upstream_headers = passed_headers(stream.headers)
                    feed = core.feed(plan, attempt)
                    raw = isinstance(feed, PassThrough)
                    async with stream:
                        next_read = stream.reads().__anext__
                        decode = stream.decode
                        watch = deadlines.ReadWatch(deadline)
                        pass_raw, take, feed_take = acc.pass_raw, acc.take, feed.take
                        try:
                            while True:
                                watch.begin()
                                try:
                                    events = await next_read()
                                except StopAsyncIteration as end:
                                    await watch.settle(end)
                                    out = []
                                    break
                                except BaseException as exc:
                                    await watch.settle(exc)
                                    raise
                                if not watch.ended():
                                    await watch.settle(None)
                                out = []
                                for sse in events:
                                    if raw and sse.event is None:
                                        passed = pass_raw(sse.data)
                                        if passed is not None:
                                            out.append(passed)
                                            continue
                                    for chunk in feed_take(decode(sse)):
                                        out += take(chunk, deadline)
                                if stream.done:
                                    break  # the read that ended the stream is handed on with its result
                                if out:
                                    yield out
                        finally:
                            watch.close()
                    for chunk in feed.end():
                        out += acc.take(chunk, deadline)
                    out += acc.check_finished()
                    result = core.stream_succeeded(plan, attempt, started, acc, holder.upstream_headers)
                except (GeneratorExit, asyncio.CancelledError):
                    core.stream_cancelled(plan, attempt, acc, "the caller stopped reading the stream")
                    raise
                except Exception as exc:  # noqa: BLE001 - stream_failed() re-raises what is not an upstream fault
                    if held:  # not held through the backoff
                        pool.release()
                        held = False
                    attempt = await self._advance(steps, core.stream_failed(plan, attempt, acc, exc))
                    continue
                finally:
                    if held:
                        pool.release()
                        held = False
                holder.result = result
                if out:
                    yield out
                return
        except NoRoute as stop:
            core.no_route(plan, stop)
            raise AllRoutesFailed(plan.request_id, plan.infos, str(stop)) from None
        finally:
            steps.close()
            core.commit(plan)


def _never_sends(request: httpx2.Request) -> httpx2.Response:
    raise AssertionError(f"the SDK client sent {request.url}: every request goes through the provider's upstream")


_NEVER_SENDS = httpx2.MockTransport(_never_sends)


def _timeout(seconds: float) -> asyncio.Timeout:
    """``asyncio.timeout`` after ``seconds`` (at least 1 ms: a passed deadline still fails by timing out)."""
    return asyncio.timeout(max(seconds, 0.001))
