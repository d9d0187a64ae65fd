"""The gateway's object graph, assembled around a routing client of the caller's choosing.

settings -> engine (migrations, the canary setting row) -> background refresher (canary ratio,
simulated fault settings) -> upstreams and transports (the built-in simulators) -> telemetry writer
(its callback is only the batch insert) -> guardrail on its own timer -> the client (``make_client``).

:func:`assemble` knows the client only by the keyword arguments it is built with, so this module
imports no router: :func:`app.gateway.build_gateway` (the composition root) passes
:class:`~app.routing.io.client.RoutingClient`, and ``RoutingClient.from_config`` passes itself, with
no import circle between the router and the root. ``Gateway.close()`` stops the timers, flushes and
closes the telemetry writer and closes the HTTP clients.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

import httpx2
from sqlalchemy import Engine

from app.alerts import Webhooks, event
from app.breaker_report import BreakerReporter
from app.config import Settings, load_settings
from app.guardrail import CHECK_EVERY_S, guardrail_timer
from app.refresh import Periodic, Refreshed, RefreshedState, Refresher
from app.shutdown import flush_on_sigterm
from app.simulated import SimulatedUpstream, simulated_upstreams
from app.simulator import make_transport
from app.telemetry.location import open_writer
from app.telemetry.writer import TelemetryWriter
from db.events import record_breaker_change_later

log = logging.getLogger(__name__)
RATIO = "canary_ratio"
ROUTE_RATIOS = "route_canary_ratios"


class RoutingClientLike(Protocol):
    """What the gateway needs of its client: to be attached, to close its HTTP clients, and its
    breaker-change hooks."""

    @property
    def on_breaker_change(self) -> Any: ...  # a list of hooks(provider, old, new, why)

    def attach(self, gateway: Any) -> None: ...

    def close_http(self) -> None: ...

    def breaker_states(self) -> Any: ...  # {provider: BreakerSnapshot}

    @property
    def core(self) -> Any: ...  # the routing core (its route canary ratios are wired here)


C = TypeVar("C", bound=RoutingClientLike)


@dataclass(eq=False)
class Gateway(Generic[C]):
    """Everything one process needs to route requests, wired together; close it once."""

    settings: Settings
    engine: Engine
    refresher: Refresher
    ratio: Refreshed[float]
    upstreams: dict[str, SimulatedUpstream]
    transports: dict[str, httpx2.BaseTransport]
    telemetry: TelemetryWriter
    guardrail: Periodic | None
    client: C
    owns_telemetry: bool = True
    breaker_report: BreakerReporter | None = None
    alerts: Webhooks | None = None
    rollouts: Any = None  # the rollout controller (app.rollout.driver.RolloutDriver) when this process runs one
    shadow: Any = None  # the shadow phase's mirror (app.rollout.shadow.Shadower), with the controller
    _closed: bool = field(default=False, repr=False)
    _close_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def refresh(self) -> None:
        """Reload the ratio and fault settings now (a process that has just changed them)."""
        self.refresher.reload_all()

    def snapshot(self) -> dict[str, RefreshedState]:
        """Each refreshed value with its age in seconds (for ``status`` and the dashboard)."""
        return self.refresher.snapshot()

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self.rollouts is not None:
            self.rollouts.close()
        if self.shadow is not None:
            self.shadow.close()
        if self.guardrail is not None:
            self.guardrail.stop()
        if self.breaker_report is not None:
            self.breaker_report.close()
        self.refresher.stop()
        if self.owns_telemetry:
            self.telemetry.close()
        else:
            self.telemetry.flush()
        self.client.close_http()
        if self.alerts is not None:
            self.alerts.close()

    def __enter__(self) -> Gateway[C]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def assemble(
    settings: Settings | None,
    make_client: Callable[..., C],
    *,
    config_path: str | None = None,
    engine: Engine | None = None,
    transports: Mapping[str, httpx2.BaseTransport] | None = None,
    env: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    source: str = "api",
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.perf_counter,
    wall_clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
    stop: threading.Event | None = None,
    telemetry: TelemetryWriter | None = None,
    guardrail: bool = True,
    guardrail_every_s: float = CHECK_EVERY_S,
    rollout_controller: bool = False,
    rollout_every_s: float | None = None,
    alerts: Webhooks | None = None,
) -> Gateway[C]:
    """Build the whole object graph from ``settings`` (default: ``GATEWAY_CONFIG`` and
    ``DATABASE_URL``).

    ``transports`` replaces a provider's network (tests, benchmarks); every other ``sim://``
    provider gets the built-in simulator. ``stop`` ends the background timers when set (tests may
    pass their own); ``monotonic`` is their clock. ``guardrail=False`` leaves the guardrail timer
    out (the simulator process, benchmarks). ``alerts`` replaces the ``[alerts]`` webhooks (tests).
    ``rollout_controller=True`` runs the rollout
    controller here too (the processes that route: ``serve`` and the dashboard); one process of all
    that run it acts, by a lease in the database.
    """
    from db.canary import ensure_setting, read_ratio_version, read_route_ratios
    from db.engine import DbTimeouts, get_engine
    from db.requests import insert_batch

    settings = settings if settings is not None else load_settings(config_path, env=env)
    if engine is None:
        engine = get_engine(settings.database_url, timeouts=DbTimeouts(**settings.database.model_dump()))
    ensure_setting(engine, settings.routing.initial_ratio)

    stop = stop or threading.Event()
    refresher = Refresher(settings.routing.ratio_refresh_s, clock=monotonic, stop=stop)
    ratio = refresher.add(RATIO, lambda: read_ratio_version(engine)[0])
    # Injected transports win; every other sim:// provider is served by the built-in simulator.
    wired = dict(transports or {})
    upstreams = simulated_upstreams(settings, engine, refresher, skip=wired)
    for name, upstream in upstreams.items():
        wired[name] = make_transport(upstream.provider)

    owns_telemetry = telemetry is None
    # The writer journals what the database cannot take yet (queue full, database down) and
    # replays it, including a journal left by a killed process (app.telemetry.location).
    writer = telemetry or open_writer(
        settings.database_url,
        partial(insert_batch, engine),
        journal_dir=settings.telemetry.journal_dir,
        queue_size=settings.telemetry.queue_size,
        batch_size=settings.telemetry.batch_size,
        flush_interval_s=settings.telemetry.flush_interval_s,
    )
    if alerts is None:
        a = settings.alerts
        alerts = Webhooks(a.webhooks, timeout_s=a.timeout_s, attempts=a.attempts)

    def rolled_back() -> None:
        refresher.reload_all()
        from db.canary import audit_log

        last = audit_log(engine, limit=1, scope="global")
        why = last[0].reason if last else "automatic rollback"
        alerts.send(event("guardrail.rollback", f"[global canary] canary rolled back to 0 %: {why}", reason=why))

    timer = None
    if guardrail:
        timer = guardrail_timer(
            engine,
            settings,
            on_rollback=rolled_back,
            interval_s=guardrail_every_s,
            stop=stop,
            wall_clock=wall_clock,
        )
    client = make_client(
        settings,
        telemetry=writer,
        ratio=ratio,
        transports=wired,
        reload=refresher.reload_all,
        sleep=sleep,
        clock=clock,
        wall_clock=wall_clock,
        rng=rng,
        source=source,
        env=env,
        secrets=secrets,
    )
    if any(r.canary is not None for r in settings.routes.values()):
        client.core.route_ratios = refresher.add(ROUTE_RATIOS, lambda: read_route_ratios(engine))
    gateway = Gateway(
        settings=settings,
        engine=engine,
        refresher=refresher,
        ratio=ratio,
        upstreams=upstreams,
        transports=wired,
        telemetry=writer,
        guardrail=timer,
        client=client,
        owns_telemetry=owns_telemetry,
        alerts=alerts,
    )
    client.attach(gateway)

    # Breaker transitions become ops events (markers on the monitor's charts); written off the request
    # thread, since the hook runs on it under the breaker's lock.
    def record_breaker_change(provider: str, old: str, new: str, why: str) -> None:
        record_breaker_change_later(engine, provider, old, new, why)

    client.on_breaker_change.append(record_breaker_change)

    def alert_breaker_open(provider: str, old: str, new: str, why: str) -> None:
        if new == "open":
            alerts.send(event("breaker.open", f"circuit breaker for {provider} opened: {why}", provider=provider,
                              reason=why, source=source))  # fmt: skip

    client.on_breaker_change.append(alert_breaker_open)
    if rollout_controller:
        from app.rollout.driver import INTERVAL_S, LEASE_TTL_S, RolloutDriver

        gateway.rollouts = RolloutDriver(
            engine, notify=alerts.send, on_change=refresher.reload_all, wall_clock=wall_clock, stop=stop,
            interval_s=rollout_every_s or INTERVAL_S, lease_ttl_s=max(LEASE_TTL_S, 5 * (rollout_every_s or INTERVAL_S)),
        )  # fmt: skip
        from app.rollout.shadow import Shadower

        gateway.shadow = Shadower(engine, settings, make_client=make_client, transports=wired, env=env,
                                  secrets=secrets, stop=stop, wall_clock=wall_clock)  # fmt: skip
        client.core.on_plan.append(gateway.shadow.offer)
    # Every process reports its breakers and cooling route deployments with a heartbeat: the
    # banner and the routes table count only live processes.
    reporter = BreakerReporter(
        engine,
        client.breaker_states,
        cooldowns=client.core.cooldowns,
        source=source,
        wall_clock=wall_clock,
        stop=stop,
    )
    gateway.breaker_report = reporter
    client.on_breaker_change.append(reporter.changed)
    client.core.on_cooldown.append(reporter.cooling)
    refresher.start()
    reporter.start()
    if timer is not None:
        timer.start()
    if gateway.rollouts is not None:
        gateway.rollouts.start()
    if gateway.shadow is not None:
        gateway.shadow.start()
    flush_on_sigterm(gateway)  # only where the program left SIGTERM at its default (app.shutdown)
    return gateway
