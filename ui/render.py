"""Small Streamlit renderers shared by pages: answer metadata, failures, flash messages."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.dashboard.answer import AnswerMeta, FailureView, explain_failure
from app.dashboard.answer import answer_meta as build_answer_meta
from app.dashboard.safe_text import safe_markdown, safe_stream


def answer_meta(meta: AnswerMeta) -> None:
    st.caption(meta.headline)
    st.caption(f"{meta.timing} · {meta.tokens}")
    for note in meta.notes:
        st.caption(f"Note: {note}")
    failed = [a for a in meta.attempts if a["status"] != "ok"]
    label = f"Attempts ({len(meta.attempts)}, {len(failed)} failed) · request {meta.request_id}"
    with st.expander(label, expanded=bool(failed)):
        st.dataframe(pd.DataFrame(meta.attempts), hide_index=True, width="stretch")


def failure(view: FailureView) -> None:
    body = "\n".join(f"- {line}" for line in view.lines)
    st.error(f"**{view.title}**\n\n{body}\n\n**Fix:** {view.fix}")


def flash(kind: str, message: str) -> None:
    {"success": st.success, "error": st.error, "warning": st.warning}.get(kind, st.info)(message)


def chat_turn(turn: dict) -> None:
    """One past turn of the playground conversation (model text shown without loading images)."""
    with st.chat_message(turn["role"]):
        if turn.get("compare"):
            for col, (label, meta, error) in zip(st.columns(len(turn["compare"])), turn["compare"], strict=False):
                with col:
                    st.markdown(f"**{label}**")
                    if meta:
                        st.markdown(safe_markdown(meta["text"]))
                        answer_meta(build_answer_meta(meta))
                    if error:
                        failure(error)
            return
        if turn.get("content"):
            st.markdown(safe_markdown(turn["content"]))
        if turn.get("meta"):
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
    answer_meta(build_answer_meta(result))
    return result, None
