"""What a transaction costs on Base beyond its L2 gas, and what ETH is worth, read from the
chain: the OP-stack GasPriceOracle predeploy (the L1 data fee upper bound for a transaction
size, Fjord; the operator fee for a gas amount, Isthmus) and a Chainlink-style ETH/USD
aggregator. Where the chain has no oracle (no code at the predeploy) both fees are 0; a chain
before Isthmus has no operator fee (its oracle reverts on it): 0. Reads are cached per head."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Final

from relayer.chain import codec
from relayer.chain.errors import ChainRevert, rpc
from relayer.chain.node import ChainNode, address

GAS_PRICE_ORACLE: Final = "0x420000000000000000000000000000000000000F"

_L1_FEE_UPPER_BOUND: Final = codec.function("GasPriceOracleDev", "getL1FeeUpperBound")
_OPERATOR_FEE: Final = codec.function("GasPriceOracleDev", "getOperatorFee")
_LATEST_ROUND: Final = codec.function("EthUsdFeedDev", "latestRoundData")
_DECIMALS: Final = codec.function("EthUsdFeedDev", "decimals")

OPERATOR_FEE_GAS_STEP: Final = 16_384
"""The operator fee is read at the gas limit rounded up to a multiple of this many gas: an
upper bound of the gas limit's own fee (it grows with gas under Isthmus's formula,
``gas * operatorFeeScalar / 1e6 + operatorFeeConstant``, and Jovian's, ``gas *
operatorFeeScalar * 100 + operatorFeeConstant``), by at most the fee of 16,383 gas (under 6 %
of the fee at 300,000 gas; Base charges none today). The jobs of a block then share a few
such reads, read ahead with the head's other reads, where each gas limit (nearly every job's
is its own) cost a read of its own, waited for by its plan (issue 20)."""


def operator_fee_gas(gas: int) -> int:
    """``gas`` rounded up to a multiple of :data:`OPERATOR_FEE_GAS_STEP` (gas)."""
    return -(-gas // OPERATOR_FEE_GAS_STEP) * OPERATOR_FEE_GAS_STEP


@dataclass(frozen=True, slots=True)
class FeedAnswer:
    """A Chainlink-style answer: ``answer`` with ``decimals`` places, updated at unix s."""

    answer: int
    decimals: int
    updated_at: int


class BaseCosts:
    """Reads of the L1 data fee, the operator fee and the ETH/USD feed.

    Every method raises ``ChainUnavailable`` when the node fails.
    """

    def __init__(self, node: ChainNode, eth_usd_feed: str | None) -> None:
        self.node = node
        self.eth_usd_feed = eth_usd_feed
        self._has_oracle: bool | None = None
        self._feed_decimals: int | None = None
        self._first_read = asyncio.Lock()

    async def has_oracle(self) -> bool:
        """Whether the chain has code at the GasPriceOracle predeploy (read once: concurrent
        first callers share the one read)."""
        if self._has_oracle is None:
            async with self._first_read:
                if self._has_oracle is None:
                    code = await rpc(self.node.w3.eth.get_code(address(GAS_PRICE_ORACLE)))
                    self._has_oracle = len(bytes(code)) > 0
        return self._has_oracle

    def fresh(self, unsigned_tx_size: int) -> bool:
        """Whether the L1 data fee of that unsigned size and the ETH/USD answer are known and
        current (see :meth:`ChainNode.fresh`): awaiting :meth:`l1_fee` and :meth:`eth_usd` now
        costs no round trip and never waits. The operator fee is not asked (it is read ahead
        too, but a gas limit's first plan may ask it before its first head's read)."""
        if self._has_oracle is None or (self.eth_usd_feed is not None and self._feed_decimals is None):
            return False
        keys = ([f"l1fee:{unsigned_tx_size}"] if self._has_oracle else []) + (
            ["eth_usd"] if self.eth_usd_feed is not None else []
        )
        return self.node.fresh(*keys)

    async def l1_fee(self, unsigned_tx_size: int) -> int:
        """Upper bound of the L1 data fee (wei) of a transaction of that unsigned size (bytes)."""
        if not await self.has_oracle():
            return 0

        (fee,), _block = await self.node.cached_view(
            f"l1fee:{unsigned_tx_size}", GAS_PRICE_ORACLE, _L1_FEE_UPPER_BOUND, unsigned_tx_size
        )
        return int(fee)

    async def operator_fee(self, gas: int) -> int:
        """An upper bound of the operator fee (wei) charged for ``gas`` gas (charged on the
        gas limit up front): the oracle's ``getOperatorFee`` of ``gas`` rounded up to
        :data:`OPERATOR_FEE_GAS_STEP`, read ahead at each head with the other per-head reads."""
        if not await self.has_oracle():
            return 0
        rounded = operator_fee_gas(gas)
        try:
            (fee,), _block = await self.node.cached_view(
                f"opfee:{rounded}", GAS_PRICE_ORACLE, _OPERATOR_FEE, rounded
            )
        except ChainRevert:
            return 0  # an oracle from before Isthmus: no operator fee
        return int(fee)

    async def eth_usd(self) -> FeedAnswer | None:
        """The ETH/USD feed's latest answer, or None without a feed."""
        feed = self.eth_usd_feed
        if feed is None:
            return None
        if self._feed_decimals is None:
            async with self._first_read:
                if self._feed_decimals is None:
                    (decimals,) = await self.node.call(feed, _DECIMALS)
                    self._feed_decimals = int(decimals)
        places = self._feed_decimals

        (_round, answer, _started, updated_at, _answered), _block = await self.node.cached_view(
            "eth_usd", feed, _LATEST_ROUND
        )
        return FeedAnswer(int(answer), places, int(updated_at))
