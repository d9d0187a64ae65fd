"""How values and untrusted text are shown, for the dashboard's pages and the monitor alike: below
both, importing nothing of ours."""
