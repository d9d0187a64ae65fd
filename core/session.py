"""Session ids: what a caller may use as one, and the ASCII form that goes upstream in a header.

A session id is any Unicode text of 1 to :data:`MAX_SESSION_ID` characters (the width of
``request_log.session_id``), because callers use user names, chat titles and ids from other systems in
any script ('세션', 'café', an emoji). HTTP header values, though, are ASCII in practice (httpx encodes
them as ASCII and fails otherwise), so the value sent upstream is a stable ASCII encoding:

- an id of printable ASCII without spaces (``!`` to ``~``) that does not start with ``u-`` is sent
  unchanged, so existing ids keep their prefix-cache affinity on the upstream;
- any other id is sent as ``u-`` followed by the percent-encoding of its UTF-8 bytes (RFC 3986
  unreserved characters kept). That is injective and reversible, so two distinct ids never share an
  upstream cache scope, and an operator can read it back (``urllib.parse.unquote``).

Decision on bad text: an id holding NUL or a lone surrogate is **rejected**, not normalised. Either
would have to be changed to be stored (PostgreSQL refuses NUL; UTF-8 cannot encode a lone surrogate),
and silently changing an id could merge two callers' sessions. No Unicode normalisation either: 'café'
in NFC and in NFD are different ids, as two byte-different ids are anywhere else.

This module imports nothing of ours.
"""

from __future__ import annotations

import re
from urllib.parse import quote

MAX_SESSION_ID = 128  # characters, the width of request_log.session_id
ENCODED_PREFIX = "u-"

_PLAIN = re.compile(r"[!-~]+")
_SURROGATE = re.compile("[\ud800-\udfff]")


def validate_session_id(s: object) -> str:
    """``s`` if it is a usable session id; otherwise ``ValueError`` naming the rule it breaks."""
    if not isinstance(s, str):
        raise ValueError(f"session_id must be text of 1 to {MAX_SESSION_ID} characters, got {type(s).__name__}")
    if not s:
        raise ValueError(f"session_id must be text of 1 to {MAX_SESSION_ID} characters, got an empty string")
    if len(s) > MAX_SESSION_ID:
        raise ValueError(f"session_id must be text of 1 to {MAX_SESSION_ID} characters, got {len(s)} characters")
    if "\x00" in s:
        raise ValueError("session_id must not contain NUL (\\x00): the database cannot store it")
    if _SURROGATE.search(s):
        raise ValueError("session_id must be valid Unicode text: it holds a lone surrogate (undecodable input?)")
    return s


def session_header_value(session_id: str) -> str:
    """The ASCII header value for ``session_id`` (validated first): stable across processes and
    releases, free of control characters and spaces, distinct for distinct ids."""
    validate_session_id(session_id)
    if _PLAIN.fullmatch(session_id) and not session_id.startswith(ENCODED_PREFIX):
        return session_id
    return ENCODED_PREFIX + quote(session_id.encode("utf-8"), safe="")
