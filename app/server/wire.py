"""The OpenAI wire format as the gateway server speaks it: request validation, SSE framing and error
objects. Pure functions of their inputs (no I/O). The answers themselves are the upstreams',
forwarded whole; the server builds none of its own.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

from core import fastjson

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_MODEL_LEN = 256
MAX_MESSAGES = 10_000
MAX_OUTPUT_TOKENS = 1_000_000
MAX_STOP = 4
MAX_USER_LEN = 256
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
SSE_DONE = b"data: [DONE]\n\n"
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"


def _dumps(obj: Any) -> bytes:
    return fastjson.dumps(obj)  # json.dumps(obj, separators=(",", ":"), ensure_ascii=False), UTF-8


# ------------------------------------------------------------------------------------------ errors

# status -> (type, default code). Where OpenAI's own API answers with a known type and code, the
# same ones (401 invalid_api_key, 404 model_not_found, 429 rate_limit_exceeded); the SDK picks its
# exception class from the status alone.
ERROR_TYPES: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", "model_not_allowed"),
    404: ("invalid_request_error", "not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    502: ("upstream_error", "bad_gateway"),
    503: ("service_unavailable", "no_healthy_upstream"),
    504: ("timeout", "upstream_timeout"),
}


# The gateway's own error bodies, each encoded once: a flood of refusals sends the same few.
_ERROR_BODIES: dict[tuple[str, str, str | None, str | None], bytes] = {}


class WireError(Exception):
    """An error the server answers with as an OpenAI error object; ``headers`` go on the response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,  # the wire field's name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        upstream: dict | None = None,
    ):
        default_type, default_code = ERROR_TYPES.get(status, ("server_error", None))
        # An upstream's own error object (cleaned by the router), answered as it was sent.
        self.upstream = upstream
        self.status = status
        self.message = message
        self.type = type or default_type
        self.param = param
        self.code = code if code is not None else default_code
        self.headers = dict(headers or {})
        super().__init__(message)

    def body(self) -> dict:
        if self.upstream is not None:
            return self.upstream
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_json(self) -> bytes:
        if self.upstream is not None:
            return _dumps(self.upstream)
        key = (self.message, self.type, self.param, self.code)
        body = _ERROR_BODIES.get(key)
        if body is None:
            if len(_ERROR_BODIES) >= 256:  # bounded, whatever the messages
                _ERROR_BODIES.clear()
            body = _ERROR_BODIES[key] = _dumps(self.body())
        return body

    def to_sse(self) -> bytes:
        """The error as an SSE event, for failures after a stream has started (the SDK raises it)."""
        return b"data: " + self.to_json() + b"\n\n"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> WireError:
    return WireError(400, message, param=param, code=code)


def unauthorized(message: str = "") -> WireError:
    return WireError(
        401,
        message
        or "Missing or invalid gateway key. Fix: send the header 'Authorization: Bearer gw-...' "
        "with a key from `python -m app keys create`.",
        headers={"WWW-Authenticate": "Bearer"},
    )


def model_not_allowed(model: str) -> WireError:
    return WireError(403, f"This gateway key may not use the model '{model}'.", param="model")


def model_not_found(model: str) -> WireError:
    return WireError(
        404,
        f"The model '{model}' is not served by this gateway. Fix: see GET /v1/models, or use 'auto'.",
        param="model",
        code="model_not_found",
    )


def route_not_found(method: str, path: str) -> WireError:
    return WireError(404, f"Unknown request URL: {method} {path}.", code="unknown_url")


def method_not_allowed(method: str, path: str) -> WireError:
    # 405 is not in the SDK's status table, but some clients probe; answer in the same shape.
    return WireError(405, f"Method {method} is not allowed for {path}.", type="invalid_request_error")


def unsupported_content_type(given: str | None) -> WireError:
    """415 for a routed API's body that is not declared JSON. OpenAI refuses these too, with this
    code (it answers 400); 415 is HTTP's status for it, and no client retries either."""
    shown = "no Content-Type" if given is None else f"Content-Type: {given[:100]}"
    return WireError(
        415,
        f"This API accepts only 'application/json' request bodies, but the request has {shown}. "
        "Fix: send the header 'Content-Type: application/json'.",
        type="invalid_request_error",
        code="unsupported_content_type",
    )


def is_json_content_type(value: str | None) -> bool:
    """``application/json``, in any case, with parameters allowed; a charset other than UTF-8
    is not (the body is read as UTF-8, as JSON must be)."""
    if value is None:
        return False
    media, _, params = value.partition(";")
    if media.strip().lower() != "application/json":
        return False
    for param in params.split(";"):
        name, _, v = param.partition("=")
        if name.strip().lower() == "charset" and v.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


def body_too_large(limit: int) -> WireError:
    return WireError(413, f"Request body is larger than this gateway's limit of {limit:,} bytes.")


def rate_limited(message: str, retry_after_s: int, *, tokens: bool = False) -> WireError:
    return WireError(
        429,
        message,
        type="tokens" if tokens else "requests",
        code="tokens_limit_exceeded" if tokens else "rate_limit_exceeded",
        headers={"Retry-After": str(max(1, int(retry_after_s)))},
    )


def budget_exceeded(message: str) -> WireError:
    # OpenAI's quota error type, which clients treat as not worth retrying, with our own code.
    return WireError(429, message, type="insufficient_quota", code="budget_exceeded")


def upstream_failed(message: str = "All upstream providers failed for this request.") -> WireError:
    return WireError(502, message)


def unavailable(message: str = "No provider is available right now (circuit breakers open).") -> WireError:
    return WireError(503, message, headers={"Retry-After": "1"})


OVERLOADED = "gateway_overloaded"


def overloaded(limit: int) -> WireError:
    """503: this gateway process is serving its bound of requests at once (not an upstream's fault)."""
    return WireError(
        503,
        f"The gateway is at its limit of {limit:,} requests in flight; retry shortly.",
        type="service_unavailable",
        code=OVERLOADED,
        headers={"Retry-After": "1"},
    )


STORE_UNAVAILABLE = "gateway_store_unavailable"


def store_unavailable(what: str) -> WireError:
    """503: the gateway's own database did not answer (not an upstream's fault)."""
    return WireError(
        503,
        f"The gateway's database is not answering, so {what}. Retry shortly.",
        type="service_unavailable",
        code=STORE_UNAVAILABLE,
        headers={"Retry-After": "5"},
    )


def upstream_timeout(message: str = "The upstream provider did not answer in time.") -> WireError:
    return WireError(504, message)


# ------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True)
class ChatRequest:
    """A validated request body of one of the routed APIs (``api``: chat, responses, embeddings,
    completions). ``body`` is the whole parsed object: it is forwarded as sent (less ``model`` and
    ``stream``, which the gateway owns). The other fields are what the gateway itself reads."""

    model: str
    messages: list[dict]
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    user: str | None = None
    body: dict = field(default_factory=dict, repr=False)
    api: str = "chat"
    headers: tuple[tuple[bytes, bytes], ...] = field(default=(), repr=False)  # the caller's, raw


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_body(raw: bytes, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> dict:
    """The request body as a JSON object, or a :class:`WireError` (413 too large, 400 otherwise)."""
    if len(raw) > max_body_bytes:
        raise body_too_large(max_body_bytes)
    if not raw.strip():
        raise bad_request("The request body is empty. Fix: send a JSON object.")
    try:
        text = raw.decode("utf-8")  # strictly: json.loads would guess UTF-16/32 from the bytes
    except UnicodeDecodeError:
        raise bad_request("The request body is not UTF-8 text.") from None
    try:
        parsed = fastjson.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise bad_request("The JSON body is nested too deeply.") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's own limit, not a JSON syntax error
            raise bad_request(
                f"A number in the JSON body has more than {sys.get_int_max_str_digits():,} digits; "
                "no parameter takes one that large."
            ) from None
        raise bad_request(f"We could not parse the JSON body of your request: {exc}.") from None
    if not isinstance(parsed, dict):
        raise bad_request(f"The request body must be a JSON object, got {type(parsed).__name__}.")
    return parsed


def _number(body: dict, name: str, lo: float, hi: float) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not lo <= v <= hi:
        raise bad_request(f"'{name}' must be a number between {lo:g} and {hi:g}, got {v!r}.", param=name)
    return float(v)


def _integer(body: dict, name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        shown = v if not isinstance(v, int) or abs(v) < 10**30 else "a huge number"
        raise bad_request(f"'{name}' must be a whole number between {lo:,} and {hi:,}, got {shown!r}.", param=name)
    return v


def _validate_message(i: int, m: object) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"'{where}' must be an object with 'role' and 'content'.", param=where)
    role = m.get("role")
    if role not in ROLES:
        raise bad_request(
            f"'{where}.role' must be one of {', '.join(sorted(ROLES))}, got {role!r}.", param=f"{where}.role"
        )
    content = m.get("content")
    if content is None:
        if role not in ("assistant", "function"):
            raise bad_request(f"'{where}.content' is required for role '{role}'.", param=f"{where}.content")
    elif isinstance(content, list):
        for j, part in enumerate(content):
            p = f"{where}.content[{j}]"
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise bad_request(f"'{p}' must be an object with a 'type'.", param=p)
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise bad_request(f"'{p}.text' must be a string.", param=f"{p}.text")
    elif not isinstance(content, str):
        raise bad_request(f"'{where}.content' must be a string or a list of content parts.", param=f"{where}.content")
    name = m.get("name")
    if name is not None and not isinstance(name, str):
        raise bad_request(f"'{where}.name' must be a string.", param=f"{where}.name")
    return m


def validate_chat_request(body: dict) -> ChatRequest:
    """Check a parsed body against the parts of the chat completions API the gateway interprets."""
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_request("'model' is required and must be a non-empty string (or 'auto').", param="model")
    if len(model) > MAX_MODEL_LEN:
        raise bad_request(f"'model' is longer than {MAX_MODEL_LEN} characters.", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty array.", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"'messages' has more than {MAX_MESSAGES:,} entries.", param="messages")
    msgs = [_validate_message(i, m) for i, m in enumerate(messages)]

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false.", param="stream")
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise bad_request(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
            )
        if not isinstance(opts, dict):
            raise bad_request("'stream_options' must be an object.", param="stream_options")
        iu = opts.get("include_usage", False)
        if not isinstance(iu, bool):
            raise bad_request(
                "'stream_options.include_usage' must be true or false.", param="stream_options.include_usage"
            )
        include_usage = iu

    max_tokens = _integer(body, "max_tokens", 1, MAX_OUTPUT_TOKENS)
    max_completion = _integer(body, "max_completion_tokens", 1, MAX_OUTPUT_TOKENS)
    if max_tokens is not None and max_completion is not None:
        raise bad_request("Send either 'max_tokens' or 'max_completion_tokens', not both.", param="max_tokens")
    _integer(body, "n", 1, 128)
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    _number(body, "presence_penalty", -2.0, 2.0)
    _number(body, "frequency_penalty", -2.0, 2.0)
    seed = _integer(body, "seed", -(2**63), 2**63 - 1)

    stop = body.get("stop")
    stops: list[str] | None = None
    if isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list):
        if len(stop) > MAX_STOP or not all(isinstance(s, str) for s in stop):
            raise bad_request(f"'stop' must be a string or up to {MAX_STOP} strings.", param="stop")
        stops = list(stop)
    elif stop is not None:
        raise bad_request(f"'stop' must be a string or up to {MAX_STOP} strings.", param="stop")

    user = body.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER_LEN):
        raise bad_request(f"'user' must be a string of at most {MAX_USER_LEN} characters.", param="user")

    return ChatRequest(
        model=model,
        messages=msgs,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens if max_tokens is not None else max_completion,
        temperature=temperature,
        top_p=top_p,
        stop=stops,
        seed=seed,
        user=user,
        body=body,
    )


def _model_and_stream(body: dict, *, streams: bool) -> tuple[str, bool]:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_request("'model' is required and must be a non-empty string (or 'auto').", param="model")
    if len(model) > MAX_MODEL_LEN:
        raise bad_request(f"'model' is longer than {MAX_MODEL_LEN} characters.", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false.", param="stream")
    if stream and not streams:
        raise bad_request("This API does not stream; leave 'stream' out.", param="stream")
    return model, stream


def _user(body: dict) -> str | None:
    user = body.get("user", body.get("safety_identifier"))
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER_LEN):
        raise bad_request(f"'user' must be a string of at most {MAX_USER_LEN} characters.", param="user")
    return user


def validate_api_request(api: str, body: dict) -> ChatRequest:
    """Check a parsed body of ``api`` against what the gateway reads of it (the upstream judges
    the rest): chat as :func:`validate_chat_request`; the Responses API needs ``input``,
    embeddings ``input``, completions ``prompt``."""
    if api == "chat":
        return validate_chat_request(body)
    model, stream = _model_and_stream(body, streams=api != "embeddings")
    needed = "prompt" if api == "completions" else "input"
    value = body.get(needed)
    if value is None or (isinstance(value, (str, list)) and not value) or not isinstance(value, (str, list)):
        raise bad_request(f"'{needed}' is required: text or a non-empty array.", param=needed)
    limit = "max_output_tokens" if api == "responses" else "max_tokens"
    max_tokens = _integer(body, limit, 1, MAX_OUTPUT_TOKENS)
    include_usage = False
    if api == "completions" and stream and isinstance(body.get("stream_options"), dict):
        include_usage = body["stream_options"].get("include_usage") is True
    return ChatRequest(
        model=model,
        messages=[],
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0),
        user=_user(body),
        body=body,
        api=api,
    )


def sse_data(obj: Any) -> bytes:
    """One SSE ``data:`` event of a JSON object (chat and completions chunks)."""
    return b"data: " + _dumps(obj) + b"\n\n"


def sse_event(obj: Any) -> bytes:
    """One SSE event with its ``event:`` name (the Responses API's semantic events)."""
    kind = obj.get("type") if isinstance(obj, dict) else None
    head = b"event: " + str(kind).encode("utf-8", "replace") + b"\n" if isinstance(kind, str) else b""
    return head + b"data: " + _dumps(obj) + b"\n\n"


def dumps(obj: Any) -> bytes:
    """A JSON body as the server writes it (compact, UTF-8)."""
    return _dumps(obj)


def parse_chat_request(raw: bytes, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> ChatRequest:
    """Bytes of a ``POST /v1/chat/completions`` body -> :class:`ChatRequest`, or a :class:`WireError`."""
    return validate_chat_request(parse_json_body(raw, max_body_bytes=max_body_bytes))
