"""Refunds of x402 payments whose retirement can never execute (design:
docs/design/x402-v2.md, C6): what the treasury received, back to the payer by a
treasury-signed ``transferWithAuthorization`` whose EIP-3009 nonce derives from the payment id
(the token allows at most one), the operator paying the gas; ``refunded`` once the chain
proves it. Only a payment the chain proved paid is ever refunded. Amounts in USDC atomic
units; times in unix seconds."""

from __future__ import annotations

import logging
from typing import Any, Final

from relayer.chain.signer import TreasurySigner
from relayer.domain import eip712
from relayer.domain.eip712 import typed_data_digest
from relayer.domain.errors import Rejection, RelayerError, Unavailable
from relayer.domain.payment_states import PaymentState
from relayer.domain.states import JobState
from relayer.domain.verify import (
    Refusal,
    TokenDomain,
    TransferAuthorization,
    TransferRequirement,
    VerifiedTransfer,
    verify_transfer,
)
from relayer.service.outcome import Outcomes
from relayer.service.payments.quotes import refund_nonce
from relayer.service.relay import Relay
from relayer.store.relay_jobs import RelayJobs
from relayer.store.x402_payments import PaymentRow, X402Payments

log = logging.getLogger(__name__)
P = PaymentState

REFUND_LIFETIME_S: Final = 3600
"""How long a refund's authorization is valid (seconds)."""


class Refunds:
    """Takes and follows refunds: the payments' store, the relay that takes the refund's
    transfer and its jobs and outcomes, the treasury that signs it, the token's domain."""

    def __init__(
        self,
        store: X402Payments,
        relay: Relay,
        jobs: RelayJobs,
        outcomes: Outcomes,
        treasury: TreasurySigner | None,
        domain: TokenDomain,
    ) -> None:
        self.store = store
        self.relay = relay
        self.jobs = jobs
        self.outcomes = outcomes
        self.treasury = treasury
        self.domain = domain

    async def to_refund(
        self, row: PaymentRow, error: dict[str, Any], now: int, retire_job_id: int | None = None
    ) -> PaymentRow:
        """Move a payment whose retirement can never execute to ``refunding`` (why:
        ``error``) and take its refund: only a payment the chain proved paid (``received``)."""
        if row.payment_tx is None or not row.received:
            log.error("x402 payment not proven paid: never refunded", extra={"payment": str(row.id)})
            return row
        log.warning(
            "x402 payment refunded: its retirement cannot execute",
            extra={"payment": str(row.id), "code": error.get("code")},
        )
        moved = await self.store.move(
            row.id,
            (P.PAID, P.RETIRING),
            P.REFUNDING,
            now,
            retire_job_id=retire_job_id,
            refund_valid_before=now + REFUND_LIFETIME_S,
            error=error,
        )
        return row if moved is None else await self.refund(moved, now)

    async def refund(self, row: PaymentRow, now: int) -> PaymentRow:
        """``refunding``: the treasury's transfer of what it received back to the payer (nonce
        :func:`refund_nonce`, the operator pays the gas); ``refunded`` once the chain proves it."""
        job = None if row.refund_job_id is None else await self.jobs.get(row.refund_job_id)
        if job is None or job.state is JobState.REJECTED:
            try:
                job = await self.relay.accept_transfer(self._refund_transfer(row, now), now)
            except RelayerError as exc:
                log.warning("x402 refund not taken yet", extra={"payment": str(row.id), "code": exc.code})
                return row
            row = await self.store.move(row.id, (P.REFUNDING,), P.REFUNDING, now, refund_job_id=job.id) or row
        if job.state is JobState.CONFIRMED:
            try:
                proven = (await self.outcomes.wait_transfer(job.id, 0)).success
            except Unavailable:
                return row
            if proven:
                return await self.store.move(row.id, (P.REFUNDING,), P.REFUNDED, now) or row
        return row

    def _refund_transfer(self, row: PaymentRow, now: int) -> VerifiedTransfer:
        treasury = self.treasury
        assert treasury is not None and row.refund_valid_before is not None and row.received
        d, nonce, value = self.domain, refund_nonce(row.id), row.received
        typed = eip712.transfer_with_authorization(
            chain_id=d.chain_id,
            usdc=d.address,
            payer=treasury.address,
            to=row.payer,
            value=value,
            valid_after=0,
            valid_before=row.refund_valid_before,
            nonce=nonce,
            name=d.name,
            version=d.version,
        )
        signature = treasury.sign_digest(typed_data_digest(typed))
        auth = TransferAuthorization(
            treasury.address, row.payer, value, 0, row.refund_valid_before, nonce, signature
        )
        verified = verify_transfer(auth, TransferRequirement(d.address, row.payer, value), d, now)
        if isinstance(verified, Refusal):
            raise Rejection("internal_error", f"the refund does not verify: {verified.message}")
        return verified
