"""core.session: any Unicode session id, sent upstream as a stable, injective ASCII header value."""

from __future__ import annotations

from urllib.parse import unquote

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.session import ENCODED_PREFIX, MAX_SESSION_ID, session_header_value, validate_session_id

valid_ids = st.text(
    alphabet=st.characters(codec="utf-8", blacklist_characters="\x00"), min_size=1, max_size=MAX_SESSION_ID
)


@pytest.mark.parametrize("sid", ["세션", "café", "cafe\u0301", "\U0001f680 launch", "\n", "a b", "u-x"])
def test_non_plain_ids_are_encoded_to_ascii_and_round_trip(sid):
    value = session_header_value(sid)
    assert value.isascii() and value.startswith(ENCODED_PREFIX)
    assert all(0x21 <= ord(c) <= 0x7E for c in value)  # no controls, no spaces
    assert unquote(value[len(ENCODED_PREFIX) :], errors="strict") == sid


def test_plain_ascii_ids_are_sent_unchanged_so_existing_affinity_holds():
    for sid in ["s1", "user-42", "abc_DEF.~!$%", "x" * MAX_SESSION_ID]:
        assert session_header_value(sid) == sid


def test_the_encoding_is_stable():
    assert session_header_value("세션") == "u-%EC%84%B8%EC%85%98"
    assert session_header_value("café") == "u-caf%C3%A9"
    assert session_header_value("\n") == "u-%0A"


def test_encoded_value_is_a_valid_httpx_header():
    request = httpx2.Request("POST", "http://x/", headers={"x-session-id": session_header_value("세션 🚀\n")})
    assert request.headers["x-session-id"].startswith(ENCODED_PREFIX)


@given(valid_ids, valid_ids)
def test_distinct_ids_give_distinct_ascii_values(a, b):
    va, vb = session_header_value(a), session_header_value(b)
    assert va.isascii() and vb.isascii()
    assert (va == vb) == (a == b)


@given(valid_ids)
def test_every_valid_id_is_accepted_unchanged(sid):
    assert validate_session_id(sid) == sid


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("", "1 to 128 characters"),
        ("x" * (MAX_SESSION_ID + 1), "1 to 128 characters, got 129"),
        ("a\x00b", "NUL"),
        ("bad \udcff", "lone surrogate"),
        (42, "got int"),
        (None, "got NoneType"),
    ],
)
def test_invalid_ids_are_rejected_with_the_rule(bad, needle):
    with pytest.raises(ValueError, match=needle):
        validate_session_id(bad)
    with pytest.raises(ValueError):
        session_header_value(bad)
