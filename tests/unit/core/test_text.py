"""core.text: storable text for both databases, secret scrubbing, CSV formula neutralising."""

from __future__ import annotations

import csv
import io
import json
import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.text import ELLIPSIS, REDACTED, REPLACEMENT, clean, csv_safe, scrub_secrets, storable

# Any str Python can hold, lone surrogates and NUL included.
any_text = st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF))


def test_lone_surrogate_from_an_upstream_json_error_becomes_encodable():
    message = json.loads('{"error": {"message": "bad \\udcff thing"}}')["error"]["message"]
    with pytest.raises(UnicodeEncodeError):
        message.encode("utf-8")
    out = storable(message, 500)
    assert out == f"bad {REPLACEMENT} thing"
    assert out.encode("utf-8")


def test_a_valid_surrogate_pair_becomes_the_character_it_spells():
    assert storable("a\ud83d\ude00b", 10) == "a\U0001f600b"
    assert storable("\ud800", 10) == REPLACEMENT


def test_nul_and_c0_controls_are_removed_but_tab_newline_cr_kept():
    assert storable("a\u0000b\x07c\x1bd", 50) == "abcd"
    assert storable("line1\nline2\tx\r\n", 50) == "line1\nline2\tx\r\n"


def test_bytes_are_decoded_with_replacement_and_none_stays_none():
    assert storable(b"caf\xc3\xa9 \xff", 50) == f"café {REPLACEMENT}"
    assert storable(None, 5) is None


def test_length_bound_marks_the_cut():
    assert storable("abcdef", 4) == "abc" + ELLIPSIS
    assert storable("abcd", 4) == "abcd"
    with pytest.raises(ValueError, match="limit"):
        storable("x", 0)


def test_storable_text_round_trips_through_sqlite():
    conn = sqlite3.connect(":memory:")
    conn.execute("create table t (v text)")
    value = storable("bad \udcff \u0000 thing \U0001f600", 100)
    conn.execute("insert into t values (?)", (value,))
    assert conn.execute("select v from t").fetchone()[0] == value


@given(any_text, st.integers(min_value=1, max_value=300))
def test_any_text_becomes_encodable_bounded_and_idempotent(s, limit):
    out = storable(s, limit)
    out.encode("utf-8")  # never raises
    assert len(out) <= limit
    assert "\x00" not in out
    assert storable(out, limit) == out


@given(st.binary(max_size=200), st.integers(min_value=1, max_value=100))
def test_any_bytes_become_encodable_and_bounded(b, limit):
    out = storable(b, limit)
    out.encode("utf-8")
    assert len(out) <= limit


def test_openai_401_echo_is_scrubbed():
    text = "Incorrect API key provided: Bearer sk-proj-abcDEF1234567890xyz. You can find your API key at ..."
    out = scrub_secrets(text)
    assert "sk-proj" not in out and "abcDEF" not in out
    assert f"Bearer {REDACTED}" in out and out.endswith("You can find your API key at ...")


@pytest.mark.parametrize(
    "secret",
    [
        "sk-ant-api03-AbCdEfGhIjKlMnOp",
        "sk-abc12345678901234567890",
        "sk-proj-********************************wxyz",
        "AIza" + "B" * 35,
        "gsk_0123456789abcdef",
        "hf_0123456789abcdefABC",
    ],
)
def test_common_key_shapes_are_scrubbed_without_configuration(secret):
    out = scrub_secrets(f"key {secret} rejected")
    assert secret not in out and out == f"key {REDACTED} rejected"


def test_configured_key_values_are_scrubbed_whatever_their_shape():
    key = "holysheep-7f3a9c1e"  # no recognisable prefix: only configuration knows it
    out = scrub_secrets(f"auth failed for {key}; retry", [key, None, "", "x"])
    assert out == f"auth failed for {REDACTED}; retry"


def test_short_configured_values_are_not_treated_as_secrets():
    assert scrub_secrets("a x b", ["x"]) == "a x b"


def test_api_key_assignments_keep_the_name():
    assert scrub_secrets('x-api-key: abcd1234efgh and {"api_key": "qwerty123"}') == (
        f'x-api-key: {REDACTED} and {{"api_key": "{REDACTED}"}}'
    )


def test_ordinary_text_is_left_alone():
    text = "The model said: risk-free tasks, sketch-based ideas, bearer of news, api keys are secret."
    assert scrub_secrets(text) == text


@given(any_text)
def test_scrub_is_idempotent(s):
    once = scrub_secrets(s, ["secret-value-123"])
    assert scrub_secrets(once, ["secret-value-123"]) == once


def test_scrub_handles_a_large_text_in_one_pass():
    # 100 kB of near-matches: each candidate fails fast (bounded quantifiers), so the result is exact
    # and the call linear; the time budget itself lives in benchmarks, not here.
    near_misses = ("bearer of sk-short AIza1 api keys configured-secre " * 2000)[:100_000]
    text = near_misses + " sk-abcdefghijklmnop"
    out = scrub_secrets(text, ["configured-secret"])
    assert out == near_misses + f" {REDACTED}"


def test_clean_scrubs_before_bounding_so_no_half_key_survives():
    text = "x" * 20 + " Bearer sk-abcdefghijklmnopqrstuvwxyz"
    out = clean(text, 30)
    assert "sk-" not in out and "abcdef" not in out and len(out) <= 30
    assert clean(None, 5) is None
    assert clean("bad \udcff \x00", 20) == f"bad {REPLACEMENT} "


@given(any_text, any_text, st.integers(min_value=1, max_value=200))
def test_clean_never_leaks_a_configured_secret_and_is_storable(before, after, limit):
    secret = "cfg-secret-\u00e9-42"
    out = clean(before + secret + after, limit, [secret])
    assert secret not in out and len(out) <= limit
    out.encode("utf-8")


@pytest.mark.parametrize("cell", ['=HYPERLINK("http://evil","x")', "+1", "-2+3", "@SUM(A1)", "\tx", "\rx"])
def test_formula_cells_get_a_leading_apostrophe(cell):
    assert csv_safe(cell) == "'" + cell


def test_plain_cells_and_numbers_are_unchanged():
    assert csv_safe("hello =1") == "hello =1"
    assert csv_safe(-2) == -2 and csv_safe(1.5) == 1.5 and csv_safe(None) is None


def test_csv_safe_cells_survive_the_csv_writer():
    buf = io.StringIO()
    csv.writer(buf).writerow([csv_safe('=HYPERLINK("http://evil","x")'), csv_safe("ok")])
    row = next(csv.reader(io.StringIO(buf.getvalue())))
    assert row == ['\'=HYPERLINK("http://evil","x")', "ok"]
