"""``python -m ui.serve [streamlit options]``: ``streamlit run streamlit_app.py`` in st.navigation mode
from the first request on (what ``make run`` uses).

Streamlit takes an app with a ``pages/`` folder for a pre-``st.navigation`` app until the entry has
run once, so on a fresh server the first request for a page URL would be served in that mode: a page
run without the entry (``ui.chrome.page_setup`` reroutes that) or, for ``/kv-calculator``, a "Page
not found" notice. Setting the mode before the server starts avoids both; plain ``streamlit run``
still works.
"""

from __future__ import annotations

import sys
from pathlib import Path

from streamlit.runtime.pages_manager import PagesManager
from streamlit.web import cli

ENTRY = Path(__file__).resolve().parent.parent / "streamlit_app.py"


def main(argv: list[str]) -> int:
    PagesManager.uses_pages_directory = False  # what the entry's st.navigation call sets
    sys.argv = ["streamlit", "run", str(ENTRY), *argv]
    return cli.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
