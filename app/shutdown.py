"""SIGTERM and SIGINT for the long-running commands, and a shutdown that cannot hang.

SIGTERM is what systemd, Docker and Kubernetes send to stop a process; SIGINT is Ctrl-C. Python's
defaults differ (SIGINT raises KeyboardInterrupt, SIGTERM kills the process where it stands, so
queued request-log rows were lost). Inside :func:`stop_on_signals` both mean the same:

- the first signal sets a stop event (a loop such as the load generator's finishes what it has in
  flight and returns), and with ``interrupt=True`` also raises :class:`Interrupted` in the main
  thread, which unwinds a blocking call such as a single chat request;
- while the command is already shutting down (:meth:`StopSignals.shutting_down`), a signal only
  notes itself: the shutdown is bounded anyway and must not be cut half way;
- a second signal means the operator insists: the process exits at once with ``128 + signal``,
  without waiting for the log (what the writer had not written is lost, or kept in its journal).

:func:`close_within` closes a gateway (timers, request-log flush, HTTP clients) within a bound, so a
hung database delays exit by at most :data:`SHUTDOWN_FLUSH_S`: a writer that takes a ``timeout``
journals what it still holds; otherwise what is unwritten is reported on stderr and the process
leaves without waiting (:func:`abandoned` tells the entry point to skip the interpreter's exit
hooks, which would wait for the stuck writer again).

Exit status after a signal is ``128 + signal`` (130 for SIGINT, 143 for SIGTERM), as shells
report it; systemd units want ``SuccessExitStatus=143``.

Programs of their own that use :class:`~app.routing.RoutingClient` (``RoutingClient.from_config()``,
``build_gateway()``) get :func:`flush_on_sigterm`: Python's default SIGTERM ends a process without
running exit hooks, so the request-log rows still queued would be lost.
When a gateway is built in the main thread of a program whose SIGTERM is still the default, a
handler is installed that closes every live gateway (flushing its log, bounded by
:data:`SHUTDOWN_FLUSH_S`) and then chains to the default action, so the process still ends "killed
by SIGTERM" as the supervisor expects. A program that installs its own SIGTERM handler (before or
after) is left alone and calls ``client.close()`` itself.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import select
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

# Docker waits 10 s between SIGTERM and SIGKILL by default: in-flight work gets part of it, the
# request-log flush the rest, and the process is gone before the SIGKILL.
DRAIN_S = 3.0  # in-flight requests (load generator) after a stop signal
SHUTDOWN_FLUSH_S = 5.0  # closing the gateway: flushing the request log
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_abandoned = threading.Event()


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by the first SIGTERM/SIGINT when ``interrupt=True``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@dataclass
class StopSignals:
    """What :func:`stop_on_signals` hands the command: the stop event and the signal received."""

    stop: threading.Event
    interrupt: bool
    received: int | None = None
    exit: Callable[[int], object] = field(default=os._exit, repr=False)  # os._exit runs no Python code
    _closing: bool = field(default=False, repr=False)
    # Set by stop_on_signals: wakes the relay thread that sets ``stop``. A handler must not set the
    # event itself: Python runs it between two bytecodes of the main thread, which may be inside
    # ``stop.wait()`` holding the event's lock (a plain Lock), and ``stop.set()`` then waits for
    # that lock forever: the process never exits.
    _wake: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def name(self) -> str | None:
        return None if self.received is None else signal.Signals(self.received).name

    @property
    def exit_code(self) -> int | None:
        """``128 + signal`` once a signal arrived, else ``None``."""
        return None if self.received is None else 128 + self.received

    @contextmanager
    def shutting_down(self) -> Iterator[None]:
        """From here on a first signal no longer raises (the shutdown is bounded on its own)."""
        self._closing = True
        yield

    def _handle(self, signum: int, _frame: object) -> None:
        if self.received is not None:
            # The operator insists: leave now, without the flush.
            os.write(2, f"{signal.Signals(signum).name} again: exiting without waiting for the log\n".encode())
            self.exit(128 + signum)
            return
        self.received = signum
        if self._wake is None:
            self.stop.set()  # not a handler Python installed: called from plain code (tests, a host program)
        else:
            self._wake()
        if self.interrupt and not self._closing:
            raise Interrupted(signum)


@contextmanager
def stop_on_signals(stop: threading.Event | None = None, *, interrupt: bool = False) -> Iterator[StopSignals]:
    """SIGTERM and SIGINT handled as described in the module docstring while the block runs; the
    previous handlers are restored after it. Python delivers signals to the main thread only: from
    another thread (a command run inside a larger program) nothing is installed and the state stays
    idle."""
    state = StopSignals(stop=stop or threading.Event(), interrupt=interrupt)
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # a handler never blocks: one byte is enough to wake the relay
    relay = threading.Thread(target=_relay, args=(read_fd, state.stop), name="signal-relay", daemon=True)
    relay.start()

    def wake() -> None:
        with contextlib.suppress(BlockingIOError):  # the pipe is full: the relay is already woken
            os.write(write_fd, b"s")

    state._wake = wake
    previous = {s: signal.signal(s, state._handle) for s in STOP_SIGNALS}
    try:
        yield state
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        state._wake = None
        os.close(write_fd)  # the relay reads end-of-file and returns
        relay.join(1.0)
        if not relay.is_alive():
            os.close(read_fd)


def _relay(read_fd: int, stop: threading.Event) -> None:
    """Sets ``stop`` for the signal handler, outside it (see :attr:`StopSignals._wake`)."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        stop.set()


class _Closable(Protocol):
    @property
    def telemetry(self) -> object: ...

    def close(self) -> None: ...


def _writer_close_with_timeout(writer: object) -> Callable[[float], None] | None:
    """The writer's ``close(timeout=...)`` when it has one (the journaling writer: it keeps what it
    still holds in the journal when the database does not answer in time)."""
    close = getattr(writer, "close", None)
    if close is None:
        return None
    try:
        takes_timeout = "timeout" in inspect.signature(close).parameters
    except (TypeError, ValueError):
        return None
    return (lambda t: close(timeout=t)) if takes_timeout else None


def close_within(gateway: _Closable, timeout_s: float = SHUTDOWN_FLUSH_S, *, what: str = "request log") -> bool:
    """Close ``gateway`` (flushing its request log) within ``timeout_s``; True when it finished.

    On False a line on stderr says how many records were not written, and :func:`abandoned`
    becomes true: the caller should exit without the interpreter's exit hooks.
    """
    writer = gateway.telemetry
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _close_bounded(gateway, timeout_s)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller's thread below
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="shutdown", daemon=True).start()
    if done.wait(timeout_s):
        if errors:
            raise errors[0]
        return True
    pending = getattr(writer, "pending", None)
    print(_not_flushed(what, timeout_s, pending if isinstance(pending, int) else None), file=sys.stderr, flush=True)
    _abandoned.set()
    return False


def _close_bounded(gateway: _Closable, timeout_s: float) -> None:
    """Close ``gateway``, its writer first with most of ``timeout_s`` when it takes a bound (what it
    cannot write by then stays in its journal)."""
    bounded_writer_close = _writer_close_with_timeout(gateway.telemetry)
    if bounded_writer_close is not None:
        bounded_writer_close(timeout_s * 0.8)  # leaves time for the journal's fsync
    gateway.close()


def _not_flushed(what: str, timeout_s: float, pending: int | None) -> str:
    left = f"{pending} records queued" if pending is not None else "records"
    return f"warning: the {what} did not flush within {timeout_s:g} s (database not answering); {left} not written"


def abandoned() -> bool:
    """Whether a :func:`close_within` gave up: a writer thread is still stuck on the database."""
    return _abandoned.is_set()


def exit_now(code: int) -> None:
    """Leave without the interpreter's exit hooks (which would wait for a stuck writer again)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# -- SIGTERM for programs that use the routing client --------------------------------------------

_live_gateways: weakref.WeakSet = weakref.WeakSet()
_sigterm_installed = False
_flush_pipes: tuple[int, int] | None = None  # (ask_w, done_r): the handler's ends of the flush thread's pipes


def flush_on_sigterm(gateway: _Closable) -> bool:
    """Have ``gateway`` closed (its request log flushed) when the process gets SIGTERM, if the
    program leaves SIGTERM to us: called in the main thread while SIGTERM is still the default.
    Returns whether the handler is in place; otherwise the program owns SIGTERM and must call
    ``close()`` itself."""
    global _sigterm_installed, _flush_pipes
    _live_gateways.add(gateway)
    if _sigterm_installed:
        return signal.getsignal(signal.SIGTERM) is _close_then_default
    if threading.current_thread() is not threading.main_thread():
        return False  # signal.signal works only there; a program with threads decides for itself
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False  # the program (or a framework) handles SIGTERM: never replace its handler
    ask_r, ask_w = os.pipe()
    done_r, done_w = os.pipe()
    _flush_pipes = (ask_w, done_r)
    # Started now, not in the handler: the handler runs between two bytecodes of the main thread,
    # which may hold any lock (Thread.start's own, the writer's queue); the flush runs in this
    # thread, and the handler only writes to and waits on pipes.
    threading.Thread(target=_flush_when_asked, args=(ask_r, done_w), name="sigterm-flush", daemon=True).start()
    signal.signal(signal.SIGTERM, _close_then_default)
    _sigterm_installed = True
    return True


def _flush_when_asked(ask_r: int, done_w: int) -> None:
    if not os.read(ask_r, 1):
        return
    deadline = time.monotonic() + SHUTDOWN_FLUSH_S  # one bound for all of them, not one each
    for gateway in list(_live_gateways):
        if getattr(gateway, "_closed", False):
            continue
        try:
            _close_bounded(gateway, max(0.1, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - the process is ending; say why the flush stopped
            os.write(2, f"warning: closing the gateway on SIGTERM failed: {type(exc).__name__}: {exc}\n".encode())
    os.write(done_w, b"d")


def _close_then_default(signum: int, frame: object) -> None:
    # Back to the default first: a second SIGTERM during the flush ends the process at once.
    signal.signal(signum, signal.SIG_DFL)
    if _flush_pipes is not None:
        ask_w, done_r = _flush_pipes
        os.write(ask_w, b"t")
        ready, _, _ = select.select([done_r], [], [], SHUTDOWN_FLUSH_S)  # a system call: no lock taken
        if not ready:
            pending = [getattr(g.telemetry, "pending", None) for g in list(_live_gateways)]
            left = sum(n for n in pending if isinstance(n, int))
            os.write(2, (_not_flushed("request log", SHUTDOWN_FLUSH_S, left) + "\n").encode())
    # Chain to what the program had, the default action: the process ends killed by SIGTERM.
    os.kill(os.getpid(), signum)
