"""Fee, price and gas-allowance math, mirroring RetirementSettlement._quote on-chain to the
atomic unit. Spec: x402-retirement-endpoint.md, Limits 5-7.

Rounding rules (each tested at its edge):
- class cost in kVCM = ceil(priceKvcmPerTonne * units / 1000)       (seller's favour)
- listing cost in USDC = ceil(unitPrice * units / 1000)               (seller's favour)
- pool input for an exact output = floor(rIn*out*10000 / ((rOut-out)*9970)) + 1 (Uniswap V2)
- fee = max(floor, ceil(cost * bps / 10000)); kVCM floor = ceil(floorUsdc * rKvcm / rUsdc)
- gas allowance = ceil((gasLimit * maxFeePerGas + L1 data fee + operator fee) * ethPriceUsdc / 1e18)
  (+ margin, rounded up); what an allowance covers is rounded down
- ETH price from the feed = ceil(answer * 1e6 / 10**decimals) USDC atomic units
- suggested max input = ceil(total * (10000 + slippageBps) / 10000) for a class, exact for a listing
- a replacement's fee = max(ceil(old * 1.1), old + 1): the +10 % most nodes require to replace
  a pending transaction at the same nonce (OpenZeppelin relayer, Alto)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from relayer.domain.amounts import UNITS_PER_TONNE
from relayer.domain.errors import Rejection

BPS: Final = 10_000
POOL_FEE_BPS: Final = 30
WEI_PER_ETH: Final = 10**18


def ceil_div(a: int, b: int) -> int:
    """Ceiling of a / b for a >= 0, b > 0."""
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class FeeSchedule:
    """Protocol fee parameters as read from the settlement contract (USDC atomic floors)."""

    class_fee_bps: int
    class_fee_floor_usdc: int
    listing_fee_bps: int
    listing_fee_floor_usdc: int


@dataclass(frozen=True, slots=True)
class GasPrice:
    """EIP-1559 fees (wei per gas) a new transaction would be sent with now."""

    max_fee_per_gas: int
    max_priority_fee_per_gas: int


@dataclass(frozen=True, slots=True)
class PoolReserves:
    """USDC/kVCM pool reserves in atomic units."""

    usdc: int
    kvcm: int


@dataclass(frozen=True, slots=True)
class Quote:
    """A priced retirement in input-token atomic units; ``total = cost + fee``."""

    cost: int
    fee: int

    @property
    def total(self) -> int:
        return self.cost + self.fee


def protocol_fee(cost: int, bps: int, floor: int) -> int:
    """max(floor, ceil(cost * bps / 10000)), atomic units of the input token."""
    return max(floor, ceil_div(cost * bps, BPS))


def class_cost_kvcm(price_kvcm_per_tonne: int, units: int) -> int:
    """kVCM atomic units for ``units`` credit units at a class price, rounded up."""
    return ceil_div(price_kvcm_per_tonne * units, UNITS_PER_TONNE)


def listing_cost_usdc(unit_price_usdc_per_tonne: int, units: int) -> int:
    """USDC atomic units for ``units`` credit units of a listing, rounded up."""
    return ceil_div(unit_price_usdc_per_tonne * units, UNITS_PER_TONNE)


def pool_amount_in(amount_out: int, reserve_in: int, reserve_out: int) -> int:
    """Input needed for an exact ``amount_out`` from the constant-product pool.

    Raises:
        Rejection: ``insufficient_liquidity`` when the pool cannot pay ``amount_out``.
    """
    if amount_out >= reserve_out:
        raise Rejection("insufficient_liquidity", "the USDC/kVCM pool cannot fill this amount")
    return (reserve_in * amount_out * BPS) // ((reserve_out - amount_out) * (BPS - POOL_FEE_BPS)) + 1


def usdc_to_kvcm_spot(usdc: int, reserves: PoolReserves) -> int:
    """USDC atomic units as kVCM atomic units at the pool's spot price, rounded up."""
    return ceil_div(usdc * reserves.kvcm, reserves.usdc)


def quote_class(
    price_kvcm_per_tonne: int, units: int, pays_usdc: bool, reserves: PoolReserves, fees: FeeSchedule
) -> Quote:
    """Cost and fee of a carbon-class retirement in the input token (USDC or kVCM)."""
    kvcm_cost = class_cost_kvcm(price_kvcm_per_tonne, units)
    if pays_usdc:
        cost = pool_amount_in(kvcm_cost, reserves.usdc, reserves.kvcm)
        return Quote(cost, protocol_fee(cost, fees.class_fee_bps, fees.class_fee_floor_usdc))
    floor = usdc_to_kvcm_spot(fees.class_fee_floor_usdc, reserves)
    return Quote(kvcm_cost, protocol_fee(kvcm_cost, fees.class_fee_bps, floor))


def quote_listing(unit_price_usdc_per_tonne: int, units: int, fees: FeeSchedule) -> Quote:
    """Cost and fee of a listing fill in USDC (5 % with a 0.05 USDC minimum by default)."""
    cost = listing_cost_usdc(unit_price_usdc_per_tonne, units)
    return Quote(cost, protocol_fee(cost, fees.listing_fee_bps, fees.listing_fee_floor_usdc))


def with_slippage(total: int, slippage_bps: int) -> int:
    """Suggested maximum input: ceil(total * (1 + slippage)), atomic units."""
    return ceil_div(total * (BPS + slippage_bps), BPS)


def wei_in_usdc(wei: int, eth_price_usdc: int) -> int:
    """``wei`` in USDC atomic units at ``eth_price_usdc``, rounded up (against the payer)."""
    return ceil_div(wei * eth_price_usdc, WEI_PER_ETH)


def gas_allowance(
    gas_limit: int,
    max_fee_per_gas_wei: int,
    eth_price_usdc: int,
    margin_bps: int,
    pays_usdc: bool,
    reserves: PoolReserves,
    extra_wei: int = 0,
) -> int:
    """Gas allowance to ask the payer to sign, in input-token atomic units (with margin):
    ``gas_limit * maxFeePerGas`` plus ``extra_wei`` (Base's L1 data fee and operator fee)."""
    wei = gas_limit * max_fee_per_gas_wei + extra_wei
    usdc = with_slippage(wei_in_usdc(wei, eth_price_usdc), margin_bps)
    return usdc if pays_usdc else usdc_to_kvcm_spot(usdc, reserves)


def max_fee_covered(
    allowance: int,
    gas_limit: int,
    eth_price_usdc: int,
    pays_usdc: bool,
    reserves: PoolReserves,
    extra_wei: int = 0,
) -> int:
    """The highest maxFeePerGas (wei) at which ``gas_limit`` gas, plus ``extra_wei`` that the
    transaction also costs (L1 data fee, operator fee), stays within ``allowance``; 0 when
    the extra alone exceeds it.

    The executor caps its transaction's maxFeePerGas at this value, so it can never pay
    more than the signed allowance covers (converted at the ETH price and, for kVCM, the
    pool's spot price, both rounded against the executor).
    """
    return max(0, allowance_in_wei(allowance, eth_price_usdc, pays_usdc, reserves) - extra_wei) // gas_limit


UNSIGNED_TX_OVERHEAD: Final = 120
"""A bound on the bytes of an unsigned EIP-1559 transaction's RLP encoding besides its call
data: type (1), list header (3), chain id (5), nonce (9), tip and fee cap (33 each), gas (9),
to (21), value (1), call data header (3), access list (1); 118, rounded up."""


def unsigned_tx_size(call_data_bytes: int) -> int:
    """An upper bound on the unsigned size (bytes) of a transaction carrying that much call
    data: what Base's ``getL1FeeUpperBound`` takes."""
    return call_data_bytes + UNSIGNED_TX_OVERHEAD


FEED_CLOCK_SKEW_S: Final = 60
"""How far ahead of this machine's clock a feed's update time may be (the chain's clock)."""


def eth_price_from_feed(
    answer: int, decimals: int, updated_at: int, now: int, max_age_s: int, bound_usdc: int
) -> tuple[int, bool]:
    """The price of one ETH in USDC atomic units from a Chainlink-style ETH/USD answer
    (``decimals`` places; USDC taken at par with USD), rounded up (gas priced higher is
    against the payer, never the executor); or ``bound_usdc``, the configured bound, when
    the answer is not positive, older than ``max_age_s`` seconds at ``now`` or more than
    :data:`FEED_CLOCK_SKEW_S` in the future. Returns (price, whether the feed gave it)."""
    if answer <= 0 or updated_at > now + FEED_CLOCK_SKEW_S or now - updated_at > max_age_s:
        return bound_usdc, False
    return ceil_div(answer * 10**6, 10**decimals), True


def allowance_in_wei(allowance: int, eth_price_usdc: int, pays_usdc: bool, reserves: PoolReserves) -> int:
    """What a signed gas allowance (input-token atomic units) is worth in wei: kVCM through
    the pool's spot price, then USDC at ``eth_price_usdc`` (the USDC atomic price of one
    ETH); each step rounded down, against the executor. The solvency ledger's "received"."""
    usdc = allowance if pays_usdc else (allowance * reserves.usdc) // reserves.kvcm
    return (usdc * WEI_PER_ETH) // eth_price_usdc


def bounded_tip(recent_tip: int, next_base_fee: int, floor: int, base_fee_bps: int, ceiling: int) -> int:
    """The tip (wei per gas) a quote prices and the executor sends with: the recent market tip
    (the median over :data:`relayer.chain.executor.FEE_HISTORY_BLOCKS` blocks of each block's
    median tip), at least ``floor``, at most ``base_fee_bps`` of the next block's base fee
    (rounded down; never below ``floor``) and at most the operator's ``ceiling`` (which wins
    over ``floor``). A few senders paying large tips for a few blocks cannot raise what our
    payers are asked to authorize (issue 35)."""
    relative = max(floor, (next_base_fee * base_fee_bps) // BPS)
    return min(max(floor, min(recent_tip, relative)), ceiling)


REPLACEMENT_BUMP_BPS: Final = 1_000


def bumped(fee: int) -> int:
    """The least fee (wei per gas) a same-nonce replacement may offer over ``fee``:
    max(ceil(fee * 1.1), fee + 1)."""
    return max(ceil_div(fee * (BPS + REPLACEMENT_BUMP_BPS), BPS), fee + 1)


def replacement_fees(
    old_max_fee: int, old_tip: int, market_max_fee: int, market_tip: int, ceiling: int
) -> tuple[int, int] | None:
    """Fees (max fee, tip; wei per gas) for a same-nonce replacement: at least the bump over
    the old ones, at least the market's, never above ``ceiling`` (what the job's signed gas
    allowance covers). None when the ceiling does not leave room for the bump."""
    least = bumped(old_max_fee)
    if least > ceiling:
        return None
    max_fee = min(max(least, market_max_fee), ceiling)
    return max_fee, min(max(bumped(old_tip), market_tip), max_fee)
