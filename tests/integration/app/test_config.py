"""Issue 18 point 11: what a real ``python -m app ...`` process says when it cannot start, as one
line on stderr naming what to change, never a raw Python error.

- ``DATABASE_URL`` with a port that is not a number (was "invalid literal for int()"), in every
  command that reads it (CLI, serve, dashboard), the password never shown;
- a read-only journal directory (a real read-only tmpfs mounted in a mount namespace of the test's
  own): ``serve`` refuses with a ``Fix:`` line, before it says it is listening."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from app.config import ConfigError, check_database_url
from tests.support import paths

REPO = paths.REPO
BAD_PORT = "postgresql+psycopg://gw:hunter2-secret@127.0.0.1:abc/gateway"


def run(args: list[str], env: dict[str, str], wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GATEWAY_CONFIG")}
    return subprocess.run(
        [*(wrap or []), sys.executable, "-m", "app", *args],
        cwd=REPO,
        env={**base, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


# The commands that start servers, as processes; the others in-process (tests/unit/app/test_main.py).
@pytest.mark.parametrize("args", [["serve", "--port", "0"], ["dashboard"]])
def test_a_port_that_is_not_a_number_is_one_line_naming_database_url(args, tmp_path):
    done = run(args, {"DATABASE_URL": BAD_PORT, "GATEWAY_CONFIG": str(REPO / "gateway.toml")})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: DATABASE_URL: port 'abc' is not a number") and "Fix:" in lines[0]
    assert "invalid literal" not in done.stderr and "hunter2" not in done.stderr + done.stdout
    assert "listening" not in done.stdout and "gateway server on" not in done.stdout


@pytest.mark.parametrize(
    "url, problem",
    [
        ("postgresql://u:p@h:99999/db", "port 99999 is out of range"),
        ("postgresql://u:p@h:5432x/db", "port '5432x' is not a number"),
        ("postgresql://u:p@h:" + "9" * 5000 + "/db", "is out of range"),
        ("postgresql://h:\uff11\uff12/db", "is not a number"),  # fullwidth digits: int() would take them
    ],
)
def test_hostile_ports_are_refused_clearly(url, problem):
    with pytest.raises(ConfigError, match="DATABASE_URL") as caught:
        check_database_url(url)
    assert problem in str(caught.value) and ":p@" not in str(caught.value)


@pytest.mark.parametrize(
    "url", ["postgresql+psycopg://u:p@h/db", "postgresql://u@[::1]:5432/db", "sqlite:///data/a:b.db", "sqlite:////x.db"]
)
def test_ordinary_urls_pass(url):
    check_database_url(url)


def _read_only_mount_works() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _read_only_mount_works(), reason="needs root and unshare -m for a read-only mount")
def test_serve_refuses_a_read_only_journal_directory_with_a_fix(tmp_path):
    journal = tmp_path / "journal"
    journal.mkdir()
    config = tmp_path / "gateway.toml"
    config.write_text((REPO / "gateway.toml").read_text() + f'\n[telemetry]\njournal_dir = "{journal}"\n')
    env = {"GATEWAY_CONFIG": str(config), "DATABASE_URL": f"sqlite:///{tmp_path / 'gw.db'}"}
    # A read-only tmpfs over the journal directory, seen by this one process tree only.
    wrap = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o ro tmpfs "{journal}" && exec "$0" "$@"']
    done = run(["serve", "--port", "0"], env, wrap)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"telemetry journal directory '{journal}/" in lines[0]
    assert "Read-only file system" in lines[0] and "Fix:" in lines[0] and "journal_dir" in lines[0]
    assert "gateway server on" not in done.stdout
