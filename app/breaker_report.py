"""This process's circuit breakers and cooling route deployments, reported to the database with a
heartbeat so every reader (the Overview's incident banner and routes table, ``status``) sees those
of the processes that are alive, and only theirs (:mod:`db.breakers`).

:class:`BreakerReporter` reports on its own timer every :data:`db.breakers.HEARTBEAT_S` seconds and
at once (off the request's thread) when a breaker moves or a deployment starts cooling down, and
deletes this process's rows when the gateway closes. A report that fails (the database is away) is
logged once per outage by the timer and retried on the next beat; routing never waits for it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping

from sqlalchemy import Engine

from app.refresh import Periodic
from app.routing.breaker import BreakerSnapshot
from db.breakers import HEARTBEAT_S, ReportedBreaker, beat, forget

log = logging.getLogger(__name__)


class BreakerReporter:
    """Reports ``states()`` (``{provider: BreakerSnapshot}``) and ``cooldowns()`` (``{deployment:
    seconds left}``, on any clock: they are turned into wall times at each report) for one process."""

    def __init__(
        self,
        engine: Engine,
        states: Callable[[], Mapping[str, BreakerSnapshot]],
        *,
        source: str,
        wall_clock: Callable[[], float],
        cooldowns: Callable[[], Mapping[str, float]] = dict,
        interval_s: float = HEARTBEAT_S,
        stop: threading.Event | None = None,
    ) -> None:
        self.engine = engine
        self.process = uuid.uuid4().hex
        self._states = states
        self._cooldowns = cooldowns
        self._source = source
        self._wall = wall_clock
        self._since: dict[str, float] = {}  # provider -> wall time of its newest transition
        self._lock = threading.Lock()  # one report at a time (the timer and a transition's thread)
        self._closed = False
        self.reported = False  # a report reached the database at least once
        self.timer = Periodic(self.report, interval_s, name="breaker-heartbeat", stop=stop)

    def start(self) -> BreakerReporter:
        self.timer.start()
        return self

    def changed(self, provider: str, old: str, new: str, why: str) -> None:
        """The router's breaker hook (on the request's thread, under the breaker's lock): note
        when, and report on a daemon thread."""
        self._since[provider] = self._wall()
        self.now()

    def cooling(self, route: str, why: str) -> None:
        """The router's cooldown hook (on the request's thread): report on a daemon thread."""
        self.now()

    def now(self) -> None:
        threading.Thread(target=self.timer.run_once, name="breaker-heartbeat-now", daemon=True).start()

    def report(self) -> None:
        with self._lock:
            if self._closed:
                return
            snapshots = self._states()
            breakers = {name: ReportedBreaker(s.reported_state, self._since.get(name)) for name, s in snapshots.items()}
            now = self._wall()
            cooling = {d: now + left for d, left in self._cooldowns().items()}
            beat(
                self.engine,
                process=self.process,
                breakers=breakers,
                cooldowns=cooling,
                now=now,
                pid=os.getpid(),
                host=socket.gethostname(),
                source=self._source,
            )
            self.reported = True

    def close(self, wait_s: float = 1.0) -> None:
        """Stop reporting and delete this process's rows, waiting at most ``wait_s`` for the
        database (best effort: rows left behind stop counting once they are
        :data:`db.breakers.LIVE_S` old, so a database that hangs never holds up the exit)."""
        self.timer.stop()
        with self._lock:
            self._closed = True
            if not self.reported:
                return
        t = threading.Thread(target=self._forget, name="breaker-heartbeat-forget", daemon=True)
        t.start()
        t.join(wait_s)

    def _forget(self) -> None:
        try:
            forget(self.engine, self.process)
        except Exception:
            log.warning("could not delete this process's breaker report", exc_info=True)
