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


# -- rollout: the acceptance contract, in process -----------------------------------------------------

import json  # noqa: E402

import pytest  # noqa: E402

from app.__main__ import main  # noqa: E402
from app.monitor.canary_analysis import SIGNALS  # noqa: E402


@pytest.fixture
def rollout_cli(monkeypatch, sqlite_url, capsys):
    monkeypatch.setenv("GATEWAY_CONFIG", str(REPO / "gateway.toml"))
    monkeypatch.setenv("DATABASE_URL", sqlite_url)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--steps", "1,5,5"), "--steps must increase: 5 follows 5"),
        (("--steps", "nan"), "'nan' is not a percent in (0, 100]"),
        (("--steps", "0,50"), "'0' is not a percent"),
        (("--steps", "50,100.5"), "'100.5' is not a percent"),
        (("--bake-s", "1e400"), "--bake-s must be a number from 1 to 604800"),
        (("--alpha", "nan"), "--alpha must be a number"),
        (("--min-samples", "0"), "--min-samples must be a whole number from 1"),
        (("--shadow-share", "0.05", "--shadow-budget-usd", "5"), "a shadow phase is not supported yet"),
        (("--shadow-share", "0.05"), "--shadow-share and --shadow-budget-usd go together"),
        (("--reason", " "), "--reason must not be empty"),
        (("--actor", "rollout"), "reserved system actor"),
        (("--reason", "bad \udcff byte"), "--reason is not valid text"),
    ],
)
def test_rollout_start_refuses_bad_values_with_one_line_and_writes_nothing(rollout_cli, args, needle) -> None:
    before = rollout_cli("canary", "show", "--json")[1]
    code, out, err = rollout_cli("rollout", "start", "--candidate", "holysheep", "--reason", "r", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert rollout_cli("canary", "show", "--json")[1] == before
    assert "no rollout yet" in rollout_cli("rollout", "status")[1]


def test_rollout_start_names_the_provider_the_canary_share_goes_to(rollout_cli) -> None:
    code, _, err = rollout_cli("rollout", "start", "--candidate", "direct", "--reason", "r")
    assert code == 2 and "routing.primary ('holysheep')" in err
    code, _, err = rollout_cli("rollout", "start", "--candidate", "holysheep", "--route", "nope", "--reason", "r")
    assert code == 2 and "has no canary deployment" in err


def test_rollout_start_status_promote_pause_resume_abort(rollout_cli) -> None:
    code, out, _ = rollout_cli("rollout", "start", "--candidate", "holysheep", "--steps", "1,5,25,100",
                               "--bake-s", "30", "--reason", "new provider", "--actor", "alice", "--json")  # fmt: skip
    assert code == 0
    started = json.loads(out)
    assert (started["state"], started["weight"], started["plan"]["steps"]) == ("running", 0.01, [1, 5, 25, 100])
    code, _, err = rollout_cli("rollout", "start", "--candidate", "holysheep", "--reason", "again")
    assert code == 2 and "already has an active rollout" in err
    code, out, _ = rollout_cli("rollout", "status", "--json")
    [status] = json.loads(out)["rollouts"]
    assert status["id"] == started["id"] and len(status["analysis"]["metrics"]) == len(SIGNALS)
    assert {"signal", "candidate", "baseline", "verdict", "p (always valid)"} <= set(status["analysis"]["metrics"][0])
    for verb, extra, state, weight in [
        ("promote", (), "running", 0.05),
        ("pause", (), "paused", 0.05),
        ("resume", (), "running", 0.05),
        ("promote", ("--full",), "completed", 1.0),
    ]:
        code, out, err = rollout_cli("rollout", verb, *extra, "--reason", f"{verb} it", "--actor", "bob", "--json")
        assert code == 0, err
        got = json.loads(out)
        assert (got["state"], got["weight"]) == (state, weight) and f"(bob): {verb} it" in got["last_reason"]
        assert json.loads(rollout_cli("canary", "show", "--json")[1])["ratio"] == weight
    code, _, err = rollout_cli("rollout", "abort", "--reason", "late")
    assert code == 2 and "no active rollout" in err
    code, _, err = rollout_cli("rollout", "pause", "--reason", "")
    assert code == 2 and "--reason must not be empty" in err
