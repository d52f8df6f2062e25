"""Exact amount parsing and formatting. Money and credits are ints of atomic units at every
boundary; parsing is exact string arithmetic (no float, no Decimal context rounding).

Credit units: 1 unit = 1 kg CO2e, 1000 units = 1 tonne (spec, Limits 1: minimum 0.001 t).
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Final

from relayer.domain.errors import Rejection

UNITS_PER_TONNE: Final = 1000
USDC_DECIMALS: Final = 6
KVCM_DECIMALS: Final = 18

TONNES_MAX_CHARS: Final = 31
"""The longest tonne string read: 12 integer digits, a point and 18 decimals; a longer text is
malformed before any matching."""
_TONNES_RE: Final = re.compile(r"(0|[1-9][0-9]{0,11})(?:\.([0-9]{1,18}))?", re.ASCII)
_UNITS_RE: Final = re.compile(r"(0|[1-9][0-9]{0,77})(?:\.([0-9]{1,78}))?")


def _scaled(match: re.Match[str], decimals: int) -> int | None:
    """Integer value of the matched decimal times 10**decimals, or None when it has
    non-zero digits beyond ``decimals`` places. Exact (string arithmetic, no Decimal context)."""
    whole: str = match.group(1)
    frac: str = match.group(2) or ""
    if frac[decimals:].strip("0"):
        return None
    scale: int = 10**decimals
    return int(whole) * scale + int(frac[:decimals].ljust(decimals, "0") or "0")


class TonnesFault(Enum):
    """Why :func:`read_tonnes` refuses a tonne string (each surface answers its own code)."""

    MALFORMED = "malformed"
    """Not a plain decimal: more than :data:`TONNES_MAX_CHARS` characters, a character other
    than ASCII digits and one point, a sign, an exponent, a space, a separator, a leading zero,
    a bare point, more than 12 integer digits (10**12 t and above) or more than 18 decimals."""
    NOT_WHOLE_KG = "not_whole_kg"
    """Zero, or a fraction of a kg: not a positive multiple of 0.001 t."""


def read_tonnes(text: str) -> int | TonnesFault:
    """The one tonne parser of both surfaces (x402 ``amount``, marketplace ``quantity_tonnes``):
    a decimal tonne string to credit units (kg), exact (string arithmetic, no float or Decimal).

    Args:
        text: ``"1"``, ``"0.5"``, ``"12.345"``, ``"1.500"`` (zeros past the third decimal are
            allowed, any other digit there is a fraction of a kg).

    Returns:
        Credit units (int, 1000 per tonne, 1 to 10**15 - 1), or the :class:`TonnesFault`.
    """
    if len(text) > TONNES_MAX_CHARS:
        return TonnesFault.MALFORMED
    match = _TONNES_RE.fullmatch(text)
    if match is None:
        return TonnesFault.MALFORMED
    units = _scaled(match, 3)
    if units is None or units < 1:
        return TonnesFault.NOT_WHOLE_KG
    return units


def parse_tonnes(text: str) -> int:
    """Parse the x402 ``amount``, a decimal tonne string, into credit units (kg) with
    :func:`read_tonnes`.

    Args:
        text: e.g. ``"1"``, ``"0.5"``, ``"12.345"``; no sign, exponent, spaces or separators.

    Returns:
        Credit units (int, 1000 per tonne).

    Raises:
        Rejection: ``schema_validation`` when not a plain decimal;
            ``amount_below_increment`` when below 0.001 t or not a multiple of 0.001 t.
    """
    units = read_tonnes(text)
    if units is TonnesFault.MALFORMED:
        raise Rejection(
            "schema_validation",
            'amount must be a decimal tonne string such as "1.5"',
            issues=[{"path": ["amount"], "keys": [], "message": "not a decimal tonne string"}],
        )
    if units is TonnesFault.NOT_WHOLE_KG:
        raise Rejection(
            "amount_below_increment",
            "amount must be a positive multiple of 0.001 tonne (1 kg)",
            minimum="0.001",
            increment="0.001",
        )
    return units


def tonnes_ceil_units(text: str) -> int:
    """The fewest credit units that are at least ``text`` tonnes: exact decimal arithmetic,
    any fraction of a unit rounded up (``"0.0005" -> 1``, ``"1.0005" -> 1001``, ``"2" -> 2000``).
    For a lower bound on a supply in units, ``supply >= tonnes`` exactly when
    ``supply >= tonnes_ceil_units(tonnes)``.

    Args:
        text: a non-negative plain decimal (``"0"``, ``"12.5"``); no sign, exponent or spaces.

    Returns:
        Credit units (int, 1000 per tonne).

    Raises:
        ValueError: not a plain decimal.
    """
    match = _UNITS_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a decimal amount: {text!r}")
    frac: str = match.group(2) or ""
    units = int(match.group(1)) * UNITS_PER_TONNE + int(frac[:3].ljust(3, "0"))
    return units + 1 if frac[3:].strip("0") else units


def format_units(atomic: int, decimals: int) -> str:
    """Exact decimal string of ``atomic`` units of a token with ``decimals``, trailing zeros
    trimmed (``1_500_000, 6 -> "1.5"``; ``0 -> "0"``)."""
    sign = "-" if atomic < 0 else ""
    whole, frac = divmod(abs(atomic), 10**decimals)
    frac_text = str(frac).rjust(decimals, "0").rstrip("0") if decimals else ""
    return f"{sign}{whole}.{frac_text}" if frac_text else f"{sign}{whole}"


def format_tonnes(units: int) -> str:
    """Credit units (kg) as a tonne string (``1500 -> "1.5"``)."""
    return format_units(units, 3)


def parse_units(text: str, decimals: int) -> int:
    """Inverse of :func:`format_units` for a non-negative decimal string; exact.

    Raises:
        ValueError: not a plain decimal or more fractional digits than ``decimals``.
    """
    match = _UNITS_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a decimal amount: {text!r}")
    value = _scaled(match, decimals)
    if value is None:
        raise ValueError(f"more than {decimals} decimals: {text!r}")
    return value
