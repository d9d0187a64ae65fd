"""Text of simulated answers: deterministic, plain, and plainly labelled as simulated.

The same prompt to the same provider and model always gets the same answer, so tests and
demos are repeatable. Answers are plain text only: the quote of the user's message is reduced
to letters, digits and simple punctuation, so nothing in it can render as HTML or a Markdown
link when a page shows it.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.simulator.tokens import tokenize, truncate_to_tokens
from core.messages import content_text

__all__ = ["Answer", "compose_answer", "cut", "quote"]

MIN_TOKENS = 40
MAX_TOKENS = 160
_QUOTE_WORDS = 12
_QUOTE_CHARS = 80

_UNSAFE = re.compile(r"[^\w\s.,;:!?'-]")
_SPACES = re.compile(r"\s+")

_SENTENCES = (
    "A real {model} deployment would answer here; this simulator only mimics its timing and token usage.",
    "The gateway measures time to first token, output speed and cached prompt tokens for every reply.",
    "Sticky sessions keep a conversation on one upstream, so a repeated prefix shows up as cached tokens.",
    "Canary routing decides which provider receives each request, and fallback covers failed attempts.",
    "Nothing in this text was written by a language model.",
    "Retries and fallback belong to the router; the SDK's own retries are turned off.",
    "Latency, error rate and rate limits of this upstream can be changed from the dashboard to rehearse an outage.",
    "Prompt tokens are counted with a simple pseudo-tokenizer of about four characters per token.",
    "Use a real provider in the gateway configuration to get a real answer.",
    "The simulated upstream {provider} speaks the same protocol as an OpenAI-compatible server.",
)


@dataclass(frozen=True, slots=True)
class Answer:
    text: str
    finish_reason: str  # "stop", or "length" when max_tokens cut it


def quote(messages: Sequence[Mapping[str, Any]]) -> str:
    """The last user message, shortened and reduced to plain characters."""
    return _quote(messages)


def safe_text(text: str, limit: int = _QUOTE_CHARS * 3) -> str:
    """``text`` reduced to plain characters (no markup), shortened to about ``limit``."""
    flat = _SPACES.sub(" ", _UNSAFE.sub(" ", text)).strip()
    return flat if len(flat) <= limit else flat[:limit].rstrip() + "..."


def _quote(messages: Sequence[Mapping[str, Any]]) -> str:
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    text = _SPACES.sub(
        " ", _UNSAFE.sub(" ", content_text(last_user.get("content") if last_user else None, sep=" "))
    ).strip()
    words = text.split(" ")
    short = " ".join(words[:_QUOTE_WORDS])[:_QUOTE_CHARS].rstrip()
    if not short:
        return ""
    return short + ("..." if short != text else "")


def _seed(provider: str, model: str, prompt: Sequence[str], salt: str) -> int:
    # No salt hashes exactly as before, so the plain answer to a prompt never changes.
    parts = [provider, model, *prompt, *([salt] if salt else [])]
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def cut(text: str, stop: Sequence[str], max_tokens: int | None) -> Answer:
    """``text`` as generated: ended before the first ``stop`` string ("stop"), then cut to
    ``max_tokens`` ("length")."""
    finish = "stop"
    ends = [text.find(s) for s in stop if s and text.find(s) >= 0]
    if ends:
        text = text[: min(ends)]
    if max_tokens is not None and len(tokenize(text)) > max_tokens:
        return Answer(truncate_to_tokens(text, max_tokens), "length")
    return Answer(text, finish)


def compose_answer(
    provider: str,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    prompt: Sequence[str],
    max_tokens: int | None,
    *,
    salt: str = "",
    stop: Sequence[str] = (),
) -> Answer:
    """The answer to ``messages`` (whose pseudo-tokens are ``prompt``), ended at a ``stop`` string
    and cut to ``max_tokens``; a ``salt`` (the request's seed, the choice index) picks another
    answer to the same prompt."""
    rng = random.Random(_seed(provider, model, prompt, salt))
    quote = _quote(messages)
    parts = [
        f"[simulated {provider}/{model}] This is a simulated answer from a test upstream, not a real model.",
        f'You asked: "{quote}".' if quote else "Your message had no text to quote.",
    ]
    target = rng.randint(MIN_TOKENS, MAX_TOKENS)
    # Whole sentences until the target length is reached, so an uncut answer ends cleanly,
    # without running past MAX_TOKENS.
    while len(tokenize(" ".join(parts))) < target:
        sentence = rng.choice(_SENTENCES).format(provider=provider, model=model)
        if len(tokenize(" ".join([*parts, sentence]))) > MAX_TOKENS:
            break
        parts.append(sentence)
    return cut(" ".join(parts), stop, max_tokens)
