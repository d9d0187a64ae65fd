"""Sign-in fails closed when the dashboard process itself cannot read its secrets (a separate Streamlit process)."""

from __future__ import annotations

import pytest

from tests.unit.ui.test_entry import ENTRY, REPO, shown

SECRETS_PROGRAM = """
import json, sys
from streamlit import config
config.set_option("secrets.files", [sys.argv[1]])  # this process's own Streamlit configuration
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[2], default_timeout=30).run()
print(json.dumps({"exception": bool(at.exception), "titles": [t.value for t in at.title],
                  "errors": [e.value for e in at.error], "sidebar": len(at.sidebar.children)}))
"""


@pytest.mark.parametrize("broken", [True, False])
def test_a_secrets_file_that_cannot_be_parsed_fails_closed(tmp_path, broken):
    """It may hold ``[auth]`` or ``DASHBOARD_PASSWORD``: reading it as "no secrets" would open the
    dashboard. Its own process, so the Streamlit option naming the file is set for it alone."""
    import json
    import os
    import subprocess
    import sys

    secrets = tmp_path / "secrets.toml"
    if broken:
        secrets.write_text('[auth\nredirect_uri = "http://localhost:8501/oauth2callback"\n')
    cfg = tmp_path / "gateway.toml"
    cfg.write_text((REPO / "gateway.toml").read_text())
    env = {k: v for k, v in os.environ.items() if k != "DASHBOARD_PASSWORD"}
    env.update({"GATEWAY_CONFIG": str(cfg), "DATABASE_URL": f"sqlite:///{tmp_path / 'gw.db'}", "PYTHONPATH": str(REPO)})
    done = subprocess.run(
        [sys.executable, "-c", SECRETS_PROGRAM, str(secrets), ENTRY],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    page = json.loads(done.stdout.strip().splitlines()[-1])
    assert not page["exception"]
    if broken:
        assert page["titles"] == ["Sign-in unavailable"] and page["sidebar"] == 0
        assert shown(page["errors"][0]).startswith("Cannot verify sign-in: .streamlit/secrets.toml")
    else:  # no secrets file at all is the ordinary open mode
        assert page["titles"] == ["Overview"] and page["sidebar"] > 0
