"""Canary control: set the ratio (optimistic-locked, audited), quick rollback / promote, the audit
trail beside the observed split, the guardrail and fault injection for simulated providers.

The ratio is a number input without bounds, so any number the operator typed reaches the validation
in ``app.dashboard.canary_form`` and a refusal is shown under the field (bounds would keep the old
value in the browser and hide the message in a tooltip). What is not a finite number (letters,
1e400) never leaves the browser's number field: the field keeps its value, and Apply refuses it
as "no change"."""

import time

import pandas as pd
import streamlit as st

from app.dashboard import canary_form, rollout_panel
from app.dashboard.charts import audit_frame, ratio_step_figure, split_figure
from app.dashboard.providers import provider_role
from app.display.fmt import ago, ratio_pct, when
from app.display.safe_text import inert
from app.guardrail import guardrail_defaults, provider_error_rate
from core.faults import effective_faults
from ui import auth, render, resources
from ui.state import CanaryPageState

PCT_KEY, SLIDER_KEY, REASON_KEY = "canary_pct", "canary_pct_slider", "canary_reason"
GUARD_KEYS = {"threshold": "guard_threshold", "window": "guard_window", "min_requests": "guard_min"}

state = CanaryPageState.get()
who = auth.actor()


def ratio_keys() -> tuple[str, str]:
    """The ratio inputs' widget keys (number field, slider). A value the page puts in them (the
    stored ratio loaded, a write's result) goes into new widgets under new keys: until the browser
    draws the new value it sends the old one with every fragment refresh, and a later run would
    take that stale value over the one put there; under a new key the stale value belongs to a
    widget that is gone, and is dropped."""
    n = state.ratio_generation
    return (PCT_KEY, SLIDER_KEY) if n == 0 else (f"{PCT_KEY}.{n}", f"{SLIDER_KEY}.{n}")


def show_ratio(ratio: float) -> None:
    value = canary_form.input_percent(ratio)
    if ratio_keys()[0] in st.session_state:
        state.ratio_generation += 1
    pct_key, slider_key = ratio_keys()
    st.session_state[pct_key] = value
    st.session_state[slider_key] = value
    state.errors.pop("ratio", None)


def field_error(name: str) -> None:
    """The refusal about input ``name``, right under it."""
    if name in state.errors:
        st.error(inert(state.errors[name]), icon="⚠️")


def note(area: str) -> None:
    """The outcome of the last write in ``area`` (guardrail, faults_NAME), shown once beside it."""
    if area in state.notes:
        render.flash(*state.notes.pop(area))


settings = resources.settings()
engine = resources.engine()
current = resources.current_canary()  # uncached: this page must show exactly what Apply is locked on
if state.seen_version is None or ratio_keys()[0] not in st.session_state:
    # Opening the page (its widgets were not on screen in the previous run) is what "loaded" means
    # for the optimistic lock: Apply is refused if the ratio moves on after this point.
    state.seen_version = current.version
    show_ratio(current.ratio)


def after_write(outcome: canary_form.Outcome) -> None:
    """Remember the outcome (next to its field when it is about one), lock on the version now
    current and show its value in the inputs."""
    state.errors.pop("ratio", None)
    state.errors.pop("reason", None)
    if outcome.field:
        state.errors[outcome.field] = outcome.message
    else:
        state.flash = ("success" if outcome.ok else "error", outcome.message)
    if outcome.state is not None:
        state.seen_version = outcome.state.version
        show_ratio(outcome.state.ratio)
    if outcome.ok:
        st.session_state[REASON_KEY] = ""
    resources.refresh()


def on_number() -> None:
    """Check the typed value at once: a valid one moves the slider, another is refused in place."""
    try:
        ratio = canary_form.parse_percent(st.session_state[ratio_keys()[0]])
    except ValueError as exc:
        state.errors["ratio"] = f"{exc}. Nothing will be written until it is fixed."
        return
    state.errors.pop("ratio", None)
    st.session_state[ratio_keys()[1]] = canary_form.input_percent(ratio)


def on_slider() -> None:
    pct_key, slider_key = ratio_keys()
    st.session_state[pct_key] = float(st.session_state[slider_key])
    state.errors.pop("ratio", None)


def on_apply() -> None:
    after_write(
        canary_form.apply_ratio(
            engine,
            st.session_state[ratio_keys()[0]],
            st.session_state[REASON_KEY],
            expected_version=state.seen_version,
            actor=who,
        )
    )


def on_quick(action: str) -> None:
    percent, _label, _ = canary_form.QUICK_ACTIONS[action]
    reason = st.session_state.get(f"quick_reason_{action}") or ""
    state.pending = None
    after_write(canary_form.apply_ratio(engine, percent, reason, expected_version=state.seen_version, actor=who))


def load_current(now_state) -> None:
    """The header's Load button: the stored value into the inputs, then the whole page drawn again
    (a button inside the refreshing header would rerun only the header)."""
    after_write(canary_form.Outcome(True, "Loaded the current value.", now_state))
    st.rerun(scope="app")


st.title("Canary control")


@st.fragment(run_every=settings.dashboard.refresh_s)
def header() -> None:
    """The ratio as stored now, re-read every refresh (a change by the guardrail or another operator
    shows without a reload); when it moved since the page loaded, Apply is locked on the old
    version and says so."""
    now_state = resources.current_canary() if st.session_state.get("_canary_header_ran") else current
    st.session_state["_canary_header_ran"] = True
    m1, m2 = st.columns([1, 3], vertical_alignment="center")
    m1.metric("Current canary ratio", ratio_pct(now_state.ratio))
    m2.markdown(
        f"**{inert(settings.routing.primary)}** (primary) gets {ratio_pct(now_state.ratio)} of new sessions, "
        f"**{inert(settings.routing.fallback)}** the rest.  \nVersion {now_state.version}, set by "
        f"**{inert(now_state.updated_by)}** {ago(now_state.updated_at, time.time())} ({when(now_state.updated_at)}): "
        f"{inert(now_state.reason)}  \n{inert(resources.split_causes(15).exposure(15))}"
    )
    if now_state.version != state.seen_version and now_state.version != current.version:
        st.warning(
            f"The ratio changed since this page loaded (now {ratio_pct(now_state.ratio)} by "
            f"{inert(now_state.updated_by)}); Apply will be refused, and the charts and audit trail below "
            "show the page as it loaded, until you load the current value."
        )
        st.button("Load the current value", key="canary_header_load", on_click=load_current, args=(now_state,))


st.session_state["_canary_header_ran"] = False  # a full run draws the header from the read above
header()
g = resources.guardrail()
reading = provider_error_rate(engine, settings.routing.primary, g.window_minutes)
read_only = auth.viewer_note()
guard_kind, guard_text = canary_form.guardrail_summary(g, settings.routing.primary, reading)
render.flash(guard_kind, guard_text)  # at the top, under the ratio: is anything watching it?
notices = st.container()  # always present, so messages appearing never shift (and reset) the inputs below
if state.flash:
    with notices:
        render.flash(*state.flash)
    state.flash = None
if current.version != state.seen_version:
    notices.warning(
        f"The ratio changed since this page loaded (now {ratio_pct(current.ratio)} by {inert(current.updated_by)}); "
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
        value=None,  # an emptied field is None, refused: never read as 0 % (the default would be)
        key=ratio_keys()[0],
        step=0.1,
        format="%.1f",
        on_change=on_number,
        help="Share of traffic for the primary, 0 to 100 (e.g. 25 or 12.5)",
        disabled=read_only,
    )
    field_error("ratio")
    st.slider(
        "Canary ratio slider",
        min_value=0.0,
        max_value=100.0,
        step=0.1,
        key=ratio_keys()[1],
        on_change=on_slider,
        label_visibility="collapsed",
        format="%.1f %%",
        disabled=read_only,
    )
    st.text_input(
        "Reason (required)",
        key=REASON_KEY,
        max_chars=500,
        placeholder="e.g. error rate stable for 30 min, widening the canary",
        disabled=read_only,
    )
    field_error("reason")
    typed = canary_form.preview_ratio(st.session_state.get(ratio_keys()[0]), current.ratio)
    if typed is not None:
        shown = resources.ratio_preview(typed)
        with st.expander(f"Before you apply: what {ratio_pct(typed)} would do", expanded=True):
            st.caption(shown.lines()[0])
            if shown.warning():
                st.warning(inert(shown.warning()))
            if shown.rows:
                st.dataframe(shown.table(), hide_index=True, key="canary_preview")
    st.button("Apply", type="primary", on_click=on_apply, disabled=read_only)

    st.markdown("**Quick actions**")
    q1, q2 = st.columns(2)
    if q1.button("Roll back to 0 %", width="stretch", disabled=read_only):
        state.pending = "rollback"
    if q2.button("Promote to 100 %", width="stretch", disabled=read_only):
        state.pending = "promote"
    if state.pending and not read_only:
        percent, label, _ = canary_form.QUICK_ACTIONS[state.pending]
        effect = canary_form.quick_effect(state.pending, settings)
        with st.container(border=True):
            st.warning(f"{label}: {inert(effect)}. Confirm?")
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
    for line in resources.split_causes(minutes).sentences():
        st.caption(inert(line))

routes_with_canary = canary_form.route_canaries(engine, settings)
if routes_with_canary:
    st.subheader("Route canaries")
    st.caption(
        "A route's canary deployment gets its share of the route's requests (a session keeps its side); "
        "the rest go to the route's own deployments by its strategy. Each change is audited."
    )

    def on_route_apply(route: str, scope: str, seen: int | None) -> None:
        outcome = canary_form.apply_ratio(
            engine,
            st.session_state[f"route_pct_{route}"],
            st.session_state[f"route_reason_{route}"],
            expected_version=seen,
            actor=who,
            scope=scope,
        )
        state.notes[f"route_{route}"] = ("success" if outcome.ok else "error", outcome.message)
        if outcome.ok:
            st.session_state[f"route_reason_{route}"] = ""
        if outcome.state is not None:
            st.session_state[f"route_pct_{route}"] = canary_form.input_percent(outcome.state.ratio)
            st.session_state[f"route_seen_{route}"] = outcome.state.version
        resources.refresh()

    from db.canary import route_scope

    for rc in routes_with_canary:
        if f"route_pct_{rc.route}" not in st.session_state:
            st.session_state[f"route_pct_{rc.route}"] = canary_form.input_percent(rc.ratio)
            st.session_state[f"route_seen_{rc.route}"] = rc.version
        with st.container(border=True):
            c1, c2 = st.columns([1, 3], vertical_alignment="center")
            c1.metric(f"Route {rc.route}", ratio_pct(rc.ratio))
            set_by = (
                f"Version {rc.state.version}, set by **{inert(rc.state.updated_by)}** {when(rc.state.updated_at)}: "
                f"{inert(rc.state.reason)}"
                if rc.state is not None
                else "Never set: 0 %."
            )
            c2.markdown(f"Canary **{inert(rc.canary)}**; baseline {inert(rc.baseline)}.  \n{set_by}")
            seen = st.session_state.get(f"route_seen_{rc.route}")
            if rc.version is not None and seen is not None and rc.version != seen:
                st.warning("This route's ratio changed since the page loaded; Apply will be refused until you reload.")
            f1, f2, f3 = st.columns([1, 3, 1], vertical_alignment="bottom")
            f1.number_input(
                "Share (%)", value=None, key=f"route_pct_{rc.route}", step=0.1, format="%.1f", disabled=read_only
            )
            f2.text_input("Reason (required)", key=f"route_reason_{rc.route}", max_chars=500, disabled=read_only)
            f3.button(
                "Apply",
                key=f"route_apply_{rc.route}",
                on_click=on_route_apply,
                args=(rc.route, route_scope(rc.route), seen),
                disabled=read_only,
            )
            note(f"route_{rc.route}")

st.subheader("Canary vs baseline")
st.caption(
    "Each signal on both arms over the last hour, with an always-valid p-value: reading this as often as "
    "you like keeps the chance of calling a healthy canary worse under 5 % (split over the signals). "
    "Read-only: nothing here moves a ratio. It reads the hour's request log, so it runs when asked."
)
scopes = [(None, "global canary")] + [(rc.route, f"route {rc.route}") for rc in routes_with_canary]
compare = st.toggle("Compare each canary with its baseline", key="canary_analysis_on")
for route, label in scopes if compare else []:
    result = resources.analysis(route, 60)
    verdict = {"worse": "error", "nodata": "info", "pass": "success"}[result.verdict]
    render.flash(
        verdict,
        f"{label}: {result.verdict} ({result.candidate_requests:,} canary and {result.baseline_requests:,} baseline "
        "requests)",
    )
    st.dataframe(
        pd.DataFrame(result.rows()),
        hide_index=True,
        width="stretch",
        key=f"analysis_{route or 'global'}",
        column_config={
            "candidate rate": st.column_config.NumberColumn(format="percent"),
            "baseline rate": st.column_config.NumberColumn(format="percent"),
            "p (always valid)": st.column_config.NumberColumn(format="%.3g"),
        },
    )

st.subheader("Progressive rollout")
st.caption(
    "A plan the gateway carries out itself: each step bakes, then moves on when every metric passes "
    "against the baseline, and aborts on its own the moment one is worse (always-valid tests, so the "
    "chance of aborting a healthy candidate stays under alpha however often it looks)."
)
ROLLOUT_INPUTS = {
    "steps": "Steps (%)",
    "bake_s": "Bake time per step (s)",
    "min_samples": "Samples per arm (a session counts once)",
    "alpha": "Alpha (false-abort level)",
    "shadow_share": "Shadow share first (blank: none)",
    "shadow_budget_usd": "Shadow budget (USD)",
}
ROLLOUT_DEFAULTS = {"steps": "1,5,10,25,50,100", "bake_s": "600", "min_samples": "50", "alpha": "0.05",
                    "shadow_share": "", "shadow_budget_usd": ""}  # fmt: skip
choices = rollout_panel.candidates(settings)


def on_start_rollout() -> None:
    label = st.session_state["rollout_candidate"]
    route = next(r for lab, r in choices if lab == label)
    outcome = rollout_panel.start_plan(
        engine, settings, route=route, dry_run=bool(st.session_state["rollout_dry_run"]),
        reason=st.session_state["rollout_reason"], actor=who,
        **{k: st.session_state[f"rollout_{k}"] for k in ROLLOUT_INPUTS},
    )  # fmt: skip
    for k in (*ROLLOUT_INPUTS, "reason", "candidate"):
        state.errors.pop(f"rollout_{k}", None)
    if outcome.field:
        state.errors[f"rollout_{outcome.field}"] = outcome.message
    else:
        state.notes["rollout"] = ("success" if outcome.ok else "error", outcome.message)
    resources.refresh()


def on_rollout_confirm(rollout_id: int, verb: str) -> None:
    outcome = rollout_panel.act(
        engine, rollout_id, verb, reason=st.session_state.get(f"rollout_act_reason_{rollout_id}", ""), actor=who
    )
    state.notes["rollout"] = ("success" if outcome.ok else "error", outcome.message)
    if outcome.ok:
        state.pending_rollout = None
    resources.refresh()


for k, v in ROLLOUT_DEFAULTS.items():
    st.session_state.setdefault(f"rollout_{k}", v)
with st.form("rollout_plan"):
    st.selectbox("Candidate", [lab for lab, _ in choices], key="rollout_candidate", disabled=read_only)
    field_error("rollout_candidate")
    for col, (k, label) in zip(st.columns(len(ROLLOUT_INPUTS)), ROLLOUT_INPUTS.items(), strict=True):
        with col:
            st.text_input(label, key=f"rollout_{k}", disabled=read_only)
            field_error(f"rollout_{k}")
    st.checkbox("Dry run (analyse and record, never move the weight)", key="rollout_dry_run", disabled=read_only)
    st.text_input("Reason for this rollout (required)", key="rollout_reason", max_chars=500, disabled=read_only)
    field_error("rollout_reason")
    st.form_submit_button("Start rollout", type="primary", on_click=on_start_rollout, disabled=read_only)
note("rollout")


def rollout_evidence(shown) -> None:
    """One rollout's state and evidence, re-read at every refresh while it is active; readings are
    shared between sessions for a refresh interval. A long rollout's first reading goes on part by
    part (a bounded read each), the note saying how far it has read, then the evidence is drawn."""
    fresh_s = settings.dashboard.refresh_s
    view = rollout_panel.view(engine, shown, fresh_s=fresh_s)
    r = view.rollout
    render.flash(view.status, view.summary)
    progress = st.empty()
    behind, through, before = view.behind, view.read_through, None
    while behind and through != before:  # each part moves on, or the note stays
        progress.info(behind)
        before = through
        behind, through = rollout_panel.read_part(engine, r, fresh_s=fresh_s)
    if behind:
        progress.info(behind)
    else:
        progress.empty()
    if before is not None:  # parts were read: the evidence as it stands after the last one
        view = rollout_panel.view(engine, r, fresh_s=fresh_s)
    st.plotly_chart(view.figure, width="stretch", key=f"rollout_timeline_{r.id}")
    st.dataframe(
        pd.DataFrame(view.metrics), hide_index=True, width="stretch", key=f"rollout_metrics_{r.id}",
        column_config={
            "candidate rate": st.column_config.NumberColumn(format="percent"),
            "baseline rate": st.column_config.NumberColumn(format="percent"),
            "p (always valid)": st.column_config.NumberColumn(format="%.3g"),
        },
    )  # fmt: skip
    if not view.live and st.session_state.get(f"_rollout_live_{r.id}"):
        st.session_state[f"_rollout_live_{r.id}"] = False
        st.rerun(scope="app")  # it ended: the page (its buttons) drawn once more, then still
    st.session_state[f"_rollout_live_{r.id}"] = view.live


every_shown = rollout_panel.shown(engine)
rollout_panel.keep_only(engine, every_shown)
for r in every_shown:
    live = st.session_state.get(f"_rollout_live_{r.id}", True)
    st.fragment(run_every=settings.dashboard.refresh_s if live else None)(rollout_evidence)(r)
    if not r.active or read_only:
        continue
    cols = st.columns(len(rollout_panel.VERBS))
    for col, verb in zip(cols, rollout_panel.VERBS, strict=True):
        if col.button(verb.capitalize(), key=f"rollout_{verb}_{r.id}", width="stretch"):
            state.pending_rollout = (r.id, verb)
    if state.pending_rollout and state.pending_rollout[0] == r.id:
        verb = state.pending_rollout[1]
        with st.container(border=True):
            st.warning(f"{verb.capitalize()} rollout #{r.id}: {inert(rollout_panel.confirm_text(r, verb))} Confirm?")
            st.text_input("Reason for this action (required)", key=f"rollout_act_reason_{r.id}")
            c1, c2 = st.columns(2)
            c1.button(f"Confirm: {verb}", type="primary", key=f"rollout_confirm_{r.id}", on_click=on_rollout_confirm,
                      args=(r.id, verb))  # fmt: skip
            if c2.button("Cancel", key=f"rollout_cancel_{r.id}"):
                state.pending_rollout = None
                st.rerun()

st.subheader("Audit trail")
every = resources.audit(scope=None) if routes_with_canary else audit
if every:
    st.dataframe(audit_frame(every), hide_index=True, width="stretch")
else:
    st.caption("No changes yet: the ratio is the configuration's initial value.")

st.subheader("Guardrail")
st.caption(
    f"Automatic rollback to 0 % (audited as actor `guardrail`) when {inert(settings.routing.primary)}'s error "
    f"rate over the window exceeds the threshold. Now: {canary_form.guardrail_status(reading, g.window_minutes)}. "
    f"Last changed by {inert(g.updated_by)} ({when(g.updated_at)})."
)
if GUARD_KEYS["threshold"] not in st.session_state:
    st.session_state[GUARD_KEYS["threshold"]] = f"{canary_form.input_percent(g.error_rate_threshold):g}"
    st.session_state[GUARD_KEYS["window"]] = str(g.window_minutes)
    st.session_state[GUARD_KEYS["min_requests"]] = str(g.min_requests)
    st.session_state["guard_enabled"] = g.enabled


def on_save_guardrail() -> None:
    outcome = canary_form.save_guardrail(
        engine,
        st.session_state["guard_enabled"],
        *(st.session_state[k] for k in GUARD_KEYS.values()),
        actor=who,
        defaults=guardrail_defaults(settings),
    )
    for name in GUARD_KEYS:
        state.errors.pop(name, None)
    if outcome.field:
        state.errors[outcome.field] = outcome.message
    else:
        state.notes["guardrail"] = ("success" if outcome.ok else "error", outcome.message)
    resources.refresh()


with st.form("guardrail"):
    st.toggle("Enable automatic rollback", key="guard_enabled", disabled=read_only)
    gc1, gc2, gc3 = st.columns(3)
    for col, (name, label) in zip(
        (gc1, gc2, gc3),
        [
            ("threshold", "Error-rate threshold (%)"),
            ("window", "Window (minutes)"),
            ("min_requests", "Minimum attempts in window"),
        ],
        strict=True,
    ):
        with col:
            st.text_input(label, key=GUARD_KEYS[name], disabled=read_only)
            field_error(name)
    st.form_submit_button("Save guardrail", on_click=on_save_guardrail, disabled=read_only)
    note("guardrail")

st.subheader("Fault injection (simulated providers)")
st.caption(
    "Rehearse an outage: make a simulated provider fail or slow down, then watch the fallback "
    "and the guardrail act on the Monitor page. Clear to go back to the configuration's values."
)
FAULT_FIELDS = ("error_rate", "rate_limit_rate", "latency_multiplier")


def fault_keys(name: str) -> tuple[str, str, str]:
    return f"err_{name}", f"429_{name}", f"lat_{name}"


def quality_key(field: str, name: str) -> str:
    return f"q_{field}_{name}"


def show_faults(name: str, faults) -> None:
    for key, field, value in zip(fault_keys(name), FAULT_FIELDS, canary_form.fault_inputs(faults), strict=True):
        st.session_state[key] = f"{value:g}"
        state.errors.pop(f"{field}_{name}", None)
    for field, value in canary_form.quality_inputs(faults).items():
        st.session_state[quality_key(field, name)] = f"{value:g}"
        state.errors.pop(f"{field}_{name}", None)


def on_save_faults(name: str, base) -> None:
    err, limited, mult = (st.session_state[k] for k in fault_keys(name))
    quality = {f: st.session_state[quality_key(f, name)] for f, _, _ in canary_form.QUALITY_FAULTS}
    outcome = canary_form.save_faults(engine, name, err, limited, mult, actor=who, base=base, quality=quality)
    for field in (*FAULT_FIELDS, *(f for f, _, _ in canary_form.QUALITY_FAULTS)):
        state.errors.pop(f"{field}_{name}", None)
    if outcome.field:
        state.errors[f"{outcome.field}_{name}"] = outcome.message
    else:
        state.notes[f"faults_{name}"] = ("success" if outcome.ok else "error", outcome.message)
    resources.refresh()


def on_clear_faults(name: str, config_faults) -> None:
    outcome = canary_form.reset_faults(engine, name, actor=who)
    state.notes[f"faults_{name}"] = ("success" if outcome.ok else "error", outcome.message)
    if outcome.ok:
        show_faults(name, config_faults)
    resources.refresh()


simulated = [(n, p) for n, p in settings.providers.items() if p.is_simulated]
stored_faults = resources.faults()  # one cached read for every provider (cleared after each write)
for col, (name, provider) in zip(st.columns(max(len(simulated), 1)), simulated, strict=False):
    faults = effective_faults(stored_faults.get(name), provider.faults)
    if fault_keys(name)[0] not in st.session_state:
        show_faults(name, faults)
    with col, st.form(f"faults_{name}"):
        st.markdown(f"**{inert(name)}** ({provider_role(settings, name)})")
        for key, field, label in zip(
            fault_keys(name), FAULT_FIELDS, ("Error rate (%)", "429 rate (%)", "Latency multiplier"), strict=True
        ):
            st.text_input(label, key=key, disabled=read_only)
            field_error(f"{field}_{name}")
        with st.expander("Answer quality (what a worse model does)"):
            for q_field, q_label, _q_bounds in canary_form.QUALITY_FAULTS:
                st.text_input(q_label, key=quality_key(q_field, name), disabled=read_only)
                field_error(f"{q_field}_{name}")
        b1, b2 = st.columns(2)
        b1.form_submit_button(
            "Save faults", type="primary", on_click=on_save_faults, args=(name, faults), disabled=read_only
        )
        b2.form_submit_button("Clear", on_click=on_clear_faults, args=(name, provider.faults), disabled=read_only)
        note(f"faults_{name}")
