"""``python -m app users add|list|remove|set-role``, run as an operator runs it (a subprocess on a
temporary SQLite database): the password comes from stdin or the terminal, never from argv; a
refusal is one line on stderr and writes nothing. Also: ``canary set --actor`` refuses the
reserved system actors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run(tmp_path: Path):
    config = tmp_path / "gateway.toml"
    config.write_text((REPO / "gateway.toml").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GATEWAY_CONFIG")}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'users.db'}", GATEWAY_CONFIG=str(config))

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "app", *args],
            cwd=REPO,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )

    run.database_url = env["DATABASE_URL"]
    return run


def _listed(run) -> list[dict]:
    proc = run("users", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_add_list_set_role_remove(run):
    assert run("users", "list").stdout.startswith("no accounts")
    proc = run("users", "add", "Alice", "--role", "operator", "--password-stdin", stdin="correct horse battery\n")
    assert proc.returncode == 0, proc.stderr
    assert "alice" in proc.stdout and "operator" in proc.stdout
    assert [(u["name"], u["role"]) for u in _listed(run)] == [("alice", "operator")]
    assert "correct horse" not in proc.stdout + proc.stderr

    from app.accounts import Accounts
    from db.engine import dispose_all, get_engine

    try:
        accounts = Accounts(get_engine(run.database_url))
        assert accounts.sign_in("alice", "correct horse battery").ok  # the stdin line, newline stripped
    finally:
        dispose_all()

    assert run("users", "set-role", "alice", "viewer").returncode == 0
    assert [(u["name"], u["role"]) for u in _listed(run)] == [("alice", "viewer")]
    assert "alice" in run("users", "list").stdout
    assert run("users", "remove", "alice").returncode == 0
    assert _listed(run) == []


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
def test_refusals_are_one_line_and_write_nothing(run, args, stdin, needle):
    assert needle in _one_line(run(*args, stdin=stdin))
    assert _listed(run) == []


def test_a_password_is_never_taken_from_argv(run):
    proc = run("users", "add", "carol", "--role", "viewer", "--password", "hunter2hunter2")
    assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr
    assert _listed(run) == []


def test_duplicate_account_is_refused(run):
    assert run("users", "add", "dan", "--role", "viewer", "--password-stdin", stdin="long enough pw\n").returncode == 0
    assert "exists already" in _one_line(
        run("users", "add", "dan", "--role", "admin", "--password-stdin", stdin="other password\n")
    )
    assert [(u["name"], u["role"]) for u in _listed(run)] == [("dan", "viewer")]


@pytest.mark.parametrize("actor", ["guardrail", "config", " Guardrail "])
def test_canary_set_refuses_a_reserved_actor(run, actor):
    assert "reserved system actor" in _one_line(run("canary", "set", "0.3", "--reason", "x", "--actor", actor))
    shown = json.loads(run("canary", "show", "--json").stdout)
    assert shown["ratio"] != 0.3
