"""Browser tests: the real ``streamlit run`` server on a free port with a temporary database and an
instant-ish simulator, driven by Playwright in Debian's chromium (``playwright install`` is not
needed). Screenshots go to ``tests/e2e/screenshots/`` (git-ignored) for a human to look at."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHOTS = Path(__file__).parent / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READY = '[data-testid="stApp"][data-test-script-state="notRunning"]'


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.e2e)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    env: dict[str, str]
    database_url: str
    proc: subprocess.Popen
    log: Path

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``python -m app ...`` against the same database and configuration as the server."""
        return subprocess.run(
            [sys.executable, "-m", "app", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def query(self, sql: str) -> list[tuple]:
        import sqlite3

        con = sqlite3.connect(self.database_url.removeprefix("sqlite:///"))
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()


def start_server(tmp: Path, extra_env: dict[str, str] | None = None, *, launcher: bool = False) -> Server:
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "gateway.toml"
    config.write_text((REPO / "gateway.toml").read_text() + "\n[simulator]\nlatency_scale = 0.05\n")
    database_url = f"sqlite:///{tmp / 'gateway.db'}"
    env = {
        k: v for k, v in os.environ.items() if k not in ("DASHBOARD_PASSWORD", "HOLYSHEEP_API_KEY", "OPENAI_API_KEY")
    }
    env.update(
        {"GATEWAY_CONFIG": str(config), "DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    )
    port = _free_port()
    log = tmp / "server.log"
    command = ["-m", "ui.serve"] if launcher else ["-m", "streamlit", "run", "streamlit_app.py"]
    proc = subprocess.Popen(
        [
            sys.executable,
            *command,
            "--server.port",
            str(port),
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
        ],
        cwd=REPO,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"streamlit did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.25)
    return Server(url, env, database_url, proc, log)


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(5)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("e2e"))
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def new_page(browser):
    """Open pages in fresh browser contexts (separate sessions, like separate operators)."""
    contexts = []

    def make():
        ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        contexts.append(ctx)
        return ctx.new_page()

    yield make
    for ctx in contexts:
        ctx.close()


def wait_ready(page, timeout: float = 30_000) -> None:
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout)
    page.wait_for_selector(READY, timeout=timeout)


def open_page(page, server: Server, path: str = "") -> None:
    page.goto(f"{server.url}/{path}")
    wait_ready(page)


def assert_no_exception(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, page.locator(
        '[data-testid="stException"]'
    ).first.inner_text()


def screenshot(page, name: str) -> None:
    """The whole page: Streamlit scrolls inside its main block, so grow the viewport to fit it."""
    SHOTS.mkdir(exist_ok=True)
    size = page.viewport_size
    height = page.evaluate(
        "Math.max(...Array.from(document.querySelectorAll('[data-testid=stMain], [data-testid=stMainBlockContainer]'))"
        ".map(e => e.scrollHeight), 0)"
    )
    page.set_viewport_size({"width": size["width"], "height": min(max(int(height) + 40, size["height"]), 6000)})
    page.wait_for_timeout(300)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)
