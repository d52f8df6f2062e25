"""The one table of chain facts (name, CAIP-2 id, x402 network slug, explorer, block time,
default confirmations, relay and catalogue support, USDC's EIP-712 domain name) that every
surface reads; each lookup states what it answers for a chain not in the table.

Policy: the relay runs on Base (8453) and Base Sepolia (84532); the marketplace catalogue may
also index Polygon (137) and Polygon Amoy (80002). Default confirmations are blocks under a
receipt before a retirement is settled (relay) or under an event before it is indexed
(catalogue); ``RELAYER_CONFIRMATIONS`` and an index chain's ``confirmations`` override them. A
local anvil mines a block per transaction: the dev tooling sets 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final


@dataclass(frozen=True, slots=True)
class ChainFacts:
    """What this service knows of one EVM chain.

    Attributes:
        chain_id: EIP-155 chain id.
        name: display name ("Base Sepolia").
        network: x402 network slug ("base-sepolia"), as prepare/retire writes it.
        explorer_tx: block explorer transaction URL prefix (the ``0x`` hash is appended),
            None when there is none.
        block_time_ms: the chain's target block interval, milliseconds.
        confirmations: default blocks under a receipt or event before it counts (settled for
            the relay, indexed for the catalogue).
        relay: whether the relay (x402 endpoint, facilitator, marketplace orders) runs here.
        catalogue: whether the marketplace catalogue may index this chain.
        usdc_domain_name: the EIP-712 domain ``name`` of this chain's USDC, None where the
            relay does not run (see :func:`usdc_domain_name`).
    """

    chain_id: int
    name: str
    network: str
    explorer_tx: str | None
    block_time_ms: int
    confirmations: int
    relay: bool
    catalogue: bool
    usdc_domain_name: str | None

    @property
    def caip2(self) -> str:
        """The CAIP-2 chain id, ``eip155:<chain id>``."""
        return caip2(self.chain_id)


BASE: Final = ChainFacts(
    chain_id=8453,
    name="Base",
    network="base",
    explorer_tx="https://basescan.org/tx/",
    block_time_ms=2_000,
    confirmations=10,
    relay=True,
    catalogue=True,
    usdc_domain_name="USD Coin",
)
"""Base mainnet. 10 blocks is about 20 s; a reorg of Base's unsafe head is rare and shallow,
and the follower undoes one at any depth it still remembers."""
BASE_SEPOLIA: Final = ChainFacts(
    chain_id=84532,
    name="Base Sepolia",
    network="base-sepolia",
    explorer_tx="https://sepolia.basescan.org/tx/",
    block_time_ms=2_000,
    confirmations=5,
    relay=True,
    catalogue=True,
    usdc_domain_name="USDC",
)
"""Base Sepolia, a test network: 5 blocks."""
POLYGON: Final = ChainFacts(
    chain_id=137,
    name="Polygon",
    network="polygon",
    explorer_tx="https://polygonscan.com/tx/",
    block_time_ms=2_000,
    confirmations=64,
    relay=False,
    catalogue=True,
    usdc_domain_name=None,
)
"""Polygon PoS, indexed for the marketplace only: 64 blocks (about two minutes; Polygon PoS
reorgs are deeper than Base's)."""
POLYGON_AMOY: Final = ChainFacts(
    chain_id=80002,
    name="Polygon Amoy",
    network="polygon-amoy",
    explorer_tx="https://amoy.polygonscan.com/tx/",
    block_time_ms=2_000,
    confirmations=16,
    relay=False,
    catalogue=True,
    usdc_domain_name=None,
)
"""Polygon's test network, indexed for the marketplace only: 16 blocks."""

CHAINS: Final[Mapping[int, ChainFacts]] = MappingProxyType(
    {c.chain_id: c for c in (BASE, BASE_SEPOLIA, POLYGON, POLYGON_AMOY)}
)
"""Every known chain by chain id (read-only)."""
RELAY_CHAINS: Final = tuple(c.chain_id for c in CHAINS.values() if c.relay)
"""Chain ids the relay runs on: (8453, 84532)."""
CATALOGUE_CHAINS: Final = tuple(c.chain_id for c in CHAINS.values() if c.catalogue)
"""Chain ids the marketplace catalogue may index: (8453, 84532, 137, 80002)."""
UNKNOWN_CHAIN_CONFIRMATIONS: Final = max(c.confirmations for c in CHAINS.values())
"""Default confirmations on a chain not in the table: the deepest default of any known chain (64)."""
UNKNOWN_USDC_DOMAIN_NAME: Final = "USDC"
"""USDC's EIP-712 domain name where the table gives none (Circle's test-network tokens and the
local development token use it)."""


def facts(chain_id: int) -> ChainFacts | None:
    """The table's facts of ``chain_id``; None for a chain not in the table."""
    return CHAINS.get(chain_id)


def caip2(chain_id: int) -> str:
    """The CAIP-2 chain id ``eip155:<chain id>``, for any chain (known or not)."""
    return f"eip155:{chain_id}"


def display_name(chain_id: int) -> str:
    """The chain's display name ("Base"); ``"chain <id>"`` for a chain not in the table."""
    known = CHAINS.get(chain_id)
    return f"chain {chain_id}" if known is None else known.name


def network(chain_id: int) -> str:
    """The x402 network slug ("base", "base-sepolia"); the CAIP-2 id ``eip155:<id>`` for a
    chain not in the table (x402 v2 names every network that way)."""
    known = CHAINS.get(chain_id)
    return caip2(chain_id) if known is None else known.network


def explorer_tx_url(chain_id: int, tx_hash: str) -> str | None:
    """The block explorer's page of a transaction (``tx_hash``: ``0x`` + 64 hex digits);
    None for a chain without a known explorer (not in the table)."""
    known = CHAINS.get(chain_id)
    return None if known is None or known.explorer_tx is None else known.explorer_tx + tx_hash


def default_confirmations(chain_id: int) -> int:
    """Default blocks under a receipt or event before it counts on ``chain_id``;
    :data:`UNKNOWN_CHAIN_CONFIRMATIONS` (64) for a chain not in the table."""
    known = CHAINS.get(chain_id)
    return UNKNOWN_CHAIN_CONFIRMATIONS if known is None else known.confirmations


def relay_supported(chain_id: int) -> bool:
    """Whether the relay runs on ``chain_id`` (8453, 84532); False for a chain not in the table."""
    known = CHAINS.get(chain_id)
    return known is not None and known.relay


def catalogue_supported(chain_id: int) -> bool:
    """Whether the catalogue may index ``chain_id`` (8453, 84532, 137, 80002); False for a
    chain not in the table."""
    known = CHAINS.get(chain_id)
    return known is not None and known.catalogue


def usdc_domain_name(chain_id: int) -> str:
    """The EIP-712 domain ``name`` of USDC on ``chain_id`` ("USD Coin" on Base, "USDC" on Base
    Sepolia); :data:`UNKNOWN_USDC_DOMAIN_NAME` ("USDC") for a chain not in the table or one
    the relay does not run on."""
    known = CHAINS.get(chain_id)
    name = None if known is None else known.usdc_domain_name
    return UNKNOWN_USDC_DOMAIN_NAME if name is None else name
