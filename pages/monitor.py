"""Monitor: what the upstreams did (attempt errors), what the router did about it (fallbacks) and
what callers saw (final failures), per provider and model, and per route and route deployment,
over a chosen window or custom range (times in UTC), with events marked on every chart; below them
the request table for finding failures (filtered by status, error class, key and session as well,
failed rows marked, paged by keyset, held still while the operator reads it) linked to the
drill-down, and a streamed CSV export of the whole window."""

from datetime import UTC, datetime, timedelta

import streamlit as st

from app.monitor import (
    CUSTOM,
    FAILED_MARK,
    RECENT_LABELS,
    STATUS_CHOICES,
    TABLE_COLUMNS,
    WINDOWS,
    MonitorState,
    RangeError,
    clear_cache,
    intent_models,
    level_table,
    monitor_view,
    rate_columns,
    refresh_intervals,
    table_mode,
    table_refresh_s,
    table_view,
    window_download,
    window_label,
)
from core.session import MAX_SESSION_ID
from ui import resources
from ui.state import MonitorTableState

K = MonitorState.key
engine = resources.engine()
settings = resources.settings()
refresh_s = settings.dashboard.refresh_s  # [dashboard] refresh_s: the default interval
ROUTES = {"primary": settings.routing.primary, "fallback": settings.routing.fallback}
INTENT_MODELS = intent_models(settings.intents)
RATE = st.column_config.NumberColumn(format="percent")
LEVEL_COLUMNS = {  # the rate columns are named by their span: rate_columns(view.span) below
    "p50 ms": st.column_config.NumberColumn(format="%.0f"),
    "p95 ms": st.column_config.NumberColumn(format="%.0f"),
    "p99 ms": st.column_config.NumberColumn(format="%.0f"),
    "cost USD": st.column_config.NumberColumn(format="$%.4f"),
    "req/s, last 1 min": st.column_config.NumberColumn(format="%.2f"),
}

st.title("Monitor")
controls = st.columns([3, 2, 1, 1], vertical_alignment="bottom")
windows = [*WINDOWS, CUSTOM]
controls[0].selectbox("Time window", windows, index=windows.index("1h"), format_func=window_label, key=K("window"))
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
    MonitorTableState.get().go_refresh()

if st.session_state.get(K("window")) == CUSTOM:
    now = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
    span_cols = st.columns(2)
    span_cols[0].datetime_input("Start (UTC)", value=now - timedelta(hours=3), key=K("start"), step=60)
    span_cols[1].datetime_input("End (UTC)", value=now, key=K("end"), step=60)

state = MonitorState.from_session(st.session_state, refresh_s)
choices = resources.monitor_filter_choices(state.window, state.filters)
with st.expander("Filters (empty = all)", expanded=state.filters.active):
    cols = st.columns(3)
    cols[0].multiselect("Provider", choices["providers"], key=K("providers"))
    cols[1].multiselect("Model", choices["models"], key=K("models"))
    cols[2].multiselect("Intent", choices["intents"], key=K("intents"))
    cols = st.columns(3)
    cols[0].multiselect("Source", choices["sources"], key=K("sources"))
    cols[1].multiselect("Route", choices["routes"], key=K("routes"), help="A [routes] name: its traffic only")
    cols[2].multiselect(
        "Deployment", choices["deployments"], key=K("deployments"), help="provider/model of a route's deployment"
    )
state = MonitorState.from_session(st.session_state, refresh_s)
try:
    span = state.span()
except RangeError as exc:
    st.error(f"Time range refused: {exc}")
    st.stop()


@st.fragment(run_every=state.run_every)
def live() -> None:
    view = monitor_view(engine, state.window, state.filters, span=span, routes=ROUTES, intent_models=INTENT_MODELS)
    refreshing = " · paused" if state.run_every is None else f" · refreshing every {state.interval_s:g} s"
    st.caption(view.caption + refreshing)
    if not view.has_data:
        st.info(
            "No requests in this window. Send some from the Playground, or run "
            "`python -m app loadgen --rps 5 --duration 60`."
        )
    for row in (view.kpis[:5], view.kpis[5:]):
        for col, kpi in zip(st.columns(5), row, strict=False):
            col.metric(kpi.label, kpi.value, kpi.delta, delta_color=kpi.delta_color, help=kpi.help)
    if view.levels is not None:
        st.subheader("Attempts, fallbacks and final failures")
        tabs = st.tabs(["By provider", "By model", "By route", "By deployment"])
        level_columns = {**LEVEL_COLUMNS, **dict.fromkeys(rate_columns(view.span), RATE)}
        tabs[0].dataframe(
            level_table((view.levels.total, *view.levels.providers), span=view.span),
            hide_index=True,
            width="stretch",
            column_config=level_columns,
            key="monitor_levels_provider",
        )
        tabs[1].dataframe(
            level_table(view.levels.models, first="model", span=view.span),
            hide_index=True,
            width="stretch",
            column_config=level_columns,
            key="monitor_levels_model",
        )
        tabs[2].dataframe(
            level_table(view.levels.routes, first="route", span=view.span),
            hide_index=True,
            width="stretch",
            column_config=level_columns,
            key="monitor_levels_route",
        )
        tabs[3].dataframe(
            level_table(view.levels.deployments, first="deployment", span=view.span),
            hide_index=True,
            width="stretch",
            column_config=level_columns,
            key="monitor_levels_deployment",
        )
    if view.substitutions and view.substitutions.by_pair:
        st.caption(
            "Substituted requests: the provider did not serve the chosen model. Cost delta = actual "
            "cost minus the same tokens at the chosen model's price."
        )
        st.dataframe(
            [
                {"chosen model": c, "answered by": m, "requests": n, "cost delta USD": d}
                for c, m, n, d in view.substitutions.by_pair
            ],
            hide_index=True,
            column_config={"cost delta USD": st.column_config.NumberColumn(format="%+.4f")},
            key="monitor_substitutions",
        )
    figures = list(view.figures.items())
    for left, right in zip(figures[::2], figures[1::2], strict=False):
        cols = st.columns(2)
        for col, (name, fig) in zip(cols, (left, right), strict=False):
            col.plotly_chart(fig, key=f"monitor_chart_{name}", width="stretch")


live()


table_state = MonitorTableState.get()
# The table re-reads on the auto-refresh only while it follows the newest rows; otherwise it runs
# when the operator acts on it (a filter, a paging button, Refresh table) and at no other time.
table_every = table_refresh_s(table_state.cursor, state.run_every)


@st.fragment(run_every=table_every)
def request_table() -> None:
    st.subheader("Requests")
    now_state = MonitorState.from_session(st.session_state, refresh_s)
    picks = resources.monitor_table_choices(now_state.window_start(span), now_state.error_classes, now_state.key_names)
    cols = st.columns([1, 2, 2, 2])
    cols[0].selectbox("Status", STATUS_CHOICES, key=K("status"), help=f"error: failed rows, marked {FAILED_MARK}")
    cols[1].multiselect("Error class", picks["error_classes"], key=K("error_classes"))
    cols[2].multiselect("Gateway key", picks["keys"], key=K("key_names"))
    cols[3].text_input(
        "Session id", max_chars=MAX_SESSION_ID, key=K("session_text"), help="Exact session id, any script"
    )
    now_state = MonitorState.from_session(st.session_state, refresh_s)
    try:
        rows = now_state.row_filters()
    except ValueError as exc:
        st.error(str(exc))
        return
    cursor = table_state.settle(now_state.table_query(span, rows), filtered=now_state.table_filtered(rows))
    if table_refresh_s(cursor, now_state.run_every) != table_every:
        st.rerun()  # the table switched between following and holding: re-register its refresh
    page = table_view(engine, window=now_state.window, span=span, filters=now_state.filters, rows=rows, cursor=cursor)
    table_state.page = page
    st.caption(table_mode(cursor, auto_refresh_s=now_state.run_every, custom=now_state.window == CUSTOM))
    nav = st.columns([1, 1, 1, 1.4, 4], vertical_alignment="center")
    nav[0].button("Newest", key="monitor_newest", on_click=table_state.go_newest, disabled=cursor.live)
    nav[1].button("Newer", key="monitor_newer", on_click=table_state.go_newer, disabled=not page.has_newer)
    nav[2].button("Older", key="monitor_older", on_click=table_state.go_older, disabled=not page.has_older)
    nav[3].button("Refresh table", key="monitor_table_refresh", on_click=table_state.go_refresh)
    nav[4].caption(page.caption)
    st.dataframe(
        page.rows,
        hide_index=True,
        width="stretch",
        column_order=TABLE_COLUMNS,
        column_config={
            "status": st.column_config.TextColumn("status", width="small", pinned=True),
            "time_utc": st.column_config.TextColumn("time (UTC)", pinned=True),
            "error_class": st.column_config.TextColumn("error class"),
            "error": st.column_config.TextColumn("error", width="medium"),
            "open": st.column_config.LinkColumn("open", display_text="open", width="small"),
            **{name: st.column_config.Column(label) for name, label in RECENT_LABELS.items()},
        },
        key="monitor_recent",
    )
    st.download_button(
        page.download_label,
        window_download(engine, since=page.since, until=page.until, filters=now_state.filters, rows=rows),
        file_name=f"requests-{now_state.window}.csv",
        mime="text/csv",
        on_click="ignore",
        key="monitor_csv",
        help=page.download_help,
    )


request_table()
