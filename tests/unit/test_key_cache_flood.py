"""Issue 18 item 6: a client without a key cannot flush the key cache, and failed keys are
throttled per client address.

Unknown keys fill a negative cache of their own, so 10,001 random keys leave a known key's last
answer in place, and during a database outage that key is still served; an address that keeps
presenting bad keys gets 429 with Retry-After and costs the database no lookup. In process (an
injected lookup and clock) and against a real ``serve`` process on a PostgreSQL cluster of the
test's own whose connection the test cuts.
"""

from __future__ import annotations

import json
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor

import anyio
import httpx2
import pytest
from sqlalchemy.exc import OperationalError

from app.server import wire
from app.server.auth import THROTTLED, FailedKeyThrottle, KeyAuthenticator
from db.keys import KeyRecord
from tests.support import serve_process as sp
from tests.support.chaos_upstream import ChaosUpstream, ok
from tests.support.db_switch import DbSwitch
from tests.support.throwaway_pg import ThrowawayPostgres

REC = KeyRecord(
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
HELLO = [{"role": "user", "content": "hello"}]


class Store:
    def __init__(self):
        self.down = False
        self.calls = 0

    def __call__(self, engine, token):
        self.calls += 1
        if self.down:
            raise OperationalError("select ...", {}, Exception("connection refused"))
        return REC if token == "gw-good" else None


def test_ten_thousand_and_one_random_keys_do_not_evict_a_known_key():
    store, now = Store(), [0.0]
    auth = KeyAuthenticator(None, clock=lambda: now[0], lookup=store)  # type: ignore[arg-type]

    async def go():
        assert await auth("gw-good", "10.0.0.1") == REC
        for i in range(10_001):  # from many addresses, so the throttle is not what saves the key
            assert await auth(f"gw-{secrets.token_urlsafe(8)}", f"10.1.{i // 250}.{i % 250}") is None
        store.down = True
        now[0] = 30.0  # the TTL has passed: a lookup is tried, fails, the known answer stands
        assert await auth("gw-good", "10.0.0.1") == REC

    anyio.run(go)
    assert len(auth._known) == 1 and len(auth._unknown) <= auth.max_unknown


def test_an_address_presenting_bad_keys_is_throttled_with_retry_after_and_no_lookups():
    store, now = Store(), [100.0]
    auth = KeyAuthenticator(  # type: ignore[arg-type]
        None, clock=lambda: now[0], lookup=store, throttle=FailedKeyThrottle(max_failures=5, window_s=60)
    )

    async def go():
        assert await auth("gw-good", "10.0.0.9") == REC
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
        assert await auth("gw-good", "10.0.0.9") == REC  # a known key still works from there
        now[0] = 161.5
        assert await auth("gw-bad-after", "10.0.0.9") is None  # the window moved on

    anyio.run(go)


def test_a_revoked_key_leaves_the_known_cache_after_its_ttl():
    store, now = Store(), [0.0]
    auth = KeyAuthenticator(None, ttl_s=2.0, clock=lambda: now[0], lookup=store)  # type: ignore[arg-type]
    revoked = {"on": False}

    def lookup(engine, token):
        return None if revoked["on"] else store(engine, token)

    auth._lookup = lookup

    async def go():
        assert await auth("gw-good") == REC
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


def _pipelined_statuses(port: int, addr: str, n: int) -> list[int]:
    """``n`` requests with random keys sent at once on one keep-alive connection from ``addr``
    (HTTP/1.1 pipelining: the server answers them in order), and the status of each answer. Raw
    bytes rather than an HTTP client: the flood is 10,013 requests on two cores, and the client's
    per-request work would otherwise take the CPU the server under test needs."""
    head = "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer gw-{}\r\n\r\n"
    requests = "".join(head.format(secrets.token_urlsafe(24)) for _ in range(n)).encode()
    statuses: list[int] = []
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(addr, 0)) as conn:
        conn.sendall(requests)
        buf = b""
        while len(statuses) < n:
            while b"\r\n\r\n" not in buf:
                chunk = conn.recv(65536)
                assert chunk, f"connection closed after {len(statuses)} of {n} answers"
                buf += chunk
            top, _, buf = buf.partition(b"\r\n\r\n")
            lines = top.split(b"\r\n")
            statuses.append(int(lines[0].split(b" ", 2)[1]))
            length = next(
                int(v) for k, _, v in (ln.partition(b":") for ln in lines[1:]) if k.lower() == b"content-length"
            )
            while len(buf) < length:
                chunk = conn.recv(65536)
                assert chunk, "connection closed inside an answer"
                buf += chunk
            buf = buf[length:]
    return statuses


def _flood(port: int, addresses: list[str], per_address: int) -> list[int]:
    with ThreadPoolExecutor(8) as pool:
        return [s for chunk in pool.map(lambda a: _pipelined_statuses(port, a, per_address), addresses) for s in chunk]


def test_a_real_server_keeps_a_known_key_through_a_flood_and_a_database_outage(tmp_path):
    with ThrowawayPostgres() as pg, ChaosUpstream() as upstream:
        switch = DbSwitch("127.0.0.1", pg.port)
        upstream.set_default(ok())
        cfg = tmp_path / "gateway.toml"
        cfg.write_text(sp.chaos_config(upstream.url) + "[database]\nconnect_timeout_s = 1\n")
        server = sp.start(cfg, pg.url(port=switch.port))
        try:
            out = sp.cli(server.env, "keys", "create", "--name", "app", "--json")
            assert out.returncode == 0, out.stderr
            key = json.loads(out.stdout)["key"]
            chat = {"model": "gpt-4.1", "messages": HELLO}
            good = {"Authorization": f"Bearer {key}"}
            assert (
                httpx2.post(f"{server.base_url}/chat/completions", json=chat, headers=good, timeout=30).status_code
                == 200
            )

            # 10,001 random keys, 17 from each of 589 loopback addresses: under the throttle, all 401.
            addresses = [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(589)]
            statuses = _flood(server.port, addresses, 17)
            assert len(statuses) >= 10_001 and set(statuses) == {401}

            # One address keeps guessing: throttled with Retry-After.
            one = _flood_one(server.base_url, "127.0.9.9", 25)
            assert one[:20] == [401] * 20 and set(one[20:]) == {429}

            switch.off()  # the database stops answering
            r = httpx2.post(f"{server.base_url}/chat/completions", json=chat, headers=good, timeout=30)
            assert r.status_code == 200, r.text  # the key's last known answer, seconds old
            unknown = httpx2.get(
                f"{server.base_url}/models", headers={"Authorization": "Bearer gw-never-seen"}, timeout=30
            )
            assert unknown.status_code == 503 and unknown.json()["error"]["code"] == "gateway_store_unavailable"
            switch.on()
        finally:
            server.terminate()
            switch.close()


def _flood_one(base_url: str, addr: str, n: int) -> list[int]:
    out = []
    with httpx2.Client(transport=httpx2.HTTPTransport(local_address=addr), timeout=30) as c:
        for _ in range(n):
            r = c.get(f"{base_url}/models", headers={"Authorization": f"Bearer gw-{secrets.token_urlsafe(24)}"})
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] == THROTTLED
            out.append(r.status_code)
    return out
