"""core.fastjson gives exactly what the standard library gives: the same values, the same errors,
the same bytes' meaning; orjson only where that holds."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import fastjson
from tests.support.examples import examples

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=30)


def _std(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@settings(max_examples=examples(40), deadline=None)
@given(values)
def test_round_trips_agree_with_json(v):
    text = json.dumps(v)
    assert fastjson.loads(text) == json.loads(text)
    assert fastjson.loads(text.encode()) == json.loads(text.encode())
    try:
        expected = json.loads(_std(v))
    except UnicodeEncodeError:  # lone surrogates: json cannot write them as UTF-8 either
        with pytest.raises(UnicodeEncodeError):
            fastjson.dumps(v)
        return
    assert json.loads(fastjson.dumps(v)) == expected


@pytest.mark.parametrize(
    "doc",
    [
        b"123456789012345678901234567890",  # orjson would read a float
        b'{"n": -98765432109876543210}',
        b'{"x": 1e400}',  # json: inf
        b'["\\ud800"]',  # a lone surrogate escape
        b'{"a": 1, "a": 2}',
        b"[NaN, Infinity, -Infinity]",
    ],
)
def test_edge_documents_read_as_json_reads_them(doc):
    got, want = fastjson.loads(doc), json.loads(doc)
    assert repr(got) == repr(want) and type(got) is type(want)


@pytest.mark.parametrize("doc", [b"{", b"[1,]", b"\xff\xfe", b"", b"[" * 100_000 + b"]" * 100_000])
def test_errors_are_json_s_errors(doc):
    with pytest.raises((ValueError, RecursionError)) as got:
        fastjson.loads(doc)
    with pytest.raises((ValueError, RecursionError)) as want:
        json.loads(doc)
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)


def test_a_refused_constant_hook_still_refuses():
    def refuse(name: str) -> None:
        raise ValueError(f"no {name}")

    with pytest.raises(ValueError, match="no NaN"):
        fastjson.loads('{"t": NaN}', parse_constant=refuse)


@pytest.mark.parametrize(
    "obj", [{"big": 10**30}, {"f": math.inf, "n": None}, [float("nan")], {1: "int key"}, {"é": "ü", "c": "\x1f"}]
)
def test_writes_what_json_writes_where_orjson_would_differ(obj):
    assert fastjson.dumps(obj) == _std(obj)
