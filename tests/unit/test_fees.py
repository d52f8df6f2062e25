"""Fee, price and gas-allowance math against the on-chain rules of RetirementSettlement._quote,
UsdcKvcmPool.getAmountIn, CarbonClasses.quoteRedeem and Marketplace.fillCost. Each rounding
rule is tested at its edge: an exact multiple, and one atomic unit over."""

from __future__ import annotations

import random

import pytest

from relayer.domain.errors import Rejection
from relayer.domain.fees import (
    UNSIGNED_TX_OVERHEAD,
    FeeSchedule,
    PoolReserves,
    Quote,
    allowance_in_wei,
    bounded_tip,
    ceil_div,
    class_cost_kvcm,
    eth_price_from_feed,
    gas_allowance,
    listing_cost_usdc,
    max_fee_covered,
    pool_amount_in,
    protocol_fee,
    quote_class,
    quote_listing,
    unsigned_tx_size,
    usdc_to_kvcm_spot,
    wei_in_usdc,
    with_slippage,
)

USDC = 10**6
KVCM = 10**18
GWEI = 10**9

# 1 % (0.01 USDC floor) on classes, 5 % (0.05 USDC floor) on listings: spec Limits 5.
FEES = FeeSchedule(
    class_fee_bps=100, class_fee_floor_usdc=10_000, listing_fee_bps=500, listing_fee_floor_usdc=50_000
)
# 1 kVCM = 0.30 USDC at spot: 300k USDC against 1M kVCM.
RESERVES = PoolReserves(usdc=300_000 * USDC, kvcm=1_000_000 * KVCM)


# -- reference formulas, transcribed from the Solidity sources (not from relayer.domain) --


def sol_fee(cost: int, bps: int, floor: int) -> int:
    proportional = (cost * bps + 10_000 - 1) // 10_000
    return proportional if proportional > floor else floor


def sol_get_amount_in(amount_out: int, r_in: int, r_out: int) -> int:
    """Uniswap V2 getAmountIn (0.3 % fee written as 997/1000)."""
    return (r_in * amount_out * 1000) // ((r_out - amount_out) * 997) + 1


def sol_get_amount_out(amount_in: int, r_in: int, r_out: int) -> int:
    in_with_fee = amount_in * 9970
    return (in_with_fee * r_out) // (r_in * 10_000 + in_with_fee)


# ---------------------------------------------------------------- ceil_div


@pytest.mark.parametrize(
    ("a", "b", "q"), [(0, 7, 0), (1, 7, 1), (7, 7, 1), (8, 7, 2), (14, 7, 2), (15, 7, 3)]
)
def test_ceil_div(a: int, b: int, q: int) -> None:
    assert ceil_div(a, b) == q


def test_ceil_div_is_exact_on_huge_ints() -> None:
    big = 2**255 + 1
    assert ceil_div(big, 2) == 2**254 + 1
    assert ceil_div(big - 1, 2) == 2**254


# ---------------------------------------------------------------- protocol fee


@pytest.mark.parametrize(
    ("cost", "fee"),
    [
        (0, 50_000),  # nothing to take a share of: the floor
        (1, 50_000),
        (999_999, 50_000),  # 5 % = 49 999.95 -> 50 000 == floor
        (1_000_000, 50_000),  # exactly at the boundary: 5 % == floor
        (1_000_001, 50_001),  # one atomic unit over: 50 000.05 rounds up
        (1_000_020, 50_001),  # exact multiple: 50 001 exactly
        (1_000_021, 50_002),  # one over the exact multiple rounds up
        (10_000_000, 500_000),
    ],
)
def test_listing_fee_floor_and_proportional_crossover(cost: int, fee: int) -> None:
    assert protocol_fee(cost, FEES.listing_fee_bps, FEES.listing_fee_floor_usdc) == fee
    assert protocol_fee(cost, 500, 50_000) == sol_fee(cost, 500, 50_000)


def test_protocol_fee_zero_floor_and_zero_bps() -> None:
    assert protocol_fee(1, 1, 0) == 1  # 0.0001 rounds up, never to zero
    assert protocol_fee(10_000, 1, 0) == 1
    assert protocol_fee(10_001, 1, 0) == 2
    assert protocol_fee(123_456, 0, 0) == 0
    assert protocol_fee(123_456, 0, 7) == 7


def test_protocol_fee_matches_solidity_on_random_inputs() -> None:
    rng = random.Random(5)
    for _ in range(500):
        cost = rng.randrange(0, 10**30)
        bps = rng.randrange(0, 2**16)
        floor = rng.randrange(0, 10**24)
        assert protocol_fee(cost, bps, floor) == sol_fee(cost, bps, floor)


# ---------------------------------------------------------------- class and listing prices


@pytest.mark.parametrize(
    ("price", "units", "cost"),
    [
        (1000, 1, 1),  # exact: 1 kg at 1000 / tonne
        (1001, 1, 2),  # 1.001 rounds up
        (999, 1, 1),  # 0.999 rounds up
        (2000, 3, 6),
        (2001, 3, 7),  # 6.003 rounds up
        (20 * KVCM, 1500, 30 * KVCM),
        (20 * KVCM + 1, 1500, 30 * KVCM + 2),  # 30e18 + 1.5 -> +2
        (0, 1000, 0),
    ],
)
def test_class_cost_kvcm_rounds_up(price: int, units: int, cost: int) -> None:
    assert class_cost_kvcm(price, units) == cost
    assert cost == (price * units + 1000 - 1) // 1000  # CarbonClasses.quoteRedeem


@pytest.mark.parametrize(
    ("unit_price", "units", "cost"),
    [
        (1 * USDC, 1, 1000),
        (1 * USDC + 1, 1, 1001),  # 1000.001 rounds up
        (1 * USDC + 999, 1, 1001),
        (1 * USDC + 1000, 1, 1001),  # exact
        (12_345_678, 1000, 12_345_678),  # one tonne costs the unit price
        (12_345_678, 1, 12_346),  # 12 345.678 rounds up
        (3, 333, 1),  # 0.999
        (3, 334, 2),  # 1.002
    ],
)
def test_listing_cost_usdc_rounds_up(unit_price: int, units: int, cost: int) -> None:
    assert listing_cost_usdc(unit_price, units) == cost
    assert cost == (unit_price * units + 1000 - 1) // 1000  # Marketplace.fillCost


@pytest.mark.parametrize(
    ("unit_price", "units", "cost", "fee"),
    [
        (20 * USDC, 1000, 20 * USDC, 1 * USDC),  # 5 % of 20 USDC
        (1 * USDC, 1000, 1 * USDC, 50_000),  # boundary: 5 % == floor
        (1 * USDC, 1, 1000, 50_000),  # 1 kg: the floor dominates
        (1_000_001, 1000, 1_000_001, 50_001),
    ],
)
def test_quote_listing(unit_price: int, units: int, cost: int, fee: int) -> None:
    q = quote_listing(unit_price, units, FEES)
    assert (q.cost, q.fee, q.total) == (cost, fee, cost + fee)


def test_quote_total_is_cost_plus_fee() -> None:
    assert Quote(cost=7, fee=5).total == 12


# ---------------------------------------------------------------- pool


def test_pool_amount_in_known_answer() -> None:
    # 1e13 / 9 960 030 000 = 1004.01..., floor + 1
    assert pool_amount_in(1000, 1_000_000, 1_000_000) == 1005


def test_pool_amount_in_matches_uniswap_v2_formula() -> None:
    rng = random.Random(7)
    for _ in range(500):
        r_in = rng.randrange(1, 10**30)
        r_out = rng.randrange(2, 10**30)
        out = rng.randrange(1, r_out)
        amount_in = pool_amount_in(out, r_in, r_out)
        assert amount_in == sol_get_amount_in(out, r_in, r_out)
        assert amount_in >= 1


def test_pool_amount_in_buys_at_least_amount_out() -> None:
    rng = random.Random(11)
    for _ in range(300):
        r_in = rng.randrange(10**6, 10**27)
        r_out = rng.randrange(10**6, 10**27)
        out = rng.randrange(1, r_out // 2)
        assert sol_get_amount_out(pool_amount_in(out, r_in, r_out), r_in, r_out) >= out


@pytest.mark.parametrize("amount_out", [1_000_000, 1_000_001, 10**30])
def test_pool_amount_in_insufficient_liquidity(amount_out: int) -> None:
    with pytest.raises(Rejection) as exc:
        pool_amount_in(amount_out, 1_000_000, 1_000_000)
    assert exc.value.code == "insufficient_liquidity"
    assert exc.value.spec.retryable is True


def test_pool_amount_in_just_below_reserve_is_priced() -> None:
    # one unit left in the pool: the price is huge but finite
    assert pool_amount_in(999_999, 1_000_000, 1_000_000) == (10**6 * 999_999 * 10_000) // 9970 + 1


@pytest.mark.parametrize(
    ("usdc", "reserves", "kvcm"),
    [
        (3, PoolReserves(usdc=3, kvcm=10), 10),  # exact
        (1, PoolReserves(usdc=3, kvcm=10), 4),  # 3.33 rounds up
        (2, PoolReserves(usdc=3, kvcm=10), 7),  # 6.67 rounds up
        (0, PoolReserves(usdc=3, kvcm=10), 0),
        (10_000, RESERVES, 10_000 * 10**12 * 10 // 3 + 1),  # 0.01 USDC at 0.30 USDC/kVCM
    ],
)
def test_usdc_to_kvcm_spot_rounds_up(usdc: int, reserves: PoolReserves, kvcm: int) -> None:
    assert usdc_to_kvcm_spot(usdc, reserves) == kvcm


# ---------------------------------------------------------------- class quotes


def test_quote_class_usdc_prices_through_the_pool() -> None:
    price = 20 * KVCM  # 20 kVCM / tonne
    q = quote_class(price, 1500, True, RESERVES, FEES)
    kvcm_cost = 30 * KVCM
    expected_cost = sol_get_amount_in(kvcm_cost, RESERVES.usdc, RESERVES.kvcm)
    assert q.cost == expected_cost
    assert 9 * USDC < q.cost < 9_100_000  # ~30 kVCM * 0.30 USDC plus 0.3 % fee and impact
    assert q.fee == sol_fee(expected_cost, 100, 10_000)
    assert q.fee == ceil_div(expected_cost, 100)  # 1 % beats the 0.01 USDC floor
    assert q.total == q.cost + q.fee


def test_quote_class_usdc_fee_floor_is_in_usdc() -> None:
    q = quote_class(KVCM, 1, True, RESERVES, FEES)  # 1 kg at 1 kVCM / t = 0.001 kVCM
    assert q.cost == sol_get_amount_in(10**15, RESERVES.usdc, RESERVES.kvcm)
    assert q.fee == 10_000  # the USDC floor unchanged


def test_quote_class_usdc_insufficient_liquidity() -> None:
    # the whole kVCM reserve cannot be bought
    price_for_reserve = RESERVES.kvcm  # one tonne costs the whole reserve
    with pytest.raises(Rejection) as exc:
        quote_class(price_for_reserve, 1000, True, RESERVES, FEES)
    assert exc.value.code == "insufficient_liquidity"
    q = quote_class(price_for_reserve - 1000, 1000, True, RESERVES, FEES)  # reserve - 1000 units
    assert q.cost > 0


def test_quote_class_kvcm_small_cost_pays_converted_floor() -> None:
    reserves = PoolReserves(usdc=3_000_000, kvcm=KVCM)  # 1 kVCM = 3 USDC
    q = quote_class(KVCM, 1, False, reserves, FEES)  # 0.001 kVCM
    assert q.cost == 10**15
    # 0.01 USDC at 3 USDC/kVCM = 0.00333... kVCM, rounded up to the atomic unit
    assert q.fee == 3_333_333_333_333_334
    assert q.fee == (10_000 * reserves.kvcm + reserves.usdc - 1) // reserves.usdc  # contract formula


def test_quote_class_kvcm_exact_floor_conversion_is_not_bumped() -> None:
    reserves = PoolReserves(usdc=1_000_000, kvcm=2 * KVCM)  # 1 USDC = 2 kVCM exactly
    q = quote_class(KVCM, 1, False, reserves, FEES)
    assert q.fee == 10_000 * 2 * 10**12  # 0.02 kVCM exactly


def test_quote_class_kvcm_proportional_beats_floor() -> None:
    q = quote_class(20 * KVCM, 10_000, False, RESERVES, FEES)  # 10 t = 200 kVCM
    assert q.cost == 200 * KVCM
    assert q.fee == 2 * KVCM  # 1 % of 200 kVCM; floor is only ~0.033 kVCM


def test_quote_class_kvcm_crossover_at_the_converted_floor() -> None:
    reserves = PoolReserves(usdc=1_000_000, kvcm=KVCM)  # 1 kVCM = 1 USDC
    floor_kvcm = 10_000 * 10**12  # 0.01 kVCM
    # 1 % of cost == floor when cost == 1 kVCM (= price 1 kVCM/t, 1000 units)
    at = quote_class(KVCM, 1000, False, reserves, FEES)
    assert (at.cost, at.fee) == (KVCM, floor_kvcm)
    over = quote_class(KVCM + 1, 1000, False, reserves, FEES)
    assert (over.cost, over.fee) == (KVCM + 1, floor_kvcm + 1)


# ---------------------------------------------------------------- slippage and gas


@pytest.mark.parametrize(
    ("total", "bps", "out"),
    [
        (10_000, 50, 10_050),  # exact
        (10_001, 50, 10_052),  # 10 051.005 rounds up
        (10_000, 0, 10_000),
        (1, 1, 2),  # 1.0001 rounds up
        (0, 500, 0),
        (200, 10_000, 400),
    ],
)
def test_with_slippage(total: int, bps: int, out: int) -> None:
    assert with_slippage(total, bps) == out


@pytest.mark.parametrize(
    ("gas", "fee", "eth", "usdc"),
    [
        (100_000, 1 * GWEI, 3000 * USDC, 300_000),  # 1e-4 ETH at 3000 USDC: exactly 0.30 USDC
        (100_000, 1 * GWEI + 1, 3000 * USDC, 300_001),  # one wei more: 300 000.0003 rounds up
        (100_000, 1 * GWEI, 3000 * USDC + 1, 300_001),  # 300 000.0001 rounds up
        (21_000, 1, 3000 * USDC, 1),  # dust rounds up to one atomic unit
        (0, GWEI, 3000 * USDC, 0),
        (1, 10**18, 1, 1),
        (1, 10**18 + 1, 1, 2),
    ],
)
def test_worst_case_gas_cost_in_usdc(gas: int, fee: int, eth: int, usdc: int) -> None:
    assert wei_in_usdc(gas * fee, eth) == usdc


def test_gas_allowance_usdc_and_kvcm() -> None:
    # raw 300 000, +20 % margin = 360 000 exactly
    assert gas_allowance(100_000, GWEI, 3000 * USDC, 2000, True, RESERVES) == 360_000
    # raw 300 001 * 1.2 = 360 001.2 rounds up
    assert gas_allowance(100_000, GWEI + 1, 3000 * USDC, 2000, True, RESERVES) == 360_002
    assert gas_allowance(100_000, GWEI, 3000 * USDC, 0, True, RESERVES) == 300_000
    # 0.36 USDC at 0.30 USDC per kVCM = 1.2 kVCM exactly
    kvcm = gas_allowance(100_000, GWEI, 3000 * USDC, 2000, False, RESERVES)
    assert kvcm == 1_200_000 * 10**12
    # 0.360002 USDC = 1.200006666... kVCM, rounded up
    kvcm_up = gas_allowance(100_000, GWEI + 1, 3000 * USDC, 2000, False, RESERVES)
    assert kvcm_up == 1_200_006_666_666_666_667


def _random_case(rng: random.Random) -> tuple[int, int, int, int, PoolReserves]:
    gas = rng.randrange(21_000, 30_000_000)
    fee = rng.choice([rng.randrange(1, 10**8), rng.randrange(10**8, 500 * GWEI)])
    eth = rng.randrange(100 * USDC, 100_000 * USDC)
    margin = rng.randrange(0, 5000)
    reserves = PoolReserves(usdc=rng.randrange(10**6, 10**15), kvcm=rng.randrange(10**15, 10**30))
    return gas, fee, eth, margin, reserves


def test_gas_allowance_covers_raw_cost() -> None:
    rng = random.Random(42)
    for _ in range(1000):
        gas, fee, eth, margin, reserves = _random_case(rng)
        raw = wei_in_usdc(gas * fee, eth)
        assert raw * 10**18 >= gas * fee * eth  # the raw cost itself never rounds down
        allowance_usdc = gas_allowance(gas, fee, eth, margin, True, reserves)
        assert allowance_usdc >= raw
        assert allowance_usdc * 10_000 >= raw * (10_000 + margin)
        allowance_kvcm = gas_allowance(gas, fee, eth, margin, False, reserves)
        # converted back at spot, the kVCM allowance is still worth at least the USDC one
        assert allowance_kvcm * reserves.usdc >= allowance_usdc * reserves.kvcm


def test_max_fee_covered_never_exceeds_allowance_usdc() -> None:
    rng = random.Random(1234)
    for _ in range(1000):
        gas, _fee, eth, _margin, reserves = _random_case(rng)
        allowance = rng.choice([0, 1, rng.randrange(1, 10**4), rng.randrange(1, 10**9)])
        cap = max_fee_covered(allowance, gas, eth, True, reserves)
        assert wei_in_usdc(gas * cap, eth) <= allowance
        # and it is the highest such fee: one wei more would overspend
        assert wei_in_usdc(gas * (cap + 1), eth) > allowance


def test_max_fee_covered_never_exceeds_allowance_kvcm() -> None:
    rng = random.Random(4321)
    for _ in range(1000):
        gas, _fee, eth, _margin, reserves = _random_case(rng)
        allowance = rng.choice([0, 1, rng.randrange(1, 10**16), rng.randrange(1, 10**22)])
        cap = max_fee_covered(allowance, gas, eth, False, reserves)
        spent_usdc = wei_in_usdc(gas * cap, eth)
        # spent USDC, priced in kVCM at spot and rounded against the executor, fits the allowance
        assert usdc_to_kvcm_spot(spent_usdc, reserves) <= allowance
        assert spent_usdc * reserves.kvcm <= allowance * reserves.usdc


def test_max_fee_covered_admits_the_fee_the_allowance_was_priced_at() -> None:
    rng = random.Random(99)
    for _ in range(1000):
        gas, fee, eth, margin, reserves = _random_case(rng)
        for pays_usdc in (True, False):
            allowance = gas_allowance(gas, fee, eth, margin, pays_usdc, reserves)
            assert max_fee_covered(allowance, gas, eth, pays_usdc, reserves) >= fee


def test_max_fee_covered_known_answer() -> None:
    # 0.30 USDC buys 100k gas at exactly 1 gwei when ETH is 3000 USDC
    assert max_fee_covered(300_000, 100_000, 3000 * USDC, True, RESERVES) == GWEI
    # 299 999 * 1e18 / 3e14 = 999 996 666.67, floored
    assert max_fee_covered(299_999, 100_000, 3000 * USDC, True, RESERVES) == 999_996_666
    assert max_fee_covered(0, 100_000, 3000 * USDC, True, RESERVES) == 0
    # 1 kVCM = 0.30 USDC at spot
    assert max_fee_covered(KVCM, 100_000, 3000 * USDC, False, RESERVES) == GWEI
    # one kVCM atomic unit less is worth 299 999.9999... USDC atomic, floored to 299 999
    assert max_fee_covered(KVCM - 1, 100_000, 3000 * USDC, False, RESERVES) == 999_996_666


# -- Base's full cost (issue 7) ------------------------------------------------------------


def test_the_allowance_covers_l1_and_operator_fees_rounded_up() -> None:
    # 100k gas at 1 gwei = 1e14 wei; plus 2e13 wei of L1 and operator fee = 1.2e14 wei.
    # At 3,000 USDC an ETH: 0.36 USDC exactly; one wei more rounds up to the next atomic unit.
    assert gas_allowance(100_000, GWEI, 3000 * USDC, 0, True, RESERVES, extra_wei=2 * 10**13) == 360_000
    assert gas_allowance(100_000, GWEI, 3000 * USDC, 0, True, RESERVES, extra_wei=2 * 10**13 + 1) == 360_001
    assert wei_in_usdc(10**18, 3000 * USDC) == 3000 * USDC
    assert wei_in_usdc(1, 3000 * USDC) == 1  # any wei costs at least one atomic unit


def test_what_an_allowance_covers_leaves_room_for_the_extra_fees() -> None:
    # 0.36 USDC is worth 1.2e14 wei; 2e13 of it goes to L1 and operator: 1e14 / 100k gas.
    assert max_fee_covered(360_000, 100_000, 3000 * USDC, True, RESERVES, extra_wei=2 * 10**13) == GWEI
    assert (
        max_fee_covered(360_000, 100_000, 3000 * USDC, True, RESERVES, extra_wei=2 * 10**13 + 1) == GWEI - 1
    )
    assert (
        max_fee_covered(360_000, 100_000, 3000 * USDC, True, RESERVES, extra_wei=10**15) == 0
    )  # never negative
    assert allowance_in_wei(360_000, 3000 * USDC, True, RESERVES) == 12 * 10**13
    assert allowance_in_wei(KVCM, 3000 * USDC, False, RESERVES) == 10**14  # 1 kVCM = 0.30 USDC


def test_an_allowance_priced_with_extra_fees_covers_them_at_the_same_prices() -> None:
    rng = random.Random(7)
    for _ in range(500):
        gas, fee = rng.randint(21_000, 2_000_000), rng.randint(1, 500 * GWEI)
        extra, eth = rng.randint(0, 10**16), rng.randint(100 * USDC, 20_000 * USDC)
        for pays_usdc in (True, False):
            allowance = gas_allowance(gas, fee, eth, rng.randint(0, 5000), pays_usdc, RESERVES, extra)
            assert max_fee_covered(allowance, gas, eth, pays_usdc, RESERVES, extra) >= fee


def test_unsigned_tx_size_bounds_a_real_encoding() -> None:
    """The largest field values an EIP-1559 transaction of ours can carry, RLP-encoded."""
    import rlp  # eth-account's own dependency

    for size in (0, 55, 56, 1_092, 2_756, 65_535):
        fields = [
            2**32 - 1,
            2**64 - 1,
            2**256 - 1,
            2**256 - 1,
            2**64 - 1,
            b"\xff" * 20,
            0,
            b"\xff" * size,
            [],
        ]
        encoded = b"\x02" + rlp.encode(fields)
        assert len(encoded) <= unsigned_tx_size(size) == size + UNSIGNED_TX_OVERHEAD


def test_the_feed_price_is_used_while_fresh_and_the_bound_otherwise() -> None:
    now, bound = 1_700_000_000, 5000 * USDC
    # 3,000.00000001 USD (8 decimals) rounds up to the next USDC atomic unit.
    assert eth_price_from_feed(300_000_000_001, 8, now - 60, now, 3600, bound) == (3000 * USDC + 1, True)
    assert eth_price_from_feed(3000 * 10**8, 8, now - 3600, now, 3600, bound) == (3000 * USDC, True)
    assert eth_price_from_feed(3000 * 10**8, 8, now - 3601, now, 3600, bound) == (bound, False)  # stale
    skew = 3000 * USDC, True
    assert eth_price_from_feed(3000 * 10**8, 8, now + 60, now, 3600, bound) == skew  # clock skew
    future = eth_price_from_feed(3000 * 10**8, 8, now + 61, now, 3600, bound)
    assert future == (bound, False)
    assert eth_price_from_feed(0, 8, now, now, 3600, bound) == (bound, False)
    assert eth_price_from_feed(-1, 8, now, now, 3600, bound) == (bound, False)
    assert eth_price_from_feed(3000 * 10**18, 18, now, now, 3600, bound) == (3000 * USDC, True)


# -- the tip a quote prices and the executor sends (issue 35, finding 7) ---------------------


@pytest.mark.parametrize(
    ("recent", "base", "floor", "bps", "ceiling", "expected"),
    [
        (5, 10_000_000, 1_000_000, 10_000, 10**8, 1_000_000),  # a quiet market: the floor
        (3_000_000, 10_000_000, 1_000_000, 10_000, 10**8, 3_000_000),  # the market within bounds
        (10**9, 10_000_000, 1_000_000, 10_000, 10**8, 10_000_000),  # 1 gwei tips: the base fee caps it
        (10**9, 10**9, 1_000_000, 10_000, 10**8, 10**8),  # a high base fee: the operator's ceiling
        (10**9, 10, 1_000_000, 10_000, 10**8, 1_000_000),  # a tiny base fee never caps below the floor
        (10**9, 10_000_001, 0, 5_000, 10**8, 5_000_000),  # half the base fee, rounded down
        (10**9, 10**9, 10**8 + 1, 10_000, 10**8, 10**8),  # the ceiling wins over the floor
    ],
)
def test_the_tip_is_the_market_within_the_floor_the_base_fee_and_the_ceiling(
    recent: int, base: int, floor: int, bps: int, ceiling: int, expected: int
) -> None:
    assert bounded_tip(recent, base, floor, bps, ceiling) == expected
