"""The treasury's retirement of a paid x402 payment (design: docs/design/x402-v2.md, C6):
the paid request, resolved and signed by the treasury as marketplace orders are
(:mod:`relayer.service.market.orders`), its salt derived from the payment id (at most one
live job per payment); ``retired`` once the retirement index holds its ``RetirementSettled``
log; a retirement that can never execute is refunded (:mod:`relayer.service.payments.refund`),
and a payment moves to ``refunding`` only while no retirement job can still execute, so it
never ends both retired and refunded."""

from __future__ import annotations

import logging
from typing import Final

from relayer.chain.signer import TreasurySigner
from relayer.domain.errors import RelayerError, Unavailable
from relayer.domain.payment_states import PaymentState
from relayer.domain.states import JobState
from relayer.service.payments.offer import Quoting
from relayer.service.payments.quotes import payment_request_key, payment_salt
from relayer.service.payments.refund import Refunds
from relayer.service.treasury import TreasuryRetirements
from relayer.store.relay_jobs import Job, RelayJobs
from relayer.store.retirements import RetirementStore
from relayer.store.x402_payments import PaymentRow, X402Payments

log = logging.getLogger(__name__)
P = PaymentState

RETRY_WINDOW_S: Final = 900
"""A paid payment whose retirement keeps failing on an outage is refunded this long after it
was recorded."""
EXPIRY_MARGIN_S: Final = 60
"""A failed retirement's treasury authorization must be this far past its ``validBefore``
(and unused on chain) before its payment is refunded."""
SUCCEEDED: Final = frozenset({JobState.INDEXED})
"""A treasury retirement's job states that retire its payment: indexed, its ``RetirementSettled``
log in the retirement index (a confirmed job is indexed within a block or two)."""
FAILED: Final = frozenset({JobState.REJECTED, JobState.REVERTED, JobState.DROPPED})
"""A job's states that end it without its effect."""


class Retiring:
    """Makes and follows paid payments' treasury retirements: the payments' store, the relay's
    jobs, the retirement index, the quotes' resolution, the treasury's signed retirements and
    the treasury; refunds when it cannot execute."""

    def __init__(
        self,
        store: X402Payments,
        jobs: RelayJobs,
        index: RetirementStore,
        quoting: Quoting,
        signed: TreasuryRetirements,
        treasury: TreasurySigner | None,
        refunds: Refunds,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.index = index
        self.quoting = quoting
        self.signed = signed
        self.treasury = treasury
        self.refunds = refunds
        self.chain_id = quoting.chain_id

    async def retire(self, row: PaymentRow, now: int) -> PaymentRow:
        """``paid``/``retiring``: link or make the treasury's retirement; ``retired`` when the
        retirement index holds its ``RetirementSettled`` log (its job indexed, or another
        sender's transaction settled it); ``refunding`` when it can never execute."""
        job = await self.jobs.find_by_salt(self.chain_id, payment_salt(row.id))
        if job is not None and job.request_hash == payment_request_key(row.id):
            if job.state in SUCCEEDED:
                return (
                    await self.store.move(row.id, (P.PAID, P.RETIRING), P.RETIRED, now, retire_job_id=job.id)
                    or row
                )
            if job.state not in FAILED:
                return (
                    await self.store.move(row.id, (P.PAID, P.RETIRING), P.RETIRING, now, retire_job_id=job.id)
                    or row
                )
            return await self._after_failed_retirement(row, job, now)
        try:
            made = await self._make_retirement(row, now)
        except Unavailable as outage:
            if now - row.created_at < RETRY_WINDOW_S:
                log.warning(
                    "x402 retirement waits for its upstream",
                    extra={"payment": str(row.id), "upstream": outage.context.get("upstream")},
                )
                return row
            return await self.refunds.to_refund(row, {"code": outage.code, "message": outage.message}, now)
        except RelayerError as refusal:
            job = await self.jobs.find_by_salt(self.chain_id, payment_salt(row.id))
            if job is not None and job.state not in FAILED:
                return (
                    await self.store.move(row.id, (P.PAID, P.RETIRING), P.RETIRING, now, retire_job_id=job.id)
                    or row
                )
            if job is not None:
                return await self._after_failed_retirement(row, job, now)
            return await self.refunds.to_refund(row, {"code": refusal.code, "message": refusal.message}, now)
        return (
            await self.store.move(row.id, (P.PAID, P.RETIRING), P.RETIRING, now, retire_job_id=made.id) or row
        )

    async def _make_retirement(self, row: PaymentRow, now: int) -> Job:
        """The treasury-signed retirement of the paid request (the OrderDesk pattern).

        Raises:
            RelayerError: the relay's refusals (the retirement cannot execute as paid).
            Unavailable: the node or the database failed.
        """
        assert self.treasury is not None
        resolved = await self.quoting.resolved(row.request, now)
        salt, key = payment_salt(row.id), payment_request_key(row.id)
        return await self.signed.accept(self.treasury, resolved, salt, key, now, ceiling=row.amount)

    async def _after_failed_retirement(self, row: PaymentRow, job: Job, now: int) -> PaymentRow:
        """A failed retirement job: retired if the retirement index holds a ``RetirementSettled``
        log of its bound nonce (another sender settled the treasury's authorization); refunded
        once it can provably never execute (never signed, or expired and not settled); else
        left for a later step."""
        settled = await self.index.by_bound_nonce(self.chain_id, job.bound_nonce)
        if settled:
            return (
                await self.store.move(row.id, (P.PAID, P.RETIRING), P.RETIRED, now, retire_job_id=job.id)
                or row
            )
        if job.tx_hash is not None and now <= await self.store.expires_at(job.id) + EXPIRY_MARGIN_S:
            return row
        error = job.error or {"code": "transaction_reverted", "message": job.state.value}
        record = {"code": error.get("code"), "message": error.get("message")}
        return await self.refunds.to_refund(row, record, now, retire_job_id=job.id)
