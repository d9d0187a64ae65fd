"""The canary ratio set by another process reaches a router within a second."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from tests.support import paths

REPO = paths.REPO


def test_change_from_another_process_reaches_router_within_a_second(client_factory, sqlite_url, tmp_path):
    """A real second process (the operator's ``python -m app canary set``) writes the ratio; this
    process's router must route by it within a second of that process exiting, with no restart."""
    a = client_factory(sqlite_url)
    msg = [{"role": "user", "content": "hi"}]
    a.chat(msg)  # load (and cache) the initial ratio
    assert a.current_ratio() == pytest.approx(0.1)
    config = tmp_path / "cli.toml"
    config.write_text((REPO / "gateway.toml").read_text())
    env = {**os.environ, "DATABASE_URL": sqlite_url, "GATEWAY_CONFIG": str(config), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "app", "canary", "set", "1.0", "--reason", "promote", "--actor", "other"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    # Wait on the condition, bounded by the contract ("within a second"), polling every 10 ms.
    deadline = time.monotonic() + 1.0
    while a.current_ratio() != 1.0:
        assert time.monotonic() < deadline, f"ratio still {a.current_ratio()} a second after the change"
        threading.Event().wait(0.01)
    assert all(a.chat(msg, session_id=f"x{i}").side == "primary" for i in range(20))
