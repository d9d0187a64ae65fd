"""Chat messages in the OpenAI shape: the one rule for reading the text out of a message's content.

Content is a string, a list of typed parts (``{"type": "text", "text": ...}``, image parts, ...) or
``None`` (an assistant turn that only calls tools). Only text counts: the router's intent rules and
token estimate, the simulator's tokenizer and its canned answers all read it through here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def text_parts(content: Any) -> list[str]:
    """The text pieces of one message's content, in order (empty for ``None`` or non-text parts)."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, Iterable) and not isinstance(content, (bytes, Mapping)):
        return [p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
    return []


def content_text(content: Any, sep: str = "\n") -> str:
    """One message's text: its pieces joined by ``sep``."""
    return sep.join(text_parts(content))


def messages_text(messages: Sequence[Mapping[str, Any]], sep: str = "\n") -> str:
    """The text of a whole conversation, every piece of every message joined by ``sep``."""
    return sep.join(piece for m in messages for piece in text_parts(m.get("content")))
