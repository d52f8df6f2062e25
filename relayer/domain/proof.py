"""What proves a payment, as pure decisions (issue 35; design: docs/design.md, "What proves a
payment").

An EIP-3009 nonce is the payer's alone: ``cancelAuthorization``, or any other authorization
with the same nonce (to anyone, for any value), marks it used as well. A used nonce proves
nothing. A transfer of ``value`` atomic units of ``token`` from ``payer`` to ``pay_to`` under
``nonce`` is proven only by the token's logs of one transaction: ``AuthorizationUsed(payer,
nonce)`` and, right after it (the next log index: FiatToken and the devnet token emit the two
back to back in ``transferWithAuthorization`` and ``receiveWithAuthorization``), ``Transfer
(payer, pay_to, value)``. A reverted transaction keeps no logs, so a log the node answers is
from a successful one; the node answers logs of its canonical chain only, so after a reorg
the proof follows the chain.

:func:`standing` judges a payment from what the chain shows at one head: the proof (if any),
the confirmed block (the confirmation policy's), the nonce's state at the head and at the
confirmed block, and the confirmed block's time against ``validBefore``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from eth_utils.crypto import keccak

AUTHORIZATION_USED_TOPIC: Final = keccak(text="AuthorizationUsed(address,bytes32)")
TRANSFER_TOPIC: Final = keccak(text="Transfer(address,address,uint256)")


def address_topic(address: str) -> bytes:
    """An indexed ``address`` as its 32-byte topic (12 zero bytes, then the 20)."""
    return bytes(12) + bytes.fromhex(address[2:])


@dataclass(frozen=True, slots=True)
class TokenLog:
    """One log as the node answered it: the emitting contract (lower-case hex), its topics
    (32 bytes each) and data, and where it is (block number and hash, transaction hash, log
    index in the block)."""

    address: str
    topics: tuple[bytes, ...]
    data: bytes
    block_number: int
    block_hash: bytes
    tx_hash: bytes
    log_index: int


@dataclass(frozen=True, slots=True)
class TransferClaim:
    """What a payment claims happened: ``value`` atomic units of ``token`` from ``payer`` to
    ``pay_to`` under the payer's 32-byte EIP-3009 ``nonce``, valid before ``valid_before``
    (unix seconds)."""

    token: str
    payer: str
    nonce: bytes
    pay_to: str
    value: int
    valid_before: int


@dataclass(frozen=True, slots=True)
class TransferProof:
    """The transaction that made the claimed transfer: its hash, block (number, hash) and the
    value its ``Transfer`` log moved (atomic units; the claim's own)."""

    tx_hash: bytes
    block_number: int
    block_hash: bytes
    value: int


def find_proof(logs: Iterable[TokenLog], claim: TransferClaim) -> TransferProof | None:
    """The proof of ``claim`` among ``logs`` (any order, any mix of the token's logs): an
    ``AuthorizationUsed(payer, nonce)`` log of the token whose next log in the same
    transaction is the token's ``Transfer(payer, pay_to, value)``. None when no such pair."""
    token = claim.token.lower()
    ours = [log for log in logs if log.address.lower() == token]
    by_place = {(log.tx_hash, log.log_index): log for log in ours}
    used = (AUTHORIZATION_USED_TOPIC, address_topic(claim.payer), claim.nonce)
    moved = (TRANSFER_TOPIC, address_topic(claim.payer), address_topic(claim.pay_to))
    for log in ours:
        if log.topics != used:
            continue
        nxt = by_place.get((log.tx_hash, log.log_index + 1))
        if nxt is None or nxt.topics != moved or nxt.block_hash != log.block_hash:
            continue
        if int.from_bytes(nxt.data, "big") != claim.value or len(nxt.data) != 32:
            continue
        return TransferProof(log.tx_hash, log.block_number, log.block_hash, claim.value)
    return None


class Standing(StrEnum):
    """Where a claimed transfer stands on the chain.

    - ``PAID``: proven, at or below the confirmed block.
    - ``PENDING``: proven above the confirmed block, or the nonce used at the head without a
      proof but not yet at the confirmed block: the answer may still change (a reorg).
    - ``NEVER``: it can never happen: the nonce is used at the confirmed block by something
      else (a cancel, another authorization), or still unused there once the confirmed
      block's time has reached ``validBefore``.
    - ``OPEN``: nothing yet; the transfer may still come (the nonce is unused and valid).
    """

    PAID = "paid"
    PENDING = "pending"
    NEVER = "never"
    OPEN = "open"


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the chain showed at one head for a claim: the proof found in the blocks searched
    (up to ``head``), the confirmed block (-1: none yet), the nonce's state at the head and
    at the confirmed block, and the confirmed block's timestamp (unix seconds; None when
    there is no confirmed block)."""

    proof: TransferProof | None
    head: int
    confirmed_through: int
    used_at_head: bool
    used_at_confirmed: bool
    confirmed_time: int | None


def standing(evidence: Evidence, claim: TransferClaim) -> Standing:
    """Judge ``claim`` from ``evidence`` (see :class:`Standing`). A proof wins over the
    nonce's state (the proof is the use); without one, a used nonce is a use by something
    else."""
    e = evidence
    if e.proof is not None:
        return Standing.PAID if e.proof.block_number <= e.confirmed_through else Standing.PENDING
    if e.used_at_confirmed:
        return Standing.NEVER
    if e.used_at_head:
        return Standing.PENDING
    if e.confirmed_time is not None and e.confirmed_time >= claim.valid_before:
        return Standing.NEVER
    return Standing.OPEN
