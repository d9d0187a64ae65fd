"""The gateway server as a real process (``python -m app serve``) in front of a scripted chaos upstream:
the openai SDK (sync, async, streamed) and raw HTTP against every endpoint and error status, keys and
limits, client disconnect, SIGTERM with requests in flight, the request log's key column."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
from pathlib import Path

import httpx2
import openai
import pytest
from sqlalchemy import select

from app import catalog
from core.messages import estimate_prompt_tokens
from db.canary import set_ratio
from db.engine import get_engine
from db.keys import create_key
from db.models import RequestLog
from tests.support import serve_process as sp
from tests.support.chaos_upstream import (
    ChaosUpstream,
    bad_request,
    hang_until_closed,
    ok,
    server_error,
    stall_after,
    trickle,
    unavailable,
)

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def upstream():
    with ChaosUpstream() as up:
        yield up


@pytest.fixture(scope="module")
def server(upstream, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    cfg = tmp / "gateway.toml"
    cfg.write_text(sp.chaos_config(upstream.url))
    db_url = f"sqlite:///{tmp / 'gw.db'}"
    proc = sp.start(cfg, db_url)
    proc.db_url = db_url  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.terminate()


@pytest.fixture(scope="module")
def engine(server):
    return get_engine(server.db_url)


@pytest.fixture(scope="module")
def key(server):
    """An unrestricted key, created through the CLI (printed once, as JSON)."""
    out = sp.cli(server.env, "keys", "create", "--name", "main", "--json")
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    assert created["name"] == "main" and created["key"].startswith("gw-")
    return created["key"]


@pytest.fixture()
def fresh(upstream):
    """Every request answered ok unless the test scripts otherwise; scripts left over are dropped."""
    upstream.set_default(ok())
    yield upstream
    upstream.set_default(ok())
    with upstream._lock:
        upstream._queues.clear()


def open_stream(base_url: str, key: str):
    """A streamed ``gpt-4.1`` chat request to the server at ``base_url`` (use as a context manager)."""
    return httpx2.stream(
        "POST",
        f"{base_url}/chat/completions",
        json={"model": "gpt-4.1", "messages": HELLO, "stream": True},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def post(server, key, body, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx2.post(f"{server.base_url}/chat/completions", json=body, headers=headers, timeout=30, **kw)


# ---------------------------------------------------------------------------------------- openai SDK


def test_openai_sdk_sync_call_and_gateway_headers(server, key, fresh):
    client = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=HELLO)
    r = raw.parse()
    assert r.choices[0].message.content == "chaos says hello"
    assert r.model == "gpt-4.1" and r.usage.prompt_tokens == 5
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    h = raw.headers
    assert h["x-gateway-provider"] == "direct" and h["x-gateway-model"] == "gpt-4.1"
    assert h["x-gateway-intent"] == "explicit" and h["x-gateway-canary-side"] == "fallback"
    assert h["x-gateway-attempts"] == "1" and h["x-request-id"]
    # The upstream got our provider key, never the gateway key.
    sent = fresh.requests[-1]
    assert sent.headers["authorization"] == f"Bearer {sp.UPSTREAM_KEY}"
    assert key not in json.dumps(sent.headers)


def test_openai_sdk_async_calls(server, key, fresh):
    async def main():
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0)
        rs = await asyncio.gather(*[client.chat.completions.create(model="auto", messages=HELLO) for _ in range(5)])
        await client.close()
        return rs

    rs = asyncio.run(main())
    assert [r.choices[0].message.content for r in rs] == ["chaos says hello"] * 5
    assert {r.id for r in rs} == {"chatcmpl-chaos"}  # the upstream's own id: its answer is passed through


def test_openai_sdk_stream_with_usage(server, key, fresh):
    client = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="gpt-4.1", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "chaos says hello"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])


def test_raw_stream_ends_with_done(server, key, fresh):
    with open_stream(server.base_url, key) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-gateway-provider"] == "direct"
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


# ---------------------------------------------------------------------------------------- endpoints


def test_health_ready_models_metrics(server, key):
    assert httpx2.get(f"{server.url}/healthz").json() == {"status": "ok"}
    ready = httpx2.get(f"{server.url}/readyz").json()
    assert ready["status"] == "ok"
    assert ready["checks"] == {"database": True, "provider:holysheep": True, "provider:direct": True}
    models = httpx2.get(f"{server.base_url}/models", headers={"Authorization": f"Bearer {key}"}).json()
    assert [m["id"] for m in models["data"]] == ["auto", "gpt-4.1", "gemini-2.5-flash"]
    assert httpx2.get(f"{server.base_url}/models").status_code == 401
    metrics = httpx2.get(f"{server.url}/metrics")
    assert metrics.status_code == 200 and "gateway_canary_ratio 0.0" in metrics.text


def error_of(r: httpx2.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"])
    assert "Traceback" not in r.text
    return body["error"]


def test_auth_errors(server, key):
    assert error_of(post(server, None, {"model": "gpt-4.1", "messages": HELLO}))["code"] == "invalid_api_key"
    r = post(server, "gw-not-a-real-key", {"model": "gpt-4.1", "messages": HELLO})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url, api_key="sk-wrong", max_retries=0).chat.completions.create(
            model="gpt-4.1", messages=HELLO
        )


def test_request_errors_400_404_413(server, key):
    r = httpx2.post(
        f"{server.base_url}/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and error_of(r)["type"] == "invalid_request_error"
    r = post(server, key, {"model": "gpt-4.1", "messages": []})
    assert r.status_code == 400 and error_of(r)["param"] == "messages"
    r = post(server, key, {"model": "nope", "messages": HELLO})
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"
    r = post(server, key, {"model": "deepseek-chat-v3.2", "messages": HELLO})  # a catalog model nobody routes
    assert r.status_code == 404
    assert httpx2.get(f"{server.url}/v1/nothing").status_code == 404
    big = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]}
    r = post(server, key, big)
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"


def test_key_model_allow_list_403(server, engine, fresh):
    _, k = create_key(engine, "only-gpt", models="gpt-4.1")
    assert post(server, k, {"model": "gpt-4.1", "messages": HELLO}).status_code == 200
    r = post(server, k, {"model": "gemini-2.5-flash", "messages": HELLO})
    assert r.status_code == 403 and error_of(r)["code"] == "model_not_allowed"
    with pytest.raises(openai.PermissionDeniedError):
        openai.OpenAI(base_url=server.base_url, api_key=k, max_retries=0).chat.completions.create(
            model="gemini-2.5-flash", messages=HELLO
        )


def test_rpm_limit_429_with_retry_after(server, engine, fresh):
    _, k = create_key(engine, "rpm-two", rpm=2)
    codes = [post(server, k, {"model": "gpt-4.1", "messages": HELLO}).status_code for _ in range(2)]
    assert codes == [200, 200]
    r = post(server, k, {"model": "gpt-4.1", "messages": HELLO})
    assert r.status_code == 429 and error_of(r)["code"] == "rate_limit_exceeded"
    assert 1 <= int(r.headers["retry-after"]) <= 61  # sliding window: 60 s and its one-second bucket
    assert len(fresh.requests_for("direct")) >= 2


def test_budget_exceeded_429(server, engine, fresh):
    _, k = create_key(engine, "tiny-budget", budget_usd=0.000001, period="day")
    r = post(server, k, {"model": "gpt-4.1", "messages": HELLO})
    assert r.status_code == 429
    err = error_of(r)
    assert err["code"] == "budget_exceeded" and err["type"] == "insufficient_quota"


def test_upstream_failures_map_to_502_503_400(server, key, fresh):
    fresh.script(server_error(), provider="direct")
    r = post(server, key, {"model": "gpt-4.1", "messages": HELLO})
    assert r.status_code == 502 and "request id" in error_of(r)["message"]
    fresh.script(unavailable(), provider="direct")
    assert post(server, key, {"model": "gpt-4.1", "messages": HELLO}).status_code == 503
    fresh.script(bad_request("This model's maximum context length is 10 tokens"), provider="direct")
    r = post(server, key, {"model": "gpt-4.1", "messages": HELLO})
    assert r.status_code == 400 and "maximum context length" in error_of(r)["message"]
    with pytest.raises(openai.InternalServerError):
        fresh.script(server_error(), provider="direct")
        openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0).chat.completions.create(
            model="gpt-4.1", messages=HELLO
        )


def test_spend_is_logged_per_key(server, engine, fresh):
    _, k = create_key(engine, "spender")
    for _ in range(3):
        assert post(server, k, {"model": "gpt-4.1", "messages": HELLO}).status_code == 200

    def rows():
        with engine.connect() as conn:
            return conn.execute(
                select(RequestLog.cost_usd, RequestLog.source).where(RequestLog.key_name == "spender")
            ).all()

    got = sp.wait_for(lambda: rows() if len(rows()) == 3 else None, timeout_s=10, what="3 log rows")
    assert all(r.cost_usd > 0 and r.source == "server" for r in got)
    listed = json.loads(sp.cli(server.env, "keys", "list", "--json").stdout)
    spender = next(x for x in listed if x["name"] == "spender")
    assert spender["requests_month"] == 3
    assert spender["cost_month_usd"] == pytest.approx(sum(r.cost_usd for r in got))


def test_keys_revoke_cli(server, engine, fresh):
    _, k = create_key(engine, "to-revoke")
    out = sp.cli(server.env, "keys", "revoke", "to-revoke")
    assert out.returncode == 0 and "revoked" in out.stdout
    # The server's key cache holds a lookup for at most 2 s; this key was never looked up.
    assert post(server, k, {"model": "gpt-4.1", "messages": HELLO}).status_code == 401
    assert sp.cli(server.env, "keys", "revoke", "no-such-key").returncode == 2


# ---------------------------------------------------------------------------------------- disconnect


def cancelled_rows(engine, key_name: str):
    """The request log's rows of ``key_name``, once its request's rows are written."""

    def rows():
        with engine.connect() as conn:
            got = conn.execute(
                select(RequestLog.provider, RequestLog.error_class, RequestLog.final, RequestLog.stream).where(
                    RequestLog.key_name == key_name
                )
            ).all()
        return got or None

    return sp.wait_for(rows, timeout_s=10, what=f"the log rows of {key_name}")


def leave_stream_at(server, key: str, marker: str) -> None:
    """Start a stream and close our connection at the first event line containing ``marker``."""
    with open_stream(server.base_url, key) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if marker in line:
                return  # leaving the block closes our connection mid-stream
    raise AssertionError(f"the stream ended without {marker!r}")


def test_client_disconnect_closes_a_silent_upstream_stream(server, engine, fresh):
    """A client that goes away mid-stream while the upstream has gone silent (it sent two words,
    then nothing, for as long as its connection stays open): the server cancels the stream at once,
    closing the upstream connection long before the 30 s idle timeout, and logs it cancelled."""
    _, k = create_key(engine, "leaves-stream")
    fresh.script(stall_after(3), provider="direct")
    before = len(fresh.requests)
    leave_stream_at(server, k, '"content":"one')
    (stalled,) = [r for r in fresh.wait_for_requests(before + 1)[before:] if r.fault == "stall_after"]
    sp.wait_for(stalled.served.is_set, timeout_s=5, what="the upstream connection to close")
    assert cancelled_rows(engine, "leaves-stream") == [("direct", "cancelled", True, True)]


def test_client_disconnect_closes_a_trickling_upstream_stream(server, key, fresh):
    """The same with an upstream that keeps sending (a word every 5 ms for seconds)."""
    fresh.script(trickle(0.005, text="word " * 400), provider="direct")
    before = len(fresh.requests)
    leave_stream_at(server, key, '"content":"word')
    (trickled,) = [r for r in fresh.wait_for_requests(before + 1)[before:] if r.fault == "trickle"]
    sp.wait_for(trickled.served.is_set, timeout_s=5, what="the upstream connection to close")


def test_client_disconnect_cancels_a_non_streamed_upstream_request(server, engine, fresh):
    """A client that goes away while a non-streamed answer is pending: the server cancels the routed
    request at once (logged as cancelled). Its upstream request, still waiting for the answer's
    head, is abandoned and ends by the attempt's 10 s timeout: the upstream client (pyreqwest) cannot
    abort it sooner (an answer that has begun is closed at once: tests/integration/test_upstream_http)."""
    _, k = create_key(engine, "leaves-call")
    fresh.script(hang_until_closed(), provider="direct")
    before = len(fresh.requests)
    url = httpx2.URL(server.base_url)
    body = json.dumps({"model": "gpt-4.1", "messages": HELLO}).encode()
    head = (
        f"POST {url.path.rstrip('/')}/chat/completions HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        f"Authorization: Bearer {k}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((url.host, url.port), timeout=30) as conn:
        conn.sendall(head.encode() + body)
        hung = [r for r in fresh.wait_for_requests(before + 1)[before:] if r.fault == "hang_until_closed"]
        assert len(hung) == 1 and not hung[0].served.is_set()
    # Our socket is closed: the upstream's handler ends once the gateway closes its connection too.
    sp.wait_for(lambda: bool(cancelled_rows(engine, "leaves-call")), timeout_s=5, what="the cancelled row")
    assert cancelled_rows(engine, "leaves-call") == [("direct", "cancelled", True, False)]
    sp.wait_for(hung[0].served.is_set, timeout_s=15, what="the upstream connection to close by its timeout")


# ---------------------------------------------------------------------------------------- SIGTERM


def test_sigterm_lets_in_flight_requests_finish_and_flushes_the_log(upstream, tmp_path):
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(sp.chaos_config(upstream.url))
    db_url = f"sqlite:///{tmp_path / 'gw.db'}"
    proc = sp.start(cfg, db_url)
    engine = get_engine(db_url)
    _, k = create_key(engine, "term")
    n = 4
    upstream.script(*[trickle(0.002, text="finishing in flight") for _ in range(n)], provider="direct")
    before = len(upstream.requests)
    results: list[int] = []

    def one():
        results.append(post(proc, k, {"model": "gpt-4.1", "messages": HELLO}).status_code)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        upstream.wait_for_requests(before + n, timeout_s=20)
        rc = proc.terminate()
    finally:
        for t in threads:
            t.join(timeout=60)
    assert results == [200] * n
    assert rc == 0
    with engine.connect() as conn:
        logged = conn.execute(select(RequestLog.status).where(RequestLog.key_name == "term")).all()
    assert [r.status for r in logged] == ["ok"] * n  # flushed before the process exited


def test_sigterm_cuts_a_stream_that_outlives_the_grace_period_and_logs_it(upstream, tmp_path):
    """A stream still open when the grace period (here 1 s) ends is cut: the upstream connection is
    closed, the client's stream ends, the attempt is logged ``shutdown`` (issue 18: it was
    ``cancelled``, "the caller stopped reading", though the caller was still reading) and the log
    is flushed before the process exits 0."""
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(sp.chaos_config(upstream.url))
    db_url = f"sqlite:///{tmp_path / 'gw.db'}"
    proc = sp.start(cfg, db_url, args=("--graceful-s", "1"))
    engine = get_engine(db_url)
    _, k = create_key(engine, "cut")
    upstream.script(stall_after(3), provider="direct")  # two words, then silence for minutes
    before = len(upstream.requests)
    lines: list[str] = []
    with open_stream(proc.base_url, k) as r:
        assert r.status_code == 200
        events = r.iter_lines()
        for line in events:
            lines.append(line)
            if '"content":"one' in line:
                break
        rc = proc.terminate(timeout_s=30)  # SIGTERM mid-stream; returns once the process exited
        try:
            lines.extend(events)  # whatever was sent before the cut, then the end
        except httpx2.TransportError:
            pass  # the connection was closed under us: also an end
    (stalled,) = [q for q in upstream.wait_for_requests(before + 1)[before:] if q.fault == "stall_after"]
    assert rc == 0 and stalled.served.is_set()  # the upstream's connection closed before the exit
    assert "data: [DONE]" not in lines  # the cut answer is not passed off as complete
    with engine.connect() as conn:
        logged = conn.execute(
            select(RequestLog.error_class, RequestLog.error_message, RequestLog.final).where(
                RequestLog.key_name == "cut"
            )
        ).all()
    assert [tuple(r) for r in logged] == [("shutdown", "the gateway shut down before the answer was complete", True)]


def test_graceful_s_is_bounded(server):
    # One bad value as a process; every other one in-process (tests/unit/app/test_main.py).
    out = sp.cli(server.env, "serve", "--port", "0", "--graceful-s", "1e400")
    assert out.returncode != 0 and "--graceful-s must be a whole number from 0 to 3600" in out.stderr


def test_port_taken_is_one_clear_error(server):
    out = sp.cli(server.env, "serve", "--port", str(server.port))
    assert out.returncode != 0
    assert "already in use" in out.stderr and "Traceback" not in out.stderr


# -- serve workers ---------------------------------------------------------------------------------
# ``python -m app serve --workers N`` (issue 16): N processes share one port, each with its own
# upstream pool and log writer, one database; /metrics says which worker answered; a key's rate
# limit holds across workers; SIGTERM drains all of them (exit 0, every answered request logged).


HI = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def two_workers(tmp_path: Path):
    with ChaosUpstream() as up:
        cfg = tmp_path / "gw.toml"
        cfg.write_text(sp.chaos_config(up.url))
        db = tmp_path / "gw.sqlite"
        server = sp.start(cfg, f"sqlite:///{db}", args=("--workers", "2"))
        try:
            yield server, db
        finally:
            if server.proc.poll() is None:
                server.terminate()


def worker_of(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("gateway_worker_info{"):
            return line.split('worker="', 1)[1].split('"', 1)[0]
    raise AssertionError("no gateway_worker_info in /metrics")


def test_two_workers_share_the_port_and_drain_on_sigterm(two_workers):
    server, db = two_workers
    made = sp.cli(server.env, "keys", "create", "--name", "w", "--json")
    key = json.loads(made.stdout)["key"]
    limited = json.loads(sp.cli(server.env, "keys", "create", "--name", "lim", "--rpm", "3", "--json").stdout)["key"]
    seen: set[str] = set()
    with httpx2.Client(base_url=server.url, timeout=10) as c:
        for _ in range(60):  # new connections: the kernel spreads them over both workers' accepts
            with httpx2.Client(base_url=server.url, timeout=10) as fresh:
                seen.add(worker_of(fresh.get("/metrics").text))
            if len(seen) == 2:
                break
        answered = [
            c.post("/v1/chat/completions", json=HI, headers={"authorization": f"Bearer {key}"}) for _ in range(6)
        ]
        statuses = []
        for _ in range(6):  # 3 per minute, whichever worker serves each
            with httpx2.Client(base_url=server.url, timeout=10) as fresh:
                r = fresh.post("/v1/chat/completions", json=HI, headers={"authorization": f"Bearer {limited}"})
                statuses.append(r.status_code)
    assert seen == {"0", "1"}
    assert [r.status_code for r in answered] == [200] * 6
    assert sorted(statuses) == [200, 200, 200, 429, 429, 429]  # the limit holds across workers
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0
    con = sqlite3.connect(db)
    try:
        ok = con.execute("select count(*) from request_log where final and status = 'ok'").fetchone()[0]
    finally:
        con.close()
    assert ok == 9  # every answered request, from both workers, flushed before they exited


def test_every_new_connection_is_answered_and_spread_over_both_workers(two_workers):
    """Each worker listens on a socket of its own in the port's SO_REUSEPORT group, and the
    parent's socket (bound, holding the port) never listens: a connection the kernel gave to a
    socket nobody accepts on would hang here until the timeout."""
    server, _ = two_workers
    counts: dict[str, int] = {}
    for _ in range(100):
        with httpx2.Client(base_url=server.url, timeout=5) as fresh:
            w = worker_of(fresh.get("/metrics").text)
        counts[w] = counts.get(w, 0) + 1
    assert sum(counts.values()) == 100
    assert len(counts) == 2 and min(counts.values()) >= 15, counts  # the kernel's hash, not one busy accept loop


def test_workers_is_bounded(tmp_path):
    env = sp.env_for(tmp_path / "none.toml", f"sqlite:///{tmp_path / 'x.db'}")
    # One bad value as a process; every other one in-process (tests/unit/app/test_main.py).
    r = sp.cli(env, "serve", "--workers", "65")
    assert r.returncode != 0 and "--workers" in r.stderr and "Traceback" not in r.stderr


def test_the_server_process_tunes_the_collector_once_built():
    import gc

    from app.server.serve import GC_GEN0, _tune_gc

    before = gc.get_threshold()
    try:
        _tune_gc()
        assert gc.get_threshold()[0] == GC_GEN0 > before[0]
        assert gc.get_freeze_count() > 0  # what was alive at start-up is out of the collector's walks
        assert gc.get_threshold()[1:] == before[1:]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


# -- serve scale -----------------------------------------------------------------------------------
# Scale-out and observability of real ``serve`` processes: two servers on one PostgreSQL share keys,
# rate limits, budgets and the canary ratio; Debian's Prometheus scrapes a server and PromQL counts
# the requests that were sent.


def post_serve_scale(server, key, body):
    return httpx2.post(
        f"{server.base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


# ``pg_url`` (tests/conftest.py): a database of this test's own, copied from the migrated template,
# so the counts and windows start empty and neither server migrates anything at start.
@pytest.mark.postgres
def test_two_servers_share_limits_budget_and_ratio(pg_url, tmp_path):
    with ChaosUpstream() as up:
        # A 5000-token prompt as the upstream reports it: the real cost far above the estimate.
        up.set_default(ok(prompt_tokens=5000))
        cfg = tmp_path / "gateway.toml"
        cfg.write_text(sp.chaos_config(up.url))
        a, b = sp.start_many(2, cfg, pg_url)
        try:
            engine = get_engine(pg_url)
            # rpm: 3 per minute for the key, whichever process counts them.
            _, k = create_key(engine, "shared-rpm", rpm=3)
            codes = [post_serve_scale(s, k, {"model": "gpt-4.1", "messages": HELLO}).status_code for s in (a, b, a, b)]
            assert sorted(codes) == [200, 200, 200, 429]
            assert codes[-1] == 429

            # budget: room for one request's estimate; its real cost (settled by A) uses it up for B.
            body = {"model": "gpt-4.1", "messages": HELLO, "max_tokens": 4}
            est = catalog.cost_usd("gpt-4.1", estimate_prompt_tokens(HELLO), 0, 4)
            _, kb = create_key(engine, "shared-budget", budget_usd=2 * est, period="day")
            assert post_serve_scale(a, kb, body).status_code == 200
            r = post_serve_scale(b, kb, body)
            assert r.status_code == 429 and r.json()["error"]["code"] == "budget_exceeded"

            # the canary ratio set once reaches both processes' routers
            set_ratio(engine, 1.0, expected_version=None, actor="test", reason="all to the canary")

            def sides():
                got = {post_serve_scale(s, k2, body).headers.get("x-gateway-canary-side") for s in (a, b)}
                return got == {"primary"}

            _, k2 = create_key(engine, "ratio-probe")
            sp.wait_for(sides, timeout_s=15, what="both servers to route to the primary")
        finally:
            a.terminate()
            b.terminate()


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_prometheus_scrapes_a_serve_process(tmp_path):
    with ChaosUpstream() as up:
        cfg = tmp_path / "gateway.toml"
        cfg.write_text(sp.chaos_config(up.url))
        server = sp.start(cfg, f"sqlite:///{tmp_path / 'gw.db'}")
        prom = None
        try:
            _, k = create_key(get_engine(f"sqlite:///{tmp_path / 'gw.db'}"), "prom")
            for _ in range(5):
                assert post_serve_scale(server, k, {"model": "gpt-4.1", "messages": HELLO}).status_code == 200
            up.script(server_error(), server_error(), provider="direct")
            for _ in range(2):
                assert post_serve_scale(server, k, {"model": "gpt-4.1", "messages": HELLO}).status_code == 502
            (tmp_path / "prometheus.yml").write_text(
                "global:\n  scrape_interval: 1s\n"
                "scrape_configs:\n  - job_name: gateway\n"
                f"    static_configs: [{{targets: ['127.0.0.1:{server.port}']}}]\n"
            )
            prom_port = sp.free_port()
            prom = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            base = f"http://127.0.0.1:{prom_port}/api/v1"

            def query(expr: str):
                try:
                    r = httpx2.get(f"{base}/query", params={"query": expr}, timeout=5)
                except httpx2.TransportError:
                    return None
                return r.json()["data"]["result"] if r.status_code == 200 else None

            ok_total = sp.wait_for(
                lambda: query('sum(gateway_requests_total{gen_ai_system="direct",status="ok"})'),
                timeout_s=60,
                what="the first scrape",
            )
            assert float(ok_total[0]["value"][1]) == 5
            errors = query('sum by (error_type) (gateway_requests_total{status="error"})')
            assert [(e["metric"]["error_type"], float(e["value"][1])) for e in errors] == [("server_error", 2.0)]
            attempts = query("sum(gateway_attempts_total)")
            assert float(attempts[0]["value"][1]) == 7
            ratio = query("gateway_canary_ratio")
            assert float(ratio[0]["value"][1]) == 0.0
        finally:
            if prom is not None:
                prom.terminate()
                try:
                    prom.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    prom.kill()
            server.terminate()
