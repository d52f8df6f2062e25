"""The lane keeper: broadcasts the lane's transactions and keeps the lane moving. It sends
journaled bytes and handles each refusal of the node in its own way; and about once a second
it reads the chain's mined nonce and the fee market, asks :func:`relayer.domain.lane.plan`
what to do, and does it: re-send the same bytes, replace at the same nonce with bumped fees
within the job's allowance, or sign a no-op for a hole or for a job whose authorization is
about to expire. Every replacement and no-op is journaled (lease-fenced) before it is sent.

A nonce gap larger than the lane's in-flight window is no hole to fill but an incident: the
lane halts (:attr:`LaneKeeper.halted`: no re-send, replacement, no-op or new work; one log
line, ``relayer_executor_nonce_gap``) until the gap closes. A mined nonce that went back asks
the chain guard at once whether the node still serves the lane's chain."""

from __future__ import annotations

import logging
import time
from typing import Final

from relayer.chain.errors import ChainUnavailable, SendOutcome
from relayer.chain.executor import ExecutorChain
from relayer.chain.signer import ExecutorSigner
from relayer.domain.errors import Rejection
from relayer.domain.lane import FillNonce, Halt, LanePolicy, LaneTx, Replace, Resend, plan
from relayer.logs import job_fields, trace_fields
from relayer.metrics import Metrics
from relayer.service.gas import GasPricer
from relayer.store.executor_lane import ExecutorLane, LiveTx, SignedTx
from relayer.workers.chain_guard import ChainGuard

log = logging.getLogger(__name__)

UPKEEP_EVERY_S: Final = 1.0
NOOP_GAS: Final = 21_000
FEES_ABOVE_ALLOWANCE: Final = Rejection(
    "gas_estimate_unavailable",
    "network fees stayed above the signed gas allowance until the authorization expired; nothing was "
    "spent: run prepare-auth again and sign a new authorization",
    reason="fees_above_allowance",
)
# Refusals that mean the node will not take these bytes as they are: not marked broadcast.
_NOT_TAKEN: Final = frozenset(
    {SendOutcome.NONCE_AHEAD, SendOutcome.UNDERPRICED, SendOutcome.FEE_BELOW_BASE, SendOutcome.NO_FUNDS}
)


class LaneKeeper:
    """Sends and upkeeps one executor key's lane (inside the broadcaster, under its lease)."""

    def __init__(
        self,
        chain: ExecutorChain,
        gas: GasPricer,
        lane: ExecutorLane,
        signer: ExecutorSigner,
        metrics: Metrics,
        policy: LanePolicy,
        usdc: str,
        key_index: int = 0,
        guard: ChainGuard | None = None,
    ) -> None:
        self.chain = chain
        self.key = str(key_index)
        self.guard = guard
        self.halted: Halt | None = None  # the nonce gap the lane halts on
        self.gas = gas
        self.lane = lane
        self.signer = signer
        self.metrics = metrics
        self.policy = policy
        self.usdc = usdc
        self._refused: set[bytes] = set()
        self._mined: int | None = None
        self._stalled_since = time.monotonic()
        self._next_upkeep = 0.0

    async def send(self, txs: list[SignedTx]) -> None:
        """Broadcast journaled transactions and record which the node took
        (:meth:`broadcast`, then :meth:`record`).

        Raises:
            Unavailable: recording failed (the bytes went out; the upkeep re-sends them).
        """
        await self.record(await self.broadcast(txs))

    async def broadcast(self, txs: list[SignedTx]) -> list[SignedTx]:
        """Broadcast journaled transactions; returns the ones the node took. A refusal is
        remembered for the next upkeep (replace, fill a hole), a failure re-sent later. The
        bytes go out in JSON-RPC batches, in nonce order. Never raises for the node's
        failures (each transaction's is logged and counted)."""
        taken: list[SignedTx] = []
        if not txs:
            return taken
        try:
            outcomes = await self.chain.send_raw_many([tx.raw for tx in txs])
        except ChainUnavailable as exc:
            outcomes = [exc] * len(txs)
        for tx, outcome in zip(txs, outcomes, strict=True):
            if isinstance(outcome, ChainUnavailable):
                self.metrics.rpc_errors.labels("broadcaster").inc()
                log.warning(
                    "broadcast failed, will re-send",
                    extra=trace_fields(tx.job_id, tx.tx_hash, tx.request_id, reason=outcome.detail),
                )
                continue
            self.metrics.broadcasts.labels(outcome.value).inc()
            if outcome in (SendOutcome.UNDERPRICED, SendOutcome.FEE_BELOW_BASE):
                self._refused.add(tx.tx_hash)
            elif outcome is SendOutcome.NONCE_AHEAD:
                self._stalled_since = float("-inf")  # a nonce below is missing: fill it now
            elif outcome is SendOutcome.NO_FUNDS:
                log.error(
                    "the executor cannot pay for its transactions", extra={"executor": self.signer.address}
                )
            if outcome in _NOT_TAKEN:
                self._next_upkeep = 0.0
                continue
            taken.append(tx)
        return taken

    async def record(self, taken: list[SignedTx]) -> None:
        """Record that the node took ``taken``: their jobs move to submitted (one statement).

        Raises:
            Unavailable: the database failed.
        """
        if not taken:
            return
        for job in await self.lane.mark_broadcast(taken):
            self.metrics.job_transitions.labels("submitted").inc()
            self.metrics.observe_stage(
                "accepted_to_submitted", job.timestamps["accepted_at"], job.timestamps["submitted_at"]
            )
            log.info("submitted", extra=job_fields(job))

    async def resend_all(self) -> int:
        """Send the same bytes of every live transaction again (after taking the lease)."""
        live = await self.lane.live(self.signer.address)
        await self.send([t.signed() for t in live])
        return len(live)

    def upkeep_due(self) -> bool:
        """Whether :meth:`upkeep` would act now (else it returns at once)."""
        return time.monotonic() >= self._next_upkeep

    async def upkeep(self, epoch: int) -> None:
        """At most every :data:`UPKEEP_EVERY_S` (sooner after a refusal): plan and act.

        Raises:
            LeaseLost: another process took the key.
            Unavailable: the chain node or the database failed.
        """
        if time.monotonic() < self._next_upkeep:
            return
        self._next_upkeep = time.monotonic() + UPKEEP_EVERY_S
        live = await self.lane.live(self.signer.address)
        if not live:
            self._stalled_since = time.monotonic()
            self._gap_closed()
            return
        mined = await self.chain.mined_nonce(self.signer.address)
        if self.guard is not None and self._mined is not None and mined < self._mined:
            await self.guard.check("broadcaster", now=True)  # the nonce went back: which chain?
        if mined != self._mined:
            self._mined, self._stalled_since = mined, time.monotonic()
        market = await self.gas.price()
        views = {t.tx_hash: t for t in live}
        lane_txs = [await self._view(t) for t in live]
        stalled_for = time.monotonic() - self._stalled_since
        refused, self._refused = frozenset(self._refused), set()
        actions = plan(lane_txs, mined, market, time.time(), stalled_for, self.policy, refused)
        if actions and isinstance(actions[0], Halt):
            self._gap_opened(actions[0])
            return
        self._gap_closed()
        for action in actions:
            if isinstance(action, Halt):
                continue
            if isinstance(action, Resend):
                await self.send([views[action.tx.tx_hash].signed()])
            elif isinstance(action, Replace):
                await self._replace(epoch, views[action.tx.tx_hash], action)
            else:
                await self._fill(
                    epoch, action, None if action.replaces is None else views[action.replaces.tx_hash]
                )

    def _gap_opened(self, halt: Halt) -> None:
        """The lane halts on a nonce gap (logged when it begins, counted each upkeep)."""
        self.metrics.halted_steps.labels("broadcaster", "nonce_gap").inc()
        if self.halted is None:
            self.metrics.nonce_gap.labels(self.key).set(1)
            log.error(
                "nonce gap: the lane halts (no no-op, re-send or new work) until the chain's "
                "mined nonce reaches its transactions again",
                extra={
                    "executor": self.signer.address,
                    "mined_nonce": halt.mined_nonce,
                    "top": halt.top,
                    "gap": halt.gap,
                    "window": self.policy.in_flight_window,
                },
            )
        self.halted = halt

    def _gap_closed(self) -> None:
        if self.halted is not None:
            self.halted = None
            self.metrics.nonce_gap.labels(self.key).set(0)
            log.warning("nonce gap closed: the lane resumes", extra={"executor": self.signer.address})

    async def _view(self, tx: LiveTx) -> LaneTx:
        ceiling = None
        if tx.kind == "relay" and tx.job_kind == "transfer":
            ceiling = self.gas.sponsored_ceiling()  # no allowance pays a transfer's gas
        elif tx.kind == "relay" and tx.gas_allowance is not None:
            ceiling = await self.gas.ceiling(
                tx.gas_allowance, tx.gas_limit, tx.input_token == self.usdc, len(tx.data or b"")
            )
        return LaneTx(
            tx.tx_hash,
            tx.nonce,
            tx.kind,
            tx.job_id,
            tx.max_fee_per_gas,
            tx.max_priority_fee_per_gas,
            tx.signed_at,
            tx.broadcast_at,
            tx.expires_at if tx.kind == "relay" else None,
            ceiling,
        )

    async def _replace(self, epoch: int, old: LiveTx, action: Replace) -> None:
        """Sign ``old`` again at its nonce with the action's fees, journal it, send it."""
        to, data, gas = (
            (old.to, old.data, old.gas_limit) if old.kind == "relay" else (self.signer.address, b"", NOOP_GAS)
        )
        assert to is not None and data is not None
        new = self._sign(
            old.job_id,
            old.kind,
            to,
            data,
            old.nonce,
            gas,
            action.max_fee_per_gas,
            action.max_priority_fee_per_gas,
        )
        if await self.lane.record_replacement(self.signer.address, epoch, old, new):
            self.metrics.replacements.labels(old.kind).inc()
            log.info(
                "replaced a transaction with bumped fees",
                extra={"job_id": old.job_id, "nonce": old.nonce, "max_fee_per_gas": new.max_fee_per_gas},
            )
            await self.send([new])

    async def _fill(self, epoch: int, action: FillNonce, replaces: LiveTx | None) -> None:
        """Sign a zero-value self-transfer at the action's nonce, journal it, send it."""
        job_id = None if replaces is None else replaces.job_id
        noop = self._sign(
            job_id, "noop", self.signer.address, b"", action.nonce, NOOP_GAS,
            action.max_fee_per_gas, action.max_priority_fee_per_gas,
        )  # fmt: skip
        error = None if replaces is None else FEES_ABOVE_ALLOWANCE
        if await self.lane.record_noop(self.signer.address, epoch, noop, replaces, error):
            self.metrics.noops.labels(action.reason).inc()
            log.warning(
                "filling a nonce with a no-op",
                extra={"nonce": action.nonce, "reason": action.reason, "job_id": job_id},
            )
            await self.send([noop])

    def _sign(
        self,
        job_id: int | None,
        kind: str,
        to: str,
        data: bytes,
        nonce: int,
        gas: int,
        max_fee: int,
        tip: int,
    ) -> SignedTx:
        raw, tx_hash = self.signer.sign(
            to=to, data=data, nonce=nonce, gas=gas, max_fee_per_gas=max_fee, max_priority_fee_per_gas=tip
        )
        return SignedTx(job_id, tx_hash, raw, nonce, gas, max_fee, tip, "noop" if kind == "noop" else "relay")
