"""The scripted chaos upstream: each fault as a client sees it, through raw httpx2 and through the openai SDK
(``max_retries=0``), plus the server's own contract (scripting, recording, clean stop)."""

from __future__ import annotations

import json
import threading
import time

import httpx2
import openai
import pytest

from tests.support.chaos_upstream import (
    ChaosUpstream,
    bad_json,
    chat_body,
    context_length,
    embeddings_body,
    empty_choices,
    function_call_item,
    hang,
    html_200,
    huge,
    interleaved_chunks,
    invalid_parameter,
    json_array_200,
    litellm_invalid_model,
    litellm_no_db,
    logprobs_body,
    message_item,
    mid_stream_drop,
    model_body,
    models_body,
    null_choices,
    ok,
    openai_like,
    rate_limited,
    redirect,
    refusal_body,
    reply,
    reset,
    response_body,
    response_events,
    server_error,
    sse,
    stream_null_choices,
    text_chunks,
    text_completion_body,
    tool_call,
    tool_call_body,
    tool_call_chunks,
    trickle,
    unauthorized_echo,
    unavailable,
    usage,
)
from tests.support.openai_schema import SchemaError, validate
from tests.support.wire_tap import WireTap, parse_sse, validate_exchange

KEY = "sk-chaos-test-key-0123456789"
MESSAGES = [{"role": "user", "content": "hi"}]
BODY = {"model": "gpt-4.1", "messages": MESSAGES}


@pytest.fixture
def up():
    before = set(threading.enumerate())
    with ChaosUpstream() as server:
        yield server
    # stop() joined every handler and the serving thread: nothing of ours is left running.
    assert set(threading.enumerate()) <= before


@pytest.fixture
def http(up):
    with httpx2.Client(base_url=up.base_url(), timeout=2.0) as client:
        yield client


@pytest.fixture
def sdk(up):
    client = openai.OpenAI(base_url=up.base_url(), api_key=KEY, max_retries=0, timeout=2.0)
    yield client
    client.close()


def post(http: httpx2.Client, **extra) -> httpx2.Response:
    return http.post("/chat/completions", json={**BODY, **extra}, headers={"authorization": f"Bearer {KEY}"})


# -- valid answers -----------------------------------------------------------------------------------
def test_default_is_a_valid_completion_and_requests_are_recorded(up, http, sdk):
    r = post(http)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["choices"][0]["message"]["content"] == "chaos says hello"
    resp = sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES, extra_headers={"x-session-id": "s1"})
    assert resp.choices[0].message.content == "chaos says hello" and resp.model == "gpt-4.1"
    assert resp.usage.prompt_tokens == 5 and resp.usage.total_tokens == 5 + resp.usage.completion_tokens
    assert [(q.method, q.path, q.fault) for q in up.requests] == [("POST", "/v1/chat/completions", "ok")] * 2
    last = up.requests[-1]
    assert last.headers["authorization"] == f"Bearer {KEY}" and last.headers["x-session-id"] == "s1"
    assert last.json["messages"] == MESSAGES and last.provider == ""


def test_stream_ok_has_content_finish_reason_and_usage(up, sdk):
    up.script(ok("alpha beta gamma"))
    chunks = list(
        sdk.chat.completions.create(
            model="gpt-4.1", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "alpha beta gamma"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert up.requests[0].wants_stream


def test_scripts_are_per_provider_queues_then_the_default(up):
    up.script(unavailable(), provider="a")
    up.set_default(server_error(), provider="b")
    with httpx2.Client(timeout=2.0) as c:
        assert c.post(up.base_url("a") + "/chat/completions", json=BODY).status_code == 503
        assert c.post(up.base_url("a") + "/chat/completions", json=BODY).status_code == 200
        assert c.post(up.base_url("b") + "/chat/completions", json=BODY).status_code == 500
        assert c.get(up.base_url("a") + "/models").json()["data"][0]["id"]
    assert [q.provider for q in up.requests] == ["a", "a", "b", "a"]
    assert [q.fault for q in up.requests_for("a")] == ["unavailable_503", "ok", "ok"]
    assert up.pending("a") == 0


# -- HTTP errors -------------------------------------------------------------------------------------
def test_503_with_a_lone_surrogate_escape_in_the_json_message(up, http, sdk):
    up.script(unavailable("bad \udcff thing"), unavailable("bad \udcff thing"))
    r = post(http)
    assert r.status_code == 503 and b'"bad \\udcff thing"' in r.content  # the six-character escape
    message = r.json()["error"]["message"]
    assert message == "bad \udcff thing"
    with pytest.raises(UnicodeEncodeError):
        message.encode("utf-8")  # what broke the request log in issue 7
    with pytest.raises(openai.InternalServerError) as e:
        sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    assert e.value.status_code == 503 and e.value.body["message"] == "bad \udcff thing"


def test_500(up, sdk):
    up.script(server_error("boom"))
    with pytest.raises(openai.InternalServerError) as e:
        sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    assert e.value.status_code == 500 and e.value.body["message"] == "boom"


def test_429_carries_retry_after_and_retry_after_ms(up, http, sdk):
    up.script(rate_limited(retry_after_s=7, retry_after_ms=1500), rate_limited(retry_after_s=3))
    r = post(http)
    assert r.status_code == 429 and r.headers["retry-after"] == "7" and r.headers["retry-after-ms"] == "1500"
    with pytest.raises(openai.RateLimitError) as e:
        sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    assert e.value.response.headers["retry-after"] == "3" and "retry-after-ms" not in e.value.response.headers
    assert len(up.requests) == 2  # max_retries=0: the SDK did not retry behind our back


def test_401_echoes_the_authorization_header(up, sdk):
    up.script(unauthorized_echo())
    with pytest.raises(openai.AuthenticationError) as e:
        sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    assert e.value.status_code == 401
    assert e.value.body["message"] == f"Incorrect API key provided: Bearer {KEY}"


@pytest.mark.parametrize(
    ("fault", "needle", "code"),
    [
        (litellm_invalid_model("gpt-4.1"), "Invalid model name passed in model=gpt-4.1", "400"),
        (litellm_no_db(), "No connected db.", "400"),
        (context_length(), "maximum context length is 128000 tokens", "context_length_exceeded"),
        (invalid_parameter("temperature"), "Invalid value for 'temperature'", "invalid_value"),
    ],
)
def test_400_flavours(up, http, sdk, fault, needle, code):
    up.script(fault, fault)
    r = post(http)
    assert r.status_code == 400 and r.json()["error"]["code"] == code
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    assert needle in e.value.body["message"] and e.value.code == code


def test_redirect_is_seen_by_a_plain_client_but_followed_by_the_sdk_default(up, http, sdk):
    target = up.base_url("elsewhere") + "/chat/completions"
    up.script(redirect(target), redirect(target), redirect(target))
    r = post(http)
    assert r.status_code == 307 and r.headers["location"] == target
    assert [q.provider for q in up.requests] == [""]  # httpx2 does not follow by default
    # The SDK's own default client follows: the POST, its body and the key go to the Location.
    resp = sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    assert resp.choices[0].message.content == "chaos says hello"
    moved = up.requests[-1]
    assert (moved.provider, moved.method, moved.json["messages"]) == ("elsewhere", "POST", MESSAGES)
    assert moved.headers["authorization"] == f"Bearer {KEY}"
    # Given a plain httpx2.Client (as the router builds its clients), the SDK sees the 307 as an error.
    with httpx2.Client() as hc:
        plain = openai.OpenAI(base_url=up.base_url(), api_key=KEY, max_retries=0, timeout=2.0, http_client=hc)
        with pytest.raises(openai.APIStatusError) as e:
            plain.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    assert e.value.status_code == 307
    assert [q.provider for q in up.requests] == ["", "", "elsewhere", ""]


# -- the connection itself ---------------------------------------------------------------------------
def test_hang_times_out_on_the_client_and_stop_releases_the_handler(up, sdk):
    up.script(hang(), hang())
    with httpx2.Client(timeout=httpx2.Timeout(0.2)) as c, pytest.raises(httpx2.ReadTimeout):
        c.post(up.base_url() + "/chat/completions", json=BODY)
    with pytest.raises(openai.APITimeoutError):
        sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES, timeout=0.2)
    assert [q.fault for q in up.requests] == ["hang", "hang"]


def test_hang_with_the_client_still_waiting_ends_when_the_server_stops():
    before = set(threading.enumerate())
    up = ChaosUpstream().start()
    up.script(hang())
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            httpx2.post(up.base_url() + "/chat/completions", json=BODY, timeout=30)
        except httpx2.HTTPError as exc:
            outcome.append(exc)

    t = threading.Thread(target=call)
    t.start()
    up.wait_for_requests(1)
    up.stop()
    t.join(timeout=5)
    assert not t.is_alive() and isinstance(outcome[0], httpx2.RemoteProtocolError)
    assert set(threading.enumerate()) <= before


def test_reset_is_a_connection_error(up, http, sdk):
    up.script(reset(), reset())
    with pytest.raises(httpx2.ReadError, match="reset"):
        post(http)
    with pytest.raises(openai.APIConnectionError) as e:
        sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    assert not isinstance(e.value, openai.APITimeoutError)


def test_mid_stream_drop_delivers_some_chunks_then_a_protocol_error(up, http, sdk):
    up.script(mid_stream_drop(after_chunks=3), mid_stream_drop(after_chunks=3))
    received = []
    with (
        pytest.raises(httpx2.RemoteProtocolError, match="incomplete chunked read"),
        http.stream("POST", "/chat/completions", json={**BODY, "stream": True}) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        for line in r.iter_lines():
            if line.startswith("data: "):
                received.append(json.loads(line[6:]))
    assert len(received) == 3 and b"[DONE]" not in json.dumps(received).encode()
    texts = []
    with pytest.raises(openai.APIConnectionError):  # the SDK wraps it: no finish_reason ever arrived
        for chunk in sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES, stream=True):
            texts.append(chunk.choices[0].delta.content)
            assert chunk.choices[0].finish_reason is None
    assert texts == ["", "one", " two"]


# -- malformed 200s ----------------------------------------------------------------------------------
def test_bad_json_200(up, http, sdk):
    up.script(bad_json(), bad_json())
    r = post(http)
    assert r.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        r.json()
    with pytest.raises(json.JSONDecodeError):  # raw from the SDK, not an openai.APIError
        sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)


def test_html_200_reaches_the_sdk_caller_as_a_string(up, http, sdk):
    up.script(html_200(), html_200())
    r = post(http)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    resp = sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    # The SDK does not validate: the caller gets the page text, and resp.choices would raise.
    assert isinstance(resp, str) and "nginx" in resp


def test_json_array_200_reaches_the_sdk_caller_unvalidated(up, sdk):
    up.script(json_array_200())
    resp = sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    assert not hasattr(resp, "choices")  # whatever it is, it is not a completion


@pytest.mark.parametrize(("fault", "expected"), [(empty_choices(), []), (null_choices(), None)])
def test_empty_and_null_choices(up, http, sdk, fault, expected):
    up.script(fault, fault, fault)
    assert post(http).json()["choices"] == expected
    resp = sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    assert resp.choices == expected  # a "successful" completion with no answer in it
    chunks = list(sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES, stream=True))
    assert [c.choices for c in chunks] == [expected]


def test_stream_chunk_with_null_choices(up, sdk):
    up.script(stream_null_choices("half an answer"))
    chunks = list(sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES, stream=True))
    assert chunks[1].choices is None  # what made `for choice in chunk.choices` raise TypeError
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "half an answer"


# -- slow and big ------------------------------------------------------------------------------------
def test_trickle_never_trips_a_per_read_timeout(up, http):
    interval, read_timeout, wanted = 0.005, 0.25, 120
    up.script(trickle(interval))
    received = 0
    started = time.monotonic()
    with http.stream("POST", "/chat/completions", json=BODY, timeout=httpx2.Timeout(read_timeout)) as r:
        length = int(r.headers["content-length"])
        for piece in r.iter_raw():
            received += len(piece)
            if received >= wanted:
                break
    waited = time.monotonic() - started
    # The server sends byte i only after i pauses of `interval`, so `waited` has a guaranteed lower
    # bound well above the read timeout, and yet no read ever timed out: only an overall deadline
    # can bound this exchange.
    assert length > wanted and received >= wanted
    assert waited >= (wanted - 1) * interval > 2 * read_timeout


def test_trickle_completes_through_the_sdk_despite_a_short_timeout(up, sdk):
    interval, read_timeout = 0.0015, 0.25
    up.script(trickle(interval, text="x"))
    started = time.monotonic()
    raw = sdk.chat.completions.with_raw_response.create(model="gpt-4.1", messages=MESSAGES, timeout=read_timeout)
    waited = time.monotonic() - started
    length = int(raw.headers["content-length"])
    assert raw.parse().choices[0].message.content == "x"
    assert waited >= (length - 1) * interval > read_timeout  # answered, long after its "timeout"


def test_trickle_streams_sse_one_byte_per_chunk(up, sdk):
    up.script(trickle(0.0005, text="slow stream"))
    chunks = list(sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES, stream=True, timeout=0.25))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "slow stream"
    assert chunks[-1].usage is not None and up.requests[0].fault == "trickle"


def test_trickle_is_released_by_stop():
    before = set(threading.enumerate())
    up = ChaosUpstream().start()
    up.script(trickle(60.0))  # one byte, then a minute's pause
    with httpx2.Client(timeout=httpx2.Timeout(5.0)) as c, c.stream("POST", up.base_url() + "/x", json={}) as r:
        pieces = r.iter_raw()
        first = next(pieces)
        up.stop()
        with pytest.raises(httpx2.RemoteProtocolError):
            list(pieces)
    assert first == b"{"
    assert set(threading.enumerate()) <= before


def test_huge_body_is_a_valid_completion_of_the_requested_size(up, http):
    size = 50 * 1024 * 1024
    up.script(huge(size))
    total = 0
    with http.stream("POST", "/chat/completions", json=BODY) as r:
        assert r.status_code == 200 and int(r.headers["content-length"]) == size
        for piece in r.iter_raw():
            total += len(piece)
    assert total == size


def test_huge_body_through_the_sdk(up, sdk):
    up.script(huge(2 * 1024 * 1024))
    resp = sdk.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
    assert len(resp.choices[0].message.content) > 2 * 1024 * 1024 - 1024


def test_client_abandoning_a_huge_body_does_not_block_stop():
    before = set(threading.enumerate())
    up = ChaosUpstream().start()
    up.script(huge(200 * 1024 * 1024))
    with httpx2.Client(timeout=5.0) as c, c.stream("POST", up.base_url() + "/x", json={}) as r:
        next(r.iter_raw())  # read a little, then leave the server blocked on a full socket buffer
        up.stop()
    assert set(threading.enumerate()) <= before


def test_stop_is_idempotent_and_closes_keep_alive_connections():
    before = set(threading.enumerate())
    up = ChaosUpstream().start()
    with httpx2.Client(timeout=2.0) as c:
        assert c.post(up.base_url() + "/chat/completions", json=BODY).status_code == 200  # connection kept
        up.stop()
        up.stop()
    assert set(threading.enumerate()) <= before
    with pytest.raises(RuntimeError, match="not running"):
        _ = up.url


# -- scripted upstream -----------------------------------------------------------------------------
# The scripted upstream's valid answers (tests/support/chaos_upstream.py): any JSON answer with
# status and headers, SSE streams (plain and with named events), the usage chunk only when asked,
# every path served and recorded, and every builder shaped as the official OpenAI schema says.


M = "gpt-4.1"
CALLS = [tool_call("call_1", "get_weather", {"city": "Paris"}), tool_call("call_2", "get_time", {"tz": "CET"})]


@pytest.fixture
def up_scripted_upstream():
    before = set(threading.enumerate())
    with ChaosUpstream() as server:
        yield server
    assert set(threading.enumerate()) <= before


def post_scripted_upstream(up_scripted_upstream, path, body, **kw):
    return httpx2.post(f"{up_scripted_upstream.url}{path}", json=body, timeout=5, **kw)


def test_reply_any_body_status_and_headers(up_scripted_upstream):
    up_scripted_upstream.script(
        reply({"anything": [1, None]}, status=418, headers={"x-ratelimit-remaining-requests": "7"}), provider="p"
    )
    r = post_scripted_upstream(up_scripted_upstream, "/p/v1/whatever", {"x": 1}, headers={"x-custom": "c"})
    assert r.status_code == 418 and r.json() == {"anything": [1, None]}
    assert r.headers["x-ratelimit-remaining-requests"] == "7"
    rec = up_scripted_upstream.requests_for("p")[0]
    assert (rec.method, rec.path, rec.provider, rec.json) == ("POST", "/p/v1/whatever", "p", {"x": 1})
    assert rec.headers["x-custom"] == "c" and rec.fault == "reply"


def test_reply_body_can_depend_on_the_request(up_scripted_upstream):
    up_scripted_upstream.script(reply(lambda req: {"echo": req.json["v"]}))
    assert post_scripted_upstream(up_scripted_upstream, "/v1/chat/completions", {"v": 42}).json() == {"echo": 42}


def test_sse_chunks_in_order_and_done(up_scripted_upstream):
    chunks = text_chunks(M, "a b c")
    up_scripted_upstream.script(sse(chunks, headers={"openai-processing-ms": "12"}))
    r = post_scripted_upstream(up_scripted_upstream, "/v1/chat/completions", {"stream": True})
    assert r.headers["content-type"] == "text/event-stream" and r.headers["openai-processing-ms"] == "12"
    events = parse_sse(r.content)
    assert events[-1] == (None, "[DONE]")
    # Not asked for: the usage-only chunk is withheld, as OpenAI does.
    assert [d for _, d in events[:-1]] == [c for c in chunks if c["choices"]]


def test_sse_usage_chunk_when_asked(up_scripted_upstream):
    chunks = text_chunks(M, "a b")
    up_scripted_upstream.script(sse(chunks))
    r = post_scripted_upstream(
        up_scripted_upstream, "/v1/chat/completions", {"stream": True, "stream_options": {"include_usage": True}}
    )
    assert [d for _, d in parse_sse(r.content)[:-1]] == chunks


def test_sse_named_events_have_no_done(up_scripted_upstream):
    events = response_events(M, "hi there")
    up_scripted_upstream.script(sse(events, named=True))
    got = parse_sse(post_scripted_upstream(up_scripted_upstream, "/v1/responses", {"stream": True}).content)
    assert got == [(e["type"], e) for e in events]


def test_openai_like_answers_each_endpoint_validly(up_scripted_upstream):
    up_scripted_upstream.set_default(openai_like())
    cases = [
        ("POST", "/d/v1/chat/completions", {"model": M, "messages": []}),
        ("POST", "/d/v1/chat/completions", {"model": M, "messages": [], "stream": True}),
        ("POST", "/d/v1/responses", {"model": M, "input": "x"}),
        ("POST", "/d/v1/responses", {"model": M, "input": "x", "stream": True}),
        ("POST", "/d/v1/embeddings", {"model": "e", "input": ["a", "b", "c"]}),
        ("POST", "/d/v1/completions", {"model": M, "prompt": "x"}),
        ("GET", "/d/v1/models", None),
        ("GET", "/d/v1/models/gpt-4.1", None),
    ]
    for method, path, body in cases:
        r = httpx2.request(method, f"{up_scripted_upstream.url}{path}", json=body, timeout=5)
        assert r.status_code == 200, path
        assert validate_exchange(method, path, 200, r.headers["content-type"], r.content) >= 1
    assert (
        len(httpx2.post(f"{up_scripted_upstream.url}/d/v1/embeddings", json={"input": ["a", "b", "c"]}).json()["data"])
        == 3
    )
    assert httpx2.get(f"{up_scripted_upstream.url}/d/v1/models/gpt-4.1").json()["id"] == "gpt-4.1"
    assert [r.path for r in up_scripted_upstream.requests_for("d")][:2] == ["/d/v1/chat/completions"] * 2


def test_builders_are_schema_valid():
    for body in (
        chat_body(M),
        tool_call_body(M, CALLS),
        refusal_body(M),
        logprobs_body(M),
        chat_body(M, usage_=usage(10, 200, cached=5, reasoning=128)),
    ):
        validate("CreateChatCompletionResponse", body)
    for chunk in text_chunks(M) + tool_call_chunks(M, CALLS) + interleaved_chunks(M, ["a b c", "d e"]):
        validate("CreateChatCompletionStreamResponse", chunk)
    validate("CreateEmbeddingResponse", embeddings_body("e", [[0.1, 0.2]]))
    validate("CreateCompletionResponse", text_completion_body(M, ["x", "y"]))
    validate("Model", model_body(M))
    validate("ListModelsResponse", models_body([M, "e"]))
    items = [message_item("hi there"), function_call_item("call_9", "f", {"a": 1})]
    validate("Response", response_body(M, items))
    for event in response_events(M, items):
        validate("ResponseStreamEvent", event)


def test_tool_call_chunks_stream_the_call_as_openai_does():
    chunks = tool_call_chunks(M, CALLS, fragments=3)
    deltas = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls", [])]
    heads = [d for d in deltas if "id" in d]
    assert [(d["index"], d["id"], d["function"]["name"], d["function"]["arguments"]) for d in heads] == [
        (0, "call_1", "get_weather", ""),
        (1, "call_2", "get_time", ""),
    ]
    for i, call in enumerate(CALLS):
        frags = [d["function"]["arguments"] for d in deltas if d["index"] == i and "id" not in d]
        assert len(frags) > 1 and "".join(frags) == call["function"]["arguments"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls" and chunks[-1]["choices"] == []


def test_interleaved_chunks_alternate_indexes():
    chunks = interleaved_chunks(M, ["a b", "c d"])
    content = [(c["choices"][0]["index"], c["choices"][0]["delta"].get("content")) for c in chunks if c["choices"]]
    assert content[2:6] == [(0, "a"), (1, "c"), (0, " b"), (1, " d")]


def test_response_events_reassemble_the_final_response():
    items = [message_item("one two"), function_call_item("call_9", "f", {"a": 1})]
    events = response_events(M, items)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert (text, args) == ("one two", '{"a": 1}')
    assert events[-1]["response"]["output"] == items


def test_wire_tap_records_and_validates_what_a_client_read(up_scripted_upstream):
    tap = WireTap()
    up_scripted_upstream.script(
        reply(chat_body(M)), sse(text_chunks(M, "x y")), reply({**chat_body(M), "system_fingerprint": None})
    )
    with tap.client() as client:
        client.post(f"{up_scripted_upstream.base_url()}/chat/completions", json={"model": M})
        with client.stream(
            "POST", f"{up_scripted_upstream.base_url()}/chat/completions", json={"model": M, "stream": True}
        ) as r:
            assert b"".join(r.iter_bytes()).endswith(b"data: [DONE]\n\n")
        assert [ex.sent_json for ex in tap.exchanges] == [{"model": M}, {"model": M, "stream": True}]
        assert tap.validate_all() == 1 + 4  # the completion; role, two words, finish (no usage: not asked)
        client.post(f"{up_scripted_upstream.base_url()}/chat/completions", json={"model": M})
    with pytest.raises(SchemaError, match=r"POST /v1/chat/completions -> 200: .*\$\.system_fingerprint"):
        tap.validate_all()
