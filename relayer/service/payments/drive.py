"""Driving a standard x402 payment through its states (design: docs/design/x402-v2.md, C6;
the table: :mod:`relayer.domain.payment_states`), by the request that took it and then by the
payment keeper by due time: ``paid`` only once the chain proves the transfer
(:mod:`relayer.service.proofs`: the token's ``AuthorizationUsed`` and ``Transfer`` to the
treasury in a successful transaction, ours or any sender's), with its transaction and the
value received; ``failed`` once the chain shows it can never happen (the nonce cancelled or
spent elsewhere, or unused past ``validBefore``); then the treasury's retirement
(:mod:`relayer.service.payments.retire`), or its refund
(:mod:`relayer.service.payments.refund`). One payment is driven by one actor at a time (an
advisory lock). Amounts in USDC atomic units; times in unix seconds."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from relayer.chain.errors import ChainRevert
from relayer.domain.errors import RelayerError, Unavailable
from relayer.domain.payment_states import PaymentState
from relayer.domain.proof import Standing, TransferClaim
from relayer.domain.states import JobState
from relayer.domain.verify import Refusal, VerifiedTransfer
from relayer.service.outcome import USED_OTHERWISE, Outcomes, RetireOutcome
from relayer.service.payments.facilitator import NONCE_USED, Facilitator, nonce_used
from relayer.service.payments.refund import Refunds
from relayer.service.payments.retire import FAILED, Retiring
from relayer.service.proofs import TransferProofs
from relayer.service.relay import Relay
from relayer.store.relay_jobs import Job, RelayJobs
from relayer.store.x402_payments import PaymentRow, X402Payments

log = logging.getLogger(__name__)
P = PaymentState

KEEPER_GRACE_S: Final = 5
"""A new payment is due for the keeper this long after it was recorded (unix seconds)."""
KEEPER_BATCH: Final = 50
KEEPER_RETRY_S: Final = 2
"""Seconds the keeper puts a payment off after each step (every open payment gets its turn)."""
FRONT_RUN: Final = "front_run"
"""The note of a payment whose transfer another sender submitted before we took it (not a
failure: its proof is that sender's transaction)."""


@dataclass(frozen=True, slots=True)
class Paid:
    """A recorded payment's answer: the payment as it stands, the transfer's hash
    (``payment_tx``: the transaction that moved the funds once paid, else ours once signed;
    None before), whether the funds are in the treasury, and the retirement's outcome body
    (None before its job exists or when it failed)."""

    payment: PaymentRow
    paid: bool
    payment_tx: bytes | None
    retirement: dict[str, Any] | None
    refund_tx: bytes | None = None


class Driver:
    """Drives payments (see the module): the payments' store, the relay that takes their
    transfers, its jobs and outcomes, the chain's proofs, the facilitator's checks of a
    stored payload, the retirement and refund steps, the token and the treasury (``payTo``)."""

    def __init__(
        self,
        store: X402Payments,
        relay: Relay,
        jobs: RelayJobs,
        outcomes: Outcomes,
        proofs: TransferProofs,
        facilitator: Facilitator,
        retiring: Retiring,
        refunds: Refunds,
        token: str,
        pay_to: str,
        wait_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.relay = relay
        self.jobs = jobs
        self.outcomes = outcomes
        self.proofs = proofs
        self.facilitator = facilitator
        self.retiring = retiring
        self.refunds = refunds
        self.token = token
        self.pay_to = pay_to
        self.wait_s = wait_s
        self.clock = clock
        self.chain_id = relay.chain_id

    async def take_transfer(self, row: PaymentRow, verified: VerifiedTransfer, now: int) -> Refusal | None:
        """The payer's transfer to the treasury as a ``transfer`` job, linked to the payment;
        the refusal when the relay refused it before anything was signed (the payer's balance
        less its transfers in flight is short, or the simulation reverted: a short balance, a
        nonce used meanwhile). None when it was taken, or an upstream failed (the keeper takes
        it again)."""
        job: Job | None = None
        try:
            job = await self.relay.accept_transfer(verified, now)
        except ChainRevert as exc:
            job = await self.jobs.find_by_salt(self.chain_id, verified.salt)
            if job is None or job.state is JobState.REJECTED:
                if nonce_used(exc):
                    return Refusal(NONCE_USED, "the authorization's nonce is already used or cancelled")
                return Refusal("insufficient_funds", exc.message)
        except Unavailable:
            log.warning(
                "x402 payment waits for its upstream; the payment keeper takes it",
                extra={"payment": str(row.id)},
            )
        except RelayerError as exc:
            return Refusal(_reason({"code": exc.code}), exc.message)
        if job is not None:
            await self.store.move(
                row.id, (P.ACCEPTED,), P.ACCEPTED, int(self.clock()), transfer_job_id=job.id
            )
        return None

    async def note(self, row: PaymentRow, record: dict[str, Any]) -> None:
        """Keep why the payment's transfer did not happen (``{code, message}``)."""
        await self.store.move(row.id, (P.ACCEPTED,), P.ACCEPTED, int(self.clock()), error=record)

    async def answer(self, row: PaymentRow) -> Paid | Refusal | None:
        """Drive the payment within the wait and answer from it; None when it is gone (refused
        and forgotten by the request that took it). Each step (:meth:`advance`) runs under the
        payment's lock and waits for nothing; the wait for its transfer runs outside the lock,
        so a twin, the keeper or another payment never waits behind it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        last_step = False  # the transfer's answer is final: one more step applies it
        while True:
            remaining = max(0.0, deadline - loop.time())
            async with self.store.locked(row.id) as taken:
                if taken:
                    advanced = await self.advance(row.id)
                    if advanced is None:
                        return None
                    row = advanced
            if remaining <= 0 or (taken and (last_step or row.state is not P.ACCEPTED)):
                break
            if not taken or row.transfer_job_id is None:
                await asyncio.sleep(min(0.2, remaining))  # another actor holds it for a moment
                continue
            try:
                outcome = await self.outcomes.wait_transfer(row.transfer_job_id, remaining)
            except Unavailable:
                await asyncio.sleep(min(0.2, remaining))
                continue
            last_step = outcome.final
        fresh = await self.store.get(row.id)
        if fresh is None:
            return None
        return await self._paid(fresh, max(0.0, deadline - loop.time()))

    async def _paid(self, row: PaymentRow, wait_s: float) -> Paid | Refusal:
        """The answer of a payment as it stands (waiting at most ``wait_s`` for a retirement
        on its way): paid only with the transaction the chain proves."""
        transfer = None if row.transfer_job_id is None else await self.jobs.get(row.transfer_job_id)
        paid = row.payment_tx is not None and row.state not in (P.ACCEPTED, P.FAILED)
        failing = row.error is not None and row.error.get("code") != FRONT_RUN
        if not paid and (
            row.state is P.FAILED or (failing and (transfer is None or transfer.state in FAILED))
        ):
            error = row.error or {}
            return Refusal(_reason(error), str(error.get("message", "the payment did not happen")))
        tx = row.payment_tx if paid else (None if transfer is None else transfer.tx_hash)
        retirement: dict[str, Any] | None = None
        if row.retire_job_id is not None and row.state in (P.RETIRING, P.RETIRED):
            try:
                outcome: RetireOutcome = await self.outcomes.wait(row.retire_job_id, wait_s)
                retirement = outcome.body
            except RelayerError as exc:
                log.info("x402 payment's retirement failed", extra={"payment": str(row.id), "code": exc.code})
        refund = None if row.refund_job_id is None else await self.jobs.get(row.refund_job_id)
        return Paid(row, paid, tx, retirement, None if refund is None else refund.tx_hash)

    async def advance(self, payment_id: uuid.UUID) -> PaymentRow | None:
        """One step of a payment, by the holder of its lock (it waits for nothing): its
        transfer as it stands; once the chain proves it, make (or link) its retirement; a retirement that
        can never execute is refunded; a refund proven ends it. Returns the payment as it
        stands (None: no such payment).

        Raises:
            Unavailable: the database failed.
        """
        row = await self.store.get(payment_id)
        if row is None:
            return None
        now = int(self.clock())
        if row.state is P.ACCEPTED:
            row = await self._settle_transfer(row, now)
        if row.state in (P.PAID, P.RETIRING):
            row = await self.retiring.retire(row, now)
        if row.state is P.REFUNDING:
            row = await self.refunds.refund(row, now)
        return row

    def _claim(self, row: PaymentRow) -> TransferClaim:
        """What the payment claims: its amount from the payer to the treasury under its nonce."""
        auth = row.payload.authorization()
        return TransferClaim(self.token, row.payer, row.auth_nonce, auth.to, row.amount, auth.valid_before)

    async def _settle_transfer(self, row: PaymentRow, now: int) -> PaymentRow:
        """``accepted`` -> ``paid`` once the chain proves the transfer (our transaction or any
        other sender's, :mod:`relayer.service.proofs`), with its transaction and value;
        -> ``failed`` once the chain shows it can never happen (the nonce used otherwise, or
        unused past ``validBefore`` at the confirmed block): nothing was charged."""
        job = await self._transfer_job(row, now)
        if job is not None:
            try:
                outcome = await self.outcomes.wait_transfer(job.id, 0)
            except Unavailable:
                return row
            if outcome.success:
                return await self._to_paid(row, outcome.tx_hash, now)
            if not outcome.final:
                return row
            if row.error is None:
                error = outcome.error or {"code": "transaction_reverted", "message": "the transfer reverted"}
                await self.note(row, {"code": error.get("code"), "message": error.get("message")})
        try:
            judged = await self.proofs.judge(self._claim(row), row.from_block)
        except Unavailable:
            return row
        if judged.standing is Standing.PAID:
            assert judged.proof is not None
            return await self._to_paid(row, judged.proof.tx_hash, now)
        if judged.standing is Standing.NEVER:
            record = {"code": USED_OTHERWISE["code"], "message": USED_OTHERWISE["message"]}
            if row.error is None or row.error.get("code") == FRONT_RUN:
                await self.note(row, record)
            return await self.store.move(row.id, (P.ACCEPTED,), P.FAILED, now) or row
        return await self.store.get(row.id) or row

    async def _to_paid(self, row: PaymentRow, tx_hash: bytes | None, now: int) -> PaymentRow:
        """``accepted`` -> ``paid`` with the proven transaction (the claim's value arrived)."""
        assert tx_hash, "a proven transfer names its transaction"
        moved = await self.store.move(
            row.id, (P.ACCEPTED,), P.PAID, now, payment_tx=tx_hash, received=row.amount
        )
        return moved or row

    async def _transfer_job(self, row: PaymentRow, now: int) -> Job | None:
        """The payment's transfer job: linked, or made by a request that died before linking
        it (found by the authorization's salt), or taken again from the stored payload while
        the authorization is valid."""
        if row.transfer_job_id is not None:
            return await self.jobs.get(row.transfer_job_id)
        verified = self.facilitator.check(row.payload.payment(), now, pay_to_ours=self.pay_to)
        if isinstance(verified, Refusal):
            return None
        job = await self.jobs.find_by_salt(self.chain_id, verified.salt)
        if job is None and row.error is None:
            refused = await self.take_transfer(row, verified, now)
            if refused is not None:  # the keeper's attempt: the row stays, failed once it can never pay
                await self.note(row, {"code": refused.reason, "message": refused.message})
            fresh = await self.store.get(row.id)
            return (
                None
                if fresh is None or fresh.transfer_job_id is None
                else await self.jobs.get(fresh.transfer_job_id)
            )
        if job is not None:
            await self.store.move(row.id, (P.ACCEPTED,), P.ACCEPTED, now, transfer_job_id=job.id)
        return job

    async def resume(self) -> int:
        """The payment keeper's step: advance each payment not final that is due (at most
        :data:`KEEPER_BATCH`, the earliest due first) whose lock is free, and put each off by
        :data:`KEEPER_RETRY_S`, so every open payment gets its turn however many never close
        (a new payment is due :data:`KEEPER_GRACE_S` after it was recorded); how many were
        advanced.

        Raises:
            Unavailable: the database failed.
        """
        now = int(self.clock())
        done = 0
        for row in await self.store.due(self.relay.chain_id, now, KEEPER_BATCH):
            async with self.store.locked(row.id) as taken:
                if taken:
                    await self.advance(row.id)
                    done += 1
            await self.store.defer(row.id, int(self.clock()) + KEEPER_RETRY_S)
        return done


def _reason(error: dict[str, Any]) -> str:
    """The x402 reason of a payment that did not happen."""
    code = str(error.get("code", ""))
    if code in (NONCE_USED, USED_OTHERWISE["code"]):
        return NONCE_USED
    if code in ("insufficient_funds", "contract_revert"):
        return "insufficient_funds"
    if code == "invalid_auth_payload":
        return "invalid_exact_evm_payload_authorization_valid_before"
    return "invalid_transaction_state"
