"""The server when its own database does not answer: keys seen lately keep working (stale answer),
others get a 503 ``gateway_store_unavailable``; keys with limits or a budget are refused with a
503 (fail closed), never served unchecked; spend that cannot be settled is left to the estimate;
and whatever fails inside, a client gets an OpenAI error object, never uvicorn's plain-text 500.
"""

from __future__ import annotations

import anyio
import pytest
from sqlalchemy.exc import OperationalError

from app.server import wire
from app.server.admission import Admission
from app.server.auth import KeyAuthenticator
from app.server.metrics import GatewayMetrics
from db.engine import DbTimeouts, create_db_engine
from db.keys import KeyRecord
from tests.unit.test_server_asgi import echo_handler, make_app, raw

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
