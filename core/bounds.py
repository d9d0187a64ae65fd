"""Numbers from outside (config, CLI, URL query, form) parsed with bounds before any arithmetic.

Every value that a person or a link can type goes through one of these, so that ``nan``, ``inf``,
``1e400`` (overflows to inf), ``1e-400`` (silently becomes 0), ``True`` (an int in Python) and
``1e100000000`` (cheap as text, ruinous as a Fraction or a big int) are refused with one line naming
the field and the range, e.g. ``utilization must be a number from 0.1 to 1, got '1e400'``.

Text is checked by shape and length first (:data:`MAX_TEXT`), so no parse ever builds a huge object;
after that ``float()``/``int()``/``Decimal()`` of at most 64 characters is cheap. This module imports
nothing of ours.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

MAX_TEXT = 64  # characters; no legitimate setting needs more
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")


class BoundsError(ValueError):
    """A value outside its field's allowed range, or not a number at all. ``str()`` is one line."""

    def __init__(self, field: str, allowed: str, raw: object):
        self.field = field
        self.allowed = allowed
        self.raw = raw
        super().__init__(f"{field} must be {allowed}, got {_show(raw)}")


def _show(raw: object) -> str:
    if isinstance(raw, str):
        text = raw if len(raw) <= 40 else raw[:40] + "\u2026"
        return repr(text)
    if isinstance(raw, float) and not math.isfinite(raw):
        return str(raw)  # nan, inf, -inf
    return repr(raw)


def _num(x: float | int | Decimal) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return str(x)


def _range(kind: str, lo, hi, lo_open: bool, hi_open: bool) -> str:
    if lo is None and hi is None:
        return f"a finite {kind}"
    if lo is None:
        return f"a {kind} {'below' if hi_open else 'at most'} {_num(hi)}"
    if hi is None:
        return f"a {kind} {'above' if lo_open else 'at least'} {_num(lo)}"
    if not lo_open and not hi_open:
        return f"a {kind} from {_num(lo)} to {_num(hi)}"
    low = f"above {_num(lo)}" if lo_open else f"at least {_num(lo)}"
    high = f"below {_num(hi)}" if hi_open else f"at most {_num(hi)}"
    return f"a {kind} {low} and {high}"


def _in_range(x, lo, hi, lo_open: bool, hi_open: bool) -> bool:
    if lo is not None and (x <= lo if lo_open else x < lo):
        return False
    return not (hi is not None and (x >= hi if hi_open else x > hi))


def _number_text(raw: str, error: BoundsError) -> str:
    text = raw.strip()
    if not text or len(text) > MAX_TEXT or not _NUMBER.fullmatch(text):
        raise error
    return text


def _mantissa_is_zero(text: str) -> bool:
    mantissa = re.split(r"[eE]", text, maxsplit=1)[0]
    return not any(c in "123456789" for c in mantissa)


def _places(value: Decimal) -> int:
    """Digits after the point that matter (``1.500`` has 1), without context rounding."""
    _sign, digits, exponent = value.as_tuple()
    if not any(digits):
        return 0
    trailing = len(digits) - len("".join(map(str, digits)).rstrip("0"))
    return max(0, -(int(exponent) + trailing))


def parse_float(
    raw: str | float | int,
    *,
    field: str,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """A finite float within the bounds (``None`` = unbounded on that side), else :class:`BoundsError`.

    Accepts int, float and decimal text (``"0.5"``, ``"5e-1"``, surrounding spaces). Refuses bools,
    empty text, ``nan``/``inf`` in any spelling, hex, underscores, text that overflows to inf, and
    non-zero text that underflows to 0.0.
    """
    error = BoundsError(field, _range("number", lo, hi, lo_open, hi_open), raw)
    if isinstance(raw, bool):
        raise error
    if isinstance(raw, int):
        # Compare the exact int first, so 10**400 is refused rather than overflowing in float().
        if not _in_range(raw, lo, hi, lo_open, hi_open):
            raise error
        try:
            return float(raw)
        except OverflowError:  # unbounded side and beyond the float range
            raise error from None
    if isinstance(raw, float):
        value = raw
    elif isinstance(raw, str):
        text = _number_text(raw, error)
        value = float(text)  # bounded length: cheap, and never raises for this shape
        if math.isinf(value) or (value == 0.0 and not _mantissa_is_zero(text)):
            raise error
    else:
        raise error
    if not math.isfinite(value) or not _in_range(value, lo, hi, lo_open, hi_open):
        raise error
    return value


def parse_int(
    raw: str | int | float,
    *,
    field: str,
    lo: int | None = None,
    hi: int | None = None,
) -> int:
    """A whole number within ``[lo, hi]`` (``None`` = unbounded), else :class:`BoundsError`.

    Accepts int, integral finite floats (TOML ``7.0``) and digit text (``"7"``, ``" -3 "``). Refuses
    bools, fractions, exponents in text, and more than :data:`MAX_TEXT` characters.
    """
    error = BoundsError(field, _range("whole number", lo, hi, False, False), raw)
    if isinstance(raw, bool):
        raise error
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, float):
        if not math.isfinite(raw) or not raw.is_integer():
            raise error
        value = int(raw)
    elif isinstance(raw, str):
        text = raw.strip()
        if not text or len(text) > MAX_TEXT or not _INTEGER.fullmatch(text):
            raise error
        value = int(text)
    else:
        raise error
    if not _in_range(value, lo, hi, False, False):
        raise error
    return value


def parse_decimal(
    raw: str | int | float | Decimal,
    *,
    field: str,
    lo: Decimal | float | int | None = None,
    hi: Decimal | float | int | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    max_places: int | None = None,
) -> Decimal:
    """An exact, finite :class:`~decimal.Decimal` within the bounds, for values kept exactly (a ratio
    stored as typed). Floats are taken at their shortest repr (``0.1`` -> ``Decimal('0.1')``).

    ``max_places`` limits the digits after the point (``0.125`` has 3). Like :func:`parse_float`, a
    non-zero value too small to survive as a float is refused, since it would become 0 downstream.
    """
    allowed = _range("number", lo, hi, lo_open, hi_open)
    if max_places is not None:
        allowed += f" with at most {max_places} decimal places"
    error = BoundsError(field, allowed, raw)
    if isinstance(raw, bool):
        raise error
    if isinstance(raw, Decimal):
        if not raw.is_finite() or len(str(raw)) > MAX_TEXT:
            raise error
        value = raw
    elif isinstance(raw, int):
        if len(str(abs(raw))) > MAX_TEXT:
            raise error
        value = Decimal(raw)
    elif isinstance(raw, float):
        if not math.isfinite(raw):
            raise error
        value = Decimal(repr(raw))
    elif isinstance(raw, str):
        try:
            value = Decimal(_number_text(raw, error))
        except InvalidOperation:  # pragma: no cover - the shape check admits only valid literals
            raise error from None
    else:
        raise error
    # Exponent checks on the Decimal's own fields, before any comparison that could do real work.
    if value != 0 and not (-330 <= value.adjusted() <= 308):
        raise error
    if max_places is not None and _places(value) > max_places:
        raise error
    bound_lo = None if lo is None else Decimal(repr(lo)) if isinstance(lo, float) else Decimal(lo)
    bound_hi = None if hi is None else Decimal(repr(hi)) if isinstance(hi, float) else Decimal(hi)
    if not _in_range(value, bound_lo, bound_hi, lo_open, hi_open):
        raise error
    if value != 0 and float(value) == 0.0:
        raise error
    return value
