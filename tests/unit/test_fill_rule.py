"""The fill rule as figures (relayer.domain.fill.SupplyRule, which migration 0020's
``relay_supply_admits`` mirrors: tests/integration/test_store.py) admits exactly the
reservations the fill rule and the liquidity rule pass, for every listing, fill and
reservation."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from relayer.domain.fill import check_fill, check_liquidity, fill_rule, liquidity_rule

units = st.integers(min_value=0, max_value=10**6) | st.sampled_from([0, 1, 999, 1_000, 1_001, 2_000])


@dataclass(frozen=True)
class Listing:
    active: bool
    expiration: int
    left_to_sell: int
    min_fill: int


listings = st.builds(
    Listing,
    active=st.booleans(),
    expiration=st.integers(min_value=0, max_value=200),
    left_to_sell=units,
    min_fill=units,
)


@given(
    listing=listings,
    fill=units,
    now=st.integers(min_value=0, max_value=200),
    whole=st.booleans(),
    reserved=units,
)
def test_the_fill_rule_as_figures_admits_what_check_fill_passes(
    listing: Listing, fill: int, now: int, whole: bool, reserved: int
) -> None:
    rule = fill_rule(listing, fill, now, whole_tonnes_only=whole)
    passes = check_fill(listing, fill, now, whole_tonnes_only=whole, reserved=reserved) is None
    assert rule.admits(reserved) is passes


@given(available=units, fill=units, reserved=units)
def test_the_liquidity_rule_as_figures_admits_what_check_liquidity_passes(
    available: int, fill: int, reserved: int
) -> None:
    passes = check_liquidity(available, fill, reserved=reserved) is None
    assert liquidity_rule(available, fill).admits(reserved) is passes


def test_a_fill_that_takes_all_that_is_left_is_admitted_below_the_minimum() -> None:
    """The one non-monotone case: 300 units below a 500 minimum fit only when exactly 300
    are left."""
    rule = fill_rule(Listing(True, 100, 1_000, 500), 300, 0, whole_tonnes_only=False)
    assert [rule.admits(r) for r in (0, 600, 700, 800)] == [False, False, True, False]
