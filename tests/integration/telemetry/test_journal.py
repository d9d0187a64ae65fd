"""The journal across a killed process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from app.telemetry.journal import Journal


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_killed_process_loses_nothing_it_appended(tmp_path):
    child = textwrap.dedent(
        f"""
        import os, signal
        from app.telemetry.journal import Journal
        j = Journal({str(tmp_path)!r}, fsync_every=10_000, fsync_interval_s=3600)
        for i in range(50):
            j.append([{{"request_id": f"r{{i}}", "attempt": 1}}])
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], cwd=os.getcwd(), timeout=60)
    assert proc.returncode == -signal.SIGKILL
    got: list[dict] = []
    Journal(tmp_path).replay(got.extend)
    assert [r["request_id"] for r in got] == [f"r{i}" for i in range(50)]
