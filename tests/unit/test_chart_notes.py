"""An empty chart's note is wrapped: Plotly never wraps an annotation, and the time-to-first-token
note ran off both sides of a half-width chart."""

from __future__ import annotations

from app.monitor.charts import NOTE_WIDTH_CHARS, empty_figure


def test_a_long_note_is_wrapped_into_short_lines():
    note = "No streamed requests in this window (time to first token is measured on streams)"
    text = empty_figure("TTFT", text=note).layout.annotations[0].text
    lines = text.split("<br>")
    assert len(lines) > 1 and all(len(line) <= NOTE_WIDTH_CHARS for line in lines)
    assert " ".join(lines) == note


def test_a_short_note_stays_one_line():
    assert empty_figure("x").layout.annotations[0].text == "No requests in this window"
