"""The server when its own database does not answer: keys seen lately keep working (stale answer),
others get a 503 ``gateway_store_unavailable``; keys with limits or a budget are refused with a
503 (fail closed), never served unchecked; spend that cannot be settled is left to the estimate;
and whatever fails inside, a client gets an OpenAI error object, never uvicorn's plain-text 500.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time

import anyio
import pytest
from sqlalchemy.exc import OperationalError

from app.server import wire
from app.server.admission import Admission
from app.server.auth import THROTTLED, FailedKeyThrottle, KeyAuthenticator
from app.server.metrics import GatewayMetrics
from db.engine import DbTimeouts, create_db_engine
from db.keys import KeyRecord
from tests.support.echo_app import echo_handler, make_app
from tests.unit.server.test_asgi import raw

REC = KeyRecord(
    id=1,
    name="app",
    prefix="gw-good",
    models=(),
    rpm=10,
    tpm=None,
    budget_micro_usd=None,
    period=None,
    created_at=0.0,
    created_by="test",
    revoked_at=None,
)


@pytest.fixture
def dead_engine():
    """A PostgreSQL URL where nothing listens: every statement fails at connect, as in an outage."""
    engine = create_db_engine("postgresql+psycopg://nobody:nothing@127.0.0.1:9/gone", DbTimeouts(connect_timeout_s=1.0))
    yield engine
    engine.dispose()


class Store:
    """A key lookup that answers until ``down`` is set, then fails as a stalled database does."""

    def __init__(self):
        self.down = False
        self.calls = 0

    def __call__(self, engine, token):
        self.calls += 1
        if self.down:
            raise OperationalError("select ...", {}, Exception("canceling statement due to statement timeout"))
        return REC if token == "gw-good" else None


def test_a_key_seen_lately_keeps_working_while_the_store_is_down_then_not():
    store, now = Store(), [0.0]
    auth = KeyAuthenticator(None, ttl_s=2.0, stale_s=600.0, clock=lambda: now[0], lookup=store)  # type: ignore[arg-type]

    async def go():
        assert await auth("gw-good") == REC
        store.down = True
        now[0] = 5.0  # past the 2 s TTL: a lookup is tried, fails, the known answer is used
        assert await auth("gw-good") == REC and store.calls == 2
        with pytest.raises(wire.WireError) as unknown:  # never seen: refused, not let in
            await auth("gw-new")
        assert (unknown.value.status, unknown.value.code) == (503, "gateway_store_unavailable")
        assert unknown.value.headers["Retry-After"] == "5"
        now[0] = 700.0  # older than stale_s: refused too
        with pytest.raises(wire.WireError) as old:
            await auth("gw-good")
        assert old.value.status == 503
        store.down = False
        assert await auth("gw-good") == REC  # the store is back

    anyio.run(go)


def test_a_limited_key_is_refused_with_503_when_the_limits_cannot_be_checked(dead_engine):
    metrics = GatewayMetrics()
    admission = Admission(dead_engine, metrics)

    async def go():
        with pytest.raises(wire.WireError) as err:
            await admission.admit(REC, est_tokens=10, est_cost_usd=0.001)
        assert (err.value.status, err.value.code) == (503, "gateway_store_unavailable")
        assert "rate limits and budget of key 'app' cannot be checked" in err.value.message
        assert 'gateway_key_denials_total{reason="store_unavailable"} 1.0' in metrics.exposition().decode()
        # Settling into a dead store does not raise into the request: the estimate stands.
        assert await admission.settle(REC, "r1", tokens=5, cost_usd=0.001) is False

    anyio.run(go)


def test_an_unexpected_failure_is_an_openai_500_not_uvicorns_text():
    def broken_auth(token):
        raise RuntimeError("a bug of ours")

    app = make_app(echo_handler, authenticate=broken_auth)

    async def go():
        async with raw(app) as c:
            r = await c.post(
                "/v1/chat/completions",
                json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": "Bearer gw-anything"},
            )
        assert r.status_code == 500 and r.headers["content-type"].startswith("application/json")
        error = r.json()["error"]
        assert "Internal error in the gateway" in error["message"] and "a bug of ours" not in r.text
        assert r.headers["x-request-id"] in error["message"]

    anyio.run(go)


def test_the_store_outage_answer_through_the_app():
    store = Store()
    store.down = True
    app = make_app(echo_handler, authenticate=KeyAuthenticator(None, lookup=store))  # type: ignore[arg-type]

    async def go():
        async with raw(app) as c:
            r = await c.post(
                "/v1/chat/completions",
                json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": "Bearer gw-good"},
            )
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"]["code"] == "gateway_store_unavailable"
        exposed = app.metrics.exposition().decode()
        assert 'gateway_key_denials_total{reason="store_unavailable"} 1.0' in exposed  # what the alert reads

    anyio.run(go)


def test_readyz_answers_503_in_bounded_time_when_a_check_hangs():
    async def stalled_database_check():
        await anyio.sleep_forever()

    app = make_app(echo_handler, ready=stalled_database_check, ready_timeout_s=0.2)

    async def go():
        with anyio.fail_after(10):  # a bound on the test, not a timing assertion
            async with raw(app) as c:
                r = await c.get("/readyz")
        assert r.status_code == 503 and r.json() == {"status": "unavailable", "checks": {"ready_check": False}}

    anyio.run(go)


# -- auth single flight ----------------------------------------------------------------------------
# The key cache under load: when an entry expires, the requests holding that key share one
# database lookup (its answer or its error) instead of each querying at once.


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


# -- key cache flood -------------------------------------------------------------------------------
# Issue 18 item 6: a client without a key cannot flush the key cache, and failed keys are
# throttled per client address.
#
# Unknown keys fill a negative cache of their own, so 10,001 random keys leave a known key's last
# answer in place, and during a database outage that key is still served; an address that keeps
# presenting bad keys gets 429 with Retry-After and costs the database no lookup. In process (an
# injected lookup and clock) and against a real ``serve`` process on a PostgreSQL cluster of the
# test's own whose connection the test cuts.


REC_KEY_CACHE_FLOOD = KeyRecord(
    id=1,
    name="app",
    prefix="gw-good",
    models=(),
    rpm=None,
    tpm=None,
    budget_micro_usd=None,
    period=None,
    created_at=0.0,
    created_by="test",
    revoked_at=None,
)


class Store_key_cache_flood:
    def __init__(self):
        self.down = False
        self.calls = 0

    def __call__(self, engine, token):
        self.calls += 1
        if self.down:
            raise OperationalError("select ...", {}, Exception("connection refused"))
        return REC_KEY_CACHE_FLOOD if token == "gw-good" else None


def test_ten_thousand_and_one_random_keys_do_not_evict_a_known_key():
    store, now = Store_key_cache_flood(), [0.0]
    auth = KeyAuthenticator(None, clock=lambda: now[0], lookup=store)  # type: ignore[arg-type]

    async def go():
        assert await auth("gw-good", "10.0.0.1") == REC_KEY_CACHE_FLOOD
        for i in range(10_001):  # from many addresses, so the throttle is not what saves the key
            assert await auth(f"gw-{secrets.token_urlsafe(8)}", f"10.1.{i // 250}.{i % 250}") is None
        store.down = True
        now[0] = 30.0  # the TTL has passed: a lookup is tried, fails, the known answer stands
        assert await auth("gw-good", "10.0.0.1") == REC_KEY_CACHE_FLOOD

    anyio.run(go)
    assert len(auth._known) == 1 and len(auth._unknown) <= auth.max_unknown


def test_an_address_presenting_bad_keys_is_throttled_with_retry_after_and_no_lookups():
    store, now = Store_key_cache_flood(), [100.0]
    auth = KeyAuthenticator(  # type: ignore[arg-type]
        None, clock=lambda: now[0], lookup=store, throttle=FailedKeyThrottle(max_failures=5, window_s=60)
    )

    async def go():
        assert await auth("gw-good", "10.0.0.9") == REC_KEY_CACHE_FLOOD
        for i in range(5):
            now[0] += 1
            assert await auth(f"gw-bad{i}", "10.0.0.9") is None
        calls = store.calls
        with pytest.raises(wire.WireError) as err:
            await auth("gw-bad-next", "10.0.0.9")
        assert (err.value.status, err.value.code) == (429, THROTTLED)
        # The oldest counted failure (t=101) leaves the 60 s window at t=161; now is 105.
        assert err.value.headers["Retry-After"] == "56"
        assert store.calls == calls  # refused without a database lookup
        assert await auth("gw-bad0", "10.0.0.10") is None  # another address is not throttled
        assert await auth("gw-good", "10.0.0.9") == REC_KEY_CACHE_FLOOD  # a known key still works from there
        now[0] = 161.5
        assert await auth("gw-bad-after", "10.0.0.9") is None  # the window moved on

    anyio.run(go)


def test_a_revoked_key_leaves_the_known_cache_after_its_ttl():
    store, now = Store_key_cache_flood(), [0.0]
    auth = KeyAuthenticator(None, ttl_s=2.0, clock=lambda: now[0], lookup=store)  # type: ignore[arg-type]
    revoked = {"on": False}

    def lookup(engine, token):
        return None if revoked["on"] else store(engine, token)

    auth._lookup = lookup

    async def go():
        assert await auth("gw-good") == REC_KEY_CACHE_FLOOD
        revoked["on"] = True
        now[0] = 3.0
        assert await auth("gw-good") is None
        store.down = True
        revoked["on"] = False
        now[0] = 6.0  # outage: the answer last known is "refused", not the old record
        with pytest.raises(wire.WireError):
            await auth("gw-good")

    anyio.run(go)


def test_the_throttle_is_a_sliding_window_and_bounded():
    t = FailedKeyThrottle(max_failures=3, window_s=10, max_addresses=2)
    for ts in (0.0, 9.0, 9.5):
        assert t.retry_after("a", ts) is None
        t.failed("a", ts)
    assert t.retry_after("a", 9.6) == 1  # 0.0 leaves at 10.0
    assert t.retry_after("a", 10.0) is None
    t.failed("a", 10.0)
    assert t.retry_after("a", 10.1) == 9  # 9.0 leaves at 19.0
    t.failed("b", 11.0)
    t.failed("c", 11.0)  # the address quiet longest ("a") is dropped
    assert len(t) == 2 and t.retry_after("a", 11.0) is None
    assert t.retry_after(None, 0) is None
    with pytest.raises(ValueError):
        FailedKeyThrottle(max_failures=0)


# ------------------------------------------------------------------------------ real serve process
