"""Gateway keys: every key with its limits and spend, create one (its secret stays on screen until
dismissed), revoke one (after a confirmation). Enter never submits either form: only its button does."""

import pandas as pd
import streamlit as st

from app import keys
from ui import auth, resources
from ui.state import KeysPageState

state = KeysPageState.get()
st.title("Gateway keys")
if state.flash is not None:
    ok, message = state.flash
    state.flash = None
    (st.success if ok else st.error)(message)
server = resources.gateway_server()
st.caption(f"Clients call the gateway server at `{server.url}` with `Authorization: Bearer <key>`. {server.line()}")

identity = auth.actor()
admin = identity.is_admin
if not admin:
    st.info(f"Signed in as {identity.name} ({identity.role}): only admins create or revoke gateway keys.")

st.subheader("Create a key")
created = state.created
if created is not None:
    with st.container(border=True):
        st.success(created.message)
        st.code(created.key, language=None)
        if created.warning:
            st.warning(created.warning)
        for line in keys.usage_lines(server.url):
            st.code(line, language="bash" if line.startswith("curl") else "python")
        if st.button("I have stored the key: hide it", type="primary"):
            state.dismiss_created()
            st.rerun()

servable = keys.servable_models(resources.settings())
g = state.form_generation
with st.form(f"create_key_{g}", enter_to_submit=False):
    name = st.text_input("Name", max_chars=64, help="Letters, digits, '.', '_' or '-'", key=f"key_name_{g}")
    models = st.multiselect("Models (none = all)", servable, key=f"key_models_{g}")
    c1, c2, c3, c4 = st.columns(4)
    rpm = c1.number_input("Requests per minute (0 = no limit)", min_value=0, step=1, key=f"key_rpm_{g}")
    tpm = c2.number_input("Tokens per minute (0 = no limit)", min_value=0, step=1000, key=f"key_tpm_{g}")
    budget = c3.number_input("Budget USD (0 = none)", min_value=0.0, step=1.0, format="%.2f", key=f"key_budget_{g}")
    period = c4.selectbox("Budget period", ["month", "day"], key=f"key_period_{g}")
    submitted = st.form_submit_button(
        "Create key",
        type="primary",
        disabled=not admin or created is not None,
        help="Hide the key shown above first" if created is not None else None,
    )
if submitted and admin and created is None:
    outcome = keys.create_from_form(
        resources.engine(),
        name=name,
        models=models,
        rpm=int(rpm),
        tpm=int(tpm),
        budget_usd=float(budget),
        period=period,
        actor=identity.name,
        servable=servable,
    )
    if outcome.ok:
        state.created = outcome
        resources.refresh()
        st.rerun()
    else:
        st.error(outcome.message)

st.subheader("Keys")
rows = resources.key_rows()
if rows:
    st.dataframe(pd.DataFrame([r.display() for r in rows]), hide_index=True, width="stretch")
else:
    st.info("No gateway keys yet: create the first one above.")

st.subheader("Revoke a key")
active = [r.name for r in rows if r.active]
with st.form("revoke_key", enter_to_submit=False):
    target = st.selectbox("Key", active, index=None, placeholder="Choose a key")
    revoke = st.form_submit_button("Revoke", disabled=not (active and admin))
if revoke and admin:
    if target:
        state.pending_revoke = target
    else:
        st.error("Choose a key to revoke.")
if state.pending_revoke and admin:
    pending = state.pending_revoke
    with st.container(border=True):
        st.warning(
            f"Revoke '{pending}'? Every client using it is refused within a few seconds, and a revoked key "
            "cannot be restored."
        )
        yes, cancel = st.columns(2)
        if yes.button(f"Yes, revoke '{pending}'", type="primary"):
            state.pending_revoke = None
            state.flash = keys.revoke_from_form(resources.engine(), pending)
            resources.refresh()
            st.rerun()
        if cancel.button("Cancel"):
            state.pending_revoke = None
            st.rerun()
