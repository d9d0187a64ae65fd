"""Pseudo-tokenizer of the simulator: deterministic token lists for prompts and answers.

Real tokenizers are model-specific and heavy; the simulator only needs counts that look
plausible (~4 characters per token) and lists where a shared text prefix gives shared leading
tokens, so the prefix cache can find it. Words and single punctuation marks are tokens; long
words are cut into 4-character pieces.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from core.messages import content_text

__all__ = ["PIECE_CHARS", "prompt_tokens", "token_spans", "tokenize", "truncate_to_tokens"]

PIECE_CHARS = 4

_WORD_OR_MARK = re.compile(r"\w+|[^\w\s]")


def token_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of every token of ``text``, in order."""
    spans: list[tuple[int, int]] = []
    for match in _WORD_OR_MARK.finditer(text):
        start, end = match.span()
        for piece_start in range(start, end, PIECE_CHARS):
            spans.append((piece_start, min(piece_start + PIECE_CHARS, end)))
    return spans


def tokenize(text: str) -> list[str]:
    return [text[start:end] for start, end in token_spans(text)]


def truncate_to_tokens(text: str, limit: int) -> str:
    """The longest prefix of ``text`` holding exactly ``min(limit, len(tokenize(text)))`` tokens.

    Cutting at the end of a token keeps the count exact: a word cut at a piece boundary
    re-tokenizes into the same leading pieces.
    """
    spans = token_spans(text)
    if limit >= len(spans):
        return text
    if limit <= 0:
        return ""
    return text[: spans[limit - 1][1]]


def prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Role markers and contents of ``messages`` in order.

    A conversation grown by one turn starts with exactly the tokens of the shorter one, which
    is what makes sticky sessions hit the prefix cache.
    """
    tokens: list[str] = []
    for message in messages:
        tokens.append(f"<|{message.get('role', 'user')}|>")
        tokens.extend(tokenize(content_text(message.get("content"))))
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                tokens.extend(tokenize(f"{function.get('name', '')} {function.get('arguments', '')}"))
        tokens.append("<|end|>")
    return tokens
