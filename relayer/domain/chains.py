"""The one table of chain facts (name, CAIP-2 id, x402 network slug, explorer, block time,
default confirmations, relay and catalogue support, USDC's EIP-712 domain name) that every
surface reads; each lookup states what it answers for a chain not in the table.

Policy: the relay runs on Base (8453) and Base Sepolia (84532); the marketplace catalogue may
also index Polygon (137) and Polygon Amoy (80002). A chain's default confirmation is a time
(``confirmation_s``: how long blocks must pile up over a receipt before a retirement is settled,
or over an event before it is indexed); the depth in blocks is derived from the chain's block
time (:mod:`relayer.domain.confirmation`). ``RELAYER_CONFIRMATION`` (seconds, ``safe`` or
``finalized``), ``RELAYER_CONFIRMATIONS`` (blocks) and an index chain's ``confirmations``
override them. A local anvil mines a block per transaction: the dev tooling sets 1 block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from relayer.domain.confirmation import ConfirmationPolicy


@dataclass(frozen=True, slots=True)
class ChainFacts:
    """What this service knows of one EVM chain.

    Attributes:
        chain_id: EIP-155 chain id.
        name: display name ("Base Sepolia").
        network: x402 network slug ("base-sepolia"), as prepare/retire writes it.
        explorer_tx: block explorer transaction URL prefix (the ``0x`` hash is appended),
            None when there is none.
        genesis_hash: the public chain's block 0 hash (32 bytes): a node of this chain id with
            another genesis (a local devnet, a fork) is not the public chain, and its
            transactions are not on the public explorer (see :func:`explorer_tx_url`).
        block_time_ms: the chain's block interval, milliseconds (Base since Denim: 200).
        confirmation_s: default seconds of blocks under a receipt or event before it counts
            (settled for the relay, indexed for the catalogue); :attr:`confirmations` is the
            depth in blocks it makes at ``block_time_ms``.
        relay: whether the relay (x402 endpoint, facilitator, marketplace orders) runs here.
        catalogue: whether the marketplace catalogue may index this chain.
        usdc_domain_name: the EIP-712 domain ``name`` of this chain's USDC, None where the
            relay does not run (see :func:`usdc_domain_name`).
    """

    chain_id: int
    name: str
    network: str
    explorer_tx: str | None
    genesis_hash: bytes
    block_time_ms: int
    confirmation_s: float
    relay: bool
    catalogue: bool
    usdc_domain_name: str | None

    @property
    def confirmations(self) -> int:
        """Default blocks under a receipt or event before it counts: ``confirmation_s`` at
        ``block_time_ms`` (rounded up, at least 1)."""
        return ConfirmationPolicy.in_seconds(self.confirmation_s, self.block_time_ms).depth

    @property
    def caip2(self) -> str:
        """The CAIP-2 chain id, ``eip155:<chain id>``."""
        return caip2(self.chain_id)


BASE: Final = ChainFacts(
    chain_id=8453,
    name="Base",
    network="base",
    explorer_tx="https://basescan.org/tx/",
    genesis_hash=bytes.fromhex("f712aa9241cc24369b143cf6dce85f0902a9731e70d66818a3a5845b296c73dd"),
    block_time_ms=200,
    confirmation_s=20.0,
    relay=True,
    catalogue=True,
    usdc_domain_name="USD Coin",
)
"""Base mainnet: 200 ms blocks since Denim (2026-11-05); 20 s = 100 blocks, the time the
10 blocks of 2 s gave before Denim (a reorg of the sequencer's unsafe head takes a sequencer
fault and loses seconds of blocks, not a count of them; see docs/configuration.md,
Confirmation, and docs/design.md)."""
BASE_SEPOLIA: Final = ChainFacts(
    chain_id=84532,
    name="Base Sepolia",
    network="base-sepolia",
    explorer_tx="https://sepolia.basescan.org/tx/",
    genesis_hash=bytes.fromhex("0dcc9e089e30b90ddfc55be9a37dd15bc551aeee999d2e2b51414c54eaf934e4"),
    block_time_ms=200,
    confirmation_s=10.0,
    relay=True,
    catalogue=True,
    usdc_domain_name="USDC",
)
"""Base Sepolia, a test network: 200 ms blocks since Denim (2026-10-21); 10 s = 50 blocks."""
POLYGON: Final = ChainFacts(
    chain_id=137,
    name="Polygon",
    network="polygon",
    explorer_tx="https://polygonscan.com/tx/",
    genesis_hash=bytes.fromhex("a9c28ce2141b56c474f1dc504bee9b01eb1bd7d1a507580d5519d4437a97de1b"),
    block_time_ms=2_000,
    confirmation_s=128.0,
    relay=False,
    catalogue=True,
    usdc_domain_name=None,
)
"""Polygon PoS, indexed for the marketplace only: 64 blocks (about two minutes; Polygon PoS
reorgs are deeper than Base's): 128 s at 2 s blocks."""
POLYGON_AMOY: Final = ChainFacts(
    chain_id=80002,
    name="Polygon Amoy",
    network="polygon-amoy",
    explorer_tx="https://amoy.polygonscan.com/tx/",
    genesis_hash=bytes.fromhex("7202b2b53c5a0836e773e319d18922cc756dd67432f9a1f65352b61f4406c697"),
    block_time_ms=2_000,
    confirmation_s=32.0,
    relay=False,
    catalogue=True,
    usdc_domain_name=None,
)
"""Polygon's test network, indexed for the marketplace only: 16 blocks (32 s)."""

CHAINS: Final[Mapping[int, ChainFacts]] = MappingProxyType(
    {c.chain_id: c for c in (BASE, BASE_SEPOLIA, POLYGON, POLYGON_AMOY)}
)
"""Every known chain by chain id (read-only)."""
RELAY_CHAINS: Final = tuple(c.chain_id for c in CHAINS.values() if c.relay)
"""Chain ids the relay runs on: (8453, 84532)."""
CATALOGUE_CHAINS: Final = tuple(c.chain_id for c in CHAINS.values() if c.catalogue)
"""Chain ids the marketplace catalogue may index: (8453, 84532, 137, 80002)."""
UNKNOWN_CHAIN_CONFIRMATIONS: Final = max(c.confirmations for c in CHAINS.values())
"""Default confirmations on a chain not in the table: the deepest default of any known chain (100)."""
UNKNOWN_CHAIN_BLOCK_TIME_MS: Final = 2_000
"""Block time assumed on a chain not in the table unless ``RELAYER_BLOCK_TIME_MS`` says."""
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


def explorer_tx_url(chain_id: int, tx_hash: str, genesis_hash: bytes | None) -> str | None:
    """The public block explorer's page of a transaction (``tx_hash``: ``0x`` + 64 hex
    digits) on the chain whose block 0 hash is ``genesis_hash`` (as the node reported it,
    recorded in ``chain_identity``); None for a chain without a known explorer (not in the
    table), for a chain whose genesis is not the public chain's (a local devnet or a fork that
    uses the chain id: the explorer has no such transaction), and when the genesis is not
    known yet (``None``)."""
    known = CHAINS.get(chain_id)
    if known is None or known.explorer_tx is None or genesis_hash != known.genesis_hash:
        return None
    return known.explorer_tx + tx_hash


def default_confirmations(chain_id: int) -> int:
    """Default blocks under a receipt or event before it counts on ``chain_id``;
    :data:`UNKNOWN_CHAIN_CONFIRMATIONS` for a chain not in the table."""
    known = CHAINS.get(chain_id)
    return UNKNOWN_CHAIN_CONFIRMATIONS if known is None else known.confirmations


def block_time_ms(chain_id: int) -> int:
    """The chain's block interval, milliseconds; :data:`UNKNOWN_CHAIN_BLOCK_TIME_MS` for a
    chain not in the table."""
    known = CHAINS.get(chain_id)
    return UNKNOWN_CHAIN_BLOCK_TIME_MS if known is None else known.block_time_ms


def default_confirmation(chain_id: int, block_time: int | None = None) -> ConfirmationPolicy:
    """The chain's default policy: its ``confirmation_s`` at its block time (``block_time``
    ms when given, e.g. measured or set); a chain not in the table keeps
    :data:`UNKNOWN_CHAIN_CONFIRMATIONS` blocks."""
    known = CHAINS.get(chain_id)
    ms = block_time or block_time_ms(chain_id)
    if known is None:
        return ConfirmationPolicy(ms, UNKNOWN_CHAIN_CONFIRMATIONS)
    return ConfirmationPolicy.in_seconds(known.confirmation_s, ms)


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
