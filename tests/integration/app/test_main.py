"""The command line as operators run it (a subprocess): commands, refusals, users."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from sqlalchemy import select

from tests.support import paths

REPO = paths.REPO


BASE = (REPO / "gateway.toml").read_text()


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "gateway.toml"
    config.write_text(BASE + "\n[simulator]\nlatency_scale = 0\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GATEWAY_CONFIG")}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'cli.db'}", GATEWAY_CONFIG=str(config))
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


# One refusal per command, as operators meet it (a process, its exit code and its one stderr line);
# every bad number of every command is refused in-process in tests/unit/app/test_main.py.
CLI_CASES = [
    (["canary", "set", "nan", "--reason", "r"], "ratio must be a number from 0 to 1"),
    (["prune", "--days", "1e400"], "--days must be a number above 0 and at most 36500"),
    (["loadgen", "--rps", "nan", "--quiet"], "--rps must be a number above 0 and at most 1000"),
    (["simulate", "--port", "99999"], "--port must be a whole number from 0 to 65535"),
]


def test_cli_refusals_write_nothing(cli_env):
    """The first state is read once and compared at the end."""
    before = run(cli_env, "canary", "show", "--json")
    assert before.returncode == 0, before.stderr
    for args, expected in CLI_CASES:
        proc = run(cli_env, *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(lines) == 1 and expected in lines[0], (args, proc.stderr)
        assert proc.stdout == "", args
    after = run(cli_env, "canary", "show", "--json")
    assert json.loads(after.stdout) == json.loads(before.stdout)


# -- python -m app (the command line) --------------------------------------------------------------
# The command line, run as operators run it: ``python -m app ...`` in a subprocess, with a temporary
# SQLite database and a copy of gateway.toml whose simulator answers instantly.


SUPPORTED = [
    "deepseek-chat-v3.2",
    "claude-sonnet-4-20250514",
    "gemini-2.5-flash",
    "gpt-4.1",
    "text-embedding-3-small",
]


@dataclass
class Cli:
    env: dict[str, str]
    database_url: str
    config: Path

    def run(self, *args: str, timeout: float = 120, **env_over: str) -> subprocess.CompletedProcess:
        env = {**self.env, **env_over}
        return subprocess.run(
            [sys.executable, "-m", "app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GATEWAY_CONFIG")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    config = tmp_path / "gateway.toml"
    config.write_text((REPO / "gateway.toml").read_text() + "\n[simulator]\nlatency_scale = 0\n")
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    env = _base_env()
    env.update(DATABASE_URL=url, GATEWAY_CONFIG=str(config))
    return Cli(env, url, config)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {proc.stderr!r}"
    assert "Traceback" not in proc.stderr
    return lines[0]


def _audit_count(url: str) -> int:
    from db.canary import audit_count
    from db.engine import dispose_all, get_engine

    try:
        return audit_count(get_engine(url))
    finally:
        dispose_all()


def _request_rows(url: str) -> list[dict]:
    from db.engine import dispose_all, get_engine
    from db.models import RequestLog

    try:
        with get_engine(url).connect() as conn:
            return [dict(r) for r in conn.execute(select(RequestLog)).mappings().all()]
    finally:
        dispose_all()


# -- chat ------------------------------------------------------------------------------------------


def test_chat_prints_a_simulated_answer_and_logs_it(cli: Cli) -> None:
    proc = cli.run("chat", "hi there")
    assert proc.returncode == 0, proc.stderr
    assert "simulated" in proc.stdout
    assert "hi there" in proc.stdout
    rows = _request_rows(cli.database_url)
    assert len([r for r in rows if r["final"]]) == 1
    assert rows[-1]["source"] == "cli"


def test_chat_json_has_the_documented_fields(cli: Cli) -> None:
    proc = cli.run("chat", "write a python function that sorts a list", "--json", "--session", "s-42")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    for name in (
        "text",
        "provider",
        "model",
        "intent",
        "fallback_used",
        "attempts",
        "latency_ms",
        "ttft_ms",
        "usage",
        "cost_usd",
        "request_id",
    ):
        assert name in d, name
    for name in ("prompt_tokens", "cached_tokens", "completion_tokens"):
        assert isinstance(d["usage"][name], int), name
    assert d["text"] and isinstance(d["text"], str)
    assert d["provider"] in ("holysheep", "direct")
    assert d["model"] in SUPPORTED
    assert isinstance(d["fallback_used"], bool)
    assert d["attempts"] >= 1
    assert d["latency_ms"] >= 0
    assert d["cost_usd"] > 0
    assert d["usage"]["completion_tokens"] > 0
    rows = _request_rows(cli.database_url)
    assert d["request_id"] in {r["request_id"] for r in rows}
    final = next(r for r in rows if r["request_id"] == d["request_id"] and r["final"])
    assert (final["provider"], final["model"], final["intent"]) == (d["provider"], d["model"], d["intent"])
    assert final["session_id"] == "s-42"


def test_chat_stream_prints_text(cli: Cli) -> None:
    proc = cli.run("chat", "tell me about canaries", "--stream")
    assert proc.returncode == 0, proc.stderr
    assert "simulated" in proc.stdout
    rows = _request_rows(cli.database_url)
    final = [r for r in rows if r["final"]]
    assert len(final) == 1
    assert final[0]["stream"] is True or final[0]["stream"] == 1
    assert final[0]["ttft_ms"] is not None


def test_chat_stream_json_records_ttft(cli: Cli) -> None:
    proc = cli.run("chat", "hello", "--stream", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["ttft_ms"] is not None
    assert 0 <= d["ttft_ms"] <= d["latency_ms"]
    assert d["text"]


def test_chat_unknown_model_lists_supported_models(cli: Cli) -> None:
    proc = cli.run("chat", "hi", "--model", "no-such-model")
    line = _one_error_line(proc)
    assert "no-such-model" in line
    for m in SUPPORTED:
        assert m in line
    assert proc.stdout == ""


# -- canary ----------------------------------------------------------------------------------------


def test_canary_set_then_show(cli: Cli) -> None:
    proc = cli.run("canary", "set", "0.25", "--reason", "x", "--actor", "bob")
    assert proc.returncode == 0, proc.stderr
    proc = cli.run("canary", "show", "--json")
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    assert state["ratio"] == 0.25
    assert state["updated_by"] == "bob"
    assert state["reason"] == "x"
    assert _audit_count(cli.database_url) == 1
    human = cli.run("canary", "show")
    assert human.returncode == 0 and "25" in human.stdout and "bob" in human.stdout


# Numbers out of range are refused in-process too, with every other bad number
# (tests/unit/app/test_main.py): here, text that is no number, as a process.
@pytest.mark.parametrize("bad", ["abc"])
def test_canary_set_bad_ratio_fails_with_one_line_and_writes_nothing(cli: Cli, bad: str) -> None:
    before_show = json.loads(cli.run("canary", "show", "--json").stdout)  # the database exists before the bad write
    before = _audit_count(cli.database_url)
    proc = cli.run("canary", "set", bad, "--reason", "oops", "--actor", "mallory")
    line = _one_error_line(proc)
    assert "ratio" in line
    assert _audit_count(cli.database_url) == before
    assert json.loads(cli.run("canary", "show", "--json").stdout) == before_show


def test_canary_set_overlong_actor_is_one_clear_line(tmp_path: Path, cli: Cli, db_url: str) -> None:
    """The actor columns are VARCHAR(128): a 200-character actor is refused with one line naming the
    limit (on PostgreSQL too, where the database would otherwise raise a multi-line DataError), and
    nothing is written."""
    actor = "a" * 200
    before_show = json.loads(cli.run("canary", "show", "--json", DATABASE_URL=db_url).stdout)  # creates the row
    before = _audit_count(db_url)
    proc = cli.run("canary", "set", "0.3", "--reason", "long name", "--actor", actor, DATABASE_URL=db_url)
    line = _one_error_line(proc)
    assert "actor is too long (200 characters, at most 128)" in line
    assert "DataError" not in proc.stderr
    assert _audit_count(db_url) == before
    assert json.loads(cli.run("canary", "show", "--json", DATABASE_URL=db_url).stdout) == before_show


# -- configuration errors --------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("chat", "hi"), ("canary", "show")])
def test_missing_config_file_is_one_clear_line(cli: Cli, args: tuple[str, ...]) -> None:
    proc = cli.run(*args, GATEWAY_CONFIG="/nonexistent.toml")
    line = _one_error_line(proc)
    assert "/nonexistent.toml" in line
    assert "not found" in line


def test_malformed_toml_is_one_clear_line(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "broken.toml"
    bad.write_text('[routing\nprimary = "holysheep"\n')
    proc = cli.run("chat", "hi", GATEWAY_CONFIG=str(bad))
    line = _one_error_line(proc)
    assert str(bad) in line
    assert "TOML" in line


def test_unreachable_database_is_one_clear_line(cli: Cli) -> None:
    url = f"postgresql+psycopg://ci:ci@127.0.0.1:{_free_port()}/gateway"  # nothing listens there
    line = _one_error_line(cli.run("canary", "show", DATABASE_URL=url))
    assert "127.0.0.1" in line or "connect" in line.lower()


# -- loadgen -------------------------------------------------------------------------------------


def test_loadgen_is_reproducible_with_a_seed_and_tags_rows(tmp_path: Path, cli: Cli) -> None:
    reports = []
    urls = []
    for run in range(2):
        url = f"sqlite:///{tmp_path / f'loadgen-{run}.db'}"
        urls.append(url)
        proc = cli.run("loadgen", "--rps", "20", "--duration", "1", "--seed", "3", "--quiet", DATABASE_URL=url)
        assert proc.returncode == 0, proc.stderr
        reports.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    a, b = reports
    assert a["planned"] == b["planned"] == 20
    assert a["sent"] == 20
    assert sum(a["by_intent"].values()) == a["ok"]
    assert a["by_intent"] == b["by_intent"]

    for url, report in zip(urls, reports, strict=False):
        rows = _request_rows(url)
        final = [r for r in rows if r["final"]]
        assert len(final) == report["sent"]
        assert {r["source"] for r in rows} == {"loadgen"}
        ok_intents = Counter(r["intent"] for r in final if r["status"] == "ok")
        assert dict(ok_intents) == report["by_intent"]


def test_loadgen_rejects_non_positive_rates(cli: Cli) -> None:
    # One refusal as a process; --duration's and every other one in-process (tests/unit/app/test_main.py).
    line = _one_error_line(cli.run("loadgen", "--rps", "0", "--quiet"))
    assert "--rps must be a number above 0" in line


# -- simulate --------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_simulate_serves_the_openai_api_over_http(cli: Cli) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "simulate", "--port", str(port)],
        cwd=REPO,
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"simulate exited early: {proc.communicate()[1]}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "simulator did not start listening"
                time.sleep(0.1)
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sim", max_retries=0) as client:
            ids = {m.id for m in client.models.list()}
            assert ids and ids <= set(SUPPORTED)
            reply = client.chat.completions.create(model=sorted(ids)[0], messages=[{"role": "user", "content": "ping"}])
            assert "simulated" in (reply.choices[0].message.content or "")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode is not None


def test_prune_keeps_recent_rows_and_refuses_bad_arguments(cli):
    assert cli.run("chat", "hi").returncode == 0
    proc = cli.run("prune", "--days", "30")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "request_log": 0,
        "request_log_partitions_dropped": 0,
        "request_rollup": 0,
        "request_rollup_5m": 0,
        "request_rollup_1h": 0,
        "request_error_rollup": 0,
        "request_error_rollup_1h": 0,
        "request_substitution_rollup": 0,
        "request_substitution_rollup_1h": 0,
    }
    assert len(_request_rows(cli.database_url)) == 1  # today's request is kept
    # One refusal as a process; every bad argument in-process (tests/unit/app/test_main.py).
    line = _one_error_line(cli.run("prune", "--days", "10", "--rollup-days", "5"))
    assert line.startswith("error: --rollup-days")


def test_keys_create_warns_of_a_budget_smaller_than_one_worst_case_request(cli: Cli) -> None:
    out = cli.run("keys", "create", "--name", "tiny", "--models", "gpt-4.1", "--budget-usd", "0.01", "--period", "day")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("gw-")
    warning = next(line for line in out.stderr.splitlines() if line.startswith("warning: "))
    assert "($0.01 per day) is smaller than one request's worst case" in warning
    assert "32,768 tokens, $0.2621" in warning and "must set max_tokens (at most 1,250 on gpt-4.1" in warning
    roomy = cli.run(
        "keys", "create", "--name", "roomy", "--models", "gpt-4.1", "--budget-usd", "5", "--period", "month"
    )
    assert roomy.returncode == 0 and "warning" not in roomy.stderr


# -- users -----------------------------------------------------------------------------------------
# ``python -m app users add|list|remove|set-role``, run as an operator runs it (a subprocess on a
# temporary SQLite database): the password comes from stdin or the terminal, never from argv; a
# refusal is one line on stderr and writes nothing. Also: ``canary set --actor`` refuses the
# reserved system actors.


@pytest.fixture
def run_cli_users(tmp_path: Path):
    config = tmp_path / "gateway.toml"
    config.write_text((REPO / "gateway.toml").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GATEWAY_CONFIG")}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'users.db'}", GATEWAY_CONFIG=str(config))

    def run_cli_users(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "app", *args],
            cwd=REPO,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )

    run_cli_users.database_url = env["DATABASE_URL"]
    return run_cli_users


def _listed(run_cli_users) -> list[dict]:
    proc = run_cli_users("users", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_add_list_set_role_remove(run_cli_users):
    assert run_cli_users("users", "list").stdout.startswith("no accounts")
    proc = run_cli_users(
        "users", "add", "Alice", "--role", "operator", "--password-stdin", stdin="correct horse battery\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "alice" in proc.stdout and "operator" in proc.stdout
    assert [(u["name"], u["role"]) for u in _listed(run_cli_users)] == [("alice", "operator")]
    assert "correct horse" not in proc.stdout + proc.stderr

    from app.accounts import Accounts
    from db.engine import dispose_all, get_engine

    try:
        accounts = Accounts(get_engine(run_cli_users.database_url))
        assert accounts.sign_in("alice", "correct horse battery").ok  # the stdin line, newline stripped
    finally:
        dispose_all()

    assert run_cli_users("users", "set-role", "alice", "viewer").returncode == 0
    assert [(u["name"], u["role"]) for u in _listed(run_cli_users)] == [("alice", "viewer")]
    assert "alice" in run_cli_users("users", "list").stdout
    assert run_cli_users("users", "remove", "alice").returncode == 0
    assert _listed(run_cli_users) == []


@pytest.mark.parametrize(
    "args, stdin, needle",
    [
        (("users", "add", "guardrail", "--role", "admin", "--password-stdin"), "long enough pw\n", "reserved"),
        (("users", "add", "bob", "--role", "admin", "--password-stdin"), "short\n", "8 to 1024"),
        (("users", "add", "bad name!", "--role", "admin", "--password-stdin"), "long enough pw\n", "not allowed"),
        (("users", "remove", "nobody"), None, "no account named 'nobody'"),
        (("users", "set-role", "nobody", "admin"), None, "no account named 'nobody'"),
    ],
)
def test_refusals_are_one_line_and_write_nothing(run_cli_users, args, stdin, needle):
    assert needle in _one_line(run_cli_users(*args, stdin=stdin))
    assert _listed(run_cli_users) == []


def test_a_password_is_never_taken_from_argv(run_cli_users):
    proc = run_cli_users("users", "add", "carol", "--role", "viewer", "--password", "hunter2hunter2")
    assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr
    assert _listed(run_cli_users) == []


def test_duplicate_account_is_refused(run_cli_users):
    assert (
        run_cli_users(
            "users", "add", "dan", "--role", "viewer", "--password-stdin", stdin="long enough pw\n"
        ).returncode
        == 0
    )
    assert "exists already" in _one_line(
        run_cli_users("users", "add", "dan", "--role", "admin", "--password-stdin", stdin="other password\n")
    )
    assert [(u["name"], u["role"]) for u in _listed(run_cli_users)] == [("dan", "viewer")]


@pytest.mark.parametrize("actor", ["guardrail", "config", " Guardrail "])
def test_canary_set_refuses_a_reserved_actor(run_cli_users, actor):
    assert "reserved system actor" in _one_line(
        run_cli_users("canary", "set", "0.3", "--reason", "x", "--actor", actor)
    )
    shown = json.loads(run_cli_users("canary", "show", "--json").stdout)
    assert shown["ratio"] != 0.3
