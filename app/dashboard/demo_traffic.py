"""Demo traffic for an empty install: the load generator in a background thread, with its progress
readable from any rerun of the page (one job per database per process)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from app.loadgen import LoadgenReport, run_loadgen
from app.routing import RoutingClient

DEMO_RPS = 8.0
DEMO_DURATION_S = 15.0
DEMO_REQUESTS = int(DEMO_RPS * DEMO_DURATION_S)  # what the overview offers to generate
DEMO_SEED = 42


@dataclass
class DemoTrafficJob:
    client: RoutingClient
    rps: float = DEMO_RPS
    duration_s: float = DEMO_DURATION_S
    seed: int | None = DEMO_SEED
    done: int = 0
    planned: int = 0
    report: LoadgenReport | None = None
    error: str | None = None
    started_at: float = 0.0
    _thread: threading.Thread | None = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    def start(self) -> DemoTrafficJob:
        self.planned = max(1, round(self.rps * self.duration_s))
        self.started_at = time.time()
        self._thread = threading.Thread(target=self._run, name="demo-traffic", daemon=True)
        self._thread.start()
        return self

    def _progress(self, done: int, planned: int) -> None:
        self.done, self.planned = done, planned

    def _run(self) -> None:
        try:
            self.report = run_loadgen(
                self.client,
                rps=self.rps,
                duration_s=self.duration_s,
                seed=self.seed,
                progress=self._progress,
                stop=self._stop,
            )
            self.client.flush()  # the overview reads the log right after; do not leave rows queued
        except Exception as exc:  # noqa: BLE001 - shown on the page, never a traceback
            self.error = f"{type(exc).__name__}: {exc}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def finished(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.planned) if self.planned else 0.0

    def label(self) -> str:
        if self.error:
            return f"Demo traffic failed: {self.error}"
        if self.finished and self.report is not None:
            r = self.report
            return f"Demo traffic done: {r.ok} answered, {r.failed} failed, {r.fallbacks} via the fallback."
        return f"Generating demo traffic through the simulated providers: {self.done} / {self.planned} requests"

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.finished


_jobs: dict[str, DemoTrafficJob] = {}
_lock = threading.Lock()


def current_job(key: str) -> DemoTrafficJob | None:
    with _lock:
        return _jobs.get(key)


def start_job(key: str, client: RoutingClient, **kwargs: float) -> DemoTrafficJob:
    """Start demo traffic for ``key`` (the database URL) unless one is already running."""
    with _lock:
        job = _jobs.get(key)
        if job is not None and job.running:
            return job
        job = DemoTrafficJob(client, **kwargs).start()  # type: ignore[arg-type]
        _jobs[key] = job
        return job


def forget_job(key: str) -> None:
    with _lock:
        _jobs.pop(key, None)


def simulated_only(client: RoutingClient) -> bool:
    """Demo traffic is only offered when both routes are simulated: it must not spend real money."""
    s = client.settings
    return s.primary.is_simulated and s.fallback.is_simulated
