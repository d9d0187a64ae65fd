"""A gateway ASGI app with an echo handler and two keys: what the ASGI tests of both tiers serve
(the unit tier in process, the integration tier under a real uvicorn)."""

from __future__ import annotations

from app.server import wire
from app.server.asgi import ChatReply, ChatStreamReply, GatewayApp
from db.keys import KeyRecord
from tests.support import wire_bodies as bodies

MODELS = ["gpt-4.1", "gemini-2.5-flash"]
HELLO = [{"role": "user", "content": "hi"}]
GOOD = "gw-good"
LIMITED = "gw-limited"
KEYS = {
    GOOD: KeyRecord(1, "good", "gw-good", (), None, None, None, None, 0.0, "t", None),
    LIMITED: KeyRecord(2, "limited", "gw-limi", ("gemini-2.5-flash",), None, None, None, None, 0.0, "t", None),
}
GW_HEADERS = {"x-gateway-provider": "direct", "x-gateway-model": "gpt-4.1", "x-gateway-attempts": "1"}


async def echo_handler(req: wire.ChatRequest, key):
    """Answers with the last message reversed, recording who asked."""
    text = req.messages[-1]["content"][::-1]
    usage = bodies.usage_dict(3, len(text), 1)
    if req.stream:

        async def events():
            enc = bodies.ChunkStream(
                completion_id="chatcmpl-t", created=1, model=req.model, include_usage=req.include_usage
            )
            yield enc.role()
            for ch in text:
                yield enc.content(ch)
            yield enc.finish()
            if req.include_usage:
                yield enc.usage(usage)
            yield enc.done()

        return ChatStreamReply(events(), GW_HEADERS)
    body = bodies.completion_body(completion_id="chatcmpl-t", created=1, model=req.model, content=text, usage=usage)
    return ChatReply(body, {**GW_HEADERS, "x-gateway-key": key.name})


def make_app(handler=echo_handler, **kwargs) -> GatewayApp:
    kwargs.setdefault("authenticate", KEYS.get)
    kwargs.setdefault("ready", lambda: {"database": True})
    return GatewayApp(chat_handler=handler, models=MODELS, **kwargs)
