"""Dashboard logic that needs no Streamlit: provider status, canary form validation, playground
answer formatting, charts for the canary page, the KV calculator's page data and the demo-traffic
job (number and time formatting is :mod:`app.display.fmt`). Pages call these; tests call them
directly."""
