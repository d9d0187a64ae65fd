"""An upstream cannot make the gateway buffer an answer of any size: ``retry.max_response_bytes``
bounds each attempt's body, declared or not, streamed or not, in both drivers (see
:mod:`app.routing.io.body_limit`). Built on the chaos upstream like tests/integration/routing/io/test_async_client.py.
"""

from __future__ import annotations

import asyncio

import pytest

from app.routing import StreamBrokenError
from app.routing.io.async_client import AsyncRoutingClient
from tests.integration.routing.io.test_async_client import BOUND_S, router, stream_async, up  # noqa: F401 - fixtures
from tests.integration.routing.io.test_client import HI, chaos_requests, flushed, log_rows
from tests.support.chaos_upstream import huge, ok

LIMIT = 64 * 1024
LIMITED = {"retry": f"max_response_bytes = {LIMIT}"}


def chat_both(client):
    """The same request through the sync client and the async driver built from it."""

    async def via_async():
        async with AsyncRoutingClient(client) as driver:
            return await asyncio.wait_for(driver.chat(HI), BOUND_S)

    return client.chat(HI), asyncio.run(via_async())


@pytest.mark.parametrize(
    ("chunked", "said"),
    [(False, "declared 2,097,152 bytes"), (True, "more than that")],
    ids=["content-length", "chunked"],
)
def test_an_oversized_answer_fails_over_in_both_drivers(router, up, chunked, said):  # noqa: F811
    up.set_default(huge(2 * 1024 * 1024, chunked=chunked), provider="chaos")
    client = router(sections={**LIMITED, "retry": f"max_response_bytes = {LIMIT}\nmax_attempts = 1"})
    for result in chat_both(client):
        assert result.provider == "direct" and result.fallback_used
        first = result.attempt_log[0]
        assert (first.provider, first.error_class) == ("chaos", "bad_response")
        assert f"larger than the limit of {LIMIT:,} bytes ({said})" in (first.error or "")
    assert chaos_requests(up) == 2


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_answer_within_the_limit_is_served(router, up, chunked):  # noqa: F811
    up.set_default(huge(LIMIT - 1024, chunked=chunked), provider="chaos")
    client = router(sections=LIMITED)
    for result in chat_both(client):
        assert result.provider == "chaos" and len(result.text) > LIMIT // 2


def test_a_stream_passing_the_limit_after_its_first_text_is_broken_not_re_sent(router, up):  # noqa: F811
    up.set_default(ok("word " * 5000), provider="chaos")  # ~5,000 events, far over 64 KiB
    client = router(sections=LIMITED)
    with pytest.raises(StreamBrokenError, match="larger than the limit"):
        list(client.chat(HI, stream=True))
    with pytest.raises(StreamBrokenError, match="larger than the limit"):
        stream_async(client)
    assert chaos_requests(up) == 2  # once per driver: text had gone out, so never re-sent
    assert flushed(client)
    assert [r["error_class"] for r in log_rows(client)] == ["stream_broken", "stream_broken"]


def test_the_limit_is_bounded_in_the_config(tmp_path, up):  # noqa: F811
    from app.config import load_settings
    from core.errors import ConfigurationError

    for bad in ("1024", "1e400", "-1", '"lots"'):
        cfg = tmp_path / "gateway.toml"
        cfg.write_text(f"[retry]\nmax_response_bytes = {bad}\n")
        with pytest.raises(ConfigurationError, match="max_response_bytes"):
            load_settings(str(cfg))
