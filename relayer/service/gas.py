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


class GasPricer:
    """Prices executor gas in USDC or kVCM atomic units."""

    def __init__(self, executor: ExecutorChain, reads: ChainReads, settings: Settings) -> None:
        self.executor = executor
        self.reads = reads
        self.settings = settings

    async def price(self) -> GasPrice:
        """Current EIP-1559 fees: ``base_fee_multiplier * baseFee + tip``.

        Raises:
            Unavailable: the chain node failed (gas_estimate_unavailable).
        """
        tip = self.settings.priority_fee_wei
        return GasPrice(await self.executor.base_fee() * self.settings.base_fee_multiplier + tip, tip)

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
        covered = fees.max_fee_covered(
            allowance, gas_limit, self.settings.eth_price_usdc, pays_usdc, reserves
        )
        max_fee = min(price.max_fee_per_gas, covered)
        return GasPlan(gas_limit, max_fee, min(price.max_priority_fee_per_gas, max_fee))
