"""The gateway server's ASGI application: routing of the HTTP surface, gateway-key auth, body limit,
OpenAI-shaped errors and SSE streaming with client-disconnect cancellation.

Plain ASGI rather than a framework: the proxy's own overhead is the product (the benchmark budget is
well under a millisecond per request), and every byte on the wire is already built by
:mod:`app.server.wire`. What a request *does* is injected: ``chat_handler(request, key)`` performs
the routing policy and returns a :class:`ChatReply`, a :class:`ChatStreamReply`, a plain dict or an
async iterator of SSE bytes; ``authenticate(token)`` maps a bearer token to a key record;
``ready()`` reports readiness checks. Nothing here imports the router.

A client that disconnects cancels the handler (and with it the upstream request): the handler runs
in a task group beside a watcher of the ASGI ``receive`` channel.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote

import anyio

from app.routing.core import NO_SHADOW_HEADER
from app.server import wire
from app.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from app.server.metrics import GatewayMetrics
from core.ids import IdSource

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

# The routed APIs by path (the handler routes each through the same policy).
API_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
    "/v1/completions": "completions",
}
CORS_EXPOSED = (
    b"x-request-id, x-gateway-request-id, x-gateway-provider, x-gateway-model, x-gateway-intent, "
    b"x-gateway-canary-side, x-gateway-attempts, retry-after"
)
READY_TIMEOUT_S = 3.0  # /readyz answers within this even when a check hangs (a stalled database)
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

_NO_SHADOW = NO_SHADOW_HEADER.encode()  # ASGI header names are lowercase bytes


@dataclass
class ChatReply:
    """A non-streamed answer: a ``chat.completion`` body and the ``x-gateway-*`` headers."""

    body: dict | bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class ChatStreamReply:
    """A streamed answer: SSE event bytes, forwarded as they come."""

    events: AsyncIterator[bytes]
    headers: Mapping[str, str] = field(default_factory=dict)


ChatHandler = Callable[[wire.ChatRequest, Any], Awaitable[Any]]
# sync or async: (token) or (token, client=address) -> a key record or None
Authenticate = Callable[..., Any]
ReadyCheck = Callable[[], Any]  # sync or async; returns {check name: bool}


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class _Disconnected(Exception):
    pass


class GatewayApp:
    """The ASGI callable. ``models`` is what ``GET /v1/models`` lists and what ``model`` may name
    (besides ``auto``); ``authenticate=None`` turns auth off (tests, a trusted sidecar)."""

    def __init__(
        self,
        *,
        chat_handler: ChatHandler,
        models: Sequence[str],
        authenticate: Authenticate | None,
        ready: ReadyCheck | None = None,
        metrics: GatewayMetrics | None = None,
        max_body_bytes: int = wire.DEFAULT_MAX_BODY_BYTES,
        created: int | None = None,
        on_shutdown: Callable[[], Awaitable[None]] | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        cors_origins: Sequence[str] = (),
        cors_max_age_s: int = 600,
        forward_headers: bool = False,
        on_refused: Callable[[str, str | None, Any, wire.WireError], None] | None = None,
        max_in_flight: int = 0,
    ):
        self.chat_handler = chat_handler
        self.models = list(models)
        self.authenticate = authenticate
        # An authenticator taking a second argument gets the client's address (failed-key throttle).
        self._auth_per_client = _takes_client(authenticate)
        self.ready = ready
        self.metrics = metrics if metrics is not None else GatewayMetrics(models=models)
        self.max_body_bytes = max_body_bytes
        self.created = int(time.time()) if created is None else created
        self.on_shutdown = on_shutdown  # awaited at the lifespan shutdown, after the last request
        self.ready_timeout_s = ready_timeout_s  # a check that does not answer by then is "not ready"
        self.cors_origins = frozenset(cors_origins)  # browser origins allowed (CORS); none by default
        self.cors_max_age_s = cors_max_age_s
        self.forward_headers = forward_headers  # hand the caller's headers to the handler (allow-lists)
        self.on_refused = on_refused  # logs a request refused by its key before the handler runs
        self.max_in_flight = max_in_flight  # routed requests at once in this process (0: no bound)
        self._in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        rid = _request_id(scope)
        base_headers = [(b"x-request-id", rid.encode())]
        method, path = scope["method"], scope["path"]
        origin = _header(scope, b"origin") if self.cors_origins else None
        if origin is not None and origin in self.cors_origins:
            base_headers += self._cors_headers(origin)
            if method == "OPTIONS":  # a CORS preflight
                await self._preflight(scope, send, base_headers)
                return
        try:
            api = API_ROUTES.get(path)
            if api is not None:
                if method != "POST":
                    raise wire.method_not_allowed(method, path)
                await self._chat(scope, receive, send, rid, base_headers, api)
            elif path == "/healthz":
                await _send_json(send, 200, {"status": "ok"}, base_headers)
            elif path == "/readyz":
                await self._readyz(send, base_headers)
            elif path == "/metrics":
                await _send(send, 200, self.metrics.exposition(), METRICS_CONTENT_TYPE, base_headers)
            elif path in ("/v1/models", "/models"):
                if method != "GET":
                    raise wire.method_not_allowed(method, path)
                key = await self._auth(scope)
                await _send_json(send, 200, self._models_body(key), base_headers)
            elif path.startswith("/v1/models/"):
                if method != "GET":
                    raise wire.method_not_allowed(method, path)
                key = await self._auth(scope)
                await _send_json(send, 200, self._model_body(key, path[len("/v1/models/") :]), base_headers)
            else:
                raise wire.route_not_found(method, path)
        except wire.WireError as err:
            await _send_error(send, err, base_headers)
        except _Disconnected:
            pass
        except Exception as exc:  # noqa: BLE001 - never uvicorn's plain-text 500 (or a traceback) to a client
            log.error("request failed: %s (request %s)", type(exc).__name__, rid)
            await _send_error(
                send, wire.WireError(500, f"Internal error in the gateway (request id {rid})."), base_headers
            )

    # ------------------------------------------------------------------------------------ endpoints

    async def _chat(self, scope: Scope, receive: Receive, send: Send, rid: str, base: list, api: str = "chat") -> None:
        try:
            key = await self._auth(scope)
        except wire.WireError as err:
            self._refused(api, None, None, err)
            raise
        content_type = _header(scope, b"content-type")
        if not wire.is_json_content_type(content_type):  # as OpenAI: a form post is not JSON
            raise wire.unsupported_content_type(content_type)
        raw = await self._read_body(scope, receive)
        body = wire.parse_json_body(raw, max_body_bytes=self.max_body_bytes)
        req = wire.validate_api_request(api, body)
        headers = scope.get("headers", ())
        # The handler reads the caller's headers for the forward allow-lists, and for the mark that
        # a request is never to be copied to a shadow candidate, which any caller may send.
        if self.forward_headers or any(k == _NO_SHADOW for k, _ in headers):
            req = replace(req, headers=tuple(headers))
        if req.model != "auto" and req.model not in self.models:
            raise wire.model_not_found(req.model)
        if key is not None and req.model != "auto" and not key.allows_model(req.model):
            self.metrics.observe_key_denial("model_not_allowed")
            denied = wire.model_not_allowed(req.model)
            self._refused(api, req.model, key, denied)
            raise denied

        if self.max_in_flight and self._in_flight >= self.max_in_flight:
            # Admission before saturation: past the bound, a clear 503 now beats every request
            # slowing down; counted as the gateway's overload, never as an upstream's failure.
            self.metrics.overloads.inc()
            busy = wire.overloaded(self.max_in_flight)
            self._refused(api, req.model, key, busy)
            raise busy
        self._in_flight += 1
        self.metrics.in_flight.inc()
        try:
            await self._run_chat(req, key, receive, send, rid, base)
        finally:
            self._in_flight -= 1
            self.metrics.in_flight.dec()

    async def _run_chat(
        self, req: wire.ChatRequest, key: Any, receive: Receive, send: Send, rid: str, base: list
    ) -> None:
        started = False  # once the response has started, errors go into the stream
        finished = False  # the last body message was sent: a disconnect now is the normal end

        async def tracked_send(message: dict) -> None:
            nonlocal finished
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True

        async def respond() -> None:
            nonlocal started, finished
            try:
                result = await self.chat_handler(req, key)
            except wire.WireError:
                raise
            except Exception as exc:  # noqa: BLE001 - a handler bug must reach the client as a 500, never a traceback
                log.error("chat handler failed: %s (request %s)", type(exc).__name__, rid)
                raise wire.WireError(500, f"Internal error in the gateway (request id {rid}).") from None
            if isinstance(result, ChatStreamReply) or hasattr(result, "__aiter__"):
                stream = result if isinstance(result, ChatStreamReply) else ChatStreamReply(result)
                headers = base + _extra_headers(stream.headers) + [(b"cache-control", b"no-cache")]
                headers.append((b"x-accel-buffering", b"no"))
                await tracked_send(
                    {"type": "http.response.start", "status": 200, "headers": _ct(wire.SSE_CONTENT_TYPE, headers)}
                )
                started = True
                await _pump(stream.events, send, rid)  # the body's messages, without a wrapper each
                finished = True  # its last message went out
                return
            if isinstance(result, ChatReply):
                body, extra = result.body, result.headers
            else:
                body, extra = result, {}
            payload = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
            started = True
            await _send(tracked_send, 200, payload, wire.JSON_CONTENT_TYPE, base + _extra_headers(extra))

        # A watcher task reads the receive channel; on http.disconnect it cancels this task, which
        # cancels the handler and the upstream call inside it. (Plain asyncio rather than an anyio
        # task group: uvicorn runs on asyncio, and the task group cost 3x the rest of the request.)
        task = asyncio.current_task()
        assert task is not None
        disconnected = False

        async def watch() -> None:
            nonlocal disconnected
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not finished:
                        disconnected = True
                        task.cancel()
                    return

        watcher = asyncio.create_task(watch())
        try:
            await respond()
        except wire.WireError as err:
            if started:
                await tracked_send({"type": "http.response.body", "body": err.to_sse(), "more_body": False})
            else:
                await _send_error(tracked_send, err, base)
        except asyncio.CancelledError:
            if not disconnected:
                raise
            task.uncancel()  # our own cancellation, done: nobody is left to answer
            log.info("client disconnected; request %s cancelled", rid)
        finally:
            watcher.cancel()

    async def _readyz(self, send: Send, base: list) -> None:
        checks: dict[str, bool] = {}
        if self.ready is not None:
            try:
                with anyio.fail_after(self.ready_timeout_s):
                    checks = {k: bool(v) for k, v in dict(await _maybe_await(self.ready())).items()}
            except TimeoutError:
                checks = {"ready_check": False}
                log.warning("readiness check did not answer within %.1f s", self.ready_timeout_s)
            except Exception as exc:  # noqa: BLE001 - a failing check is "not ready", not a 500
                checks = {"ready_check": False}
                log.warning("readiness check raised %s", type(exc).__name__)
        ok = all(checks.values())
        await _send_json(send, 200 if ok else 503, {"status": "ok" if ok else "unavailable", "checks": checks}, base)

    def _refused(self, api: str, model: str | None, key: Any, err: wire.WireError) -> None:
        if self.on_refused is None:
            return
        try:
            self.on_refused(api, model, key, err)
        except Exception as exc:  # noqa: BLE001 - the refusal is answered whatever the log does
            log.warning("could not log a refusal: %s", type(exc).__name__)

    def _model_names(self, key: Any) -> list[str]:
        if key is not None and tuple(getattr(key, "models", ())):
            return ["auto", *[m for m in self.models if key.allows_model(m)]]
        return ["auto", *self.models]

    def _models_body(self, key: Any) -> dict:
        data = [self._model_object(m) for m in self._model_names(key)]
        return {"object": "list", "data": data}

    def _model_object(self, name: str) -> dict:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "gateway"}

    def _model_body(self, key: Any, name: str) -> dict:
        """``GET /v1/models/{id}``: the model object, or 404 for a model this key cannot use."""
        name = unquote(name)
        if name not in self._model_names(key):
            raise wire.model_not_found(name[: wire.MAX_MODEL_LEN])
        return self._model_object(name)

    def _cors_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        return [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"vary", b"Origin"),
            (b"access-control-expose-headers", CORS_EXPOSED),
        ]

    async def _preflight(self, scope: Scope, send: Send, headers: list) -> None:
        """A CORS preflight from an allowed origin: 204 with what the browser asked for (methods
        GET and POST; the headers it names, within a sane length)."""
        asked = _header(scope, b"access-control-request-headers") or "authorization, content-type"
        out = [
            *headers,
            (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
            (b"access-control-allow-headers", asked[:1024].encode("latin-1")),
            (b"access-control-max-age", str(self.cors_max_age_s).encode()),
            (b"content-length", b"0"),
        ]
        await send({"type": "http.response.start", "status": 204, "headers": out})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # ------------------------------------------------------------------------------------ helpers

    async def _auth(self, scope: Scope) -> Any:
        if self.authenticate is None:
            return None
        token = _bearer(scope)
        try:
            if not token:
                key = None
            elif self._auth_per_client:
                key = await _maybe_await(self.authenticate(token, _client_address(scope)))
            else:
                key = await _maybe_await(self.authenticate(token))
        except wire.WireError as err:
            if err.code == wire.STORE_UNAVAILABLE:
                self.metrics.observe_key_denial("store_unavailable")
            elif err.code == "failed_keys_throttled":  # app.server.auth.THROTTLED
                self.metrics.observe_key_denial(err.code)
            raise
        if key is None:
            self.metrics.observe_key_denial("unauthorized")
            raise wire.unauthorized()
        return key

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise wire.body_too_large(self.max_body_bytes)  # refused before reading a byte of it
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise wire.body_too_large(self.max_body_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.on_shutdown is not None:
                    try:
                        await self.on_shutdown()
                    except Exception as exc:  # noqa: BLE001 - shutdown goes on; the log flush follows
                        log.warning("shutdown hook failed: %s", type(exc).__name__)
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _pump(events: AsyncIterator[bytes], send: Send, rid: str) -> None:
    try:
        async for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
    except wire.WireError:
        raise
    except Exception as exc:  # noqa: BLE001 - becomes an error event in the stream
        log.error("stream failed: %s (request %s)", type(exc).__name__, rid)
        raise wire.upstream_failed(f"The stream failed mid-way (request id {rid}).") from None
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v.decode("latin-1")
    return None


def _client_address(scope: Scope) -> str | None:
    client = scope.get("client")
    return str(client[0]) if client else None


def _takes_client(fn: Any) -> bool:
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "client" in params


def _bearer(scope: Scope) -> str | None:
    value = _header(scope, b"authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


# The server's own request ids (when the caller sends none): a source per process, renewed in a
# forked worker of ``serve --workers N`` so no two workers share a prefix.
_new_request_id = IdSource()
os.register_at_fork(after_in_child=_new_request_id.reset)


def _request_id(scope: Scope) -> str:
    given = _header(scope, b"x-request-id")
    return given if given and _REQUEST_ID_RE.match(given) else _new_request_id()


def _extra_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in headers.items()]


def _ct(content_type: str, headers: list) -> list:
    return [(b"content-type", content_type.encode()), *headers]


async def _send(send: Send, status: int, body: bytes, content_type: str, headers: list) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": _ct(content_type, [*headers, (b"content-length", str(len(body)).encode())]),
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_json(send: Send, status: int, obj: Any, headers: list) -> None:
    await _send(send, status, json.dumps(obj, separators=(",", ":")).encode(), wire.JSON_CONTENT_TYPE, headers)


async def _send_error(send: Send, err: wire.WireError, headers: list) -> None:
    await _send(send, err.status, err.to_json(), wire.JSON_CONTENT_TYPE, headers + _extra_headers(err.headers))
