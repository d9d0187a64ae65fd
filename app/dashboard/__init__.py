"""Dashboard logic that needs no Streamlit: provider status, canary form validation, playground
answer formatting, charts for the canary page, the demo-traffic job and the one set of number and
time formatters (:mod:`app.dashboard.fmt`). Pages call these; tests call them directly."""
