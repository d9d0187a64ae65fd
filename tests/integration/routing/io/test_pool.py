"""The upstream connection pool against a real slow loopback upstream."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.routing.io.async_client import AsyncRoutingClient
from app.routing.result import AllRoutesFailed
from app.server import wire
from app.server.handler import status_for

HI = [{"role": "user", "content": "hi"}]


SLOTS = 3


STREAMS = 120


def _sse(obj: str) -> bytes:
    data = f"data: {obj}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


CHUNK = '{{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{choice}]{usage}}}'


ROLE = CHUNK.format(choice='{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}', usage="")


TEXT = CHUNK.format(choice='{"index":0,"delta":{"content":"slow hello"},"finish_reason":null}', usage="")


STOP = CHUNK.format(choice='{"index":0,"delta":{},"finish_reason":"stop"}', usage="")


USAGE = CHUNK.format(choice="", usage=',"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}')


class SlowUpstream:
    """Healthy but slow: each stream holds its connection ``hold_s`` before its text. Counts the
    requests it serves at once, per path prefix (provider)."""

    def __init__(self, hold_s: float):
        self.hold_s = hold_s
        self.active: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.served = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_server(self._conn, "127.0.0.1", 0, backlog=1024))
        self.port = self.server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = next((int(x.split(":", 1)[1]) for x in lines if x.lower().startswith("content-length:")), 0)
                await reader.readexactly(length)
                provider = lines[0].split()[1].split("/")[1]
                self.active[provider] = self.active.get(provider, 0) + 1
                self.peak[provider] = max(self.peak.get(provider, 0), self.active[provider])
                try:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                        + _sse(ROLE)
                    )
                    await writer.drain()
                    await asyncio.sleep(self.hold_s)
                    writer.write(_sse(TEXT) + _sse(STOP) + _sse(USAGE) + _sse("[DONE]") + b"0\r\n\r\n")
                    await writer.drain()
                    self.served += 1
                finally:
                    self.active[provider] -= 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        async def shut() -> None:
            self.server.close()
            conns = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in conns:
                t.cancel()  # connections still open end here, not when the loop is gone
            await asyncio.gather(*conns, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture
def slow():
    up = SlowUpstream(hold_s=0.25)
    yield up
    up.stop()


def config(port: int, *, slots: int, wait_s: float) -> str:
    return "".join(
        [
            '[routing]\nprimary = "one"\nfallback = "two"\n',
            *(
                f'[providers.{n}]\nbase_url = "http://127.0.0.1:{port}/{n}/v1"\napi_key_env = "POOL_TEST_KEY"\n'
                f'models = ["gpt-4.1"]\ndefault_model = "gpt-4.1"\nmax_connections = {slots}\n'
                f"pool_timeout_s = {wait_s}\n"
                for n in ("one", "two")
            ),
        ]
    )


async def _stream(driver: AsyncRoutingClient) -> str:
    stream = driver.chat_stream(HI, model="gpt-4.1")
    async with stream:
        return "".join([piece async for piece in stream])


def test_a_full_pool_is_503_overloaded_and_never_opens_a_breaker(slow, client_factory, sqlite_url):
    client = client_factory(
        sqlite_url, toml=config(slow.port, slots=SLOTS, wait_s=0.1), env={"POOL_TEST_KEY": "sk-pool"}
    )

    async def main():
        driver = AsyncRoutingClient(client)
        try:
            outcomes = await asyncio.gather(*[_stream(driver) for _ in range(STREAMS)], return_exceptions=True)
            after = await _stream(driver)  # the next ordinary request, once the load has gone
            pools = {n: (p.in_use, p.waiting, p.exhausted) for n, p in driver.pools.items()}
            return outcomes, after, pools
        finally:
            await driver.aclose()

    outcomes, after, pools = asyncio.run(main())
    served = [o for o in outcomes if o == "slow hello"]
    refused = [o for o in outcomes if isinstance(o, AllRoutesFailed)]
    assert len(served) + len(refused) == STREAMS, [o for o in outcomes if not isinstance(o, str | AllRoutesFailed)]
    assert len(served) >= SLOTS and refused  # the pool's slots were all used, and the rest refused
    for exc in refused:
        assert [a.error_class for a in exc.attempts] == ["gateway_overloaded"]  # no retry, no fallback
        err = status_for(exc)
        assert err.status == 503 and err.code == wire.OVERLOADED and err.headers["Retry-After"] == "1"
    # The upstream never held more than the slots of a provider; nothing was waiting or held at the end.
    assert max(slow.peak.values()) <= SLOTS
    assert all(in_use == 0 and waiting == 0 for in_use, waiting, _ in pools.values())
    assert sum(exhausted for *_, exhausted in pools.values()) == len(refused)
    # Saturation said nothing about the providers' health.
    assert {s.state for s in client.core.breaker_states().values()} == {"closed"}
    assert after == "slow hello"


def test_a_wait_for_a_slot_that_ends_in_time_is_served(slow, client_factory, sqlite_url):
    """Within pool_timeout_s, a request queued behind busy slots is served, not refused."""
    client = client_factory(sqlite_url, toml=config(slow.port, slots=1, wait_s=30), env={"POOL_TEST_KEY": "sk-pool"})

    async def main():
        driver = AsyncRoutingClient(client)
        try:
            return await asyncio.gather(*[_stream(driver) for _ in range(3)])
        finally:
            await driver.aclose()

    assert asyncio.run(main()) == ["slow hello"] * 3
    assert max(slow.peak.values()) == 1
