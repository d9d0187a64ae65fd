"""Monitor: live latency, traffic, errors, cost and tokens for a chosen window (times in UTC),
filtered by provider, model, intent and source, with the newest requests and a CSV export."""

import streamlit as st

from app.monitor import WINDOWS, MonitorState, clear_cache, monitor_view, refresh_intervals, window_label
from ui import resources

K = MonitorState.key
engine = resources.engine()
refresh_s = resources.settings().dashboard.refresh_s  # [dashboard] refresh_s: the default interval

st.title("Monitor")
controls = st.columns([3, 2, 1, 1], vertical_alignment="bottom")
controls[0].selectbox(
    "Time window", list(WINDOWS), index=list(WINDOWS).index("1h"), format_func=window_label, key=K("window")
)
intervals = refresh_intervals(refresh_s)
controls[1].selectbox(
    "Auto-refresh every",
    intervals,
    index=intervals.index(refresh_s),
    format_func=lambda s: f"{s:g} seconds",
    key=K("interval_s"),
)
controls[2].toggle("Pause", key=K("paused"), help="Stop auto-refresh (Refresh still works)")
if controls[3].button("Refresh", key="monitor_refresh", help="Re-read everything now"):
    resources.refresh()
    clear_cache()

state = MonitorState.from_session(st.session_state, refresh_s)
choices = resources.monitor_filter_choices(state.window, state.filters)
with st.expander("Filters (empty = all)", expanded=state.filters.active):
    cols = st.columns(4)
    cols[0].multiselect("Provider", choices["providers"], key=K("providers"))
    cols[1].multiselect("Model", choices["models"], key=K("models"))
    cols[2].multiselect("Intent", choices["intents"], key=K("intents"))
    cols[3].multiselect("Source", choices["sources"], key=K("sources"))
state = MonitorState.from_session(st.session_state, refresh_s)


@st.fragment(run_every=state.run_every)
def live() -> None:
    view = monitor_view(engine, state.window, state.filters)
    st.caption(view.caption + (" · paused" if state.paused else f" · refreshing every {state.interval_s:g} s"))
    if not view.has_data:
        st.info(
            "No requests in this window. Send some from the Playground, or run "
            "`python -m app loadgen --rps 5 --duration 60`."
        )
    for row in (view.kpis[:5], view.kpis[5:]):
        for col, kpi in zip(st.columns(5), row, strict=False):
            col.metric(kpi.label, kpi.value, help=kpi.help)
    figures = list(view.figures.items())
    for left, right in zip(figures[::2], figures[1::2], strict=False):
        cols = st.columns(2)
        for col, (name, fig) in zip(cols, (left, right), strict=False):
            col.plotly_chart(fig, key=f"monitor_chart_{name}", width="stretch")
    st.subheader("Recent requests")
    st.caption(f"Newest {len(view.recent)} attempts in the window, newest first (time_utc is UTC).")
    st.dataframe(view.recent, hide_index=True, width="stretch")
    st.download_button(
        "Download CSV", view.recent_csv, file_name=f"requests-{state.window}.csv", mime="text/csv", key="monitor_csv"
    )


live()
