"""A facilitator API key's daily gas budget, pure (design: docs/design/x402-v2.md, C3): the
UTC day a reservation counts in, how long until the next one, and the most a sponsored
transfer can cost the executor (its reservation). Amounts in wei; times in unix seconds."""

from __future__ import annotations

import datetime as dt
from typing import Final

DAY_S: Final = 86_400


def utc_day(now: int) -> dt.date:
    """The UTC calendar day of unix time ``now``: the budget row a reservation counts in."""
    return dt.datetime.fromtimestamp(now, dt.UTC).date()


def seconds_to_utc_midnight(now: int) -> int:
    """Whole seconds from ``now`` until the next UTC day starts (1 to 86 400): the
    ``Retry-After`` of an exhausted daily budget."""
    return DAY_S - now % DAY_S


def transfer_gas_ceiling(gas_limit: int, max_fee_per_gas: int, extra_wei: int) -> int:
    """The most a sponsored transfer can cost the executor, in wei: ``gas_limit`` at the
    sponsored fee ceiling ``max_fee_per_gas`` (wei per gas; no fee bump goes above it) plus
    ``extra_wei``, the upper bound of its L1 data fee and operator fee.

    Raises:
        ValueError: a negative figure.
    """
    if min(gas_limit, max_fee_per_gas, extra_wei) < 0:
        raise ValueError("gas figures are never negative")
    return gas_limit * max_fee_per_gas + extra_wei
