"""Exact amount parsing and formatting. Money and credits are ints of atomic units at every
boundary; parsing is exact string arithmetic (no float, no Decimal context rounding).

Credit units: 1 unit = 1 kg CO2e, 1000 units = 1 tonne (spec, Limits 1: minimum 0.001 t).
"""

from __future__ import annotations

import re
from typing import Final

from relayer.domain.errors import Rejection

UNITS_PER_TONNE: Final = 1000
USDC_DECIMALS: Final = 6
KVCM_DECIMALS: Final = 18

_TONNES_RE: Final = re.compile(r"(0|[1-9][0-9]{0,11})(?:\.([0-9]{1,18}))?")
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


def parse_tonnes(text: str) -> int:
    """Parse a decimal tonne string into credit units (kg).

    Args:
        text: e.g. ``"1"``, ``"0.5"``, ``"12.345"``; no sign, exponent, spaces or separators.

    Returns:
        Credit units (int, 1000 per tonne).

    Raises:
        Rejection: ``schema_validation`` when not a plain decimal;
            ``amount_below_increment`` when below 0.001 t or not a multiple of 0.001 t.
    """
    match = _TONNES_RE.fullmatch(text)
    if match is None:
        raise Rejection(
            "schema_validation",
            'amount must be a decimal tonne string such as "1.5"',
            issues=[{"path": ["amount"], "keys": [], "message": "not a decimal tonne string"}],
        )
    units = _scaled(match, 3)
    if units is None or units < 1:
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
