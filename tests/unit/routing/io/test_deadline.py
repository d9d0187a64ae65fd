"""app.routing.io.deadline.ReadWatch: each read of a stream bounded, on one timer per stream.

A read that stalls past the time the deadline leaves fails with the deadline's name; time spent
between reads (the caller not reading) never counts; a cancellation from elsewhere stays one."""

from __future__ import annotations

import asyncio
import time

import httpx2
import pytest

from app.routing.io.deadline import DeadlineExceeded, ReadWatch
from app.routing.policy import AttemptDeadline


def _deadline(idle: float = 0.05, first_token_in: float | None = None, end_in: float = 30.0) -> AttemptDeadline:
    now = time.monotonic()
    first = None if first_token_in is None else now + first_token_in
    return AttemptDeadline(time.monotonic, now + end_in, first_token_by=first, idle_s=idle)


async def _read(watch: ReadWatch, seconds: float) -> str:
    async with watch.read():
        await asyncio.sleep(seconds)
    return "read"


def test_quick_reads_pass_and_share_one_timer() -> None:
    async def main() -> None:
        watch = ReadWatch(_deadline(idle=30))
        await _read(watch, 0)
        armed = watch._handle
        assert armed is not None
        for _ in range(50):
            assert await _read(watch, 0.001) == "read"
        assert watch._handle is armed  # not re-armed per read
        watch.close()
        assert armed.cancelled()

    asyncio.run(main())


def test_a_read_that_stalls_past_the_idle_gap_fails_by_name() -> None:
    async def main() -> None:
        watch = ReadWatch(_deadline(idle=0.05))
        await _read(watch, 0.01)
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="idle timeout"):
            await _read(watch, 5)
        assert time.monotonic() - started < 2  # the read was cut, not waited out
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        watch.close()

    asyncio.run(main())


def test_a_long_wait_between_reads_never_counts() -> None:
    async def main() -> None:
        watch = ReadWatch(_deadline(idle=0.05))
        for _ in range(3):
            await _read(watch, 0.01)
            await asyncio.sleep(0.15)  # the caller reads slowly: three idle gaps, outside any read
        watch.close()

    asyncio.run(main())


def test_the_first_token_deadline_is_named_when_it_passes_first() -> None:
    async def main() -> None:
        watch = ReadWatch(_deadline(idle=10, first_token_in=0.05))
        with pytest.raises(DeadlineExceeded, match="time-to-first-token"):
            await _read(watch, 5)
        watch.close()

    asyncio.run(main())


def test_a_shorter_deadline_rearms_the_timer_earlier() -> None:
    async def main() -> None:
        deadline = _deadline(idle=5)
        watch = ReadWatch(deadline)
        await _read(watch, 0)
        deadline.end = time.monotonic() + 0.05  # the request's deadline is now nearer than the idle gap
        with pytest.raises(DeadlineExceeded, match="attempt's deadline"):
            await _read(watch, 5)
        watch.close()

    asyncio.run(main())


def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def main() -> None:
        watch = ReadWatch(_deadline(idle=10))
        task = asyncio.create_task(_read(watch, 5))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        watch.close()

    asyncio.run(main())


def test_the_clients_own_timeout_at_the_same_instant_is_named_as_the_deadline() -> None:
    async def main() -> None:
        watch = ReadWatch(_deadline(idle=10, first_token_in=0.01))
        await asyncio.sleep(0.02)
        with pytest.raises(DeadlineExceeded, match="time-to-first-token"):
            async with watch.read():
                raise httpx2.ReadTimeout("no answer in time")  # the upstream client's timeout won the race
        watch.close()

    asyncio.run(main())
