"""RoutingClient: the sync driver of the routing policy. One call in (chat completions, the
Responses API, embeddings or legacy completions), the canary split, intent routing, retries,
fallback, cache hints, streaming, cost and telemetry out.

Every decision is :class:`app.routing.core.RoutingCore`'s (planning, the retry/fallback loop, the
records, reading answers and stream chunks). The I/O is the async driver's
(:class:`~app.routing.io.async_client.AsyncRoutingClient`, the one the server routes with), run
through a blocking portal (:mod:`app.routing.io.portal`): one event loop in a background thread,
shared by every sync client of the process. So there is one send path, one response-size limit and
one deadline mechanism. A request is planned in the caller's thread (invalid input raises there,
before any I/O) and sent on the loop; a stream is pumped on the loop into a queue the caller reads
from. The request path does no database I/O: the canary ratio is the last value the gateway's
background refresher loaded, and the attempt records go to the telemetry writer in one hand-off.

``transports`` are sync ``httpx2`` transports (the built-in simulator's mock transport for
``sim://`` providers, or a test's), which the async driver runs in worker threads; a provider
without one is reached over the network.

Transparent: the caller's parameters are sent as given (``client.chat(messages, tools=[...],
response_format=..., seed=1)``) and the upstream's whole answer is kept
(``result.completion``, the SDK's type); a stream yields text and, through ``chunks()``, the SDK's
chunk objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol, overload

import httpx2
from sqlalchemy import Engine

from app.config import Settings, load_settings
from app.routing.answers import chunk_text
from app.routing.breaker import BreakerSnapshot, State
from app.routing.core import (
    DEFAULT_OPTIONS,
    MAX_SESSION_ID,
    Plan,
    RatioSource,
    RoutingCore,
    StreamState,
    TelemetrySink,
    upstream_base_url,
)
from app.routing.errors import ClientClosedError
from app.routing.inputs import VALID_ROLES, validate_messages
from app.routing.io.async_client import AsyncRoutingClient
from app.routing.io.classify import classify
from app.routing.io.portal import PORTAL
from app.routing.io.sdk import sdk_chunk
from app.routing.options import RouteOptions
from app.routing.result import ChatResult
from core import fastjson

__all__ = [
    "MAX_SESSION_ID",
    "VALID_ROLES",
    "ChatStream",
    "RoutingClient",
    "sdk_chunk",
    "upstream_base_url",
    "validate_messages",
]


class _Closable(Protocol):
    engine: Engine

    def close(self) -> None: ...


class ChatStream(StreamState):
    """Iterate for text (choice 0); or ``chunks()`` for the SDK's chunk objects (tool-call deltas,
    every choice, the usage chunk), ``events()`` for the upstream's chunks as JSON, or
    ``batches()`` for what each read of the upstream brought. One of these, once. Afterwards
    ``.result`` holds the :class:`ChatResult`. Leaving the loop early, or ``close()``, cancels the
    upstream stream and logs the attempt as ``cancelled``.

    The async driver runs the stream on the portal's loop and writes this object's state as it
    goes; the batches come through a queue (:meth:`Portal.iterate`), a few reads ahead of the
    reader at most."""

    def __init__(self, plan: Plan, run: Callable[[ChatStream], Generator[list[dict | bytes], None, None]]):
        super().__init__(plan)
        self._batches = run(self)

    def batches(self) -> Generator[list[dict | bytes], None, None]:
        """Per read of the upstream, the chunks to hand on (as :meth:`AsyncChatStream.batches`)."""
        return self._batches

    def events(self) -> Iterator[dict]:
        with contextlib.closing(self._batches):
            for batch in self._batches:
                for chunk in batch:
                    yield chunk if isinstance(chunk, dict) else fastjson.loads(chunk)

    def chunks(self) -> Iterator[Any]:
        for chunk in self.events():
            yield sdk_chunk(self.api, chunk)

    def _texts(self) -> Iterator[str]:
        for chunk in self.events():
            text = chunk_text(self.api, chunk)
            if text:
                yield text

    def __iter__(self) -> Iterator[str]:
        return self._texts()

    def close(self) -> None:
        self._batches.close()


class RoutingClient:
    """Routes OpenAI calls; built by :func:`app.gateway.build_gateway` (or :meth:`from_config`).

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
        self.source = source
        self.core = RoutingCore(
            settings,
            telemetry=telemetry,
            ratio=ratio,
            clock=clock,
            wall_clock=wall_clock,
            rng=rng or random.Random(),
            source=source,
            env=env,
            secrets=secrets,
            classify=classify,
            new_lock=threading.Lock,
        )
        self._reload = reload
        self._sleep = sleep
        self.transports: dict[str, httpx2.BaseTransport] = dict(transports or {})
        self._portal = PORTAL
        self._driver: AsyncRoutingClient | None = None
        self._driver_generation = 0  # the portal loop the driver was built on
        self._driver_lock = threading.Lock()
        self._gateway: _Closable | None = None
        self._closed = False

    @classmethod
    def from_config(cls, path: str | None = None, **kwargs: Any) -> RoutingClient:
        """A client on its own gateway, from ``GATEWAY_CONFIG`` (or ``path``) and ``DATABASE_URL``;
        ``close()`` closes the gateway (timers, telemetry flush, HTTP clients). ``kwargs`` go to
        :func:`app.runtime.assemble`."""
        from app.runtime import assemble

        return assemble(load_settings(path, env=kwargs.get("env")), cls, **kwargs).client

    def attach(self, gateway: Any) -> None:
        """Called by the gateway that built this client: ``close()`` then closes the gateway."""
        self._gateway = gateway

    @property
    def gateway(self) -> Any:
        if self._gateway is None:
            raise AttributeError("this RoutingClient was constructed directly, not by build_gateway()")
        return self._gateway

    @property
    def engine(self) -> Engine:
        return self.gateway.engine

    @property
    def telemetry(self) -> TelemetrySink:
        """Where the attempt records go (the core's sink; the server wraps it to count them)."""
        return self.core.telemetry

    @telemetry.setter
    def telemetry(self, sink: TelemetrySink) -> None:
        self.core.telemetry = sink

    @property
    def on_breaker_change(self) -> list[Callable[[str, State, State, str], None]]:
        """Hooks called as ``hook(provider, old_state, new_state, why)`` on every breaker change."""
        return self.core.on_breaker_change

    # -- public API ----------------------------------------------------------------------------
    def current_ratio(self) -> float:
        """The last canary ratio the refresher loaded (no database read)."""
        return self.core.ratio.value

    def ratio_age_s(self) -> float:
        """Seconds since the canary ratio was last loaded from the database."""
        return self.core.ratio.age_s()

    def breaker_states(self) -> dict[str, BreakerSnapshot]:
        """Each provider's circuit breaker now (times on the router's monotonic clock)."""
        return self.core.breaker_states()

    @property
    def closed(self) -> bool:
        return self._closed

    @overload
    def chat(
        self, messages: Sequence[dict], model: str = "auto", *, stream: Literal[False] = False, **params: Any
    ) -> ChatResult: ...

    @overload
    def chat(
        self, messages: Sequence[dict], model: str = "auto", *, stream: Literal[True], **params: Any
    ) -> ChatStream: ...

    @overload
    def chat(
        self, messages: Sequence[dict], model: str = "auto", *, stream: bool = False, **params: Any
    ) -> ChatResult | ChatStream: ...

    def chat(
        self, messages: Sequence[dict], model: str = "auto", *, stream: bool = False, **params: Any
    ) -> ChatResult | ChatStream:
        """Send one chat request through the router. ``params`` are the routing options of
        :class:`~app.routing.options.RouteOptions` (``session_id``, ``source``, ``route``,
        ``cache_hints``, ``key_name``, ``headers``) and any chat completions parameters (``tools``,
        ``tool_choice``, ``response_format``, ``temperature``, ``seed``, ``n``, ``logprobs``, ...),
        sent as given; a ``None`` value is left out.

        ``route`` forces one side with no fallback (the playground's compare mode). Raises
        :class:`ClientClosedError` at once, without any network I/O, once ``close()`` has begun.
        """
        options, rest = RouteOptions.split(params, model=model, stream=stream)
        return self.request("chat", {"messages": messages, **rest}, options)

    def responses(
        self, input: Any, model: str = "auto", *, stream: bool = False, **params: Any
    ) -> ChatResult | ChatStream:
        """One Responses API request (``POST /v1/responses``) through the same policy;
        ``result.completion`` is the SDK's ``Response``; streamed, the semantic events."""
        options, rest = RouteOptions.split(params, model=model, stream=stream)
        return self.request("responses", {"input": input, **rest}, options)

    def embeddings(self, input: Any, model: str = "auto", **params: Any) -> ChatResult:
        """Embeddings (``POST /v1/embeddings``) through the same policy; ``result.completion`` is
        the SDK's ``CreateEmbeddingResponse`` (``.data[i].embedding``); ``model='auto'`` takes the
        route's first embedding model."""
        options, rest = RouteOptions.split(params, model=model)
        result = self.request("embeddings", {"input": input, **rest}, options)
        assert isinstance(result, ChatResult)
        return result

    def completions(
        self, prompt: Any, model: str = "auto", *, stream: bool = False, **params: Any
    ) -> ChatResult | ChatStream:
        """Legacy completions (``POST /v1/completions``) through the same policy."""
        options, rest = RouteOptions.split(params, model=model, stream=stream)
        return self.request("completions", {"prompt": prompt, **rest}, options)

    def request(
        self, api: str, body: Mapping[str, Any], options: RouteOptions = DEFAULT_OPTIONS
    ) -> ChatResult | ChatStream:
        """Any routed API call: ``api`` is chat, responses, embeddings or completions, ``body`` its
        parameters (``None`` values left out), ``options`` how to route it."""
        if self._closed:
            raise ClientClosedError("this RoutingClient is closed: build a new one (RoutingClient.from_config())")
        plan = self.core.plan(api, {k: v for k, v in body.items() if v is not None}, options)
        driver = self.driver()
        if options.stream:
            return ChatStream(plan, lambda holder: self._portal.iterate(lambda: driver._run_stream(plan, holder)))
        return self._portal.call(driver._run(plan))

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
        """Close the async driver's HTTP clients (on the portal's loop)."""
        self._closed = True
        with self._driver_lock:
            driver, self._driver = self._driver, None
        if driver is None or self._driver_generation != self._portal.generation:
            return  # none, or built on a loop this process does not have (before a fork)
        self._portal.discard(self)
        closing = self._portal.submit(driver.aclose())
        if not self._portal.in_loop_thread():  # there it runs once the caller returns to the loop
            closing.result()

    def __enter__(self) -> RoutingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- I/O -----------------------------------------------------------------------------------
    def driver(self) -> AsyncRoutingClient:
        """The async driver that does this client's I/O, on the portal's loop: built at the first
        request (and again in a forked child, whose loop is another)."""
        driver = self._driver
        if driver is not None and self._driver_generation == self._portal.generation:
            return driver
        with self._driver_lock:
            if self._closed:
                raise ClientClosedError("this RoutingClient is closed")
            if self._driver is None or self._driver_generation != self._portal.generation:
                self._driver = self._portal.call(self._new_driver())
                self._driver_generation = self._portal.generation
                self._portal.on_close(self, self._driver.aclose)
            return self._driver

    async def _new_driver(self) -> AsyncRoutingClient:
        # Built on the loop: the HTTP clients it makes belong to the loop that uses them.
        return AsyncRoutingClient(self, sleep=_awaitable(self._sleep))


def _awaitable(sleep: Callable[[float], None]) -> Callable[[float], Awaitable[None]]:
    """The backoff wait on the loop: ``asyncio.sleep`` for ``time.sleep``; an injected one (a
    test's recorder) is called as it is."""
    if sleep is time.sleep:
        return asyncio.sleep

    async def call(seconds: float) -> None:
        sleep(seconds)

    return call
