"""Intent routing for ``model="auto"``: rules are data (``app/data/intent_rules.toml`` or the
``[intents]`` table of the gateway config).

Order: a prompt estimated above ``long_context_tokens`` goes to the long-context model; otherwise
the first rule with a matching keyword or pattern; otherwise the default model. ASCII keywords match
at the start of a word ("debug" matches "Debugging", "math" matches "mathematics", "code" does not
match "barcode"); Hangul keywords match as substrings because Korean attaches particles ("코드를").
A rule's ``patterns`` are regular expressions (case-insensitive), for what words cannot say: an
equation such as ``x^2-5x+6=0``, ``d/dx``, or a word only in context. They are validated when the
configuration loads (:class:`app.config.IntentRule`) and compiled once per rule.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from app.config import IntentConfig, IntentRule
from core.messages import estimate_tokens, messages_text


@dataclass(frozen=True)
class IntentDecision:
    intent: str
    model: str
    estimated_tokens: int


def message_text(messages: Sequence[dict]) -> str:
    """Every text piece of the conversation, one per line (see :mod:`core.messages`)."""
    return messages_text(messages)


@lru_cache(maxsize=64)
def _matchers(keywords: tuple[str, ...], patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    # Each pattern is compiled on its own: joined with "|" an inline flag such as "(?x)" would no
    # longer be at the start of the expression, and one rule's groups could clash with another's.
    compiled = [re.compile(p, re.IGNORECASE) for p in patterns]
    if keywords:
        alts = []
        for kw in keywords:
            escaped = re.escape(kw.lower())
            alts.append(rf"\b{escaped}" if kw.isascii() else escaped)
        compiled.insert(0, re.compile("|".join(alts), re.IGNORECASE))
    return tuple(compiled)


def matches(rule: IntentRule, text: str) -> bool:
    """Whether any keyword or pattern of ``rule`` is found in ``text``."""
    return any(m.search(text) for m in _matchers(tuple(rule.keywords), tuple(rule.patterns)))


def classify(messages: Sequence[dict], cfg: IntentConfig) -> IntentDecision:
    # Only what the user wrote decides the intent; a system prompt saying "you are a python
    # tutor" should not send every question to the coding model.
    user_text = message_text([m for m in messages if m.get("role") == "user"])
    tokens = estimate_tokens(len(message_text(messages)), cfg.chars_per_token)
    if tokens > cfg.long_context_tokens:
        return IntentDecision("long_context", cfg.long_context_model, tokens)
    for rule in cfg.rules:
        if matches(rule, user_text):
            return IntentDecision(rule.intent, rule.model, tokens)
    return IntentDecision("general", cfg.default_model, tokens)
