"""Browser tests: the real dashboard server (``python -m app dashboard``, the one launch command) on
a free port with a temporary database and an instant-ish simulator, driven by Playwright in Debian's
chromium (``playwright install`` is not needed). Screenshots go to ``tests/e2e/screenshots/``
(git-ignored) for a human to look at."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SHOTS = Path(__file__).parent / "screenshots"
# A bound on one script run, not a timing assertion: generous, because two cores shared with a
# Streamlit server, Chromium and the database can stall a run for many seconds under load.
RUN_TIMEOUT_MS = 90_000
RUN_SEEN_MS = 15_000  # how long to watch for the script run an action triggers
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
# A bound on each expectation (Playwright's default is 5 s). The socket can say a run ended before
# the page has drawn what it sent, and drawing lags by seconds when two cores carry a server,
# Chromium and other suites; an expectation met sooner returns at once.
EXPECT_TIMEOUT_MS = 20_000


def pytest_configure(config):
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)


# The session-scoped servers below, each with the work unit whose tests use it. Under ``-n 2``
# (pytest-xdist) a unit's tests run on one worker, in file order, as the servers' state assumes
# (``server``'s tests leave canary changes and requests behind for the next; the first request to
# ``fresh_server`` and ``gated_server`` is test_browser.py's), and each server starts once; every
# other file is a unit of its own, with the server of its own it starts.
SERVER_UNITS = {
    "server": "default servers",
    "fresh_server": "default servers",
    "gated_server": "default servers",
    "accounts_server": "accounts server",
    "incident_server": "incident server",
}
SHARED_SERVERS = set(SERVER_UNITS)
# The files whose tests use them, with their unit. A test asking for a server of another unit than
# its file's is refused at collection, so this table stays true.
SHARED_FILES = {
    "test_browser.py": "default servers",
    "test_layout_and_theme.py": "default servers",
    "test_operator_truth.py": "default servers",
    "test_playground_tools.py": "default servers",
    "test_session_cookie.py": "accounts server",
    "test_sign_in_browser.py": "accounts server",
    "test_monitor_find_failures.py": "incident server",
    "test_monitor_incident.py": "incident server",
}
# The order the units are handed to the workers: longest first (their time on the quiet 2-core
# machine), so the last ones handed out are short and both workers end close together (a worker
# takes its next unit while it runs its last test, so a long unit handed out last would run alone).
# A unit not listed follows these, in collection order.
LONGEST_FIRST = (
    "default servers",
    "accounts server",
    "tests/e2e/test_incident_drill.py",
    "tests/e2e/test_oidc.py",
    "tests/e2e/test_rollout_drill.py",
    "tests/e2e/test_routes_browser.py",
    "tests/e2e/test_upstream_error_browser.py",
    "incident server",
    "tests/e2e/test_keys_page_browser.py",
    "tests/e2e/test_overview_live_browser.py",
    "tests/e2e/test_sign_in_fails_closed_browser.py",
    "tests/e2e/test_rollback_drill.py",
)


def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(str(item.fspath))
        if path.parent == Path(__file__).parent:
            item.add_marker(pytest.mark.e2e)
            for name in sorted(SHARED_SERVERS & set(getattr(item, "fixturenames", ()))):
                if SHARED_FILES.get(path.name) != SERVER_UNITS[name]:
                    raise pytest.UsageError(
                        f"{item.nodeid} uses {name}: list {path.name} in SHARED_FILES as {SERVER_UNITS[name]!r}"
                    )


def pytest_xdist_make_scheduler(config, log):
    """Work units for ``-n 2``: the tests of each unit of ``SHARED_FILES`` in one, each other file
    in one of its own, handed out in ``LONGEST_FIRST`` order. (``--dist loadgroup`` cannot do this
    with pytest 9: the group it tags onto a test's id is lost.)"""
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    def rank(unit: str) -> int:
        return LONGEST_FIRST.index(unit) if unit in LONGEST_FIRST else len(LONGEST_FIRST)

    class LongestFirst(OrderedDict):
        """The scheduler's queue of units: it takes the first (``popitem(last=False)``); this
        hands out the best-ranked, ties in the order they were queued."""

        def popitem(self, last: bool = True):
            unit = min(self, key=rank)  # min keeps the first of equal ranks
            return unit, self.pop(unit)

    class SharedServers(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = LongestFirst()

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_FILES.get(Path(path).name, path)

    return SharedServers(config, log)


def free_port() -> int:
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

    def cli(self, *args: str, timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
        """``python -m app ...`` against the same database and configuration as the server."""
        return subprocess.run(
            [sys.executable, "-m", "app", *args],
            cwd=REPO,
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def engine(self):
        """An engine on the server's database (the one of its environment: SQLite or PostgreSQL)."""
        from db.engine import get_engine

        return get_engine(self.env["DATABASE_URL"])

    def add_user(self, name: str, role: str, password: str) -> None:
        """An account, added in this process as ``python -m app users add`` adds it (the CLI's
        own tests are in tests/integration/app/test_main.py): a process start less per account."""
        from app.accounts import Accounts
        from db.engine import dispose_all

        Accounts(self.engine()).add(name, role, password, actor="e2e")
        dispose_all()

    def set_ratio(self, ratio: float, reason: str, actor: str = "e2e") -> None:
        """The canary ratio, written as ``python -m app canary set`` writes it (audited)."""
        from app.config import load_settings
        from db.canary import ensure_setting, set_ratio
        from db.engine import dispose_all

        engine = self.engine()
        ensure_setting(engine, load_settings(env=self.env).routing.initial_ratio)  # as the CLI does
        set_ratio(engine, ratio, expected_version=None, actor=actor, reason=reason)
        dispose_all()

    @contextmanager
    def gateway(self, source: str = "e2e") -> Iterator[Any]:
        """A gateway (``build_gateway``) on the server's configuration and database, in this
        process: a routing process other than the dashboard's, without a process start (seconds of
        CPU each). Closed on exit, so every request it answered is in the log by then."""
        from app.config import load_settings
        from app.gateway import build_gateway
        from db.engine import dispose_all

        gateway = build_gateway(load_settings(env=self.env), env=self.env, source=source)
        try:
            yield gateway
        finally:
            gateway.close()
            dispose_all()

    def loadgen(self, rps: float, duration_s: float, seed: int) -> Any:
        """Traffic as ``python -m app loadgen --rps --duration --seed`` sends it (the command's own
        tests are in tests/integration/app/test_main.py), from a gateway of this process
        (``gateway``); every request the report counts is in the log when it returns."""
        from app.loadgen import run_loadgen

        with self.gateway(source="loadgen") as gateway:
            report = run_loadgen(gateway.client, rps=rps, duration_s=duration_s, seed=seed)
        assert report.sent == report.planned and report.unfinished == 0, report
        return report

    def canary_row(self) -> tuple:
        """The stored global canary setting, every column: equal before and after means nothing was
        written."""
        return self.query("select * from canary_setting where scope = 'global'")[0]

    def query(self, sql: str) -> list[tuple]:
        import sqlite3

        con = sqlite3.connect(self.database_url.removeprefix("sqlite:///"))
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()


def wait_until(condition: Callable[[], Any], timeout: float, what: str, poll: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something truthy (returned) or ``timeout`` seconds pass
    (``TimeoutError`` naming ``what``): for conditions outside the browser, such as a database row."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()  # never set: its bounded wait is the polling interval
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        pause.wait(poll)


def start_server(
    tmp: Path,
    extra_env: dict[str, str] | None = None,
    config_text: str | None = None,
    cwd: Path = REPO,
    port: int | None = None,
) -> Server:
    """``config_text`` replaces the default configuration (gateway.toml with a fast simulator);
    ``cwd`` is where Streamlit looks for ``.streamlit/`` (config.toml, secrets.toml)."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "gateway.toml"
    config.write_text(
        config_text
        if config_text is not None
        else (REPO / "gateway.toml").read_text() + "\n[simulator]\nlatency_scale = 0.05\n"
    )
    database_url = f"sqlite:///{tmp / 'gateway.db'}"
    env = {
        k: v for k, v in os.environ.items() if k not in ("DASHBOARD_PASSWORD", "HOLYSHEEP_API_KEY", "OPENAI_API_KEY")
    }
    env.update(
        {"GATEWAY_CONFIG": str(config), "DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    )
    port = port or free_port()
    log = tmp / "server.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "dashboard",
            "--server.port",
            str(port),
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
        ],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(REPO)},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the dashboard exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_until(healthy, 60, f"{url}/_stcore/health", poll=0.25)
    except TimeoutError as exc:
        proc.kill()
        raise RuntimeError(f"{exc}; the dashboard did not start:\n{log.read_text()[-3000:]}") from None
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


# -- servers shared by the tests of several modules, reset between tests --------------------------
#
# A server start costs seconds of CPU (Streamlit and the whole app imported); the tests below need
# the same kind of server, and what one test leaves behind that another could see is reset by the
# function-scoped fixture each test asks for.

ACCOUNTS = {
    "olga": ("operator", "pw-of-olga-123"),
    "vic": ("viewer", "pw-of-vic-123"),
    "rita": ("operator", "pw-of-rita-123"),
    "sam": ("admin", "pw-of-sam-1234"),
}


@pytest.fixture(scope="session")
def _accounts_server(tmp_path_factory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("accounts"))
    yield s
    stop_server(s)


@pytest.fixture
def accounts_server(_accounts_server: Server) -> Server:
    """A server with local accounts: ``ACCOUNTS`` (name: role, password) as listed, and no sign-in
    failures counted, at the start of every test (a test may change a role or remove an account)."""
    from app.accounts import Accounts
    from db.engine import dispose_all

    s = _accounts_server
    accounts = Accounts(s.engine())
    for name, (role, password) in ACCOUNTS.items():
        user = accounts.get(name)
        if user is None:
            accounts.add(name, role, password, actor="e2e")
        elif user.role != role:
            accounts.set_role(name, role)
    with s.engine().begin() as conn:
        conn.exec_driver_sql("delete from signin_throttle")
    dispose_all()
    return s


@pytest.fixture(scope="session")
def _gated_server(tmp_path_factory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("gated"), {"DASHBOARD_PASSWORD": "e2e-secret"})
    yield s
    stop_server(s)


@pytest.fixture
def gated_server(_gated_server: Server) -> Server:
    """A server behind the shared password ``e2e-secret``, with no sign-in failures counted at the
    start of every test. In a run of the whole tier the first test to open it is
    test_browser.py's (files run in name order), whose first request is a page URL."""
    with _gated_server.engine().begin() as conn:
        conn.exec_driver_sql("delete from signin_throttle")
    from db.engine import dispose_all

    dispose_all()
    return _gated_server


@pytest.fixture(scope="session")
def fresh_server(tmp_path_factory) -> Iterator[Server]:
    """A server on the default configuration whose request log stays empty: its tests open pages
    and may set the canary ratio, but send no request (no prompt, no demo traffic, no loadgen). In
    a run of the whole tier the first test to open it is test_browser.py's, whose first request is
    a page URL."""
    s = start_server(tmp_path_factory.mktemp("fresh"))
    yield s
    stop_server(s)


# Failed requests written straight into the incident server's log in the last minutes, on top of
# what its loadgen produces.
BURST = 90


@pytest.fixture(scope="session")
def incident_server(tmp_path_factory) -> Iterator[Server]:
    """Mid-incident, for the Monitor's tests (which read it, never write): half the traffic on the
    primary, 70 % errors injected there, ``BURST`` failed requests logged in the last ten minutes
    (hostile text in their error messages, a non-ASCII session id), then 90 requests of loadgen
    traffic from two gateways other than the dashboard's (``Server.loadgen``)."""
    server = start_server(tmp_path_factory.mktemp("incident"))
    try:
        server.set_ratio(0.5, "incident drill: half the traffic on the primary")
        from app.dashboard.canary_form import save_faults
        from app.dashboard.identity import Identity
        from core.records import AttemptRecord
        from db.engine import dispose_all
        from db.requests import insert_batch

        engine = server.engine()
        operator = Identity("e2e-operator", "operator", "account")
        assert save_faults(engine, "holysheep", 70, 0, 1, actor=operator).ok
        now = time.time()
        insert_batch(
            engine,
            [
                AttemptRecord(
                    request_id=f"burst-{k:03d}",
                    attempt=1,
                    ts=now - 600 + k,
                    provider="holysheep",
                    model="gemini-2.5-flash",
                    requested_model="auto",
                    intent="general",
                    side="primary",
                    status="error",
                    http_status=503,
                    error_class="server_error",
                    error_message='=HYPERLINK("http://evil.example","upstream 503")',
                    latency_ms=20.0,
                    source="loadgen",
                    session_id="세션-drill",
                )
                for k in range(BURST)
            ],
        )
        dispose_all()
        # Two routing processes' worth: each one's breaker lets about ten attempts reach the primary
        # before it opens (about seven failures at 70 %), so one alone could leave the log at or
        # under the failed rows test_monitor_find_failures.py needs beyond the burst.
        for seed in (3, 4):
            server.loadgen(rps=30, duration_s=1.5, seed=seed)
        yield server
    finally:
        stop_server(server)


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
        return watch_runs(ctx.new_page())

    yield make
    for ctx in contexts:
        ctx.close()


def wait_ready(page, timeout: float = RUN_TIMEOUT_MS) -> None:
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout)
    page.wait_for_selector(READY, timeout=timeout)


class RunWatch:
    """The script runs of one page, read from its websocket as Streamlit's own frontend reads them:
    each rerun the page asks for (a ``rerun_script`` BackMsg: a widget committed, a button clicked,
    a page opened, or a fragment's ``run_every`` tick, marked ``is_auto_rerun``) and each run that
    ends (a ``script_finished`` ForwardMsg, with the fragments it reran: none for a full run).

    The page's script-state attribute cannot tell these apart: a fragment's timed rerun flips it to
    ``running`` and back like a full run, so a test that counted those could take a fragment's
    refresh for the end of the run its typing started, and type on while that run still came."""

    def __init__(self, page) -> None:
        self.events: list[tuple[str, object, object]] = []
        page.on("websocket", self._socket)

    def _socket(self, ws) -> None:
        if ws.url.endswith("/_stcore/stream"):
            ws.on("framesent", self._sent)
            ws.on("framereceived", self._received)

    def _sent(self, payload: str | bytes) -> None:
        from streamlit.proto.BackMsg_pb2 import BackMsg

        if isinstance(payload, bytes):
            msg = BackMsg()
            msg.ParseFromString(payload)
            if msg.WhichOneof("type") == "rerun_script":
                asked = msg.rerun_script
                self.events.append(("asked", asked.is_auto_rerun, asked.fragment_id))

    def _received(self, payload: str | bytes) -> None:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        if isinstance(payload, bytes):
            msg = ForwardMsg()
            msg.ParseFromString(payload)
            if msg.WhichOneof("type") == "script_finished":
                self.events.append(("ended", msg.script_finished, tuple(msg.metadata.run.fragment_ids)))

    def run_ended(self, since: int) -> bool | None:
        """Whether the first rerun asked for since event ``since`` that is not a fragment's timed
        tick has ended (a full run ending, or that fragment's run); ``None`` while none was asked."""
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        full = (ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_WITH_COMPILE_ERROR)
        fragment_done = ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY
        events = self.events[since:]
        for k, (kind, auto, fragment) in enumerate(events):
            if kind == "asked" and not auto:
                return any(
                    kind2 == "ended" and (status in full or (fragment and status == fragment_done and fragment in ids))
                    for kind2, status, ids in events[k + 1 :]
                )
        return None

    def timed_run_ended(self, since: int) -> bool:
        """Whether a fragment's timed rerun (``run_every``) asked for since event ``since`` has
        ended."""
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        events = self.events[since:]
        return any(
            kind == "asked"
            and auto
            and any(
                kind2 == "ended" and status == ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY and fragment in ids
                for kind2, status, ids in events[k + 1 :]
            )
            for k, (kind, auto, fragment) in enumerate(events)
        )


def wait_for_timed_refresh(page, timeout: float = RUN_TIMEOUT_MS) -> None:
    """Wait until a fragment of ``page`` has rerun on its timer, and ended (a bounded condition: what
    a page shows after its own refresh, with nothing clicked)."""
    watch: RunWatch = page.run_watch
    since = len(watch.events)
    ended_by = time.monotonic() + timeout / 1000
    while not watch.timed_run_ended(since):
        if time.monotonic() > ended_by:
            raise TimeoutError(f"no timed refresh ended in {timeout / 1000:g} s: {watch.events[since:]}")
        page.wait_for_timeout(50)  # lets Playwright deliver the socket's frames; the condition decides


def watch_runs(page):
    """Start reading ``page``'s script runs (before it opens a URL); ``rerun`` needs it. Pages from
    ``new_page``, and any page of a context handed to ``watch_context``, are watched already."""
    if getattr(page, "run_watch", None) is None:
        page.run_watch = RunWatch(page)
    return page


def watch_context(ctx):
    """Watch the script runs of every page ``ctx`` opens."""
    ctx.on("page", watch_runs)
    return ctx


@contextmanager
def rerun(page, timeout: float = RUN_TIMEOUT_MS) -> Iterator[None]:
    """Wait for the script run the body triggers (an input committed, a button clicked) to end:
    the full run it asked for, or the run of the fragment its widget sits in, never a fragment's
    timed refresh that happened to end meanwhile."""
    watch: RunWatch = page.run_watch
    since = len(watch.events)
    yield
    seen_by = time.monotonic() + RUN_SEEN_MS / 1000
    ended_by = time.monotonic() + timeout / 1000
    while True:
        ended = watch.run_ended(since)
        if ended:
            break
        if ended is None and time.monotonic() > seen_by:
            break  # the body asked for no run (a click on something that reruns nothing)
        if time.monotonic() > ended_by:
            raise TimeoutError(f"the run asked for did not end in {timeout / 1000:g} s: {watch.events[since:]}")
        page.wait_for_timeout(50)  # lets Playwright deliver the socket's frames; the condition decides
    wait_ready(page, timeout)


def open_page(page, server: Server, path: str = "") -> None:
    """Open ``path`` and wait for its first script run to end (a watched page: the run the page
    asked for on connecting; else the script state the page shows)."""
    if getattr(page, "run_watch", None) is None:
        page.goto(f"{server.url}/{path}")
        wait_ready(page)
        return
    with rerun(page):
        page.goto(f"{server.url}/{path}")


def commit(page, label: str, value: str) -> None:
    """Fill the field labelled ``label`` and press Enter: the run that commits it has ended on return."""
    box = page.get_by_label(label, exact=True).first
    with rerun(page):
        box.fill(value)
        box.press("Enter")


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
    tall = min(max(int(height) + 40, size["height"]), 6000)
    page.set_viewport_size({"width": size["width"], "height": tall})
    page.wait_for_function("h => window.innerHeight === h", arg=tall)
    wait_ready(page)
    # Plotly redraws each chart after the resize: wait (bounded) until every chart has drawn its
    # plot at its container's width, so the picture shows the charts rather than empty boxes.
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('[data-testid=stPlotlyChart]')).every(c => {"
            " const svg = c.querySelector('svg.main-svg'); const plot = c.querySelector('.js-plotly-plot');"
            " return svg && plot && c.querySelector('.cartesianlayer, .pielayer, .barlayer, .scatterlayer')"
            " && Math.abs(svg.getBoundingClientRect().width - plot.getBoundingClientRect().width) < 2; })",
            timeout=10_000,
        )
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)


# -- untrusted text ----------------------------------------------------------------------------------


def seen_text(locator) -> str:
    """The text a reader sees (the invisible word joiner that stops auto-linking dropped)."""
    return locator.inner_text().replace("\u2060", "")


class PixelCounter:
    """A loopback HTTP server counting every request (the 'image' untrusted text points at)."""

    def __init__(self):
        hits = self.hits = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                self.send_response(200)
                self.send_header("content-type", "image/gif")
                self.end_headers()
                self.wfile.write(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def pixel():
    p = PixelCounter()
    yield p
    p.close()


def visit_everywhere_text_is_shown(page, server) -> None:
    for path in ("", "canary", "playground", "monitor"):
        open_page(page, server, path)
        # Tooltips render their text when shown: hover every help icon in the sidebar.
        icons = page.get_by_test_id("stSidebar").get_by_test_id("stTooltipHoverTarget")
        for i in range(icons.count()):
            icons.nth(i).hover()
            page.wait_for_timeout(200)  # let a tooltip (and any image in it) render before moving on
