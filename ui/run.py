"""``streamlit run`` for ``python -m app dashboard``, with a clean stop on SIGTERM and SIGINT.

Under ``st.App`` Streamlit serves through uvicorn, which shuts down gracefully on SIGTERM or SIGINT
and then raises the signal again against the handler that was installed before it: the default
SIGTERM handler kills the process (status -15, no exit hooks run) and Python's SIGINT handler
becomes click's "Aborted!" (status 1). The handlers installed here turn that second signal into a
normal exit with status 0, after uvicorn's graceful shutdown, so the exit hooks run (the request
log of the dashboard's client is flushed) and a supervisor sees a clean stop.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

from streamlit.web import cli


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    # As `python -m streamlit` from the repository would: the project's packages importable (a
    # script's own folder is what Python puts first on the path).
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    sys.argv = ["streamlit", *sys.argv[1:]]
    cli.main()
