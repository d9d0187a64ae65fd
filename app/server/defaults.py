"""Where the gateway server listens and how long it drains, unless the operator says otherwise.

Shared by the command line (``python -m app serve`` flags), the server itself (:mod:`app.server.serve`)
and the dashboard's probe of it (:mod:`app.server.probe`); it imports nothing, so the command line can
offer the defaults without loading the server.
"""

from __future__ import annotations

DEFAULT_HOST = "127.0.0.1"  # local only unless the operator says otherwise
DEFAULT_PORT = 8000
DEFAULT_GRACEFUL_S = 30  # on SIGTERM/Ctrl-C, seconds in-flight requests get to finish
MAX_GRACEFUL_S = 3600

MAX_WORKERS = 64  # server processes of one `serve` (a bound, like every CLI number)
