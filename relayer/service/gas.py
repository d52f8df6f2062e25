"""Gas for the executor, priced in the payer's token: the allowance prepare-auth asks the
payer to sign, and the send-time check that a simulated job's signed allowance covers the
whole cost of a Base transaction: ``gasLimit * maxFeePerGas``, the L1 data fee (the
GasPriceOracle's upper bound for the transaction's size) and the operator fee (on the gas
limit), converted at the ETH/USD feed's price (the configured bound when the feed is stale)
(spec: Limits 7; gas_estimate_unavailable, gas_limit_exceeds_cap,
insufficient_authorized_value). The executor never pays what the signed value does not
cover: maxFeePerGas is capped at what the allowance covers beside the other two fees."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from relayer.chain.costs import BaseCosts
from relayer.chain.executor import ExecutorChain
from relayer.chain.reads import ChainReads
from relayer.config import Settings
from relayer.domain import fees
from relayer.domain.errors import Rejection
from relayer.domain.fees import GasPrice
from relayer.service.supply import Route

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EthPrice:
    """One ETH in USDC atomic units, and whether the on-chain feed gave it (else the
    configured bound, the feed being absent or stale)."""

    usdc: int
    from_feed: bool


@dataclass(frozen=True, slots=True)
class Allowance:
    """The gas allowance to sign (input-token atomic units) and its parts, which sum to it:
    L2 execution at the gas budget, the L1 data fee and the operator fee of the transaction,
    and the margin; ``eth_price`` converted them."""

    amount: int
    l2_execution: int
    l1_data_fee: int
    operator_fee: int
    margin: int
    eth_price: EthPrice

    def parts(self) -> dict[str, Any]:
        """The parts as the API shows them (atomic-unit strings)."""
        return {
            "l2Execution": str(self.l2_execution),
            "l1DataFee": str(self.l1_data_fee),
            "operatorFee": str(self.operator_fee),
            "margin": str(self.margin),
            "ethPriceUsdc": str(self.eth_price.usdc),
            "ethPriceSource": "feed" if self.eth_price.from_feed else "bound",
        }


@dataclass(frozen=True, slots=True)
class GasPlan:
    """How a simulated job will be sent: gas limit and fees (wei per gas) within its allowance."""

    gas_limit: int
    max_fee_per_gas: int
    max_priority_fee_per_gas: int
    allowance_wei: int  # what the signed allowance is worth, wei (rounded down)


class GasPricer:
    """Prices a Base transaction's full cost (L2 execution, L1 data fee, operator fee) in
    USDC or kVCM atomic units."""

    def __init__(
        self, executor: ExecutorChain, reads: ChainReads, costs: BaseCosts, settings: Settings
    ) -> None:
        self.executor = executor
        self.reads = reads
        self.costs = costs
        self.settings = settings

    async def price(self) -> GasPrice:
        """EIP-1559 fees to send with now, and to price allowances at: ``base_fee_multiplier``
        times the next block's base fee, plus the recent median tip (``eth_feeHistory``)
        bounded by :func:`relayer.domain.fees.bounded_tip` (at least ``priority_fee_wei``, at
        most ``priority_fee_max_base_fee_bps`` of the base fee and ``priority_fee_max_wei``).
        The quote and the executor's transaction take the same tip from here.

        Raises:
            Unavailable: the chain node failed (gas_estimate_unavailable).
        """
        market = await self.executor.fee_market()
        s = self.settings
        tip = fees.bounded_tip(
            market.recent_tip,
            market.next_base_fee,
            s.priority_fee_wei,
            s.priority_fee_max_base_fee_bps,
            s.priority_fee_max_wei,
        )
        return GasPrice(market.next_base_fee * self.settings.base_fee_multiplier + tip, tip)

    async def eth_price(self) -> EthPrice:
        """One ETH in USDC atomic units: the ETH/USD feed's answer when it is fresh (at most
        ``price_feed_max_age_s`` old), else the configured bound ``eth_price_usdc``.

        Raises:
            Unavailable: the chain node failed.
        """
        answer = await self.costs.eth_usd()
        bound = self.settings.eth_price_usdc
        if answer is None:
            return EthPrice(bound, False)
        usdc, fresh = fees.eth_price_from_feed(
            answer.answer,
            answer.decimals,
            answer.updated_at,
            int(time.time()),
            self.settings.price_feed_max_age_s,
            bound,
        )
        if not fresh:
            log.warning("ETH/USD feed stale or invalid: pricing gas at the configured bound")
        return EthPrice(usdc, fresh)

    async def extra_wei(self, call_data_bytes: int, gas_limit: int) -> tuple[int, int]:
        """(L1 data fee upper bound times ``l1_fee_headroom_bps``, operator fee) in wei of a
        transaction with that much call data and that gas limit (0, 0 on a chain without the
        oracle).

        Raises:
            Unavailable: the chain node failed.
        """
        size = fees.unsigned_tx_size(call_data_bytes)
        if self.costs.fresh(size):  # the L1 fee cached: the operator fee is the one read that may wait
            l1, operator = await self.costs.l1_fee(size), await self.costs.operator_fee(gas_limit)
        else:
            l1, operator = await asyncio.gather(self.costs.l1_fee(size), self.costs.operator_fee(gas_limit))
        # The L1 fee is charged at the L1 prices of the block that includes the transaction,
        # whatever its fee cap: price it with headroom for their moves until then.
        return fees.ceil_div(l1 * self.settings.l1_fee_headroom_bps, fees.BPS), operator

    async def _reads_at_head(
        self, call_data_bytes: int, gas_limit: int
    ) -> tuple[GasPrice, fees.PoolReserves, EthPrice, tuple[int, int]]:
        """:meth:`price`, the pool's reserves, :meth:`eth_price` and :meth:`extra_wei`: one
        after the other when the per-head reads among them are cached and current (each
        returns at once, so a task each for ``asyncio.gather`` would be all they cost: about
        35 us for four here), else together.

        Raises:
            Unavailable: the chain node failed.
        """
        if (
            self.executor.fee_market_fresh()
            and self.reads.reserves_fresh()
            and self.costs.fresh(fees.unsigned_tx_size(call_data_bytes))
        ):
            return (
                await self.price(),
                await self.reads.reserves(),
                await self.eth_price(),
                await self.extra_wei(call_data_bytes, gas_limit),
            )
        return await asyncio.gather(
            self.price(), self.reads.reserves(), self.eth_price(), self.extra_wei(call_data_bytes, gas_limit)
        )

    async def warm(self, call_data_sizes: Iterable[int]) -> None:
        """Read what :meth:`plan` reads at the head (fees, pool reserves, the ETH price, the L1
        data fee of each call data size), so that plans made next find it cached or on its
        way: the relay reads it beside a batch's simulation rather than after it. A failure
        is left for the plan to meet (and raise)."""
        sizes = {fees.unsigned_tx_size(n) for n in call_data_sizes}
        await asyncio.gather(
            self.price(),
            self.reads.reserves(),
            self.eth_price(),
            *(self.costs.l1_fee(size) for size in sizes),
            return_exceptions=True,
        )

    def budget(self, route: Route) -> int:
        """Gas priced into the allowance of a class or a listing retirement."""
        return self.settings.gas_budget_class if route.carbon_class else self.settings.gas_budget_listing

    async def allowance(self, route: Route, call_data_bytes: int) -> Allowance:
        """The gas allowance to ask the payer to sign for ``route``, in its token's atomic
        units: the budget at today's fees, plus the L1 data fee of a transaction carrying
        ``call_data_bytes`` of call data (it grows with the caller's ``details``) and the
        operator fee, with the configured margin.

        Raises:
            Unavailable: the chain node failed (gas_estimate_unavailable).
        """
        budget = self.budget(route)
        price, reserves, eth, (l1, operator) = await self._reads_at_head(call_data_bytes, budget)
        pays_usdc = route.token.key == "usdc"
        amount = fees.gas_allowance(
            budget,
            price.max_fee_per_gas,
            eth.usdc,
            self.settings.gas_allowance_margin_bps,
            pays_usdc,
            reserves,
            l1 + operator,
        )

        def token(wei: int) -> int:
            usdc = fees.wei_in_usdc(wei, eth.usdc)
            return usdc if pays_usdc else fees.usdc_to_kvcm_spot(usdc, reserves)

        l2_part, l1_part, op_part = token(budget * price.max_fee_per_gas), token(l1), token(operator)
        return Allowance(amount, l2_part, l1_part, op_part, amount - l2_part - l1_part - op_part, eth)

    async def plan(
        self, estimate: int, allowance: int, pays_usdc: bool, total: int, call_data_bytes: int
    ) -> GasPlan:
        """Check a simulated job's gas against the cap and its signed allowance, and choose
        fees the allowance covers beside the transaction's L1 data fee and operator fee.

        Args:
            estimate: gas of the simulation.
            allowance: the signed gas allowance, input-token atomic units.
            pays_usdc: the input token is USDC (else kVCM, converted at the pool's spot).
            total: the quote total, for ``requiredMinimum``.
            call_data_bytes: the length of the job's call data.

        Raises:
            Rejection: gas_limit_exceeds_cap; insufficient_authorized_value when the
                allowance no longer covers the transaction's full cost at today's prices.
            Unavailable: the chain node failed.
        """
        cap = self.settings.gas_cap
        if estimate > cap:
            raise Rejection("gas_limit_exceeds_cap", gasEstimate=estimate, gasCap=cap)
        gas_limit = min(fees.ceil_div(estimate * (10_000 + self.settings.gas_limit_margin_bps), 10_000), cap)
        price, reserves, eth, (l1, operator) = await self._reads_at_head(call_data_bytes, gas_limit)
        needed_wei = gas_limit * price.max_fee_per_gas + l1 + operator
        worth = fees.allowance_in_wei(allowance, eth.usdc, pays_usdc, reserves)
        if worth < needed_wei:
            needed = fees.wei_in_usdc(needed_wei, eth.usdc)
            if not pays_usdc:
                needed = fees.usdc_to_kvcm_spot(needed, reserves)
            raise Rejection(
                "insufficient_authorized_value",
                "the signed gas allowance no longer covers the transaction's cost",
                requiredMinimum=str(total + needed),
                requiredGasAllowance=str(needed),
                gasAllowance=str(allowance),
            )
        max_fee = min(price.max_fee_per_gas, (worth - l1 - operator) // gas_limit)
        return GasPlan(gas_limit, max_fee, min(price.max_priority_fee_per_gas, max_fee), worth)

    def sponsored_ceiling(self) -> int:
        """The highest max fee per gas (wei) of a sponsored transfer (no signed allowance pays
        its gas): ``facilitator_max_fee_per_gas_wei``. No fee bump may go above it."""
        return self.settings.facilitator_max_fee_per_gas_wei

    def sponsored_gas_limit(self, estimate: int) -> int:
        """The gas limit a sponsored transfer is sent with for a simulation's ``estimate``:
        the plan's margin on it, at most the gas cap.

        Raises:
            Rejection: gas_limit_exceeds_cap.
        """
        cap = self.settings.gas_cap
        if estimate > cap:
            raise Rejection("gas_limit_exceeds_cap", gasEstimate=estimate, gasCap=cap)
        return min(fees.ceil_div(estimate * (10_000 + self.settings.gas_limit_margin_bps), 10_000), cap)

    async def plan_sponsored(self, estimate: int, ceiling: int | None = None) -> GasPlan:
        """Gas and fees (wei per gas) of a sponsored transfer, whose gas the executor pays with
        no signed allowance: the gas cap and the plan's margin as :meth:`plan`, today's fees
        capped at ``ceiling`` (default :meth:`sponsored_ceiling`); ``allowance_wei`` is 0.

        Raises:
            Rejection: gas_limit_exceeds_cap; payment_unavailable (503, retryable) when the
                next block's base fee is above the ceiling (the transaction could not be mined).
            Unavailable: the chain node failed (gas_estimate_unavailable).
        """
        ceiling = self.sponsored_ceiling() if ceiling is None else ceiling
        gas_limit = self.sponsored_gas_limit(estimate)
        market = await self.executor.fee_market()
        if market.next_base_fee > ceiling:
            raise Rejection(
                "payment_unavailable",
                "the network's fees are above the sponsored fee ceiling; retry later",
                baseFeePerGas=str(market.next_base_fee),
                maxFeePerGas=str(ceiling),
            )
        price = await self.price()
        max_fee = min(price.max_fee_per_gas, ceiling)
        return GasPlan(gas_limit, max_fee, min(price.max_priority_fee_per_gas, max_fee), 0)

    async def ceiling(self, allowance: int, gas_limit: int, pays_usdc: bool, call_data_bytes: int) -> int:
        """The highest max fee per gas (wei) at which ``gas_limit`` gas, with the
        transaction's L1 data fee and operator fee, stays within the signed ``allowance``
        (input-token atomic units): no fee bump may go above it.

        Raises:
            Unavailable: the chain node failed (kVCM needs the pool's reserves).
        """
        reserves = await self.reads.reserves() if not pays_usdc else fees.PoolReserves(1, 1)
        if self.costs.fresh(fees.unsigned_tx_size(call_data_bytes)):  # one after the other: no task each
            eth, (l1, operator) = await self.eth_price(), await self.extra_wei(call_data_bytes, gas_limit)
        else:
            eth, (l1, operator) = await asyncio.gather(
                self.eth_price(), self.extra_wei(call_data_bytes, gas_limit)
            )
        return fees.max_fee_covered(allowance, gas_limit, eth.usdc, pays_usdc, reserves, l1 + operator)

    async def replacement(self, old_max_fee: int, old_tip: int, ceiling: int) -> GasPrice | None:
        """Fees for a same-nonce replacement of a transaction sent at ``old_max_fee`` and
        ``old_tip``: the +10 % bump, the market's if higher, never above ``ceiling``; None
        when the ceiling leaves no room.

        Raises:
            Unavailable: the chain node failed.
        """
        market = await self.price()
        fees_ = fees.replacement_fees(
            old_max_fee, old_tip, market.max_fee_per_gas, market.max_priority_fee_per_gas, ceiling
        )
        return None if fees_ is None else GasPrice(*fees_)
