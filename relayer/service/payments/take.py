"""Taking a standard x402 payment of ``actions/retire`` (design: docs/design/x402-v2.md, C5):
a ``PAYMENT-SIGNATURE`` for the body its quote was made for. The payload's identical
authorization is answered from its payment (never a second charge); else the quote reference
is checked against this body and the echoed requirement, the facilitator's pure checks run
(:meth:`Facilitator.check`, ``validBefore`` within ``maxTimeoutSeconds``), the retirement is
re-priced, the payer's balance and nonce read (a used nonce is taken only when the chain
already holds this very transfer: a front-runner's); then the payment is recorded (the quote
consumed: ``quote_id`` UNIQUE) with its signed payload, and the payer's transfer to the
treasury taken as a ``transfer`` job. A refusal, before or by that job, records nothing (the
row is forgotten; the quote may be used again). Amounts in USDC atomic units."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Final

from relayer.chain.reads import ChainReads
from relayer.domain.errors import Rejection
from relayer.domain.proof import TransferClaim
from relayer.domain.schemas import ActionRequest
from relayer.domain.verify import Refusal, VerifiedTransfer, request_hash
from relayer.domain.x402_wire import Payment, PaymentPayload
from relayer.service.payments.drive import FRONT_RUN, KEEPER_GRACE_S, Driver, Paid
from relayer.service.payments.facilitator import NONCE_USED, VALID_BEFORE, Facilitator
from relayer.service.payments.offer import Quoting
from relayer.service.prepare import Prepare
from relayer.service.proofs import TransferProofs, search_from
from relayer.service.treasury import retirement_cost
from relayer.store.x402_payments import NewPayment, PaymentRow, QuoteSpent, X402Payments

log = logging.getLogger(__name__)

VALID_BEFORE_SKEW_S: Final = 30
"""How far past ``maxTimeoutSeconds`` an authorization's ``validBefore`` may reach (the
client's clock may run a little ahead of ours)."""


@dataclass(frozen=True, slots=True)
class Payable:
    """A payment that may be taken: where its proof is searched from (a block number), and
    whether the chain already holds its transfer (``front_run``: no transfer job of ours)."""

    from_block: int
    front_run: bool


class Taking:
    """Takes a new payment (see the module): the quotes it was made under, the facilitator's
    checks, the payer's balance and nonce on chain and the proofs of a front-runner's
    transfer; the driver then takes its transfer and answers it."""

    def __init__(
        self,
        quoting: Quoting,
        prepare: Prepare,
        facilitator: Facilitator,
        store: X402Payments,
        reads: ChainReads,
        proofs: TransferProofs,
        driver: Driver,
    ) -> None:
        self.quoting = quoting
        self.prepare = prepare
        self.facilitator = facilitator
        self.store = store
        self.reads = reads
        self.proofs = proofs
        self.driver = driver
        self.chain_id = quoting.chain_id

    async def pay(self, request: ActionRequest, payload: PaymentPayload, now: int) -> Paid | Refusal:
        """Take the payment of ``request`` (see the module) and answer it within the wait:
        :class:`Paid` once recorded (HTTP 200), :class:`Refusal` (HTTP 402 with a fresh quote)
        when nothing was charged. The same payload posted again, or at the same time, is
        answered from its payment; a refusal records nothing (the quote may be used again).

        Raises:
            Unavailable: the database or the node failed before the payment was recorded.
        """
        payload_hash, payment = payload.digest(), payload.payment()
        authorization = payment.authorization
        for _ in range(3):  # a twin's payment refused and forgotten meanwhile: take it anew
            existing = await self.store.by_authorization(
                self.chain_id, authorization.payer, authorization.nonce
            )
            if existing is not None:
                if existing.payload_hash != payload_hash:
                    return Refusal(NONCE_USED, "this authorization paid another request")
                answer = await self.driver.answer(existing)
            else:
                answer = await self._take(request, payment, payload, payload_hash, now)
            if answer is not None:
                return answer
        return Refusal("invalid_transaction_state", "the payment was refused meanwhile: ask for a new quote")

    async def _take(
        self,
        request: ActionRequest,
        payment: Payment,
        payload: PaymentPayload,
        payload_hash: bytes,
        now: int,
    ) -> Paid | Refusal | None:
        """A new payment: checked (the quote, the facilitator's pure checks, the price, the
        payer's balance and unused nonce), recorded under its own lock with its transfer job;
        a refusal of the transfer forgets the row. None when the same authorization's payment
        was recorded by a concurrent request (answer from it).

        Raises:
            Unavailable: the database or the node failed before the payment was recorded.
        """
        if not self.quoting.enabled:
            return Refusal("unsupported_scheme", "this operator takes no standard x402 payments")
        checked = self._checked(request, payment, now)
        if isinstance(checked, Refusal):
            return checked
        verified, quote_id = checked
        spent = await self.store.by_quote(quote_id)
        if spent is not None:
            return None if _same_authorization(spent, verified) else _quote_consumed()
        payable = await self._payable(request, verified, now)
        if isinstance(payable, Refusal):
            return payable
        new = NewPayment(
            uuid.uuid4(),
            self.chain_id,
            quote_id,
            request_hash(request),
            request,
            payload,
            payload_hash,
            verified.payer,
            verified.nonce,
            verified.value,
            payable.from_block,
        )
        try:
            row = await self.store.record(new, now, now + KEEPER_GRACE_S)
        except QuoteSpent:
            spent = await self.store.by_quote(quote_id)
            same = spent is not None and _same_authorization(spent, verified)
            return None if same else _quote_consumed()
        if row.id != new.id:
            return None
        if payable.front_run:  # no transfer of ours: the proof is the front-runner's transaction
            await self.driver.note(
                row, {"code": FRONT_RUN, "message": "another sender submitted the authorization"}
            )
            return await self.driver.answer(row)
        refused = await self.driver.take_transfer(row, verified, now)
        if refused is not None:
            await self.store.forget(row.id, self.chain_id, verified.salt)
            log.info("x402 payment refused: nothing recorded", extra={"code": refused.reason})
            return refused
        return await self.driver.answer(row)

    def _checked(
        self, request: ActionRequest, payment: Payment, now: int
    ) -> tuple[VerifiedTransfer, str] | Refusal:
        """The quote reference against this body and the echoed requirement
        (:meth:`Quoting.check_quote`), then the facilitator's pure checks with the quoted
        requirement, and ``validBefore`` within the quote's ``maxTimeoutSeconds`` (plus
        :data:`VALID_BEFORE_SKEW_S`); (the transfer, the quote's id)."""
        accepted, auth = payment.accepted, payment.authorization
        quote_id = self.quoting.check_quote(request, accepted, now)
        if isinstance(quote_id, Refusal):
            return quote_id
        checked = self.facilitator.check(payment, now, pay_to_ours=self.quoting.pay_to)
        if isinstance(checked, Refusal):
            return checked
        if auth.valid_before > now + accepted.max_timeout_s + VALID_BEFORE_SKEW_S:
            return Refusal(
                VALID_BEFORE,
                "authorization.validBefore must be at most maxTimeoutSeconds "
                f"({accepted.max_timeout_s} s) ahead",
            )
        return checked, quote_id

    async def _payable(
        self, request: ActionRequest, verified: VerifiedTransfer, now: int
    ) -> Payable | Refusal:
        """Before any money moves: the retirement still executes within the amount paid, and
        the payer holds the amount with its nonce unused, or the chain already holds this very
        transfer (a front-runner submitted the payload: ``front_run``). A used nonce with no
        such transfer pays nothing (it was cancelled, or spent on another authorization). With
        the block the payment's proof is searched from (:func:`search_from` of the block the
        balance was read at).

        Raises:
            Unavailable: the chain node failed.
        """
        try:
            resolved = await self.quoting.resolved(request, now)
            prepared = await self.prepare.authorization(resolved, now)
        except Rejection as exc:
            return Refusal(
                "invalid_payment_requirements", f"the retirement cannot execute now: {exc.message}"
            )
        if retirement_cost(resolved, prepared.gas_allowance) > verified.value:
            return Refusal(
                "invalid_payment_requirements", "the retirement's price moved above the quote: ask again"
            )
        chain = self.reads
        held, used = await asyncio.gather(
            chain.balance_latest(verified.token, verified.payer),
            chain.authorization_state(verified.token, verified.payer, verified.nonce),
        )
        from_block = search_from(held.block_number)
        if used:  # paid only if the chain holds this very transfer (a front-runner's submission)
            judged = await self.proofs.judge(_claim_of(verified), from_block)
            if judged.proof is None:
                return Refusal(NONCE_USED, "the authorization's nonce is already used or cancelled")
            return Payable(from_block, front_run=True)
        if held.amount < verified.value:
            return Refusal("insufficient_funds", "the payer's balance does not cover the amount")
        return Payable(from_block, front_run=False)


def _claim_of(verified: VerifiedTransfer) -> TransferClaim:
    """What a verified authorization claims: its value from the payer to ``to`` under its nonce."""
    return TransferClaim(
        verified.token, verified.payer, verified.nonce, verified.to, verified.value, verified.valid_before
    )


def _same_authorization(row: PaymentRow, verified: VerifiedTransfer) -> bool:
    return row.payer.lower() == verified.payer.lower() and row.auth_nonce == verified.nonce


def _quote_consumed() -> Refusal:
    return Refusal("quote_consumed", "this quote reference was already used by another payment")
