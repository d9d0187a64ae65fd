"""The key cache under load: when an entry expires, the requests holding that key share one
database lookup (its answer or its error) instead of each querying at once."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from sqlalchemy.exc import OperationalError

from app.server import wire
from app.server.auth import KeyAuthenticator
from db.keys import KeyRecord


def _record() -> KeyRecord:
    return KeyRecord.__new__(KeyRecord)  # the lookup's answer, passed through untouched


def test_concurrent_requests_for_one_key_share_one_lookup():
    calls = []
    gate = threading.Event()
    answer = _record()

    def lookup(engine, token):
        calls.append(token)
        gate.wait(5)  # the database is slow: everyone else arrives meanwhile
        return answer

    auth = KeyAuthenticator(engine=None, lookup=lookup)  # type: ignore[arg-type]

    async def main():
        tasks = [asyncio.create_task(auth("gw-same")) for _ in range(20)]
        await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(*tasks)

    got = asyncio.run(main())
    assert calls == ["gw-same"] and all(r is answer for r in got)


def test_a_failed_shared_lookup_fails_every_waiter_the_same_way():
    gate = threading.Event()

    def lookup(engine, token):
        gate.wait(5)
        raise OperationalError("select", {}, Exception("down"))

    auth = KeyAuthenticator(engine=None, lookup=lookup)  # type: ignore[arg-type]

    async def main():
        tasks = [asyncio.create_task(auth("gw-new")) for _ in range(5)]
        await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    got = asyncio.run(main())
    assert all(isinstance(e, wire.WireError) and e.code == wire.STORE_UNAVAILABLE for e in got)


def test_when_the_request_looking_up_is_cancelled_the_others_still_get_an_answer():
    calls = []
    answer = _record()

    def lookup(engine, token):
        calls.append(token)
        time.sleep(0.1)
        return answer

    auth = KeyAuthenticator(engine=None, lookup=lookup)  # type: ignore[arg-type]

    async def main():
        first = asyncio.create_task(auth("gw-k"))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(auth("gw-k"))
        await asyncio.sleep(0.01)
        first.cancel()  # its client went away
        with pytest.raises(asyncio.CancelledError):
            await first
        return await second

    assert asyncio.run(main()) is answer
    assert len(calls) == 2
