"""What the gateway reads of a request's input, sans I/O: chat messages of every shape (text,
content parts, an assistant turn with only tool calls, tool results), the Responses API's
``input`` items, embeddings' ``input`` and completions' ``prompt``, each as chat-like messages for
the intent rules, the token estimate and the stored prompt. Only what the gateway itself reads is
validated; the upstream judges the rest.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from core.errors import InvalidRequest
from core.text import storable

VALID_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def validate_messages(messages: object) -> list[dict]:
    """Chat messages as the gateway reads them: a non-empty list of objects with a known role and
    text, parts, or (an assistant turn that only calls tools) ``None`` as content. The rest of a
    message (tool calls, tool_call_id, name, audio, ...) is the upstream's to judge."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise InvalidRequest("messages must be a non-empty list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidRequest(f"messages[{i}] must be a mapping with 'role' and 'content'")
        role = m.get("role")
        if role not in VALID_ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(sorted(VALID_ROLES))}, got {role!r}")
        content = m.get("content")
        if content is None and role not in ("assistant", "function"):
            raise InvalidRequest(f"messages[{i}].content is required for role {role!r}")
        if content is not None and not isinstance(content, (str, list)):
            raise InvalidRequest(f"messages[{i}].content must be text or a list of content parts")
        out.append(dict(m))
    return out


def _input_messages(value: object) -> list[dict]:
    """The Responses API's ``input`` as chat-like messages, for the intent rules and the token
    estimate only (the body is forwarded as sent)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("input must be text or a non-empty list of input items")
    out: list[dict] = []
    for item in value:
        if not isinstance(item, Mapping):
            raise InvalidRequest("each input item must be an object")
        content = item.get("content")
        if isinstance(content, list):
            content = [
                {"type": "text", "text": p.get("text")}
                for p in content
                if isinstance(p, Mapping) and isinstance(p.get("text"), str)
            ]
        elif not isinstance(content, str):
            content = item.get("output") if isinstance(item.get("output"), str) else None
        role = item.get("role") if isinstance(item.get("role"), str) else "user"
        out.append({"role": role, "content": content})
    return out


def _embedding_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return "\n".join(value)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return " " * (4 * len(value))  # token ids: four characters a token for the estimate
        if all(isinstance(v, list) and all(isinstance(t, int) for t in v) for v in value):
            return " " * (4 * sum(len(v) for v in value))
    raise InvalidRequest("input must be text, a list of texts, or token ids")


def _prompt_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return " " * (4 * len(value))
    raise InvalidRequest("prompt must be text or a list of texts")


def _repaired(s: str) -> str:
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\udcff" parses to one): U+FFFD
        return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# The longest integer JSON text can carry here: Python's int/str conversion limit (4,300 digits by
# default; 0 means none). Numbers short enough by their bit length are never converted to check.
_MAX_INT_DIGITS = sys.get_int_max_str_digits()
_SURE_INT_BITS = int((_MAX_INT_DIGITS - 1) * math.log2(10)) if _MAX_INT_DIGITS else 1 << 62


def encodable(value: Any, depth: int = 0) -> Any:
    """``value`` (a parsed JSON body) with every lone surrogate, in keys and strings at any depth,
    replaced by U+FFFD: text that is not valid Unicode cannot be sent as UTF-8, so it is repaired
    rather than refused (nothing else of the body changes). Bounded in depth like the JSON parser."""
    if isinstance(value, str):
        return _repaired(value)
    if depth > 256:
        raise InvalidRequest("the request body is nested too deeply")
    if isinstance(value, dict):
        return {_repaired(k) if isinstance(k, str) else k: encodable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [encodable(v, depth + 1) for v in value]
    if type(value) is int and value.bit_length() > _SURE_INT_BITS and not _convertible(value):
        # json.dumps would fail on it with Python's own "Exceeds the limit (4300 digits) for integer
        # string conversion"; no API parameter takes such a number.
        raise InvalidRequest(f"a number in the request has more than {_MAX_INT_DIGITS:,} digits")
    return value


def _convertible(value: int) -> bool:
    try:
        str(value)
    except ValueError:
        return False
    return True


def input_messages(api: str, body: Mapping[str, Any]) -> list[dict]:
    """A request's input as chat messages (copies), for the intent rules, the token estimate and
    the stored prompt; :class:`InvalidRequest` when the field the API needs is missing or bad."""
    if api == "chat":
        return validate_messages(body.get("messages"))
    if api == "responses":
        if "input" not in body:
            raise InvalidRequest("input is required")
        msgs = _input_messages(body["input"])
        if isinstance(body.get("instructions"), str):
            msgs.insert(0, {"role": "system", "content": body["instructions"]})
        return msgs
    if api == "embeddings":
        if "input" not in body:
            raise InvalidRequest("input is required")
        return [{"role": "user", "content": _embedding_text(body["input"])}]
    if "prompt" not in body:
        raise InvalidRequest("prompt is required")
    return [{"role": "user", "content": _prompt_text(body["prompt"])}]


def sendable_message(m: dict) -> dict:
    """A validated message whose text can be encoded and stored: lone surrogates replaced, NUL and
    other C0 controls (except tab and newlines) removed."""
    content = m.get("content")
    if isinstance(content, str):
        m["content"] = storable(content, max(len(content), 1))
    elif isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                part = {**part, "text": storable(part["text"], max(len(part["text"]), 1))}
            parts.append(part)
        m["content"] = parts
    return m
