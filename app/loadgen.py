"""Load generator: a deterministic mix of coding, long-context and general prompts at a target rate,
sent through the same RoutingClient as every other request and tagged ``source="loadgen"``.

Requests are scheduled open-loop (request ``i`` starts at ``i / rps`` seconds) on a thread pool, so a
slow upstream shows up as latency rather than as a lower request rate. Prompts belong to a pool of
sessions whose conversations grow turn by turn, so sticky routing and prefix-cache hits show up in
the charts the way they do in production.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> LoadgenReport:
    """Send ``rps * duration_s`` requests at ``rps``; ``progress(done, planned)`` after each one."""
    if not rps > 0:
        raise ValueError("--rps must be greater than 0")
    if not duration_s > 0:
        raise ValueError("--duration must be greater than 0")
    planned = max(1, round(rps * duration_s))
    report = LoadgenReport(planned=planned)
    lock = threading.Lock()
    prompts = prompt_stream(seed)

    def one(sid: str, messages: list[dict]) -> None:
        try:
            r = client.chat(messages, model="auto", session_id=sid, source=SOURCE)
            with lock:
                report.ok += 1
                report.fallbacks += r.fallback_used
                report.cost_usd += r.cost_usd
                report.by_provider[r.provider] += 1
                report.by_intent[r.intent] += 1
        except AllRoutesFailed as exc:
            with lock:
                report.failed += 1
                cause = exc.attempts[-1].error_class if exc.attempts else None
                report.errors[cause or "error"] += 1
        finally:
            with lock:
                report.sent += 1
                done = report.sent
            if progress is not None:
                progress(done, planned)

    start = clock()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="loadgen") as pool:
        for i in range(planned):
            if stop is not None and stop.is_set():
                report.planned = i
                break
            wait = start + i / rps - clock()
            if wait > 0:
                sleep(wait)
            sid, messages = next(prompts)
            pool.submit(one, sid, messages)
    report.elapsed_s = clock() - start
    return report
