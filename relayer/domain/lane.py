"""The upkeep of an executor lane, as pure decisions: given the lane's live transactions, the
chain's mined nonce, the fee market and the clock, what keeps the lane moving.

- A transaction never broadcast, or not mined for ``resend_after_s``, is re-sent with the
  same bytes (while its nonce is free, that is all a dropped transaction needs).
- One the node refused for its fee, or not mined for ``replace_after_s`` while the market
  asks more than it offers, is replaced at the same nonce with fees bumped by at least 10 %
  (a node's replacement minimum), never above what the job's signed gas allowance covers.
- A job whose authorization will expire within ``noop_before_expiry_s`` before it is mined
  (fees stayed above its allowance) gets its nonce filled with a zero-value self-transfer;
  the executor pays for that no-op.
- Nonces between the mined one and the lane's that no transaction holds (a hole, which would
  stall every later transaction) are filled with no-ops once the lane has not moved for
  ``hole_after_s``; unless there are more of them than the lane's in-flight window
  (``in_flight_window``): such a gap is no hole but an incident (the chain is not the one the
  lane signed for, or lost its history), and the plan is :class:`Halt`, nothing else.

Amounts are wei per gas; times unix seconds (``signed_at``, ``broadcast_at``) or durations in
seconds. No I/O: the broadcaster executes the actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from relayer.domain.fees import GasPrice, bumped, replacement_fees

MAX_HOLE_SCAN: Final = 100
"""At most this many nonces above the mined one are filled in one plan."""
IN_FLIGHT_WINDOW: Final = 32
"""The most nonces a lane leaves unheld under its live transactions in ordinary work (one
signing batch): a larger gap is an incident, never filled with no-ops."""
UNLIMITED: Final = 2**256 - 1


@dataclass(frozen=True, slots=True)
class LaneTx:
    """A live transaction of the lane: the newest at its nonce, not seen mined.

    Attributes:
        kind: ``relay`` (a job's retirement) or ``noop`` (a zero-value self-transfer).
        job_id: the job it settles or stands in for (None for a no-op filling a hole).
        expires_at: when the job's authorization expires (relay only).
        ceiling: the highest max fee per gas the job's signed allowance covers (relay only).
    """

    tx_hash: bytes
    nonce: int
    kind: Literal["relay", "noop"]
    job_id: int | None
    max_fee_per_gas: int
    max_priority_fee_per_gas: int
    signed_at: float
    broadcast_at: float | None
    expires_at: int | None = None
    ceiling: int | None = None


@dataclass(frozen=True, slots=True)
class LanePolicy:
    """How patient the lane is, in seconds."""

    resend_after_s: float = 10.0
    replace_after_s: float = 30.0
    hole_after_s: float = 10.0
    noop_before_expiry_s: float = 30.0
    unsent_after_s: float = 2.0
    in_flight_window: int = IN_FLIGHT_WINDOW


@dataclass(frozen=True, slots=True)
class Resend:
    """Broadcast the same bytes again."""

    tx: LaneTx


@dataclass(frozen=True, slots=True)
class Replace:
    """Sign the same transaction at the same nonce with these fees, and send it."""

    tx: LaneTx
    max_fee_per_gas: int
    max_priority_fee_per_gas: int


@dataclass(frozen=True, slots=True)
class FillNonce:
    """Sign a zero-value self-transfer at ``nonce`` and send it; ``replaces`` is the lane's
    transaction it stands in for (None for a hole)."""

    nonce: int
    max_fee_per_gas: int
    max_priority_fee_per_gas: int
    reason: Literal["hole", "expired"]
    replaces: LaneTx | None = None


@dataclass(frozen=True, slots=True)
class Halt:
    """The lane halts (an incident): ``gap`` nonces from ``mined_nonce`` up to the lane's
    newest live one (``top``) are held by no transaction, more than the in-flight window."""

    mined_nonce: int
    top: int
    gap: int


Action = Resend | Replace | FillNonce | Halt


def nonce_gap(txs: list[LaneTx], mined_nonce: int) -> int:
    """How many nonces from ``mined_nonce`` up to the newest live transaction no live
    transaction holds (0 for an empty lane)."""
    held = {t.nonce for t in txs if t.nonce >= mined_nonce}
    if not held:
        return 0
    return max(held) - mined_nonce + 1 - len(held)


def plan(
    txs: list[LaneTx],
    mined_nonce: int,
    market: GasPrice,
    now: float,
    stalled_for_s: float,
    policy: LanePolicy,
    refused: frozenset[bytes] = frozenset(),
) -> list[Action]:
    """The actions that keep the lane moving, in nonce order.

    Args:
        txs: the lane's live transactions (at most one per nonce).
        mined_nonce: the chain's count of mined transactions from the executor.
        market: fees a new transaction would get now.
        now: unix seconds.
        stalled_for_s: how long ``mined_nonce`` has not moved while the lane had work.
        policy: the lane's patience.
        refused: hashes the node refused for their fee (replace them now).

    Returns:
        The actions in nonce order; or ``[Halt]`` alone when the lane has not moved for
        ``hole_after_s`` and its nonce gap (:func:`nonce_gap`) exceeds
        ``policy.in_flight_window``.
    """
    live = sorted((t for t in txs if t.nonce >= mined_nonce), key=lambda t: t.nonce)
    gap = nonce_gap(live, mined_nonce)
    if gap > policy.in_flight_window and stalled_for_s >= policy.hole_after_s:
        return [Halt(mined_nonce, live[-1].nonce, gap)]
    actions: list[Action] = [*_holes(live, mined_nonce, market, stalled_for_s, policy)]
    for tx in live:
        action = _upkeep(tx, market, now, policy, tx.tx_hash in refused)
        if action is not None:
            actions.append(action)
    return sorted(actions, key=_nonce)


def _holes(
    live: list[LaneTx], mined_nonce: int, market: GasPrice, stalled_for_s: float, policy: LanePolicy
) -> list[FillNonce]:
    if not live or stalled_for_s < policy.hole_after_s:
        return []
    held = {t.nonce for t in live}
    top = min(live[-1].nonce, mined_nonce + MAX_HOLE_SCAN)
    return [
        FillNonce(n, market.max_fee_per_gas, market.max_priority_fee_per_gas, "hole")
        for n in range(mined_nonce, top)
        if n not in held
    ]


def _upkeep(tx: LaneTx, market: GasPrice, now: float, policy: LanePolicy, refused: bool) -> Action | None:
    if (
        tx.kind == "relay"
        and tx.expires_at is not None
        and tx.expires_at <= now + policy.noop_before_expiry_s
    ):
        max_fee = max(bumped(tx.max_fee_per_gas), market.max_fee_per_gas)
        tip = min(max(bumped(tx.max_priority_fee_per_gas), market.max_priority_fee_per_gas), max_fee)
        return FillNonce(tx.nonce, max_fee, tip, "expired", replaces=tx)
    sent_age = None if tx.broadcast_at is None else now - tx.broadcast_at
    priced_out = market.max_fee_per_gas > tx.max_fee_per_gas
    if refused or (sent_age is not None and sent_age >= policy.replace_after_s and priced_out):
        ceiling = tx.ceiling if tx.kind == "relay" and tx.ceiling is not None else UNLIMITED
        fees = replacement_fees(
            tx.max_fee_per_gas, tx.max_priority_fee_per_gas, market.max_fee_per_gas,
            market.max_priority_fee_per_gas, ceiling,
        )  # fmt: skip
        if fees is not None:
            return Replace(tx, *fees)
        return None  # the allowance leaves no room: wait for fees to fall, or the no-op at expiry
    if sent_age is None and now - tx.signed_at >= policy.unsent_after_s:
        return Resend(tx)
    if sent_age is not None and sent_age >= policy.resend_after_s:
        return Resend(tx)
    return None


def _nonce(action: Action) -> int:
    if isinstance(action, Halt):
        return action.mined_nonce
    return action.nonce if isinstance(action, FillNonce) else action.tx.nonce
