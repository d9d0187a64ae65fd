"""Dashboard logic that needs no Streamlit: provider status, canary form validation, playground
answer formatting, charts for the canary page and the demo-traffic job. Pages call these; tests call
them directly."""
