"""Load generator: a deterministic mix of coding, long-context and general prompts at a target rate,
sent through the same RoutingClient as every other request and tagged ``source="loadgen"``.

Requests are scheduled open-loop (request ``i`` starts at ``i / rps`` seconds) on a thread pool, so a
slow upstream shows up as latency rather than as a lower request rate. Prompts belong to a pool of
sessions whose conversations grow turn by turn, so sticky routing and prefix-cache hits show up in
the charts the way they do in production.

A stop event (set by SIGTERM/SIGINT in the CLI, or the dashboard's Stop button) ends the schedule:
no new request starts, the ones in flight get ``drain_s`` to finish, and the report covers what was
done so far (``unfinished`` counts requests still running when the report was taken).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field

from app.routing import AllRoutesFailed, RoutingClient

SOURCE = "loadgen"

CODING = [
    "Write a python function that merges two sorted lists.",
    "Debug this code: for i in range(10) print(i)",
    "Explain the algorithm behind Dijkstra's shortest path.",
    "파이썬으로 피보나치 함수를 작성해 주세요.",
    "이 코드의 시간 복잡도를 계산해 주세요.",
    "Solve this math problem: integrate x^2 from 0 to 3.",
]
GENERAL = [
    "Summarise the benefits of a canary rollout in two sentences.",
    "What is a good name for a coffee shop near a library?",
    "Translate 'good morning' into French and Korean.",
    "Give me three tips for writing a clear incident report.",
    "오늘 회의 내용을 간단히 요약해 주세요.",
]
LONG_FILLER = (
    "The quarterly operations review covered latency, cost, capacity and incident history "
    "across every region in considerable detail. "
)


@dataclass
class LoadgenReport:
    planned: int
    sent: int = 0
    ok: int = 0
    failed: int = 0
    fallbacks: int = 0
    cost_usd: float = 0.0
    elapsed_s: float = 0.0
    unfinished: int = 0  # started but not answered when the report was taken (after a stop)
    interrupted: str | None = None  # the signal that stopped the run (set by the CLI)
    by_provider: Counter[str] = field(default_factory=Counter)
    by_intent: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict:
        return {
            "planned": self.planned,
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "fallbacks": self.fallbacks,
            "cost_usd": round(self.cost_usd, 6),
            "elapsed_s": round(self.elapsed_s, 3),
            "unfinished": self.unfinished,
            "interrupted": self.interrupted,
            "by_provider": dict(self.by_provider),
            "by_intent": dict(self.by_intent),
            "errors": dict(self.errors),
        }


def prompt_stream(
    seed: int | None, sessions: int = 24, long_share: float = 0.05, coding_share: float = 0.35
) -> Iterator[tuple[str, list[dict]]]:
    """Endless (session id, messages) pairs; the same seed gives the same sequence."""
    rng = random.Random(seed)
    tag = f"{seed if seed is not None else rng.randrange(10**6)}"
    histories: dict[str, list[dict]] = {}
    while True:
        sid = f"loadgen-{tag}-{rng.randrange(sessions)}"
        history = histories.setdefault(sid, [])
        draw = rng.random()
        if draw < long_share:
            text = LONG_FILLER * rng.randint(330, 420) + "\nList the three main risks."
            history = histories[sid] = []  # a long document starts a fresh conversation
        elif draw < long_share + coding_share:
            text = rng.choice(CODING)
        else:
            text = rng.choice(GENERAL)
        history.append({"role": "user", "content": text})
        yield sid, list(history)
        # Keep conversations short so prompts stay realistic; the reply is stood in by a marker.
        history.append({"role": "assistant", "content": "(previous answer)"})
        if len(history) > 8:
            histories[sid] = []


def run_loadgen(
    client: RoutingClient,
    *,
    rps: float,
    duration_s: float,
    seed: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int = 16,
    stop: threading.Event | None = None,
    drain_s: float | None = None,
    sleep: Callable[[float], object] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> LoadgenReport:
    """Send ``rps * duration_s`` requests at ``rps``; ``progress(done, planned)`` after each one.

    When ``stop`` is set the schedule ends at once (the wait for the next slot is the stop event's
    own wait, so a low rate does not delay it); requests in flight then get ``drain_s`` seconds
    (``None``: as long as they take) before the report is returned without them. ``sleep`` replaces
    the wait between slots (tests with a fake clock).
    """
    if not rps > 0:
        raise ValueError("--rps must be greater than 0")
    if not duration_s > 0:
        raise ValueError("--duration must be greater than 0")
    planned = max(1, round(rps * duration_s))
    report = LoadgenReport(planned=planned)
    lock = threading.Lock()
    prompts = prompt_stream(seed)

    pause: Callable[[float], object] = sleep or (stop or threading.Event()).wait  # wakes at once on stop
    taken = threading.Event()  # the report went out: late answers no longer change it

    def one(sid: str, messages: list[dict]) -> None:
        # The request's records reach the log before chat() returns or raises, so every request
        # counted here as ok or failed is in the log once the gateway is closed.
        try:
            r = client.chat(messages, model="auto", session_id=sid, source=SOURCE)
        except AllRoutesFailed as exc:
            with lock:
                if taken.is_set():
                    return
                report.failed += 1
                cause = exc.attempts[-1].error_class if exc.attempts else None
                report.errors[cause or "error"] += 1
                report.sent += 1
                done = report.sent
        except Exception as exc:  # noqa: BLE001 - counted and named in the report, never a silent loss
            with lock:
                if taken.is_set():
                    return
                report.failed += 1
                report.errors[type(exc).__name__] += 1
                report.sent += 1
                done = report.sent
        else:
            with lock:
                if taken.is_set():
                    return
                report.ok += 1
                report.fallbacks += r.fallback_used
                report.cost_usd += r.cost_usd
                report.by_provider[r.provider] += 1
                report.by_intent[r.intent] += 1
                report.sent += 1
                done = report.sent
        if progress is not None:
            progress(done, planned)

    start = clock()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="loadgen")
    in_flight: set[Future[None]] = set()  # only the running ones: a week-long run keeps no history
    try:
        for i in range(planned):
            if stop is not None and stop.is_set():
                report.planned = i
                break
            wait = start + i / rps - clock()
            if wait > 0:
                pause(wait)
                if stop is not None and stop.is_set():
                    report.planned = i
                    break
            sid, messages = next(prompts)
            future = pool.submit(one, sid, messages)
            with lock:
                in_flight.add(future)
            future.add_done_callback(lambda f: _discard(lock, in_flight, f))
    finally:
        stopped = stop is not None and stop.is_set()
        with lock:
            pending = set(in_flight)
        _, running = wait_futures(pending, timeout=drain_s if stopped else None)
        # Requests still running after the drain are left to their worker threads; the gateway's
        # close() refuses their records (they were never answered), so the report leaves them out.
        pool.shutdown(wait=not running, cancel_futures=True)
        with lock:
            taken.set()
            report.unfinished = len(running)
            report.elapsed_s = clock() - start
    return report


def _discard(lock: threading.Lock, futures: set[Future[None]], future: Future[None]) -> None:
    with lock:
        futures.discard(future)
