"""Gateway keys: every key with its limits and spend, create one (shown once), revoke one."""

import pandas as pd
import streamlit as st

from app import keys
from ui import auth, resources

st.title("Gateway keys")
if flash := st.session_state.pop("keys_flash", None):  # the outcome of a revoke, across its rerun
    (st.success if flash[0] else st.error)(flash[1])
server = resources.gateway_server()
st.caption(f"Clients call the gateway server at `{server.url}` with `Authorization: Bearer <key>`. {server.line()}")

identity = auth.actor()
admin = identity.is_admin
if not admin:
    st.info(f"Signed in as {identity.name} ({identity.role}): only admins create or revoke gateway keys.")

st.subheader("Create a key")
with st.form("create_key", clear_on_submit=True):
    name = st.text_input("Name", max_chars=64, help="Letters, digits, '.', '_' or '-'")
    models = st.multiselect("Models (none = all)", keys.servable_models(resources.settings()))
    c1, c2, c3, c4 = st.columns(4)
    rpm = c1.number_input("Requests per minute (0 = no limit)", min_value=0, step=1)
    tpm = c2.number_input("Tokens per minute (0 = no limit)", min_value=0, step=1000)
    budget = c3.number_input("Budget USD (0 = none)", min_value=0.0, step=1.0, format="%.2f")
    period = c4.selectbox("Budget period", ["month", "day"])
    submitted = st.form_submit_button("Create key", type="primary", disabled=not admin)
if submitted and admin:
    outcome = keys.create_from_form(
        resources.engine(),
        name=name,
        models=models,
        rpm=int(rpm),
        tpm=int(tpm),
        budget_usd=float(budget),
        period=period,
        actor=identity.name,
    )
    if outcome.ok:
        resources.refresh()
        st.success(outcome.message)
        st.code(outcome.key, language=None)
        for line in keys.usage_lines(server.url):
            st.code(line, language="bash" if line.startswith("curl") else "python")
    else:
        st.error(outcome.message)

st.subheader("Keys")
rows = resources.key_rows()  # read after a Create above, so the new key is listed
if rows:
    st.dataframe(pd.DataFrame([r.display() for r in rows]), hide_index=True, width="stretch")
else:
    st.info("No gateway keys yet: create the first one above.")

st.subheader("Revoke a key")
active = [r.name for r in rows if r.active]
with st.form("revoke_key"):
    target = st.selectbox("Key", active, index=None, placeholder="Choose a key")
    revoke = st.form_submit_button("Revoke", disabled=not (active and admin))
if revoke and admin:
    st.session_state["keys_flash"] = keys.revoke_from_form(resources.engine(), target)
    resources.refresh()
    st.rerun()
