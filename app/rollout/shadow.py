"""A rollout's shadow phase: a share of the baseline's requests mirrored to the candidate, off the
request path, the candidate's answers logged apart and discarded.

Every process that routes runs a :class:`Shadower`. It learns from the database, every
``refresh_s``, which rollouts are in their shadow phase (each one's share, budget and what its
mirrors cost so far): the global canary's, whose baseline is the fallback side, and any route's,
whose baseline is the route's own deployments and whose candidate is its canary deployment. The
routing core calls :meth:`Shadower.offer` with each request's plan as it is planned: for a request
on a shadowed baseline it draws the share and, when drawn, puts a copy on a bounded queue and
returns. A request whose caller sent ``x-gateway-no-shadow``
(:data:`app.routing.core.NO_SHADOW_HEADER`) is never copied. Nothing on the request path waits for a mirror: the
draw and a ``put_nowait`` are all it costs; a full queue drops the copy (counted).

``concurrency`` worker threads send the copies to the candidate (the routing policy forced to the
primary side, or to the route's canary deployment, with no fallback; streamed when the request it
copies was, so its first token and chunk gaps compare; its own breakers, so a mirror never moves
the real traffic's) and write one ``shadow_log`` row per copy:
the baseline request it copies, the candidate's status, latency, tokens, cost and answer-quality
fields. ``shadow_log`` is apart from ``request_log``: no figure of real traffic (rollups, spend,
the Monitor) counts a mirror.

The budget: a copy is only queued while the spend so far (``shadow_log``'s cost, read each refresh,
plus what this process's mirrors cost since) is under the rollout's budget. Processes share the
budget through the database, so the overshoot is bounded by what the copies in flight (at most
``concurrency`` per process plus the queue) and those answered within one refresh cost.

The controller (:mod:`app.rollout.driver`) judges the pairs (the candidate's answer and the
baseline's own, :func:`app.monitor.canary_analysis.analyse_shadow`) like a step, and moves the
rollout to its first step when they pass; mirroring stops when the phase ends.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from app.config import Settings
from app.refresh import Periodic
from app.routing.options import RouteOptions
from core.records import AttemptRecord
from core.rollout import RUNNING
from db import rollouts, shadow
from db.canary import GLOBAL

log = logging.getLogger(__name__)
REFRESH_S = 1.0
CONCURRENCY = 2
QUEUE = 32
SOURCE = "shadow"
MIRRORED_APIS = frozenset({"chat", "responses", "completions"})
#: Body fields a mirror leaves out: whether it streams is the routing option's, as for the request it copies.
NOT_MIRRORED = frozenset({"stream", "stream_options"})


@dataclass(frozen=True)
class Phase:
    """A shadow phase in force: which rollout, the route it shadows (None: the global canary), the
    share of baseline requests to mirror, the budget and its spend as last read."""

    rollout_id: int
    route: str | None
    share: float
    budget_usd: float
    spent_usd: float


class _Sink:
    """The mirror client's telemetry: the records of each copy in flight, by the token the copy's
    requests carry as their key name (the routing client may log them from another thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, list[AttemptRecord]] = {}

    def begin(self, token: str) -> None:
        with self._lock:
            self._records[token] = []

    def take(self, token: str) -> list[AttemptRecord]:
        with self._lock:
            return self._records.pop(token, [])

    def submit_many(self, records: Sequence[AttemptRecord]) -> None:
        with self._lock:
            for r in records:
                kept = self._records.get(r.key_name or "")
                if kept is not None:
                    kept.append(r)

    def flush(self) -> None:
        return None


class _NoRatio:
    value = 0.0

    def age_s(self) -> float:
        return 0.0


class Shadower:
    """Mirrors a rollout's baseline requests to its candidate during its shadow phase (the global
    canary's, and each route's).
    ``make_client``: the routing client class the gateway is built with (its blocking one,
    :class:`app.routing.io.client.RoutingClient`), called with that class's keyword arguments."""

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        *,
        make_client: Callable[..., Any],
        transports: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        concurrency: int = CONCURRENCY,
        queue_size: int = QUEUE,
        refresh_s: float = REFRESH_S,
        rng: random.Random | None = None,
        stop: threading.Event | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self._routes = frozenset(name for name, r in settings.routes.items() if r.canary is not None)
        self._sink = _Sink()
        # The gateway's own (blocking) routing client class, built anew with its own breakers and
        # this sink: a mirror never moves the real traffic's breakers or log.
        self.client = make_client(
            settings, telemetry=self._sink, ratio=_NoRatio(), transports=transports, rng=random.Random(),
            source=SOURCE, env=env, secrets=secrets,
        )  # fmt: skip
        self._rng = rng or random.Random()
        self._wall = wall_clock
        self._stop = stop or threading.Event()
        self._queue: queue.Queue[tuple[int, str, dict, str, str, bool]] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        # Read without a lock on the request path: one attribute, replaced whole on each refresh.
        self.phases: dict[str | None, Phase] = {}
        self._spent_here: dict[int, float] = {}  # per rollout: this process's mirrors' cost since the last refresh
        self.sent = 0
        self.dropped = 0
        self.failed_writes = 0
        self.timer = Periodic(self.refresh, refresh_s, name="shadow-refresh", stop=self._stop)
        self._workers = [
            threading.Thread(target=self._work, name=f"shadow-{i}", daemon=True) for i in range(max(1, concurrency))
        ]

    # -- the request path ------------------------------------------------------------------------
    @property
    def phase(self) -> Phase | None:
        """The global canary's shadow phase, if one is in force."""
        return self.phases.get(None)

    def offer(self, plan: Any) -> None:
        """Called with each planned request; queues a copy when it is drawn (never waits). The
        baseline is the fallback side for the global canary, a route's own deployments (not its
        canary) for a route's; the copy names the route, so the candidate answers the same model."""
        phases = self.phases
        if not phases or plan.api not in MIRRORED_APIS:
            return
        phase = phases.get(plan.route)
        if phase is None or plan.side != ("fallback" if plan.route is None else "route"):
            return
        if plan.no_shadow or plan.source == SOURCE or self._rng.random() >= phase.share:
            return
        if phase.spent_usd + self._spent_here.get(phase.rollout_id, 0.0) >= phase.budget_usd:
            return
        body = {k: v for k, v in plan.body.items() if k not in NOT_MIRRORED}
        model = plan.requested_model if plan.route is None else plan.route
        try:
            self._queue.put_nowait((phase.rollout_id, plan.api, body, model, plan.request_id, bool(plan.stream)))
        except queue.Full:
            self.dropped += 1

    # -- off the request path ------------------------------------------------------------------
    def refresh(self) -> None:
        """Read which shadow phases run, and the spend of each so far."""
        phases: dict[str | None, Phase] = {}
        for r in rollouts.all_active(self.engine):
            if r.state != RUNNING or not r.shadowing or r.plan.shadow_share is None:
                continue
            route = None if r.scope == GLOBAL else r.plan.route
            if route is not None and route not in self._routes:
                continue  # a route this process's configuration does not have
            _, usd = shadow.spent(self.engine, r.id)
            phases[route] = Phase(r.id, route, float(r.plan.shadow_share), float(r.plan.shadow_budget_usd or 0.0), usd)
        with self._lock:
            self._spent_here = {}
        self.phases = phases

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self._mirror(*job)
            except Exception:  # one copy's failure must not end the worker
                log.exception("shadow: mirroring a request failed")

    def _mirror(self, rollout_id: int, api: str, body: dict, model: str, request_id: str, stream: bool = False) -> None:
        phase = next((p for p in self.phases.values() if p.rollout_id == rollout_id), None)
        if phase is None:
            return  # the phase ended while the copy waited
        token = f"shadow-copy-{request_id}"
        self._sink.begin(token)
        # The global canary's candidate is the primary side; a route's, its canary deployment.
        options = RouteOptions(model=model, route="primary" if phase.route is None else None,
                               canary_only=phase.route is not None, source=SOURCE, cache_hints=False, key_name=token,
                               stream=stream)  # fmt: skip
        try:
            answer = self.client.request(api, body, options)
            if stream:
                for _piece in answer:  # read whole: its records carry the first token and the gaps
                    pass
        except Exception as exc:  # noqa: BLE001 - the candidate's failure is what the log records
            log.debug("shadow: the candidate failed a mirrored request: %s", exc)
        records = self._sink.take(token)
        if not records:
            return
        final = records[-1]
        row = {
            "rollout_id": rollout_id, "request_id": request_id, "ts": records[0].ts, "provider": final.provider,
            "model": final.model, "status": final.status, "error_class": final.error_class,
            "latency_ms": sum(r.latency_ms for r in records), "ttft_ms": final.ttft_ms,
            "completion_tokens": final.completion_tokens, "tool_calls": final.tool_calls,
            "cost_usd": sum(r.cost_usd for r in records), "finish_reason": final.finish_reason,
            "refused": final.refused, "tool_json_bad": final.tool_json_bad, "schema_bad": final.schema_bad,
            "stream": stream, "chunk_gap_ms": final.chunk_gap_ms if stream else None,
        }  # fmt: skip
        try:
            shadow.insert_rows(self.engine, [row])
        except Exception as exc:  # noqa: BLE001 - a lost row costs one sample, never the caller
            self.failed_writes += 1
            log.warning("shadow: could not log a mirrored answer (%s)", exc)
            return
        with self._lock:
            self._spent_here[rollout_id] = self._spent_here.get(rollout_id, 0.0) + float(
                sum(r.cost_usd for r in records)
            )
        self.sent += 1

    def start(self) -> Shadower:
        self.timer.start()
        for t in self._workers:
            t.start()
        return self

    def close(self) -> None:
        self.timer.stop()
        self._stop.set()
        self.phases = {}
        self.client.close_http()
