"""Playground: chat through the routing client, see how each answer was routed, compare the routes."""

import streamlit as st

from app.catalog import model_names
from app.dashboard.answer import build_messages, parse_max_tokens
from app.dashboard.structured import FORMATS, chat_params
from app.display.safe_text import inert
from ui import render, resources
from ui.state import PlaygroundState

state = PlaygroundState.get()
settings = resources.settings()
client = resources.client()

with st.sidebar:
    st.subheader("Playground settings")
    model = st.selectbox("Model", ["auto", *model_names()], help="auto = intent routing picks the model")
    compare = st.toggle(
        "Compare primary and fallback",
        help="Send each prompt through both routes, side by side (no fallback, no canary split)",
    )
    system_prompt = st.text_area("System prompt", placeholder="You are a helpful assistant.", height=80)
    temperature = st.slider("Temperature", 0.0, 2.0, 0.7, 0.1)
    # A text field: a number input with bounds would keep (and send) its old value when 0 is typed.
    max_tokens_text = st.text_input("Max tokens", value="512", help="A whole number from 1 to 32,768")
    try:
        max_tokens: int | None = parse_max_tokens(max_tokens_text)
    except ValueError as exc:
        max_tokens = None
        st.error(f"{inert(exc)}. Nothing is sent until it is fixed.", icon="⚠️")
    offer_tool = st.toggle("Offer a sample tool (get_weather)", help="Ask for the weather in a city to see a tool call")
    answer_format = st.selectbox("Answer format", FORMATS, help="JSON modes send response_format upstream")
    st.text_input(
        "Session id",
        value=state.session_id,
        disabled=True,
        help="Requests of one session stick to one canary side and reuse the provider's prompt cache",
    )
    if st.button("New session"):
        state.new_session()
        st.rerun()

chat_options = {
    "model": model,
    "session_id": state.session_id,
    "temperature": temperature,
    "max_tokens": max_tokens,
    **chat_params(offer_tool=offer_tool, response_format=answer_format),
}

st.title("Playground")
st.caption(
    f"Session {inert(state.session_id)} · model {inert(model)} · "
    + ("compare mode: primary vs fallback" if compare else "routed by the canary split")
)


prompt = st.chat_input("Ask the gateway something")  # pinned to the bottom wherever it is called
for turn in state.turns:
    render.chat_turn(turn)

if not state.turns and not prompt:
    st.info(
        "Send a prompt below. Under each answer you will see the provider, model, intent, canary side, "
        "attempts, latency, tokens and cost."
    )

if prompt and max_tokens is None:
    st.error("Not sent: Max tokens in the sidebar is not valid. Fix it and send the prompt again.")
elif prompt:
    user_turn: dict[str, object] = {"role": "user", "content": prompt}
    state.turns.append(user_turn)
    with st.chat_message("user"):
        render.long_text(prompt)
    messages = build_messages(system_prompt, state.history()[:-1], prompt)
    with st.chat_message("assistant"):
        if compare:
            routes = [
                ("primary", f"Primary: {settings.routing.primary}"),
                ("fallback", f"Fallback: {settings.routing.fallback}"),
            ]
            results = []
            for col, (route, label) in zip(st.columns(2), routes, strict=False):
                with col:
                    st.markdown(f"**{inert(label)}**")
                    result, error = render.streamed_answer(client, settings, messages, chat_options, route)
                    results.append((label, result, error))
            state.turns.append({"role": "assistant", "content": "", "compare": results})
            user_turn["failed"] = True  # compare turns are not part of the conversation history
        else:
            result, error = render.streamed_answer(client, settings, messages, chat_options)
            if result is None:
                user_turn["failed"] = True
            state.turns.append(
                {
                    "role": "assistant",
                    "content": result["text"] if result else "",
                    "meta": result,
                    "error": error,
                    "wanted_json": "response_format" in chat_options,
                }
            )
