"""``python -m app serve``: the gateway built through :func:`app.gateway.build_gateway`, its
:class:`ChatHandler` injected into :class:`GatewayApp`, served by uvicorn.

Shutdown: on SIGTERM or Ctrl-C uvicorn stops accepting connections and lets in-flight requests
finish (up to ``graceful_s``); what is still running then is cut and logged ``shutdown`` (not
``cancelled``: nobody stopped reading); then :meth:`Gateway.close` flushes the request log.

Connections are bounded at the edge (:mod:`app.server.edge`): header size and count, a header read
timeout, connections per process, keep-alive; the open-file limit is raised to the hard limit first.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import uvicorn
from sqlalchemy import text

from app.config import ProviderNotConfigured, resolve_api_key
from app.gateway import Gateway, build_gateway
from app.server import edge
from app.server.asgi import GatewayApp
from app.server.auth import KeyAuthenticator
from app.server.defaults import DEFAULT_GRACEFUL_S, DEFAULT_HOST, DEFAULT_PORT
from app.server.handler import DEFAULT_WORKERS, ChatHandler
from app.server.metrics import GatewayMetrics
from core.errors import ConfigurationError
from core.records import AttemptRecord

log = logging.getLogger(__name__)

GRACEFUL_S = DEFAULT_GRACEFUL_S


class PortInUse(ConfigurationError):
    def __init__(self, host: str, port: int):
        super().__init__(
            f"{host}:{port} is already in use. Fix: stop what listens there, or pick another port "
            f"(python -m app serve --port N)"
        )


class ServerMetrics(GatewayMetrics):
    """GatewayMetrics whose gauges read the gateway's live state at each scrape: the canary ratio,
    the request log's queue and journal, and each provider's circuit breaker (a breaker opens and
    closes on requests' threads; reading its snapshot at the scrape is what keeps the gauge true
    without a hook on the hot path)."""

    def __init__(self, gateway: Gateway, **kwargs: Any):
        super().__init__(**kwargs)
        self.gateway = gateway
        self.pools: dict[str, Any] = {}  # the async driver's ProviderPools, by provider

    def exposition(self) -> bytes:
        g = self.gateway
        for name, pool in self.pools.items():
            self.set_pool(name, in_use=pool.in_use, waiting=pool.waiting, limit=pool.limit, exhausted=pool.exhausted)
        self.set_canary_ratio(g.ratio.value)
        self.set_log_depths(queue=_depth(g.telemetry, "pending"), journal=_depth(g.telemetry, "journal_depth"))
        try:
            breakers = g.client.breaker_states()
        except Exception as exc:  # noqa: BLE001 - a gauge must never break the scrape
            log.warning("metrics: breaker states unreadable (%s)", type(exc).__name__)
            breakers = {}
        for provider, snapshot in breakers.items():
            self.set_breaker_state(provider, snapshot.reported_state)
        return super().exposition()


def _depth(writer: Any, name: str) -> int:
    """A writer's depth gauge, property or method (0 when this writer has no such figure)."""
    value = getattr(writer, name, 0)
    try:
        return int(value() if callable(value) else value)
    except Exception:  # noqa: BLE001 - a gauge must never break the scrape
        return 0


class MeteredSink:
    """The gateway's telemetry sink with every record also observed in the metrics: each attempt,
    and each request (its final attempt), exactly as the router logs them."""

    def __init__(self, inner: Any, metrics: GatewayMetrics):
        self.inner = inner
        self.metrics = metrics

    def submit_many(self, records: Iterable[AttemptRecord]) -> None:
        records = list(records)
        for r in records:
            try:
                self.metrics.observe_record(r)
            except Exception as exc:  # noqa: BLE001 - a metrics bug must never lose the log row
                log.warning("metrics: %s", type(exc).__name__)
        self.inner.submit_many(records)

    def flush(self) -> None:
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def served_models(gateway: Gateway) -> list[str]:
    """Every model some provider routes, in configuration order."""
    from app.keys import servable_models

    return servable_models(gateway.settings)


@dataclass
class Server:
    gateway: Gateway
    app: GatewayApp
    handler: ChatHandler


def build_server(gateway: Gateway | None = None, *, workers: int = DEFAULT_WORKERS, worker: int = 0) -> Server:
    gateway = gateway if gateway is not None else build_gateway(source="server", rollout_controller=True)
    models = served_models(gateway)
    metrics = ServerMetrics(gateway, providers=list(gateway.settings.providers), models=models, worker=worker)
    gateway.client.telemetry = MeteredSink(gateway.client.telemetry, metrics)
    handler = ChatHandler(gateway.client, engine=gateway.engine, metrics=metrics, workers=workers)
    metrics.pools = handler.driver.pools

    def check_ready() -> dict[str, bool]:
        checks: dict[str, bool] = {}
        try:
            with gateway.engine.connect() as conn:
                conn.execute(text("select 1"))
            checks["database"] = True
        except Exception:  # noqa: BLE001 - reported as not ready
            checks["database"] = False
        for name, p in gateway.settings.providers.items():
            try:
                resolve_api_key(name, p)
                checks[f"provider:{name}"] = True
            except ProviderNotConfigured:
                checks[f"provider:{name}"] = False
        return checks

    async def ready() -> dict[str, bool]:
        # abandon_on_cancel: a check stuck on a stalled database does not hold /readyz past its bound.
        return await anyio.to_thread.run_sync(check_ready, abandon_on_cancel=True)

    app = GatewayApp(
        chat_handler=handler,
        models=models,
        authenticate=KeyAuthenticator(gateway.engine),
        ready=ready,
        metrics=metrics,
        on_shutdown=handler.aclose,  # the async driver's upstream connections
        cors_origins=gateway.settings.server.cors_origins,
        cors_max_age_s=gateway.settings.server.cors_max_age_s,
        forward_headers=any(p.forward_headers for p in gateway.settings.providers.values()),
        on_refused=handler.log_refusal,
        max_in_flight=gateway.settings.server.max_in_flight,
    )
    return Server(gateway, app, handler)


def check_port(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """Bind now, so a taken port is one clear error instead of a uvicorn traceback; uvicorn then
    serves on this very socket (no window for another process to take it). ``reuse_port``: one of
    the workers' sockets on a shared port (``SO_REUSEPORT``: the kernel spreads new connections
    evenly over the listening ones)."""
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it every response written in two parts waits 40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise PortInUse(host, port) from None
    if listen:
        sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, graceful_s: int = GRACEFUL_S, workers: int = 1) -> int:
    """Serve until SIGTERM or Ctrl-C; the exit status. With ``workers`` > 1 the port is held here
    and each forked worker process listens on it with a socket of its own (``SO_REUSEPORT``, so the
    kernel balances connections across them; where it is missing, one shared socket, pre-fork as
    gunicorn does), each building its own gateway (upstream pool, telemetry writer, breakers) on
    the one database; SIGTERM or Ctrl-C here drains all of them."""
    shared = workers > 1 and not hasattr(socket, "SO_REUSEPORT")
    # The parent's socket of a reuse-port group is bound but never listens: it holds the port and
    # names a taken port once, and the kernel hands it no connection.
    sock = check_port(host, port, reuse_port=workers > 1 and not shared, listen=workers <= 1 or shared)
    shown = f"[{host}]" if ":" in host else host
    before, after = edge.raise_open_file_limit()  # before the fork: every worker inherits it
    if after != before:
        print(f"open files: soft limit raised from {before:,} to {after:,} (the hard limit)", flush=True)
    if workers <= 1:
        print(f"gateway server on http://{shown}:{port}/v1 (Ctrl-C stops it)", flush=True)
        _serve_on(sock, graceful_s, worker=0)
        return 0
    print(f"gateway server on http://{shown}:{port}/v1, {workers} workers (Ctrl-C stops them)", flush=True)
    own = None if shared else (host, sock.getsockname()[1])
    return _prefork(sock, graceful_s, workers, own_socket=own)


def _prefork(sock: socket.socket, graceful_s: int, workers: int, *, own_socket: tuple[str, int] | None) -> int:
    """Fork the workers (nothing else is built in this process before, so no thread or connection is
    copied), forward SIGTERM/SIGINT to them as SIGTERM (their graceful drain), wait for all."""
    pids: list[int] = []
    for n in range(workers):
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                if own_socket is not None:  # its own listening socket in the port's reuse-port group
                    sock.close()
                    sock = check_port(*own_socket, reuse_port=True)
                _serve_on(sock, graceful_s, worker=n)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                log.exception("gateway worker %d failed", n)
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)

    def forward(signum: int, frame: Any) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        for pid in pids:
            while True:
                try:
                    _, raw = os.waitpid(pid, 0)
                    break
                except InterruptedError:
                    continue
            code = os.waitstatus_to_exitcode(raw)
            if code != 0:
                log.error("gateway worker %d ended with status %d", pid, code)
                status = 1
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        sock.close()
    return status


def _serve_on(sock: socket.socket, graceful_s: int, *, worker: int) -> None:
    server = build_server(worker=worker)
    settings = server.gateway.settings.server
    limits = edge.EdgeLimits.from_config(settings, open_files=resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    if limits.max_connections < settings.max_connections and worker == 0:
        log.warning(
            "at most %d connections per server process (max_connections = %d does not fit in the open-file "
            "limit of %d). Fix: raise the limit (ulimit -n, LimitNOFILE= in systemd)",
            limits.max_connections,
            settings.max_connections,
            resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )
    config = uvicorn.Config(
        server.app,
        http=edge.protocol_class(limits),  # uvicorn's httptools protocol, bounded
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        lifespan="on",  # its shutdown closes the upstream connections
        timeout_graceful_shutdown=graceful_s,
        server_header=False,
        date_header=False,
    )
    _tune_gc()
    userver = _Server(config, on_cut=server.handler.client.core.begin_shutdown)
    # uvicorn handles SIGTERM itself (graceful shutdown), then re-raises it with the handler it found
    # installed. This one turns it into a normal exit, so the finally below flushes the log (the
    # default handler would kill the process first).
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        userver.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.gateway.close()  # flushes the request log after the in-flight requests finished
        sock.close()
        log.info("gateway server stopped; request log flushed")


GC_GEN0 = 20_000  # allocations between young collections (CPython's default: 700 until 3.12)


def _tune_gc() -> None:
    """Once the process is built: everything alive now (modules, config, the catalog, pools) is
    moved out of the collector's sight (``gc.freeze``), and young collections run every
    ``GC_GEN0`` allocations instead of 700. With 256 requests in flight each of CPython's frequent
    collections walked every live request's objects: server CPU per request grew 30 % from 16 to
    256 connections. Cycles are still collected, just in larger, rarer batches."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0, gen1, gen2)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


class _Server(uvicorn.Server):
    """uvicorn's server, telling the gateway the moment its grace period ran out: uvicorn then
    cancels the requests still running, and the attempts cut that way are logged ``shutdown``."""

    def __init__(self, config: Any, *, on_cut: Any):
        super().__init__(config)
        self.on_cut = on_cut

    async def _wait_tasks_to_complete(self) -> None:
        # uvicorn awaits this under wait_for(timeout_graceful_shutdown): the cancellation that ends
        # it is the grace period running out, just before uvicorn cancels the request tasks.
        try:
            await super()._wait_tasks_to_complete()
        except asyncio.CancelledError:
            self.on_cut()
            raise
