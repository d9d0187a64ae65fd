"""`python -m app dashboard [streamlit options]`: the one launch command runs `streamlit run` on the
dashboard's ASGI app (`st.App` over the entry script, which sits where Streamlit sees no `pages/`
folder beside it, plus the session-cookie route)."""

from __future__ import annotations

import sys
from pathlib import Path

from app.__main__ import build_parser, dashboard_argv
from tests.support import paths

REPO = paths.REPO


def test_streamlit_options_pass_through_untouched():
    args = build_parser().parse_args(["dashboard", "--server.port", "8600", "--server.headless", "true"])
    assert args.command == "dashboard"
    assert args.streamlit_args == ["--server.port", "8600", "--server.headless", "true"]
    assert build_parser().parse_args(["dashboard"]).streamlit_args == []


def test_it_runs_streamlit_on_the_entry_with_the_options():
    argv = dashboard_argv(["--server.port", "8600"])
    assert argv[:3] == [sys.executable, str(REPO / "ui" / "run.py"), "run"]  # streamlit run, clean stops
    assert argv[4:] == [
        "--server.address=127.0.0.1",
        "--client.showErrorDetails=none",
        "--browser.gatherUsageStats=false",
        "--server.port",
        "8600",
    ]
    launcher = Path(argv[3])
    assert launcher == REPO / "ui" / "asgi.py" and launcher.is_file()
    # Streamlit serves it as an ASGI app only when it finds the st.App instance in the file.
    from streamlit.web.server.app_discovery import discover_asgi_app

    assert discover_asgi_app(launcher).is_asgi_app
    entry = launcher.parent / "entry.py"
    assert entry.is_file()
    # Streamlit's legacy pages-folder mode starts when a pages/ folder is beside the main script.
    assert not (entry.parent / "pages").exists()
    assert (REPO / "pages" / "canary.py").is_file()


def test_an_option_the_operator_passes_wins_over_the_local_only_default():
    argv = dashboard_argv(["--server.address", "0.0.0.0"])
    assert "--server.address=127.0.0.1" not in argv
    assert argv[-2:] == ["--server.address", "0.0.0.0"]
    assert dashboard_argv(["--server.address=10.0.0.1"])[-1] == "--server.address=10.0.0.1"
