"""The one rule for "can this listing be filled with N credit units now?", shared by the x402
quote/prepare/relay path and by marketplace quotes and orders (spec: x402 quote, Errors
``listing_*``, ``below_min_fill``, ``insufficient_listing_supply``, ``amount_not_whole_tonnes``;
marketplace-api.md, Rules). Pure: the caller reads the listing (from the node or the index)
and the credit's registry rule, and maps the refusal's reason to its surface's code.

Units: credit units (1000 a tonne); times in unix seconds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from relayer.domain.amounts import UNITS_PER_TONNE


class Fillable(Protocol):
    """What the rule needs of a listing (a node read or an indexed listing state)."""

    @property
    def active(self) -> bool: ...
    @property
    def expiration(self) -> int: ...
    @property
    def left_to_sell(self) -> int: ...
    @property
    def min_fill(self) -> int: ...


class Unfillable(enum.Enum):
    """Why a fill is refused, in the order the rule checks (the value is the marketplace's
    code; the x402 surface names ``CANCELLED`` ``listing_not_found`` and ``SOLD_OUT``
    ``insufficient_listing_supply``, as its spec's table does)."""

    CANCELLED = "listing_cancelled"
    EXPIRED = "listing_expired"
    SOLD_OUT = "listing_sold_out"
    INSUFFICIENT_SUPPLY = "insufficient_listing_supply"
    BELOW_MIN_FILL = "below_min_fill"
    NOT_WHOLE_TONNES = "amount_not_whole_tonnes"


@dataclass(frozen=True, slots=True)
class FillRefusal:
    """A refused fill: the reason and the listing figures a caller needs to fix it (credit
    units, unix seconds)."""

    reason: Unfillable
    left_to_sell: int
    min_fill: int
    expiration: int


def check_fill(
    listing: Fillable, units: int, now: int, *, whole_tonnes_only: bool, reserved: int = 0
) -> FillRefusal | None:
    """Whether ``units`` credit units of ``listing`` can be filled at ``now``: None when they
    can, else the first failing check: cancelled (inactive), expired (``expiration <= now``),
    sold out (nothing left), more than is left, below the listing's minimum fill (unless the
    fill takes all that is left), a fraction of a tonne of a whole-tonne registry's credit.

    ``reserved`` (credit units) is what fills in flight, not yet shown in ``listing``, take
    before this one: what is left is ``left_to_sell - reserved`` (at least 0), and the
    refusal's ``left_to_sell`` says so. A listing that has supply but whose supply fills in
    flight take is refused as more than is left, never as sold out (the listing's own state)."""
    left = max(0, listing.left_to_sell - reserved)
    reason = _first_failure(listing, units, now, whole_tonnes_only, left)
    if reason is None:
        return None
    return FillRefusal(reason, left, listing.min_fill, listing.expiration)


def check_liquidity(available: int, units: int, *, reserved: int = 0) -> int | None:
    """Whether ``units`` credit units of a carbon class's credit holding ``available`` can be
    redeemed beside ``reserved`` units that redemptions in flight (not yet shown in
    ``available``) take first: None when they can, else what is left for it (credit units,
    at least 0; the surface answers ``insufficient_liquidity``)."""
    left = max(0, available - reserved)
    return None if units <= left else left


def _first_failure(
    listing: Fillable, units: int, now: int, whole_tonnes_only: bool, left: int
) -> Unfillable | None:
    if not listing.active:
        return Unfillable.CANCELLED
    if listing.expiration <= now:
        return Unfillable.EXPIRED
    if listing.left_to_sell == 0:
        return Unfillable.SOLD_OUT
    if units > left:
        return Unfillable.INSUFFICIENT_SUPPLY
    if units < listing.min_fill and units != left:
        return Unfillable.BELOW_MIN_FILL
    if whole_tonnes_only and units % UNITS_PER_TONNE:
        return Unfillable.NOT_WHOLE_TONNES
    return None


@dataclass(frozen=True, slots=True)
class SupplyRule:
    """The fill rule as figures a database can apply beside what is reserved (the one-statement
    reservation: migration 0020's ``relay_supply_admits``, which this mirrors): a fill of
    ``units`` fits ``left`` credit units beside ``reserved`` units taken first when it does not
    exceed what is left (``max(0, left - reserved)``) and reaches ``min_fill`` unless it takes
    all that is left; ``possible`` False refuses it whatever is reserved. Built by
    :func:`fill_rule` and :func:`liquidity_rule`, whose answers it gives for every
    ``reserved`` (tests/unit/test_fill_rule.py)."""

    left: int
    units: int
    min_fill: int
    possible: bool

    def admits(self, reserved: int) -> bool:
        """Whether the fill fits beside ``reserved`` credit units."""
        rest = max(0, self.left - reserved)
        return self.possible and self.units <= rest and (self.units >= self.min_fill or self.units == rest)


def fill_rule(listing: Fillable, units: int, now: int, *, whole_tonnes_only: bool) -> SupplyRule:
    """:func:`check_fill` as a :class:`SupplyRule`: it admits a ``reserved`` exactly when
    ``check_fill(..., reserved=reserved)`` returns None. The checks that do not depend on
    what is reserved (cancelled, expired, sold out, whole tonnes) make ``possible``."""
    possible = (
        listing.active
        and listing.expiration > now
        and listing.left_to_sell > 0
        and not (whole_tonnes_only and units % UNITS_PER_TONNE)
    )
    return SupplyRule(listing.left_to_sell, units, listing.min_fill, possible)


def liquidity_rule(available: int, units: int) -> SupplyRule:
    """:func:`check_liquidity` as a :class:`SupplyRule` (no minimum): it admits a
    ``reserved`` exactly when ``check_liquidity(..., reserved=reserved)`` returns None."""
    return SupplyRule(available, units, 0, True)
