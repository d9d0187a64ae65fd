"""Streamlit-side glue: cached resources, the password gate, page chrome and typed session state.

The only package besides ``pages/`` and ``streamlit_app.py`` that imports streamlit; the logic it
wires up lives in ``app/`` and ``db/``.
"""

from streamlit.runtime.pages_manager import PagesManager

# Streamlit treats an app with a ``pages/`` folder as a pre-``st.navigation`` multipage app until the
# entry's first ``st.navigation`` call, and until then runs a requested page script *without the
# entry*, i.e. without the password gate. Every page imports this package, so from the first page
# run on, every run goes through the entry. (Pages also call ``ui.chrome.page_setup()`` for that
# first run.)
PagesManager.uses_pages_directory = False
