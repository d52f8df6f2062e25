"""Gas for the executor, priced in the payer's token: the allowance prepare-auth asks the
payer to sign, and the send-time check that a simulated job's signed allowance covers
``gasLimit * maxFeePerGas`` (spec: Limits 7; gas_estimate_unavailable,
gas_limit_exceeds_cap, insufficient_authorized_value). The executor never pays gas the
signed value does not cover: maxFeePerGas is capped at what the allowance covers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from relayer.chain.executor import ExecutorChain
from relayer.chain.reads import ChainReads
from relayer.config import Settings
from relayer.domain import fees
from relayer.domain.errors import Rejection
from relayer.service.catalog import Route


@dataclass(frozen=True, slots=True)
class GasPrice:
    """EIP-1559 fees (wei per gas) the executor would send with now."""

    max_fee_per_gas: int
    max_priority_fee_per_gas: int


@dataclass(frozen=True, slots=True)
class GasPlan:
    """How a simulated job will be sent: gas limit and fees (wei per gas) within its allowance."""

    gas_limit: int
    max_fee_per_gas: int
    max_priority_fee_per_gas: int
    allowance_wei: int  # what the signed allowance is worth, wei (rounded down)


class GasPricer:
    """Prices executor gas in USDC or kVCM atomic units."""

    def __init__(self, executor: ExecutorChain, reads: ChainReads, settings: Settings) -> None:
        self.executor = executor
        self.reads = reads
        self.settings = settings

    async def price(self) -> GasPrice:
        """EIP-1559 fees to send with now: ``base_fee_multiplier`` times the next block's base
        fee, plus a tip of at least ``priority_fee_wei`` and the recent median (``eth_feeHistory``).

        Raises:
            Unavailable: the chain node failed (gas_estimate_unavailable).
        """
        market = await self.executor.fee_market()
        tip = max(self.settings.priority_fee_wei, market.recent_tip)
        return GasPrice(market.next_base_fee * self.settings.base_fee_multiplier + tip, tip)

    def budget(self, route: Route) -> int:
        """Gas priced into the allowance of a class or a listing retirement."""
        return self.settings.gas_budget_class if route.carbon_class else self.settings.gas_budget_listing

    async def allowance(self, route: Route) -> int:
        """The gas allowance to ask the payer to sign for ``route``, in its token's atomic
        units: the budget at today's price, with the configured margin.

        Raises:
            Unavailable: the chain node failed (gas_estimate_unavailable).
        """
        price, reserves = await asyncio.gather(self.price(), self.reads.reserves())
        return fees.gas_allowance(
            self.budget(route),
            price.max_fee_per_gas,
            self.settings.eth_price_usdc,
            self.settings.gas_allowance_margin_bps,
            route.token.key == "usdc",
            reserves,
        )

    async def plan(self, estimate: int, allowance: int, pays_usdc: bool, total: int) -> GasPlan:
        """Check a simulated job's gas against the cap and its signed allowance, and choose
        fees the allowance covers.

        Args:
            estimate: gas of the simulation.
            allowance: the signed gas allowance, input-token atomic units.
            pays_usdc: the input token is USDC (else kVCM, converted at the pool's spot).
            total: the quote total, for ``requiredMinimum``.

        Raises:
            Rejection: gas_limit_exceeds_cap; insufficient_authorized_value when the
                allowance no longer covers gas at today's price.
            Unavailable: the chain node failed.
        """
        cap = self.settings.gas_cap
        if estimate > cap:
            raise Rejection("gas_limit_exceeds_cap", gasEstimate=estimate, gasCap=cap)
        gas_limit = min(fees.ceil_div(estimate * (10_000 + self.settings.gas_limit_margin_bps), 10_000), cap)
        price, reserves = await asyncio.gather(self.price(), self.reads.reserves())
        needed = fees.gas_cost_in_usdc(gas_limit, price.max_fee_per_gas, self.settings.eth_price_usdc)
        if not pays_usdc:
            needed = fees.usdc_to_kvcm_spot(needed, reserves)
        if allowance < needed:
            raise Rejection(
                "insufficient_authorized_value",
                "the signed gas allowance no longer covers gas",
                requiredMinimum=str(total + needed),
                requiredGasAllowance=str(needed),
                gasAllowance=str(allowance),
            )
        worth = fees.allowance_in_wei(allowance, self.settings.eth_price_usdc, pays_usdc, reserves)
        max_fee = min(price.max_fee_per_gas, worth // gas_limit)
        return GasPlan(gas_limit, max_fee, min(price.max_priority_fee_per_gas, max_fee), worth)

    async def ceiling(self, allowance: int, gas_limit: int, pays_usdc: bool) -> int:
        """The highest max fee per gas (wei) at which ``gas_limit`` gas stays within the
        signed ``allowance`` (input-token atomic units): no fee bump may go above it.

        Raises:
            Unavailable: the chain node failed (kVCM needs the pool's reserves).
        """
        reserves = await self.reads.reserves() if not pays_usdc else fees.PoolReserves(1, 1)
        return fees.max_fee_covered(allowance, gas_limit, self.settings.eth_price_usdc, pays_usdc, reserves)

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
