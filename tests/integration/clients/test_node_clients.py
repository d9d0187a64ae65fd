"""Real Node clients against the gateway: openai-node (chat, tool round trip, streamed tool calls) and
the Vercel AI SDK (``generateText`` and ``streamText`` with tools, ``generateObject`` with a zod
schema, the default Responses model of ``@ai-sdk/openai``, and ``@ai-sdk/openai-compatible``).

Each scenario is ``node tests/integration/clients/node/run.mjs NAME`` with ``BASE_URL`` and ``API_KEY`` in its
environment; it prints its result and every HTTP exchange it made (bodies as the client read them),
which are validated here against the official OpenAI schema. The packages are pinned by
tests/integration/clients/node/package-lock.json; ``npm ci --prefix tests/integration/clients/node`` installs them
(scripts/test.sh does, with Debian's nodejs and npm). ``target``: see tests/integration/clients/conftest.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.integration.clients.expect import MODEL, SNAPSHOT, answer_model, forwarded
from tests.support.chaos_upstream import (
    chat_body,
    choice,
    function_call_item,
    reply,
    response_body,
    response_events,
    sse,
    text_chunks,
    tool_call,
    tool_call_body,
    tool_call_chunks,
    usage,
)
from tests.support.wire_tap import validate_exchange

NODE_DIR = Path(__file__).with_name("node")
RESULT = {"city": "Paris", "temp_c": 18.5, "conditions": ["clear"]}


@pytest.fixture(scope="module")
def node() -> str:
    exe = shutil.which("node")
    assert exe, "node is not installed (apt-get install -y nodejs npm; scripts/test.sh does it)"
    assert (NODE_DIR / "node_modules" / "ai").is_dir(), "run: npm ci --prefix tests/integration/clients/node"
    return exe


def run(node: str, target, scenario: str) -> dict:
    """Run one scenario against ``target``; returns its result after validating every exchange."""
    env = {**os.environ, "BASE_URL": target.base_url, "API_KEY": target.api_key}
    proc = subprocess.run(
        [node, str(NODE_DIR / "run.mjs"), scenario], cwd=NODE_DIR, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["failure"] is None, out["failure"]
    for ex in out["wire"]:
        assert ex["body"] is not None, ex
        validate_exchange(
            ex["method"], urlsplit(ex["url"]).path, ex["status"], ex["contentType"] or "", ex["body"].encode()
        )
    # What reached the upstream is what the client sent (bar what the gateway owns).
    sent = [(urlsplit(ex["url"]).path, json.loads(ex["sent"])) for ex in out["wire"] if ex["sent"]]
    assert [r.json for r in target.received] == [forwarded(target, body, path) for path, body in sent]
    out["result"]["_wire"] = out["wire"]
    return out["result"]


WEATHER_PARIS = tool_call("call_n1", "get_weather", {"city": "Paris", "unit": "c"})


# ----------------------------------------------------------------------------------------- openai-node


def test_openai_node_chat(node, target):
    target.script(reply(chat_body(SNAPSHOT, usage_=usage(10, 4, cached=2, reasoning=1))))
    r = run(node, target, "openai_chat")
    assert r["content"] == "Hello from the scripted upstream." and r["model"] == answer_model(target)
    assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 1
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 2
    assert r["fingerprint"] == "fp_chaos_0001"
    assert target.last.json["seed"] == 7


def test_openai_node_tool_round_trip(node, target):
    call = tool_call("call_n1", "get_weather", {"city": "Paris"})
    target.script(reply(tool_call_body(SNAPSHOT, [call])), reply(chat_body(SNAPSHOT, [choice(content="18C")])))
    r = run(node, target, "openai_tools")
    assert r["finish"] == "tool_calls" and r["final"] == "18C"
    assert r["call"] == {"id": "call_n1", "name": "get_weather", "arguments": {"city": "Paris"}}
    leg2 = target.received[1].json["messages"]
    assert leg2[1] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert leg2[2] == {"role": "tool", "tool_call_id": "call_n1", "content": '{"temp":18}'}


def test_openai_node_stream_tool_calls(node, target):
    calls = [WEATHER_PARIS, tool_call("call_n2", "get_weather", {"city": "Lima", "unit": "f"})]
    chunks = tool_call_chunks(SNAPSHOT, calls, fragments=4, usage_=usage(9, 30))
    target.script(sse(chunks))
    r = run(node, target, "openai_stream")
    assert r["calls"] == [
        {"id": c["id"], "name": "get_weather", "arguments": json.loads(c["function"]["arguments"])} for c in calls
    ]
    assert r["chunks"] == len(chunks) and r["usage"]["completion_tokens"] == 30


# ------------------------------------------------------------------------- Vercel AI SDK (chat model)


def test_ai_sdk_generate_text_with_tools(node, target):
    target.script(
        reply(tool_call_body(SNAPSHOT, [WEATHER_PARIS])), reply(chat_body(SNAPSHOT, [choice(content="18C in Paris")]))
    )
    r = run(node, target, "ai_generate_text_tools")
    assert r["text"] == "18C in Paris"
    first, second = r["steps"]
    assert first["finishReason"] == "tool-calls"
    assert first["toolCalls"] == [{"id": "call_n1", "name": "get_weather", "input": {"city": "Paris", "unit": "c"}}]
    assert first["toolResults"] == [{"id": "call_n1", "output": {"city": "Paris", "unit": "c", "temp": 18}}]
    assert second["finishReason"] == "stop"
    leg1, leg2 = (x.json for x in target.received)
    assert leg1["tools"][0]["function"]["name"] == "get_weather"
    assistant, tool = leg2["messages"][1], leg2["messages"][2]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == "call_n1"
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_n1"
    assert json.loads(tool["content"]) == {"city": "Paris", "unit": "c", "temp": 18}


def test_ai_sdk_stream_text_with_tools(node, target):
    call = tool_call("call_n3", "get_weather", {"city": "Oslo", "unit": "f"})
    target.script(sse(tool_call_chunks(SNAPSHOT, [call], fragments=3)), sse(text_chunks(SNAPSHOT, "Cold in Oslo")))
    r = run(node, target, "ai_stream_text_tools")
    assert r["text"] == "Cold in Oslo" and "".join(r["deltas"]) == "Cold in Oslo"
    assert r["steps"][0]["toolCalls"] == [
        {"id": "call_n3", "name": "get_weather", "input": {"city": "Oslo", "unit": "f"}}
    ]
    assert all(x.json["stream"] is True for x in target.received)


def test_ai_sdk_generate_object_with_zod(node, target):
    target.script(reply(chat_body(SNAPSHOT, [choice(content=json.dumps(RESULT))])))
    r = run(node, target, "ai_generate_object")
    assert r["object"] == RESULT and r["finishReason"] == "stop"
    fmt = target.last.json["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "CityWeather"
    assert set(fmt["json_schema"]["schema"]["properties"]) == {"city", "temp_c", "conditions"}


# ------------------------------------------------------------------- Vercel AI SDK (Responses model)


def test_ai_sdk_default_model_uses_responses(node, target):
    target.script(reply(response_body(SNAPSHOT, "¡Hola!")))
    r = run(node, target, "ai_responses_generate")
    assert r["text"] == "¡Hola!" and r["finishReason"] == "stop"
    assert urlsplit(r["_wire"][0]["url"]).path.endswith("/responses")
    assert target.last.path.endswith("/v1/responses") and target.last.json["model"] == MODEL


def test_ai_sdk_responses_stream(node, target):
    target.script(sse(response_events(SNAPSHOT, "Hola amigo mio"), named=True))
    r = run(node, target, "ai_responses_stream")
    assert r["deltas"] == ["Hola", " amigo", " mio"] and r["text"] == "Hola amigo mio"
    assert target.last.json["stream"] is True


def test_ai_sdk_responses_function_call(node, target):
    item = function_call_item("call_n4", "get_weather", {"city": "Kyiv", "unit": "c"})
    target.script(reply(response_body(SNAPSHOT, [item])), reply(response_body(SNAPSHOT, "3C in Kyiv")))
    r = run(node, target, "ai_responses_tools")
    assert r["text"] == "3C in Kyiv"
    assert r["steps"][0]["toolCalls"] == [
        {"id": "call_n4", "name": "get_weather", "input": {"city": "Kyiv", "unit": "c"}}
    ]
    outputs = [i for i in target.received[1].json["input"] if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["call_n4"]


# --------------------------------------------------------------------------- @ai-sdk/openai-compatible


def test_openai_compatible_generate_text_with_tools(node, target):
    call = tool_call("call_n5", "get_weather", {"city": "Rome", "unit": "c"})
    target.script(reply(tool_call_body(SNAPSHOT, [call])), reply(chat_body(SNAPSHOT, [choice(content="Warm in Rome")])))
    r = run(node, target, "compat_generate_text_tools")
    assert r["text"] == "Warm in Rome"
    assert r["steps"][0]["toolResults"] == [{"id": "call_n5", "output": {"city": "Rome", "unit": "c", "temp": 18}}]
    assert target.received[1].json["messages"][2]["tool_call_id"] == "call_n5"


def test_openai_compatible_stream_text_usage(node, target):
    target.script(sse(text_chunks(SNAPSHOT, "one two three", usage_=usage(6, 3))))
    r = run(node, target, "compat_stream_text")
    assert r["deltas"] == ["one", " two", " three"]
    assert r["usage"]["inputTokens"] == 6 and r["usage"]["outputTokens"] == 3
    assert target.last.json["stream_options"] == {"include_usage": True}
