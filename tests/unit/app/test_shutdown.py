"""The pieces behind the CLI's signal handling, in-process: the handler's first/second-signal rules,
the bounded gateway close, and the load generator's stop and drain (test_signals.py runs the real
processes)."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field

import pytest

from app import shutdown
from app.loadgen import run_loadgen
from app.routing import AllRoutesFailed
from app.shutdown import Interrupted, StopSignals, close_within, stop_on_signals


def test_first_signal_sets_stop_and_raises_where_the_main_thread_is():
    codes: list[int] = []
    state = StopSignals(stop=threading.Event(), interrupt=True, exit=codes.append)
    with pytest.raises(Interrupted) as info:
        state._handle(signal.SIGTERM, None)
    assert state.stop.is_set() and state.name == "SIGTERM" and state.exit_code == 143
    assert info.value.exit_code == 143 and isinstance(info.value, KeyboardInterrupt)
    assert codes == []


def test_a_signal_during_shutdown_only_notes_itself_and_a_second_one_exits_at_once(capfd):
    codes: list[int] = []
    state = StopSignals(stop=threading.Event(), interrupt=True, exit=codes.append)
    with state.shutting_down():
        state._handle(signal.SIGINT, None)  # no raise: the bounded close must not be cut
        assert state.received == signal.SIGINT and codes == []
        state._handle(signal.SIGINT, None)
    assert codes == [130]
    assert "SIGINT again: exiting without waiting for the log" in capfd.readouterr().err


def test_without_interrupt_a_signal_only_sets_the_stop_event():
    state = StopSignals(stop=threading.Event(), interrupt=False, exit=lambda code: None)
    state._handle(signal.SIGTERM, None)
    assert state.stop.is_set() and state.exit_code == 143


def test_handlers_are_installed_for_the_block_and_restored_after():
    before = {s: signal.getsignal(s) for s in shutdown.STOP_SIGNALS}
    with stop_on_signals(interrupt=True) as state:
        with pytest.raises(Interrupted):
            signal.raise_signal(signal.SIGTERM)
        assert state.received == signal.SIGTERM
    assert {s: signal.getsignal(s) for s in shutdown.STOP_SIGNALS} == before


def test_a_signal_landing_while_the_main_thread_holds_the_stop_events_lock_does_not_deadlock():
    """Python runs a handler between two bytecodes of the main thread, which may be inside
    ``stop.wait()`` with the event's lock held (a plain Lock). A handler that calls ``stop.set()``
    waits for that lock forever, and the process never exits. The lock is held here the way
    ``Event.wait`` holds it; a watchdog releases it after 5 s (any thread may release a plain Lock),
    so such a handler fails this test instead of hanging it."""
    with stop_on_signals(interrupt=False) as state:
        lock = state.stop._cond  # the Condition whose Lock Event.wait holds
        returned, deadlocked = threading.Event(), threading.Event()

        def watchdog() -> None:
            if not returned.wait(5):
                deadlocked.set()
                lock.release()

        lock.acquire()
        threading.Thread(target=watchdog, daemon=True).start()
        signal.raise_signal(signal.SIGTERM)  # the handler runs here, in this (the main) thread
        returned.set()
        if not deadlocked.is_set():
            lock.release()
        assert not deadlocked.is_set(), "the signal handler waited for the stop event's lock"
        assert state.received == signal.SIGTERM
        assert state.stop.wait(5), "the stop event was never set"


def test_the_relay_thread_ends_with_the_block():
    with stop_on_signals(interrupt=False):
        assert any(t.name == "signal-relay" for t in threading.enumerate())
    assert not any(t.name == "signal-relay" for t in threading.enumerate())


def test_outside_the_main_thread_nothing_is_installed():
    before = {s: signal.getsignal(s) for s in shutdown.STOP_SIGNALS}
    seen: list[object] = []

    def run() -> None:
        with stop_on_signals(interrupt=True) as state:
            seen.append({s: signal.getsignal(s) for s in shutdown.STOP_SIGNALS})
            seen.append(state.received)

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert seen == [before, None]


@dataclass
class FakeWriter:
    pending: int = 0
    timeouts: list[float | None] = field(default_factory=list)

    def close(self, timeout: float | None = None) -> None:
        self.timeouts.append(timeout)


@dataclass
class FakeGateway:
    telemetry: object
    release: threading.Event = field(default_factory=threading.Event)
    closed: int = 0

    def close(self) -> None:
        self.release.wait(30)  # a gateway whose flush hangs until released
        self.closed += 1


def test_close_within_returns_once_the_gateway_closed(monkeypatch):
    monkeypatch.setattr(shutdown, "_abandoned", threading.Event())
    writer = FakeWriter()
    gateway = FakeGateway(telemetry=writer)
    gateway.release.set()
    assert close_within(gateway, 5.0) is True
    assert gateway.closed == 1 and not shutdown.abandoned()
    assert writer.timeouts == [4.0]  # a writer that takes a timeout gets most of the bound


def test_close_within_gives_up_at_its_bound_and_says_what_was_not_written(monkeypatch, capsys):
    monkeypatch.setattr(shutdown, "_abandoned", threading.Event())
    gateway = FakeGateway(telemetry=FakeWriter(pending=17))
    try:
        assert close_within(gateway, 0.05) is False
    finally:
        gateway.release.set()
    assert shutdown.abandoned()
    err = capsys.readouterr().err
    assert "did not flush within 0.05 s" in err and "17 records queued not written" in err


# -- the load generator's stop ---------------------------------------------------------------------


@dataclass
class Result:
    provider: str = "p"
    intent: str = "general"
    fallback_used: bool = False
    cost_usd: float = 0.001


class GatedClient:
    """Answers the first ``answer`` requests at once; the rest wait on ``gate``."""

    def __init__(self, answer: int, fail_every: int = 0):
        self.answer = answer
        self.fail_every = fail_every
        self.calls = 0
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.all_started = threading.Event()
        self.started_target = answer + 2

    def chat(self, messages, **kwargs):
        with self.lock:
            self.calls += 1
            n = self.calls
            if n >= self.started_target:
                self.all_started.set()
        if n > self.answer:
            self.gate.wait(30)
        if self.fail_every and n % self.fail_every == 0:
            raise AllRoutesFailed("r", [], "all routes failed")
        return Result()


def test_stop_ends_the_schedule_and_the_report_leaves_out_what_did_not_finish_in_the_drain():
    client = GatedClient(answer=6, fail_every=3)
    stop = threading.Event()
    report_box: list = []
    t = threading.Thread(
        target=lambda: report_box.append(
            run_loadgen(client, rps=1000, duration_s=10, seed=1, stop=stop, drain_s=0.05, workers=4)  # type: ignore[arg-type]
        )
    )
    t.start()
    assert client.all_started.wait(30)  # 6 answered, at least 2 more in flight and held
    stop.set()
    t.join(30)
    client.gate.set()
    assert not t.is_alive()
    report = report_box[0]
    assert report.sent == report.ok + report.failed == 6 and report.failed == 2
    assert report.unfinished >= 2 and report.planned == report.sent + report.unfinished
    assert report.planned < 10_000


def test_without_a_drain_bound_the_stop_waits_for_requests_in_flight():
    client = GatedClient(answer=0)
    stop = threading.Event()
    report_box: list = []
    t = threading.Thread(
        target=lambda: report_box.append(
            run_loadgen(client, rps=1000, duration_s=10, seed=1, stop=stop, workers=2)  # type: ignore[arg-type]
        )
    )
    t.start()
    assert client.all_started.wait(30)
    stop.set()
    client.gate.set()
    t.join(30)
    report = report_box[0]
    assert report.unfinished == 0 and report.ok == report.sent == report.planned >= 2
