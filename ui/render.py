"""Small Streamlit renderers shared by pages: answer metadata, failures, flash messages."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.dashboard.answer import AnswerMeta, FailureView


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
