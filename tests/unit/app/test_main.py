"""`python -m app dashboard [streamlit options]`: the one launch command runs `streamlit run` on the
dashboard's ASGI app (`st.App` over the entry script, which sits where Streamlit sees no `pages/`
folder beside it, plus the session-cookie route). Every bad number of every command is refused
with exit 2, one stderr line and nothing written (in-process; the same as processes, one per
command, in tests/integration/app/test_main.py)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from app.__main__ import build_parser, dashboard_argv, main
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


CLI_CASES = [
    *[
        (["canary", "set", raw, "--reason", "r"], "ratio must be a number from 0 to 1")
        for raw in ["1e-400", "nan", "inf", "1.5", "-0.1", "1e100000000"]
    ],
    *[
        (["prune", "--days", raw], "--days must be a number above 0 and at most 36500")
        for raw in ["nan", "inf", "-1", "1e400"]
    ],
    (["canary", "set", "--reason", "r", "--", "-inf"], "ratio must be a number from 0 to 1"),
    (["prune", "--rollup-days", "inf"], "--rollup-days must be a number above 0"),
    (["prune", "--days", "0"], "--days must be a number above 0"),
    (["prune", "--days", "10", "--rollup-days", "5"], "--rollup-days must be at least --days"),
    (["prune", "--rollup-days", "90", "--rollup-5m-days", "30"], "--rollup-5m-days must be at least --rollup-days"),
    (["prune", "--rollup-5m-days", "400", "--rollup-1h-days", "100"], "--rollup-1h-days must be at least"),
    (["prune", "--rollup-1h-days", "nan"], "--rollup-1h-days must be a number above 0"),
    # serve refuses its options before it reads anything or binds a port
    *[
        (["serve", "--port", "0", "--graceful-s", raw], "--graceful-s must be a whole number from 0 to 3600")
        for raw in ["nan", "-1", "1e400", "3601", "ten"]
    ],
    *[
        (["serve", "--workers", raw], "--workers must be a whole number from 1 to 64")
        for raw in ["0", "65", "two", "1e400"]
    ],
    *[
        (["loadgen", "--rps", raw, "--quiet"], "--rps must be a number above 0 and at most 1000")
        for raw in ["0", "nan", "1e9"]
    ],
    (["loadgen", "--duration", "nan", "--quiet"], "--duration must be a number above 0"),
    (["loadgen", "--duration", "-1", "--quiet"], "--duration must be a number above 0"),
    (["loadgen", "--seed", "1.5", "--quiet"], "--seed must be a whole number from 0"),
    (["simulate", "--port", "99999"], "--port must be a whole number from 0 to 65535"),
    *[
        (["canary", "set", raw, "--dry-run"], "ratio must be a number from 0 to 1")
        for raw in ["nan", "1e400", "-0.5", "2"]
    ],
    (["canary", "set", "0.5"], "--reason"),  # a change without --dry-run needs its reason
    *[
        (["canary", "set", raw, "--reason", "oops", "--actor", "mallory"], "ratio")
        for raw in ["1.5", "abc", "-1", "nan"]
    ],
]


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch, sqlite_url: str) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text((REPO / "gateway.toml").read_text() + "\n[simulator]\nlatency_scale = 0\n")
    monkeypatch.setenv("GATEWAY_CONFIG", str(config))
    monkeypatch.setenv("DATABASE_URL", sqlite_url)
    yield
    from db.engine import dispose_all

    dispose_all()


def test_every_bad_number_is_refused_with_one_line_and_nothing_written(cli_env):
    code, before, _ = _main("canary", "show", "--json")
    assert code == 0
    for args, expected in CLI_CASES:
        code, out, err = _main(*args)
        lines = err.strip().splitlines()
        assert code == 2, (args, err)
        assert len(lines) == 1 and expected in lines[0], (args, err)
        assert out == "", args
    code, after, _ = _main("canary", "show", "--json")
    assert json.loads(after) == json.loads(before)


BAD_PORT = "postgresql+psycopg://gw:hunter2-secret@127.0.0.1:abc/gateway"


@pytest.mark.parametrize("args", [["status"], ["canary", "show"], ["users", "list"], ["keys", "list"]])
def test_a_port_that_is_not_a_number_is_one_line_naming_database_url(args, monkeypatch):
    """Every command that reads DATABASE_URL says what to change in one line, the password never
    shown (serve and dashboard, which start servers, as processes in tests/integration/app/test_config.py)."""
    monkeypatch.setenv("DATABASE_URL", BAD_PORT)
    monkeypatch.setenv("GATEWAY_CONFIG", str(REPO / "gateway.toml"))
    code, out, err = _main(*args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: DATABASE_URL: port 'abc' is not a number") and "Fix:" in lines[0]
    assert "invalid literal" not in err and "hunter2" not in err + out


# -- rollout: the acceptance contract, in process -----------------------------------------------------

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
        (("--shadow-share", "nan", "--shadow-budget-usd", "5"), "--shadow-share must be a number"),
        (("--shadow-share", "0.05", "--shadow-budget-usd", "1e400"), "--shadow-budget-usd must be a number"),
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


def test_a_rollout_with_a_shadow_phase_starts_there_with_the_ratio_at_0(rollout_cli) -> None:
    code, out, err = rollout_cli("rollout", "start", "--candidate", "holysheep", "--steps", "5,100", "--shadow-share",
                                 "0.05", "--shadow-budget-usd", "5", "--reason", "copies first", "--json")  # fmt: skip
    assert code == 0, err
    started = json.loads(out)
    assert (started["step_index"], started["weight"], started["plan"]["shadow_share"]) == (-1, 0.0, 0.05)
    assert json.loads(rollout_cli("canary", "show", "--json")[1])["ratio"] == 0.0
    code, out, _ = rollout_cli("rollout", "status")
    assert "in its shadow phase (5 % of the baseline mirrored, budget 5 USD" in out
    code, out, err = rollout_cli("rollout", "promote", "--reason", "enough copies", "--json")
    assert code == 0, err
    assert (json.loads(out)["step_index"], json.loads(out)["weight"]) == (0, 0.05)
    assert "promote shadow -> 5 % by hand" in json.loads(out)["last_reason"]
    assert json.loads(rollout_cli("canary", "show", "--json")[1])["ratio"] == 0.05


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
