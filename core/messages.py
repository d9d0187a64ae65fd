"""Chat messages in the OpenAI shape: the one rule for reading the text out of a message's content.

Content is a string, a list of typed parts (``{"type": "text", "text": ...}``, image parts, ...) or
``None`` (an assistant turn that only calls tools). Only text counts: the router's intent rules and
token estimate, the simulator's tokenizer and its canned answers all read it through here. The one
token estimate the gateway makes before an upstream's real usage is known lives here too.
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


CHARS_PER_TOKEN = 4


def estimate_tokens(chars: int, chars_per_token: int = CHARS_PER_TOKEN) -> int:
    """Tokens in ``chars`` characters of text, rounded up: the rough count that intent rules,
    admission and a cut stream's cost use before (or instead of) the upstream's real usage."""
    return -(-chars // chars_per_token)


def estimate_prompt_tokens(messages: Sequence[Mapping[str, Any]], chars_per_token: int = CHARS_PER_TOKEN) -> int:
    """A prompt's estimate: its text, plus 4 tokens a message for the framing the API adds. It errs
    high, so admission reserves enough; the real counts settle it."""
    chars = sum(len(piece) for m in messages for piece in text_parts(m.get("content")))
    return estimate_tokens(chars, chars_per_token) + 4 * len(messages)
