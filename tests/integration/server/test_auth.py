"""Key checks of a real serve process: a flood of unknown keys and a database outage."""

from __future__ import annotations

import json
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx2

from app.server.auth import THROTTLED
from tests.support import serve_process as sp
from tests.support.chaos_upstream import ChaosUpstream, ok
from tests.support.db_switch import DbSwitch
from tests.support.throwaway_pg import ThrowawayPostgres

HELLO = [{"role": "user", "content": "hello"}]


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
        # The outage below closes connections at once (DbSwitch), so no connect waits out this
        # bound; it only has to outlast a connect through the switch, a relay in this process that
        # the flood's eight threads starve of the GIL (at 1 s a loaded CI run turned 503s up).
        cfg.write_text(sp.chaos_config(upstream.url) + "[database]\nconnect_timeout_s = 10\n")
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
