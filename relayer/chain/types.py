"""Typed values the chain layer returns: the deployment's contract addresses, credits,
classes, listings, receipts and settled retirements. Amounts are atomic units of their
token, credit amounts are credit units (1000 a tonne), times are unix seconds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from eth_utils.address import is_address, to_checksum_address

from relayer.domain.retirement import Retirement

# Deployment description key -> Contracts field (the keys `python -m relayer_dev devnet up` writes).
_DEPLOYMENT_KEYS: Final = {
    "usdc": "usdc",
    "kvcm": "kvcm",
    "carbonCredits": "carbon_credits",
    "carbonClasses": "carbon_classes",
    "pool": "pool",
    "marketplace": "marketplace",
    "settlement": "settlement",
}


@dataclass(frozen=True, slots=True)
class Contracts:
    """Checksummed addresses of the reference protocol on one chain."""

    usdc: str
    kvcm: str
    carbon_credits: str
    carbon_classes: str
    pool: str
    marketplace: str
    settlement: str
    eth_usd_feed: str | None = None  # optional: a Chainlink-style ETH/USD aggregator

    @classmethod
    def from_deployment(cls, contracts: Mapping[str, str]) -> Contracts:
        """From a deployment description's ``contracts`` object (``usdc``, ``kvcm``,
        ``carbonCredits``, ``carbonClasses``, ``pool``, ``marketplace``, ``settlement``;
        optionally ``ethUsdFeed``).

        Raises:
            ValueError: a contract is missing or its address is malformed.
        """
        missing = sorted(set(_DEPLOYMENT_KEYS) - set(contracts))
        if missing:
            raise ValueError(f"deployment lacks contract addresses: {missing}")
        bad = sorted(k for k in _DEPLOYMENT_KEYS if not is_address(contracts[k]))
        if bad:
            raise ValueError(f"deployment has malformed contract addresses: {bad}")
        feed = contracts.get("ethUsdFeed")
        if feed is not None and not is_address(feed):
            raise ValueError("deployment has a malformed contract address: ['ethUsdFeed']")
        return cls(
            **{field: str(to_checksum_address(contracts[key])) for key, field in _DEPLOYMENT_KEYS.items()},
            eth_usd_feed=None if feed is None else str(to_checksum_address(feed)),
        )

    def named(self) -> list[tuple[str, str]]:
        """(the deployment file's key, address) of each contract, the feed when there is one."""
        named = [(key, getattr(self, field)) for key, field in _DEPLOYMENT_KEYS.items()]
        return named + ([("ethUsdFeed", self.eth_usd_feed)] if self.eth_usd_feed else [])


@dataclass(frozen=True, slots=True)
class CreditInfo:
    """An ERC-1155 carbon credit (one project and vintage) and its registry's rules."""

    token_id: int
    project_id: str
    vintage: int
    registry: str
    whole_tonnes_only: bool
    requires_consumption_metadata: bool


@dataclass(frozen=True, slots=True)
class ClassInfo:
    """A carbon class: price in kVCM atomic units per tonne, minimum in credit units, and
    ``credits`` as (token id, credit units available)."""

    class_id: int
    symbol: str
    name: str
    price_kvcm_per_tonne: int
    min_retirement_units: int
    credits: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class TokenBalance:
    """An ERC-20 balance in atomic units, as of block ``block_number``."""

    amount: int
    block_number: int


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """What the follower needs of a block to notice a reorg; ``transactions`` are the block's
    transaction hashes as the node writes them (``0x`` + 64 lower-case hex digits, unparsed:
    the follower only looks its own up among them), empty when not read."""

    number: int
    hash: bytes
    parent_hash: bytes
    transactions: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Receipt:
    """A transaction receipt: ``status`` 1 success, 0 reverted; what it paid is
    ``gas_used * effective_gas_price + l1_fee`` (wei; ``l1_fee`` is the L1 data fee and the
    operator fee an OP-stack chain such as Base reports in its receipts, 0 elsewhere)."""

    tx_hash: bytes
    block_number: int
    block_hash: bytes
    status: int
    gas_used: int
    effective_gas_price: int
    l1_fee: int = 0

    @property
    def paid_wei(self) -> int:
        return self.gas_used * self.effective_gas_price + self.l1_fee


@dataclass(frozen=True, slots=True)
class SettledLog:
    """A decoded ``RetirementSettled`` event. Money in input-token atomic units."""

    tx_hash: bytes
    block_number: int
    block_hash: bytes
    log_index: int
    payer: str
    beneficiary: str
    retirement_index: int
    value: int
    fee: int
    retirement_cost: int
    refunded: int
    bound_nonce: bytes
    retirement: Retirement
    block_timestamp: int | None = None  # the block's, when the node writes it in its logs
