"""Canary control: set the ratio (optimistic-locked, audited), quick rollback / promote, the audit
trail beside the observed split, the guardrail and fault injection for simulated providers."""

import time

import streamlit as st

from app.dashboard import canary_form
from app.dashboard.charts import audit_frame, ratio_step_figure, split_figure
from app.dashboard.fmt import ago, ratio_pct, when
from db.canary import get_state
from db.monitor import provider_error_rate
from ui import auth, render, resources
from ui.state import CanaryPageState

PCT_KEY, SLIDER_KEY, REASON_KEY = "canary_pct", "canary_pct_slider", "canary_reason"

state = CanaryPageState.get()
settings = resources.settings()
engine = resources.engine()
current = get_state(engine)  # uncached: this page must show exactly what Apply is locked on
if state.seen_version is None or PCT_KEY not in st.session_state:
    # Opening the page (its widgets were not on screen in the previous run) is what "loaded" means
    # for the optimistic lock: Apply is refused if the ratio moves on after this point.
    state.seen_version = current.version
    st.session_state[PCT_KEY] = st.session_state[SLIDER_KEY] = canary_form.input_percent(current.ratio)


def after_write(outcome: canary_form.Outcome) -> None:
    """Remember the outcome, lock on the version now current and show its value in the inputs."""
    state.flash = ("success" if outcome.ok else "error", outcome.message)
    if outcome.state is not None:
        state.seen_version = outcome.state.version
        st.session_state[PCT_KEY] = st.session_state[SLIDER_KEY] = canary_form.input_percent(outcome.state.ratio)
    if outcome.ok:
        st.session_state[REASON_KEY] = ""
    resources.refresh()


def on_number() -> None:
    if st.session_state[PCT_KEY] is not None:
        st.session_state[SLIDER_KEY] = round(float(st.session_state[PCT_KEY]), 1)


def on_slider() -> None:
    st.session_state[PCT_KEY] = float(st.session_state[SLIDER_KEY])


def on_apply() -> None:
    after_write(
        canary_form.apply_ratio(
            engine,
            st.session_state[PCT_KEY],
            st.session_state[REASON_KEY],
            expected_version=state.seen_version,
            actor=auth.actor(),
        )
    )


def on_quick(action: str) -> None:
    percent, _label, _ = canary_form.QUICK_ACTIONS[action]
    reason = st.session_state.get(f"quick_reason_{action}") or ""
    state.pending = None
    after_write(
        canary_form.apply_ratio(engine, percent, reason, expected_version=state.seen_version, actor=auth.actor())
    )


st.title("Canary control")
m1, m2 = st.columns([1, 3], vertical_alignment="center")
m1.metric("Current canary ratio", ratio_pct(current.ratio))
m2.markdown(
    f"**{settings.routing.primary}** (primary) gets {ratio_pct(current.ratio)} of new sessions, "
    f"**{settings.routing.fallback}** the rest.  \nVersion {current.version}, set by "
    f"**{current.updated_by}** {ago(current.updated_at, time.time())} ({when(current.updated_at)}): "
    f"{current.reason}"
)
notices = st.container()  # always present, so messages appearing never shift (and reset) the inputs below
if state.flash:
    with notices:
        render.flash(*state.flash)
    state.flash = None
if current.version != state.seen_version:
    notices.warning(
        f"The ratio changed since this page loaded (now {ratio_pct(current.ratio)} by {current.updated_by}); "
        "Apply will be refused until you reload the value."
    )
    notices.button(
        "Load the current value",
        on_click=after_write,
        args=(canary_form.Outcome(True, "Loaded the current value.", current),),
    )

form_col, chart_col = st.columns([2, 3], gap="large")
with form_col:
    st.subheader("Change the ratio")
    st.number_input(
        "Canary ratio (%)",
        min_value=0.0,
        max_value=100.0,
        value=None,
        step=1.0,
        format="%.1f",
        key=PCT_KEY,
        on_change=on_number,
        help="Share of traffic for the primary, 0 to 100",
    )
    st.slider(
        "Canary ratio slider",
        min_value=0.0,
        max_value=100.0,
        step=0.1,
        key=SLIDER_KEY,
        on_change=on_slider,
        label_visibility="collapsed",
        format="%.1f %%",
    )
    st.text_input(
        "Reason (required)",
        key=REASON_KEY,
        max_chars=500,
        placeholder="e.g. error rate stable for 30 min, widening the canary",
    )
    st.button("Apply", type="primary", on_click=on_apply)

    st.markdown("**Quick actions**")
    q1, q2 = st.columns(2)
    if q1.button("Roll back to 0 %", width="stretch"):
        state.pending = "rollback"
    if q2.button("Promote to 100 %", width="stretch"):
        state.pending = "promote"
    if state.pending:
        percent, label, effect = canary_form.QUICK_ACTIONS[state.pending]
        with st.container(border=True):
            st.warning(f"{label}: {effect}. Confirm?")
            st.text_input("Reason (required)", value=f"{label} from the dashboard", key=f"quick_reason_{state.pending}")
            c1, c2 = st.columns(2)
            c1.button(f"Confirm: {label}", type="primary", on_click=on_quick, args=(state.pending,))
            if c2.button("Cancel"):
                state.pending = None
                st.rerun()

audit = resources.audit()
with chart_col:
    st.plotly_chart(ratio_step_figure(audit, current, time.time()), width="stretch")
    minutes = st.segmented_control(
        "Observed split window", [15, 60, 240], default=60, format_func=lambda m: f"{m} min", required=True
    )
    st.plotly_chart(split_figure(resources.split(minutes), audit, current, time.time(), minutes), width="stretch")

st.subheader("Audit trail")
if audit:
    st.dataframe(audit_frame(audit), hide_index=True, width="stretch")
else:
    st.caption("No changes yet: the ratio is the configuration's initial value.")

st.subheader("Guardrail")
g = resources.guardrail()
reading = provider_error_rate(engine, settings.routing.primary, g.window_minutes)
st.caption(
    f"Automatic rollback to 0 % (audited as actor `guardrail`) when {settings.routing.primary}'s error rate "
    f"over the window exceeds the threshold. Now: {canary_form.guardrail_status(reading, g.window_minutes)}. "
    f"Last changed by {g.updated_by} ({when(g.updated_at)})."
)
with st.form("guardrail"):
    enabled = st.toggle("Enable automatic rollback", value=g.enabled)
    gc1, gc2, gc3 = st.columns(3)
    threshold = gc1.number_input(
        "Error-rate threshold (%)",
        min_value=1.0,
        max_value=100.0,
        value=canary_form.input_percent(g.error_rate_threshold),
        step=5.0,
    )
    window = gc2.number_input("Window (minutes)", min_value=1, max_value=60, value=g.window_minutes)
    min_requests = gc3.number_input("Minimum attempts in window", min_value=1, value=g.min_requests)
    if st.form_submit_button("Save guardrail"):
        outcome = canary_form.save_guardrail(engine, enabled, threshold, window, min_requests, actor=auth.actor())
        render.flash("success" if outcome.ok else "error", outcome.message)

st.subheader("Fault injection (simulated providers)")
st.caption(
    "Rehearse an outage: make a simulated provider fail or slow down, then watch the fallback "
    "and the guardrail act on the Monitor page. Clear to go back to the configuration's values."
)


def fault_keys(name: str) -> tuple[str, str, str]:
    return f"err_{name}", f"429_{name}", f"lat_{name}"


def show_faults(name: str, faults) -> None:
    for key, value in zip(
        fault_keys(name),
        canary_form.fault_inputs(faults),
        strict=False,
    ):
        st.session_state[key] = float(value)


def on_save_faults(name: str, base) -> None:
    err, limited, mult = (st.session_state[k] for k in fault_keys(name))
    outcome = canary_form.save_faults(engine, name, err, limited, mult, actor=auth.actor(), base=base)
    state.flash = ("success" if outcome.ok else "error", outcome.message)
    resources.refresh()


def on_clear_faults(name: str, config_faults) -> None:
    state.flash = ("success", canary_form.reset_faults(engine, name).message)
    show_faults(name, config_faults)
    resources.refresh()


simulated = [(n, p) for n, p in settings.providers.items() if p.is_simulated]
stored_faults = resources.faults()  # one cached read for every provider (cleared after each write)
for col, (name, provider) in zip(st.columns(max(len(simulated), 1)), simulated, strict=False):
    faults = stored_faults.get(name) or provider.faults
    if fault_keys(name)[0] not in st.session_state:
        show_faults(name, faults)
    err_key, limit_key, lat_key = fault_keys(name)
    with col, st.form(f"faults_{name}"):
        st.markdown(f"**{name}** ({'primary' if name == settings.routing.primary else 'fallback'})")
        st.number_input("Error rate (%)", 0.0, 100.0, step=5.0, key=err_key)
        st.number_input("429 rate (%)", 0.0, 100.0, step=5.0, key=limit_key)
        st.number_input("Latency multiplier", 0.1, 100.0, step=0.5, key=lat_key)
        b1, b2 = st.columns(2)
        b1.form_submit_button("Save faults", type="primary", on_click=on_save_faults, args=(name, faults))
        b2.form_submit_button("Clear", on_click=on_clear_faults, args=(name, provider.faults))
