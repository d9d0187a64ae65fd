"""Overview: an incident banner, the canary ratio, demo traffic, the named figures (last minute and
last 15 minutes), charts, provider states and the request log. The live parts refresh themselves
every ``[dashboard] refresh_s`` seconds (fragments), without a reload."""

import time

import pandas as pd
import streamlit as st

from app.dashboard import demo_traffic
from app.dashboard.log_health import log_counters
from app.dashboard.overview import OVERVIEW_WINDOW_S
from app.dashboard.providers import provider_statuses, status_rows
from app.display.fmt import ago, ms, pct, ratio_pct, usd, utc_time, when
from app.display.safe_text import inert
from app.monitor.figures import span_label
from app.monitor.incidents import banner_text, refusals_text
from ui import render, resources
from ui.state import OverviewState

st.title("Overview")
settings = resources.settings()
refresh_s = settings.dashboard.refresh_s


@st.fragment(run_every=refresh_s)
def incidents_and_ratio() -> None:
    _, incidents, read_at = resources.live(OVERVIEW_WINDOW_S)
    for incident in incidents:
        show = st.error if incident.severity == "error" else st.warning
        show(banner_text(incident, read_at), icon=":material/warning:")
    rollout = resources.rollout_banner()
    if rollout is not None:
        render.flash(*rollout)
    refusals = resources.gateway_refusals(OVERVIEW_WINDOW_S)
    if refusals is not None:
        st.warning(refusals_text(refusals), icon=":material/block:")
    now = time.time()
    canary = resources.current_canary()
    left, right = st.columns([1, 3], vertical_alignment="center")
    left.metric("Canary ratio", ratio_pct(canary.ratio), help="Share of new sessions sent to the primary")
    right.markdown(
        f"**{inert(settings.routing.primary)}** (primary) gets {ratio_pct(canary.ratio)} of traffic, "
        f"**{inert(settings.routing.fallback)}** the rest.  \nSet by **{inert(canary.updated_by)}** "
        f"{ago(canary.updated_at, now)} ({when(canary.updated_at)}): {inert(canary.reason)}  \n"
        f"{inert(resources.split_causes(15).exposure(15))}"
    )
    st.caption(resources.gateway_server().line())


incidents_and_ratio()

# Demo traffic: offered on an empty log, so a fresh install has something to look at. It comes
# right after the ratio, so a phone (390 px, where every column stacks) shows it without scrolling.
job_key = settings.database_url
job = demo_traffic.current_job(job_key)
if job is not None and job.running:

    @st.fragment(run_every=1.0)
    def demo_progress() -> None:
        current = demo_traffic.current_job(job_key)
        if current is None:
            return
        st.progress(current.fraction, text=current.label())
        if current.finished:
            resources.refresh()
            st.rerun(scope="app")

    demo_progress()
elif job is not None and job.finished and job is OverviewState.get().demo_job:
    (st.error if job.error else st.success)(inert(job.label()))
else:
    # The offer disappears by itself once traffic arrives (loadgen in another process, say).
    @st.fragment(run_every=refresh_s)
    def empty_log_offer() -> None:
        # One slot, emptied explicitly: a fragment run that draws nothing may leave its last
        # drawing on screen.
        slot = st.empty()
        if resources.has_requests():
            slot.empty()
            return
        with slot.container():
            st.subheader("No traffic yet")
            client = resources.client()
            if demo_traffic.simulated_only(client):
                st.info(
                    f"The request log is empty. Generate about {demo_traffic.DEMO_REQUESTS} "
                    "demo requests through the simulated providers (tagged `loadgen`) so the charts have data."
                )
                if st.button("Generate demo traffic", type="primary"):
                    OverviewState.get().demo_job = demo_traffic.start_job(job_key, client)
                    st.rerun(scope="app")
            else:
                st.info(
                    "The request log is empty. Send a prompt from the Playground, or run "
                    "`python -m app loadgen` against simulated providers."
                )

    empty_log_offer()


@st.fragment(run_every=refresh_s)
def live_figures() -> None:
    figures, _, read_at = resources.live(OVERVIEW_WINDOW_S)
    st.subheader("Last 15 minutes")
    st.caption(f"Updated {utc_time(read_at)} UTC, refreshing every {refresh_s:g} s")
    stats = resources.overview(OVERVIEW_WINDOW_S)
    cols = st.columns(4)
    cols[0].metric(f"Requests, {span_label(OVERVIEW_WINDOW_S)}", f"{stats.requests:,}")
    cols[1].metric("p50 latency", ms(stats.p50_ms))
    cols[2].metric("p95 latency", ms(stats.p95_ms))
    cols[3].metric("Cost today (UTC)", usd(stats.cost_today_usd))
    tiles = figures.tiles()
    for row in (tiles[:3], tiles[3:]):
        for col, (label, rate, help_text) in zip(st.columns(3), row, strict=True):
            col.metric(label, pct(rate), help=help_text)

    if stats.requests or resources.has_requests():
        charts = resources.overview_figures()
        left, right = st.columns(2)
        left.plotly_chart(charts["requests"], key="overview_requests")
        right.plotly_chart(charts["latency"], key="overview_latency")

    st.subheader("Providers")
    statuses = provider_statuses(
        settings,
        resources.health(),
        secrets=resources.secrets(),
        faults=resources.faults(),
        breakers=resources.breakers(),
        figures=figures,
    )
    st.dataframe(
        pd.DataFrame(status_rows(statuses, OVERVIEW_WINDOW_S)),
        hide_index=True,
        width="stretch",
        # The breaker's state and since when is what an incident is read by: never cut to "half-oper".
        column_config={
            "breaker": st.column_config.TextColumn(width="large"),
            "state": st.column_config.TextColumn(width="medium"),
        },
    )
    if settings.routes:
        st.subheader("Routes")
        st.caption(
            f"Each route's deployments as configured, what each served over the {span_label(OVERVIEW_WINDOW_S)}, "
            "and its health in every gateway process still reporting."
        )
        st.dataframe(
            pd.DataFrame(resources.deployments(OVERVIEW_WINDOW_S)),
            hide_index=True,
            width="stretch",
            column_config={"error rate": st.column_config.NumberColumn(format="percent")},
            key="overview_routes",
        )

    st.subheader("Request log")
    log_state = log_counters(resources.client())
    if log_state is not None:
        for col, (label, value, help_text) in zip(st.columns(4), log_state.metrics(), strict=True):
            col.metric(label, value, help=help_text)
        if log_state.warning:
            st.warning(log_state.warning)


live_figures()
