"""Background batch writer: the request path never waits on disk.

A request hands its attempt records over in one step (:meth:`TelemetryWriter.submit_many`: one
append under a lock, no thread wake-up). One daemon thread wakes every ``flush_interval_s``, or as
soon as ``batch_size`` records are waiting, a flush is requested or the writer closes, takes up to
``batch_size`` records and hands them to ``write_batch``. Waking per batch rather than per record is
what keeps the hand-off off the request's latency. A full queue (``queue_size`` records) makes
``submit`` wait (backpressure), it never drops. A failed write is retried with backoff and the batch
is kept, so a database hiccup delays records but does not lose them. ``close()`` and interpreter
exit flush what is queued.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence

from core.records import AttemptRecord

log = logging.getLogger(__name__)


class TelemetryWriter:
    def __init__(
        self,
        write_batch: Callable[[Sequence[AttemptRecord]], int],
        *,
        queue_size: int = 10_000,
        batch_size: int = 500,
        flush_interval_s: float = 0.2,
        retry_delays_s: Sequence[float] = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
        name: str = "telemetry-writer",
    ):
        self._write_batch = write_batch
        self._max = queue_size
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._retry_delays = tuple(retry_delays_s)
        self._cv = threading.Condition()
        self._chunks: deque[Sequence[AttemptRecord]] = deque()  # one entry per submit_many
        self._count = 0  # records queued, not yet taken by the writer thread
        self._submitted = 0  # records accepted since start
        self._done = 0  # records taken and written (or rejected for good)
        self._flush_waiters = 0
        self._closed = False
        self._stopping = False
        self.written = 0
        self.write_failures = 0
        self.rejected = 0
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        ref = weakref.ref(self)
        atexit.register(lambda: (w := ref()) is not None and w.close())

    # -- producer side -------------------------------------------------------------------------
    def submit(self, record: AttemptRecord, timeout: float | None = None) -> None:
        """Queue a record; waits while the queue is full (raises ``queue.Full`` after ``timeout``)."""
        self.submit_many((record,), timeout=timeout)

    def submit_many(self, records: Sequence[AttemptRecord], timeout: float | None = None) -> None:
        """Queue one request's records in one step (waits while the queue is full, as :meth:`submit`).

        A group larger than the whole queue is accepted once the queue is empty, never split."""
        n = len(records)
        with self._cv:
            if self._closed:
                raise RuntimeError("telemetry writer is closed")
            if n == 0:
                return
            if self._count + n > self._max and self._count > 0:
                if not self._cv.wait_for(lambda: self._count + n <= self._max or self._count == 0, timeout):
                    raise queue.Full
                if self._closed:
                    raise RuntimeError("telemetry writer is closed")
            self._chunks.append(records)
            self._count += n
            self._submitted += n
            if self._count >= self._batch_size:
                self._cv.notify_all()  # a full batch is waiting: no need to sit out the interval

    @property
    def pending(self) -> int:
        """Records queued and not yet taken by the writer thread."""
        return self._count

    def flush(self) -> None:
        """Wait until everything submitted so far is written."""
        with self._cv:
            target = self._submitted
            if self._done >= target:
                return
            self._flush_waiters += 1
            self._cv.notify_all()
            try:
                self._cv.wait_for(lambda: self._done >= target or not self._thread.is_alive())
            finally:
                self._flush_waiters -= 1

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = self._stopping = True
            self._cv.notify_all()
        self._thread.join()

    # -- writer thread -------------------------------------------------------------------------
    def _take(self) -> list[AttemptRecord]:
        """Up to ``batch_size`` records from the front of the queue (caller holds the lock)."""
        batch: list[AttemptRecord] = []
        while self._chunks and len(batch) < self._batch_size:
            chunk = self._chunks.popleft()
            room = self._batch_size - len(batch)
            if len(chunk) > room:
                self._chunks.appendleft(chunk[room:])
                chunk = chunk[:room]
            batch.extend(chunk)
        self._count -= len(batch)
        return batch

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(
                    lambda: (
                        self._count >= self._batch_size
                        or self._stopping
                        or (self._flush_waiters > 0 and self._count > 0)
                    ),
                    timeout=self._interval,
                )
                if not self._chunks:
                    if self._stopping:
                        self._cv.notify_all()
                        return
                    continue
                batch = self._take()
                final = self._stopping
                self._cv.notify_all()  # producers waiting for room
            try:
                self._write_with_retry(batch, final=final)
            finally:
                with self._cv:
                    self._done += len(batch)
                    self._cv.notify_all()  # flush() waiters

    def _write_with_retry(self, batch: list[AttemptRecord], *, final: bool) -> None:
        attempt = 0
        while True:
            try:
                self.written += self._write_batch(batch)
                return
            except Exception as exc:  # noqa: BLE001 - any DB error: keep the batch and retry
                if _is_permanent(exc):
                    # Retrying the same rows cannot help: split the batch so one bad record does
                    # not hold back (or, at shutdown, take down) the good ones.
                    self._isolate(batch, exc, final=final)
                    return
                self.write_failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                delay = self._retry_delays[min(attempt, len(self._retry_delays) - 1)]
                attempt += 1
                if (final or self._closed) and attempt > len(self._retry_delays):
                    # Shutting down and the database stays unreachable: say so loudly.
                    log.error("could not write %d telemetry records: %s", len(batch), self.last_error)
                    return
                log.warning("telemetry write failed (%s); retrying in %.2fs", self.last_error, delay)
                time.sleep(delay)

    def _isolate(self, batch: list[AttemptRecord], exc: Exception, *, final: bool) -> None:
        if len(batch) == 1:
            self.rejected += 1
            self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.error(
                "telemetry record %s#%s rejected by the database: %s",
                batch[0].request_id,
                batch[0].attempt,
                self.last_error,
            )
            return
        mid = len(batch) // 2
        self._write_with_retry(batch[:mid], final=final)
        self._write_with_retry(batch[mid:], final=final)


def _is_permanent(exc: Exception) -> bool:
    """Errors caused by the rows themselves (too long, wrong type, constraint), not the database's
    state: the same rows would fail again."""
    from sqlalchemy.exc import DataError, IntegrityError, ProgrammingError

    return isinstance(exc, (DataError, IntegrityError, ProgrammingError))
