"""The rollout controller: runs in every process that routes (``serve``, each of its workers, and
the dashboard) and acts in exactly one.

Every ``interval_s`` each process tries to take or renew the lease (:func:`db.rollouts.acquire_lease`).
The holder reads each running rollout's evidence, asks the pure :func:`app.routing.rollout.decide`
what to do and performs it as one fenced write: a process whose lease lapsed (paused, partitioned,
slow) writes nothing, so a step happens once however many processes and machines run. Everything a
rollout needs to continue (its state, step and the step's start) is in the database: after a
restart the next holder carries on where the last one stopped. The guardrail keeps running under it
as the absolute circuit breaker; a ratio it sets to 0 aborts the rollout at the next tick.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from sqlalchemy import Engine

from app.monitor.canary_analysis import RunningAnalysis
from app.refresh import Periodic
from app.rollout.ops import Notify, read, rollout_event
from app.routing.rollout import Action, decide
from core.rollout import RUNNING
from db import rollouts
from db.canary import StaleCanaryError
from db.rollouts import LeaseLost, StaleRollout

log = logging.getLogger(__name__)
ACTOR = "rollout"
INTERVAL_S = 2.0
LEASE_TTL_S = 10.0
ROWS_PER_TICK = 50_000  # rows one tick reads at most: a long log (a restart mid-rollout) is read over several


def holder_name() -> str:
    """This process, as the lease names it: host, pid and a random part (a pid is reused)."""
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class RolloutDriver:
    """One process's controller; :meth:`tick` is one round (tests call it with their own clock)."""

    def __init__(
        self,
        engine: Engine,
        *,
        notify: Notify,
        on_change: Callable[[], None] = lambda: None,
        holder: str | None = None,
        interval_s: float = INTERVAL_S,
        lease_ttl_s: float = LEASE_TTL_S,
        wall_clock: Callable[[], float] = time.time,
        stop: threading.Event | None = None,
        rows_per_tick: int = ROWS_PER_TICK,
    ) -> None:
        if not lease_ttl_s > interval_s:
            raise ValueError("lease_ttl_s must be longer than interval_s, or the lease lapses between ticks")
        self.engine = engine
        self.notify = notify
        self.on_change = on_change
        self.holder = holder or holder_name()
        self.lease_ttl_s = lease_ttl_s
        self._clock = wall_clock
        self.timer = Periodic(self.tick, interval_s, name="rollout-controller", stop=stop)
        self.actions = 0
        self.rows_per_tick = rows_per_tick
        # Each running rollout's analysis, kept up to date from the rows logged since the last tick
        # (a tick's read is flat in the size of the log); rebuilt when another process acted.
        self._running: dict[tuple[int, float], RunningAnalysis] = {}

    def tick(self) -> list[Action]:
        """Take or renew the lease; when held, decide and act on every running rollout."""
        fence = rollouts.acquire_lease(self.engine, self.holder, ttl_s=self.lease_ttl_s, now=self._clock())
        if fence is None:
            self._running.clear()  # another process acts; rebuilt (caught up) if the lease comes back
            return []
        done: list[Action] = []
        live: set[tuple[int, float]] = set()
        for r in rollouts.all_active(self.engine):
            if r.state != RUNNING:
                continue
            now = self._clock()
            key = (r.id, r.started_at)
            live.add(key)
            running = self._running.get(key)
            if running is None and not r.shadowing:
                running = self._running[key] = RunningAnalysis(
                    self.engine, since=r.started_at, route=r.plan.route, alpha=r.plan.alpha,
                    min_samples=r.plan.min_samples, bake_s=r.plan.bake_s, max_rows=self.rows_per_tick,
                )  # fmt: skip
            reading = read(self.engine, r, now, running)
            action = decide(r, reading.evidence, now)
            if not action.acts:
                continue
            try:
                new = rollouts.apply(
                    self.engine, r, state=action.state, step_index=action.step_index,
                    ratio=None if r.plan.dry_run else action.ratio, actor=ACTOR, reason=action.reason,
                    now=self._clock(), fence=fence, expected_canary_version=reading.canary_version,
                )  # fmt: skip
            except LeaseLost:
                log.info("rollout controller: lease lost mid-round; another process acts now")
                return done
            except (StaleRollout, StaleCanaryError) as exc:
                log.info("rollout #%d changed while deciding (%s); deciding again next round", r.id, exc)
                continue
            self.actions += 1
            done.append(action)
            log.warning("%s", new.last_reason)
            self.notify(rollout_event(action.kind, new, new.last_reason))
        for gone in set(self._running) - live:
            del self._running[gone]
        if done:
            self.on_change()
        return done

    def start(self) -> RolloutDriver:
        self.timer.start()
        return self

    def close(self) -> None:
        """Stop ticking and let the lease go at once, so another process takes over without waiting."""
        self.timer.stop()
        try:
            rollouts.release_lease(self.engine, self.holder)
        except Exception as exc:  # noqa: BLE001 - the lease expires on its own
            log.info("rollout controller: could not release the lease (%s); it expires on its own", exc)
