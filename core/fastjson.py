"""JSON on the proxy's hot path: orjson where it gives exactly what the standard library gives,
the standard library everywhere else.

orjson parses and writes several times faster than ``json``, but differs at the edges, and the
gateway's strictness is defined by ``json``'s behaviour there (its tests pin it). So:

- :func:`loads` hands a document to orjson only when it holds no run of 19 or more digits
  (orjson reads an integer beyond 64 bits as a float, silently; ``json`` keeps it exact); anything
  orjson refuses (NaN and Infinity literals, ``1e400``, lone surrogate escapes, nesting past 1,024
  levels) is parsed again by ``json``, so the result, or the error and its message, is ``json``'s.
- :func:`dumps` writes compact UTF-8 (``json.dumps(obj, separators=(",", ":"),
  ensure_ascii=False)``); whatever orjson refuses (integers beyond 64 bits, lone surrogates,
  non-string keys) is written by ``json``. A non-finite float, which orjson writes as ``null``, is
  looked for first and written by ``json`` as it always was.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

_LONG_DIGITS = re.compile(rb"\d{19}")
_LONG_DIGITS_STR = re.compile(r"\d{19}")


def loads(data: bytes | str, **json_kwargs: Any) -> Any:
    """``json.loads(data, **json_kwargs)``, faster where that is provably the same answer."""
    long_digits = _LONG_DIGITS if isinstance(data, bytes) else _LONG_DIGITS_STR
    if not json_kwargs.get("object_hook") and long_digits.search(data) is None:  # type: ignore[arg-type]
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # json's answer, or json's error, below
    return json.loads(data, **json_kwargs)


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON, as ``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)``."""
    try:
        out = orjson.dumps(obj)
    except (TypeError, orjson.JSONEncodeError):
        return _std_dumps(obj)
    if b"null" in out and _has_non_finite(obj):
        return _std_dumps(obj)
    return out


def _std_dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _has_non_finite(obj: Any) -> bool:
    """Whether a non-finite float sits anywhere in ``obj`` (orjson would write it as null)."""
    todo = [obj]
    while todo:
        v = todo.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return True
        elif isinstance(v, dict):
            todo.extend(v.values())
        elif isinstance(v, list | tuple):
            todo.extend(v)
    return False
