"""The one fill rule (domain/fill.py) shared by the x402 path and marketplace quotes and orders:
each refusal in the order it is checked, the boundaries, and the surfaces' codes for each."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from relayer.domain.fill import Unfillable, check_fill, check_liquidity

NOW = 1_800_000_000


@dataclass(frozen=True)
class Listing:
    active: bool = True
    expiration: int = NOW + 3600
    left_to_sell: int = 5_000
    min_fill: int = 1_000


L = Listing()


@pytest.mark.parametrize(
    ("listing", "units", "whole", "reason"),
    [
        (L, 1_000, False, None),
        (L, 5_000, True, None),  # all that is left
        (replace(L, active=False), 1_000, False, Unfillable.CANCELLED),
        (replace(L, active=False, expiration=NOW), 1_000, False, Unfillable.CANCELLED),  # cancelled first
        (replace(L, expiration=NOW), 1_000, False, Unfillable.EXPIRED),  # expiration <= now
        (replace(L, expiration=NOW + 1), 1_000, False, None),
        (replace(L, left_to_sell=0), 1_000, False, Unfillable.SOLD_OUT),
        (L, 5_001, False, Unfillable.INSUFFICIENT_SUPPLY),
        (L, 999, False, Unfillable.BELOW_MIN_FILL),
        (replace(L, left_to_sell=500), 500, False, None),  # below min fill but takes all that is left
        (L, 1_500, True, Unfillable.NOT_WHOLE_TONNES),
        (L, 1_500, False, None),
        (L, 2_000, True, None),
    ],
)
def test_each_refusal_in_its_order(
    listing: Listing, units: int, whole: bool, reason: Unfillable | None
) -> None:
    refusal = check_fill(listing, units, NOW, whole_tonnes_only=whole)
    assert (None if refusal is None else refusal.reason) == reason
    if refusal is not None:
        assert (refusal.left_to_sell, refusal.min_fill, refusal.expiration) == (
            listing.left_to_sell,
            listing.min_fill,
            listing.expiration,
        )


def test_each_surface_names_every_reason() -> None:
    """The x402 surface uses its spec's codes (cancelled is listing_not_found, sold out is
    insufficient_listing_supply); the marketplace the reason's own code."""
    from relayer.service.market.orders import marketplace_fill_refusal
    from relayer.service.supply import x402_fill_refusal

    x402 = {
        Unfillable.CANCELLED: "listing_not_found",
        Unfillable.EXPIRED: "listing_expired",
        Unfillable.SOLD_OUT: "insufficient_listing_supply",
        Unfillable.INSUFFICIENT_SUPPLY: "insufficient_listing_supply",
        Unfillable.BELOW_MIN_FILL: "below_min_fill",
        Unfillable.NOT_WHOLE_TONNES: "amount_not_whole_tonnes",
    }
    for reason in Unfillable:
        refusal = check_fill(_failing(reason), 1_500, NOW, whole_tonnes_only=True)
        assert refusal is not None and refusal.reason is reason
        assert x402_fill_refusal(refusal, 6, None).code == x402[reason]
        assert marketplace_fill_refusal(refusal, 6, 84532).code == reason.value


def _failing(reason: Unfillable) -> Listing:
    return {
        Unfillable.CANCELLED: replace(L, active=False),
        Unfillable.EXPIRED: replace(L, expiration=NOW),
        Unfillable.SOLD_OUT: replace(L, left_to_sell=0),
        Unfillable.INSUFFICIENT_SUPPLY: replace(L, left_to_sell=1_400),
        Unfillable.BELOW_MIN_FILL: replace(L, min_fill=2_000),
        Unfillable.NOT_WHOLE_TONNES: L,
    }[reason]


@pytest.mark.parametrize(
    ("listing", "units", "reserved", "reason", "left"),
    [
        (L, 1_000, 4_000, None, None),  # fits beside the fills in flight
        (L, 1_000, 4_001, Unfillable.INSUFFICIENT_SUPPLY, 999),
        (L, 1_000, 5_000, Unfillable.INSUFFICIENT_SUPPLY, 0),  # taken in flight, not sold out
        (L, 1_000, 9_000, Unfillable.INSUFFICIENT_SUPPLY, 0),
        (replace(L, left_to_sell=0), 1_000, 0, Unfillable.SOLD_OUT, 0),  # the listing's own state
        (L, 500, 4_500, None, None),  # below the minimum but takes all that fills in flight leave
        (L, 500, 4_000, Unfillable.BELOW_MIN_FILL, 1_000),
        (replace(L, active=False), 1_000, 9_000, Unfillable.CANCELLED, 0),
    ],
)
def test_fills_in_flight_are_taken_first(
    listing: Listing, units: int, reserved: int, reason: Unfillable | None, left: int | None
) -> None:
    """Supply in flight (issue 18): what fills in flight take is not there for this one."""
    refusal = check_fill(listing, units, NOW, whole_tonnes_only=False, reserved=reserved)
    assert (None if refusal is None else (refusal.reason, refusal.left_to_sell)) == (
        None if reason is None else (reason, left)
    )


@pytest.mark.parametrize(
    ("available", "units", "reserved", "left"),
    [
        (2_000, 1_000, 1_000, None),
        (2_000, 1_000, 0, None),
        (2_000, 1_000, 1_001, 999),
        (2_000, 1_000, 2_000, 0),
        (2_000, 1_000, 5_000, 0),
        (0, 1_000, 0, 0),
    ],
)
def test_class_liquidity_beside_redemptions_in_flight(
    available: int, units: int, reserved: int, left: int | None
) -> None:
    assert check_liquidity(available, units, reserved=reserved) == left
