"""Request drill-down: find requests by request id, session id or gateway key name, and read one
request: a failed one leads with why (error class and message) and then its attempts; its attempts
(provider, model, status, error, latency, TTFT, the wait before each retry), tokens, cost, canary
side, intent, substitution and the prompt when stored. Every text that came
from a caller or an upstream is shown as plain text."""

import streamlit as st

from app.monitor import intent_models, load_story, search
from app.monitor.drilldown import PARAMS, query_from_params
from db.drilldown import SEARCH_KINDS
from ui import resources

MS = st.column_config.NumberColumn(format="%.1f")
LABELS = {"request": "Request id", "session": "Session id", "key": "Gateway key name"}
engine = resources.engine()
INTENT_MODELS = intent_models(resources.settings().intents)


def show_facts(view) -> None:
    st.subheader("Request")
    facts = view.facts()
    st.dataframe(facts, hide_index=True, width="stretch", height=35 * (len(facts) + 1) + 3, key="request_facts")


def show_attempts(view) -> None:
    st.subheader("Attempt timeline")
    st.dataframe(
        view.timeline_rows(),
        hide_index=True,
        width="stretch",
        column_config={name: MS for name in ("latency ms", "TTFT ms", "wait before ms")},
        key="request_timeline",
    )


st.title("Request drill-down")
asked = query_from_params(st.query_params.to_dict())
# The form's widgets keep their keys across searches; a new address (a link followed) fills them.
if asked and st.session_state.get("request_asked") != asked:
    st.session_state["request_asked"] = asked
    st.session_state["request_kind"], st.session_state["request_value"] = asked
with st.form("request_search"):
    cols = st.columns([1, 3, 1], vertical_alignment="bottom")
    kind: str = cols[0].selectbox("Search by", list(SEARCH_KINDS), format_func=LABELS.__getitem__, key="request_kind")
    value: str = cols[1].text_input("Value (exact match)", max_chars=256, key="request_value")
    submitted = cols[2].form_submit_button("Search")
if submitted:
    asked = (kind, value.strip()) if value.strip() else None
    st.session_state["request_asked"] = asked
    st.query_params.from_dict({PARAMS[kind]: value.strip()} if asked else {})  # the address follows the search

if asked is None:
    st.info("Enter a request id, a session id or a gateway key name. The Monitor links every row here.")
    st.stop()

kind, value = asked
if kind == "request":
    view = load_story(engine, value.strip(), INTENT_MODELS)
    if view is None:
        st.warning("No request with that id is logged (ids are exact; records are written within seconds).")
        st.stop()
    why = view.why()
    if why is not None:  # a failure leads with why, then the attempts that tried
        st.error(why.markdown())
        show_attempts(view)
        show_facts(view)
    else:
        show_facts(view)
        show_attempts(view)
    st.subheader("Prompt")
    if view.prompt_text:
        st.text(view.prompt_text)  # plain text: a prompt is caller data
    else:
        st.caption("Not stored (prompts are kept only with telemetry.store_prompts = true).")
    st.subheader("Answer")
    if view.answer_text:
        st.text(view.answer_text)  # plain text: model output is never rendered as Markdown or HTML here
    else:
        st.caption("Not stored (answers are kept only with telemetry.store_prompts = true).")
else:
    result = search(engine, kind, value)
    if result.error:
        st.error(result.error)
        st.stop()
    st.caption(f"{len(result.matches)} requests, newest first.")
    st.dataframe(
        result.rows(),
        hide_index=True,
        width="stretch",
        column_config={"open": st.column_config.LinkColumn("open", display_text="open", width="small")},
        key="request_matches",
    )
