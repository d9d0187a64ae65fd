"""Small Streamlit renderers shared by pages: answer metadata, failures, flash messages."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.dashboard.answer import AnswerMeta, FailureView, explain_failure, preview
from app.dashboard.answer import answer_meta as build_answer_meta
from app.dashboard.structured import structured_view
from app.display.safe_text import inert, safe_markdown, safe_stream
from app.monitor import request_link


def answer_meta(meta: AnswerMeta) -> None:
    # Provider, model and error texts come from configuration and upstream answers: shown inert.
    st.caption(inert(meta.headline))
    st.caption(inert(meta.timing))
    st.caption(inert(meta.tokens))
    for note in meta.notes:
        st.caption(f"Note: {inert(note)}")
    failed = [a for a in meta.attempts if a["status"] != "ok"]
    label = f"Attempts ({len(meta.attempts)}, {len(failed)} failed) · request {inert(meta.request_id)}"
    with st.expander(label, expanded=bool(failed)):
        st.dataframe(pd.DataFrame(meta.attempts), hide_index=True, width="stretch")
    if meta.request_id:
        st.link_button("Open in request drill-down", request_link(meta.request_id), type="tertiary")


def failure(view: FailureView) -> None:
    """A failure with its fix; the title and lines carry upstream error texts, so they are inert."""
    body = "\n".join(f"- {inert(line, limit=1000)}" for line in view.lines)
    st.error(f"**{inert(view.title)}**\n\n{body}\n\n**Fix:** {inert(view.fix)}")


def flash(kind: str, message: str) -> None:
    """A write's outcome; its message can quote stored text (a reason, an actor), so it is inert."""
    {"success": st.success, "error": st.error, "warning": st.warning}.get(kind, st.info)(inert(message))


def long_text(text: str) -> None:
    """A message that may be very long (a pasted 40k-character prompt): the start, and the whole
    text behind a 'Show all' expander. Images in it never load."""
    head, hidden = preview(text)
    st.markdown(safe_markdown(head) + ("…" if hidden else ""))
    if hidden:
        with st.expander(f"Show all ({len(text):,} characters, {hidden:,} more)"):
            st.text(text)


def chat_turn(turn: dict) -> None:
    """One past turn of the playground conversation (model text shown without loading images)."""
    with st.chat_message(turn["role"]):
        if turn.get("compare"):
            for col, (label, meta, error) in zip(st.columns(len(turn["compare"])), turn["compare"], strict=False):
                with col:
                    st.markdown(f"**{inert(label)}**")
                    if meta:
                        st.markdown(safe_markdown(meta["text"]))
                        answer_meta(build_answer_meta(meta))
                    if error:
                        failure(error)
            return
        if turn.get("content"):
            long_text(turn["content"])
        if turn.get("meta"):
            structured(turn["meta"], wanted_json=bool(turn.get("wanted_json")))
            answer_meta(build_answer_meta(turn["meta"]))
        if turn.get("error"):
            failure(turn["error"])


def streamed_answer(
    client, settings, messages: list[dict], options: dict, route: str | None = None
) -> tuple[dict | None, FailureView | None]:
    """Stream one answer into the current container; returns (result dict, failure view)."""
    try:
        stream = client.chat(messages, stream=True, route=route, **options)
        st.write_stream(safe_stream(stream))
        result = stream.result.to_dict()
    except Exception as exc:  # noqa: BLE001 - shown as a message with the fix, never a traceback
        view = explain_failure(exc, settings)
        failure(view)
        return None, view
    structured(result, wanted_json="response_format" in options)
    answer_meta(build_answer_meta(result))
    return result, None


def structured(result: dict, *, wanted_json: bool) -> None:
    """An answer's tool calls and JSON, shown as data (st.json: never HTML or markdown)."""
    view = structured_view(result, wanted_json=wanted_json)
    for call in view.tool_calls:
        st.markdown(f"**Tool call:** {inert(call.name)}" + ("" if call.valid_json else " (arguments are not JSON)"))
        if call.valid_json:
            st.json(call.arguments)
        else:
            st.code(str(call.arguments), language=None)
    if view.data is not None:
        st.caption("Structured output")
        st.json(view.data)
    elif view.json_error:
        st.warning(f"JSON was asked for, but {view.json_error}.", icon="⚠️")
