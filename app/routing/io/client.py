"""RoutingClient: the sync driver of the routing policy. One call in (chat completions, the
Responses API, embeddings or legacy completions), the canary split, intent routing, retries,
fallback, cache hints, streaming, cost and telemetry out.

Every decision is :class:`app.routing.core.RoutingCore`'s (planning, the retry/fallback loop, the
records, reading answers and stream chunks); this module performs only the I/O: an
``openai.OpenAI`` client per provider with the SDK's own retries off (``max_retries=0``), on an
``httpx2.Client`` with the transport it was handed (:func:`app.gateway.build_gateway` hands it the
built-in simulator's mock transport for ``sim://`` providers, or a test's transport), the network
otherwise; ``time.sleep`` for the backoff; deadlines enforced at the transport
(:mod:`app.routing.io.deadline`). The request path does no database I/O: the canary ratio is the last
value the gateway's background refresher loaded, and the attempt records go to the telemetry
writer in one hand-off.

Transparent: the caller's parameters are sent as given (``client.chat(messages, tools=[...],
response_format=..., seed=1)``) and the upstream's whole answer is kept
(``result.completion``, the SDK's type); a stream yields text and, through ``chunks()``, the SDK's
chunk objects.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol, overload

import httpx2
import openai
from sqlalchemy import Engine

from app.config import Settings, load_settings
from app.netconf import NetConf
from app.routing.answers import StreamAccount, chunk_text, passed_headers
from app.routing.breaker import BreakerSnapshot, State
from app.routing.core import (
    DEFAULT_OPTIONS,
    MAX_SESSION_ID,
    Attempt,
    NoRoute,
    Plan,
    RatioSource,
    RoutingCore,
    StreamState,
    TelemetrySink,
    Wait,
    upstream_base_url,
)
from app.routing.errors import ClientClosedError, Failure
from app.routing.inputs import VALID_ROLES, validate_messages
from app.routing.io import deadline as deadlines
from app.routing.io.body_limit import BodyLimitTransport
from app.routing.io.classify import classify
from app.routing.io.sdk import sdk_chunk, sdk_options, sdk_settings
from app.routing.options import RouteOptions
from app.routing.result import AllRoutesFailed, ChatResult

__all__ = [
    "MAX_SESSION_ID",
    "VALID_ROLES",
    "ChatStream",
    "RoutingClient",
    "sdk_chunk",
    "upstream_base_url",
    "validate_messages",
]


def httpx_transport(net: NetConf) -> httpx2.HTTPTransport:
    """A provider's network transport for the sync driver, with its proxy and TLS settings."""
    kwargs: dict = {}
    ctx = net.ssl_context()
    if ctx is not None:
        kwargs["verify"] = ctx
    if net.proxy:
        kwargs["proxy"] = httpx2.Proxy(net.proxy)
    return httpx2.HTTPTransport(**kwargs)


class _Closable(Protocol):
    engine: Engine

    def close(self) -> None: ...


class ChatStream(StreamState):
    """Iterate for text (choice 0); or ``chunks()`` for the SDK's chunk objects (tool-call deltas,
    every choice, the usage chunk), or ``events()`` for the upstream's chunks as JSON. One of the
    three, once. Afterwards ``.result`` holds the :class:`ChatResult`."""

    def __init__(self, gen_factory: Callable[[ChatStream], Generator[dict, None, None]], plan: Plan):
        super().__init__(plan)
        self._gen = gen_factory(self)

    def events(self) -> Iterator[dict]:
        return self._gen

    def chunks(self) -> Iterator[Any]:
        for chunk in self._gen:
            yield sdk_chunk(self.api, chunk)

    def _texts(self) -> Iterator[str]:
        for chunk in self._gen:
            text = chunk_text(self.api, chunk)
            if text:
                yield text

    def __iter__(self) -> Iterator[str]:
        return self._texts()

    def close(self) -> None:
        self._gen.close()


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
        self._clients: dict[str, openai.OpenAI] = {}
        self._http_clients: list[httpx2.Client] = []
        self._clients_lock = threading.Lock()
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
        if options.stream:
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

    # -- I/O -----------------------------------------------------------------------------------
    def _client(self, name: str) -> openai.OpenAI:
        with self._clients_lock:
            client = self._clients.get(name)
            if client is not None:
                return client
            if self._closed:
                raise ClientClosedError("this RoutingClient is closed")
            sdk = sdk_settings(self.settings, name, self.core.env, self.core.secrets)  # ProviderNotConfigured if unset
            # Deadlines and the response size limit are enforced at the transport (see
            # app.routing.io.deadline and app.routing.io.body_limit).
            inner = BodyLimitTransport(
                self.transports.get(name) or httpx_transport(self.settings.providers[name].net()),
                self.settings.retry.max_response_bytes,
            )
            transport = deadlines.DeadlineTransport(inner)
            http_client = httpx2.Client(transport=transport, follow_redirects=False)
            client = openai.OpenAI(**sdk, http_client=http_client)
            self._http_clients.append(http_client)
            self._clients[name] = client
            return client

    def _advance(self, steps: Generator[Attempt | Wait, Failure | None, None], outcome: Failure | None) -> Attempt:
        """Send ``outcome`` to the decision loop, sleeping through its waits, until it names the
        next attempt (or raises :class:`NoRoute`)."""
        step = steps.send(outcome)
        while isinstance(step, Wait):
            self._sleep(step.seconds)
            step = steps.send(None)
        return step

    def _send(self, plan: Plan, attempt: Attempt, deadline: deadlines.AttemptDeadline) -> Any:
        """The request through the SDK's ``client.post`` (its error mapping, auth and SSE parsing;
        not its model construction): the raw response, or for a stream the SDK's stream of JSON
        chunks."""
        client = self._client(attempt.provider)
        req = self.core.request(plan, attempt)
        options = sdk_options(req)
        token = deadlines.activate(deadline)
        try:
            if plan.stream:
                return client.post(
                    req.path,
                    body=req.body,
                    options=options,
                    cast_to=object,
                    stream=True,
                    stream_cls=openai.Stream[object],
                )
            return client.post(req.path, body=req.body, options=options, cast_to=httpx2.Response)
        finally:
            deadlines.deactivate(token)

    def _run(self, plan: Plan) -> ChatResult:
        core = self.core
        started = core.start(plan)
        steps = core.attempts(plan)
        try:
            attempt = self._advance(steps, None)
            while True:
                attempt = attempt.begin(core.wall(), core.clock())
                try:
                    response = self._send(plan, attempt, core.deadline(plan, attempt))
                    answer = core.read(plan, attempt, response.content, response.headers)
                except Exception as exc:  # noqa: BLE001 - failed() re-raises what is not an upstream fault
                    attempt = self._advance(steps, core.failed(plan, attempt, exc))
                    continue
                return core.succeed(plan, attempt, started, answer)
        except NoRoute as stop:
            core.no_route(plan, stop)
            raise AllRoutesFailed(plan.request_id, plan.infos, str(stop)) from None
        finally:
            steps.close()
            core.commit(plan)

    def _run_stream(self, plan: Plan, holder: ChatStream) -> Generator[dict, None, None]:
        core = self.core
        started = core.start(plan)
        steps = core.attempts(plan)
        try:
            attempt = self._advance(steps, None)
            while True:
                attempt = attempt.begin(core.wall(), core.clock())
                holder.attempting(attempt, len(plan.records) + 1)
                acc: StreamAccount = core.stream_account(plan, attempt, started)
                try:
                    deadline = core.deadline(plan, attempt)
                    stream = self._send(plan, attempt, deadline)
                    holder.upstream_headers = passed_headers(stream.response.headers)
                    feed = core.feed(plan, attempt)
                    with stream:
                        for chunk in stream:
                            for event in feed.take(chunk):
                                yield from acc.take(event, deadline)
                    for event in feed.end():
                        yield from acc.take(event, deadline)
                    yield from acc.check_finished()
                except GeneratorExit:
                    core.stream_cancelled(plan, attempt, acc, "the caller stopped reading the stream")
                    raise
                except Exception as exc:  # noqa: BLE001 - stream_failed() re-raises what is not an upstream fault
                    attempt = self._advance(steps, core.stream_failed(plan, attempt, acc, exc))
                    continue
                holder.result = core.stream_succeeded(plan, attempt, started, acc, holder.upstream_headers)
                return
        except NoRoute as stop:
            core.no_route(plan, stop)
            raise AllRoutesFailed(plan.request_id, plan.infos, str(stop)) from None
        finally:
            steps.close()
            core.commit(plan)
