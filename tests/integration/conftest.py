"""The integration tier: real ``python -m app`` processes (serve, the CLI, the dashboard launcher),
loopback upstreams, PostgreSQL clusters of a test's own, real clients. Every test here carries the
``integration`` marker, so one command runs this tier and the PostgreSQL runs of the unit tier's
database tests:

    pytest tests/integration tests/unit -m "integration or postgres"
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
