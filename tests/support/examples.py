"""Hypothesis example counts per tier. ``HYPOTHESIS_PROFILE`` picks the profile (registered in
tests/conftest.py): ``quick`` (the default: the unit tier as a 3-minute inner loop) draws a tenth of
each test's thorough count, ``thorough`` draws all of it (before a release, or after touching the
code a property covers):

    HYPOTHESIS_PROFILE=thorough make test-unit
"""

from __future__ import annotations

import os

SHARE = {"quick": 0.1, "thorough": 1.0}
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "quick")


def examples(thorough: int) -> int:
    """The example count of a property test whose thorough run draws ``thorough`` examples."""
    if PROFILE not in SHARE:
        raise ValueError(f"HYPOTHESIS_PROFILE={PROFILE!r}: choose among {', '.join(SHARE)}")
    return max(10, round(thorough * SHARE[PROFILE]))
