"""Background batch writer: the request path never waits on disk.

Records go into a bounded queue; one daemon thread takes up to ``batch_size`` of them at a time
(waiting at most ``flush_interval_s`` to fill a batch) and hands them to ``write_batch``. A full
queue makes ``submit`` wait (backpressure), it never drops. A failed write is retried with backoff
and the batch is kept, so a database hiccup delays records but does not lose them. ``close()`` and
interpreter exit flush what is queued.
"""

from __future__ import annotations

import atexit
import logging
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from core.records import AttemptRecord

log = logging.getLogger(__name__)

_STOP = object()


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
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._retry_delays = tuple(retry_delays_s)
        self._closed = False
        self._close_lock = threading.Lock()
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
        if self._closed:
            raise RuntimeError("telemetry writer is closed")
        self._queue.put(record, timeout=timeout)

    def submit_many(self, records: Sequence[AttemptRecord]) -> None:
        if self._closed:
            raise RuntimeError("telemetry writer is closed")
        for r in records:
            self.submit(r)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def flush(self) -> None:
        """Wait until everything submitted so far is written."""
        self._queue.join()

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(_STOP)
        self._thread.join()

    # -- writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is _STOP:
                self._queue.task_done()
                break
            batch: list[AttemptRecord] = [first]  # type: ignore[list-item]
            taken = 1
            deadline = time.monotonic() + self._interval
            while len(batch) < self._batch_size:
                remaining = deadline - time.monotonic()
                try:
                    item = self._queue.get(timeout=max(remaining, 0)) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                taken += 1
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)  # type: ignore[arg-type]
            self._write_with_retry(batch, final=stop)
            for _ in range(taken):
                self._queue.task_done()

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
                    print(f"telemetry: could not write {len(batch)} records: {self.last_error}", file=sys.stderr)
                    return
                log.warning("telemetry write failed (%s); retrying in %.2fs", self.last_error, delay)
                time.sleep(delay)

    def _isolate(self, batch: list[AttemptRecord], exc: Exception, *, final: bool) -> None:
        if len(batch) == 1:
            self.rejected += 1
            self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(
                f"telemetry: record {batch[0].request_id}#{batch[0].attempt} rejected by the database: "
                f"{self.last_error}",
                file=sys.stderr,
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
