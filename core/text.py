"""Text hygiene at one boundary: every string that comes from an upstream or a caller and is about to be
stored, logged or shown passes through here once.

- :func:`storable` makes text safe for both databases: lone surrogates (from ``"\\udcff"`` JSON escapes or
  ``surrogateescape`` decoding) become U+FFFD, so UTF-8 encoding (SQLite, psycopg) cannot fail; NUL and
  the other C0 controls except tab, newline and carriage return are removed (PostgreSQL ``text`` rejects
  NUL outright); the result is bounded in characters, which is what ``String(n)`` columns count.
- :func:`scrub_secrets` replaces the configured key values and bearer-token / API-key shapes with
  :data:`REDACTED`, because upstreams echo keys in 401 texts ("Incorrect API key provided: Bearer sk-...").
- :func:`clean` is the two together in the right order (repair, scrub, then bound), for callers that
  want one call.
- :func:`csv_safe` neutralises spreadsheet formulas in exported cells (OWASP "CSV injection").

All patterns are compiled once; the functions are linear in the text length (no nested quantifiers),
so a 100 kB upstream body costs milliseconds. This module imports nothing of ours.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

REDACTED = "[REDACTED]"
ELLIPSIS = "\u2026"
REPLACEMENT = "\ufffd"
# A configured "secret" shorter than this is not a key (tests use "x"); redacting it would shred text.
MIN_SECRET_LEN = 6
# clean() scrubs at most this many characters beyond the limit: enough that a secret cut at the
# pre-bound cannot slide into the kept part, without scanning a 50 MB body.
SCRUB_MARGIN = 65_536

_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 controls except \t (09), \n (0a), \r (0d). DEL and C1 are legal in both databases and kept.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")

# Token shapes, each bounded so a pathological input cannot cause backtracking blow-ups.
_TOKEN_CHARS = r"[A-Za-z0-9._~+/=*-]"
_SECRET_PATTERNS = re.compile(
    "|".join(
        (
            # "Bearer <token>" / "Basic <token>": keep the scheme word, drop the credential.
            rf"(?P<scheme>\b(?:[Bb]earer|BEARER|[Bb]asic|BASIC)[ \t]{{1,8}}){_TOKEN_CHARS}{{4,}}",
            # OpenAI (sk-, sk-proj-, including the SDK's masked "sk-abc***wxyz"), Anthropic (sk-ant-).
            r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_*-]{8,}",
            # Google API keys: "AIza" + 35 characters.
            r"\bAIza[0-9A-Za-z_-]{35}",
            # Other common provider prefixes: xAI, Groq, Hugging Face, GitHub, Slack.
            r"\b(?:xai-|gsk_|hf_|ghp_|gho_|github_pat_|xox[abpr]-)[A-Za-z0-9_-]{10,}",
            # api_key=..., "api-key": "...", x-api-key: ... : keep the name, drop the value.
            r"""(?P<name>(?i:\b(?:x-)?api[_-]?key)["']?[ \t]{0,4}[:=][ \t]{0,4}["']?)[^\s"',;&]{4,}""",
        )
    )
)


def _mask(match: re.Match[str]) -> str:
    prefix = match.group("scheme") or match.group("name") or ""
    return prefix + REDACTED


def _repair(s: str | bytes | bytearray | object) -> str:
    if isinstance(s, (bytes, bytearray)):
        s = bytes(s).decode("utf-8", errors="replace")
    elif not isinstance(s, str):
        s = str(s)
    if _SURROGATE.search(s):
        # Round-trip through UTF-16 so that a valid high+low pair (JSON "\ud83d\ude00" read by a lenient
        # decoder) becomes the one character it spells, and only lone halves become U+FFFD.
        s = s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if _CONTROL.search(s):
        s = _CONTROL.sub("", s)
    return s


def _bound(s: str, limit: int) -> str:
    if len(s) <= limit:
        return s
    # Mark the cut so a reader knows the text went on; the marker keeps the result within the limit,
    # which also makes storable() idempotent.
    return s[: limit - 1] + ELLIPSIS


def storable(s: str | bytes | None, limit: int) -> str | None:
    """``s`` as text that every database we support accepts and that fits ``limit`` characters.

    Bytes are decoded as UTF-8 with replacement. Idempotent: ``storable(storable(s, n), n) ==
    storable(s, n)``. ``None`` stays ``None`` (a nullable column).
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if s is None:
        return None
    return _bound(_repair(s), limit)


@lru_cache(maxsize=32)
def _secrets_pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    usable = sorted({x for x in secrets if x and len(x) >= MIN_SECRET_LEN}, key=len, reverse=True)
    if not usable:
        return None
    return re.compile("|".join(re.escape(x) for x in usable))


def scrub_secrets(s: str, secrets: Iterable[str | None] = ()) -> str:
    """``s`` with each configured secret value (at least :data:`MIN_SECRET_LEN` characters) and each
    bearer-token or API-key shape replaced by :data:`REDACTED`. Idempotent."""
    key = tuple(sorted(x for x in secrets if x))
    exact = _secrets_pattern(key) if key else None
    if exact is not None:
        s = exact.sub(REDACTED, s)
    return _SECRET_PATTERNS.sub(_mask, s)


def clean(s: str | bytes | None, limit: int, secrets: Iterable[str | None] = ()) -> str | None:
    """The one call for a string on its way to storage, a log line or a page: repaired, scrubbed of
    secrets, then bounded (scrubbing first, so a cut can never leave half a key behind)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if s is None:
        return None
    text = _repair(s)
    if len(text) > limit + SCRUB_MARGIN:
        text = text[: limit + SCRUB_MARGIN]
    return _bound(scrub_secrets(text, secrets), limit)


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(cell: object) -> object:
    """A CSV cell that a spreadsheet will not evaluate: text starting with ``= + - @``, tab or carriage
    return gets a leading apostrophe (OWASP CSV injection). Non-text cells (numbers, None) pass unchanged,
    so numeric columns stay numeric; quoting is left to the ``csv`` module."""
    if isinstance(cell, str) and cell.startswith(_FORMULA_START):
        return "'" + cell
    return cell
