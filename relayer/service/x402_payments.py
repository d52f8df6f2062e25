"""The retirement endpoint as a standard x402 v2 resource (design: docs/design/x402-v2.md,
C4-C6): ``payTo`` is the operator's treasury, and the retirement is then relayed from the
treasury exactly as marketplace orders are (:mod:`relayer.service.market.orders`).

- :meth:`Payments.offer`: the ``exact`` requirement of a 402 for an ``actions/retire`` body:
  the amount (what the treasury's retirement authorization will carry, plus the gas of the
  payment's own transfer in USDC), USDC, the treasury, and a **quote reference**: a stateless
  HMAC (``x402_quote_secret``) over the chain, the request's canonical hash (credit, amount,
  beneficiary and every other field), the amount, asset, payTo, lifetime and expiry, with 16
  random bytes that name it. An unpaid 402 writes nothing.
- :meth:`Payments.pay`: a ``PAYMENT-SIGNATURE`` for the same body: the payload's identical
  authorization is answered from its payment (never a second charge); else the quote
  reference is checked against this body and the echoed requirement, the facilitator's pure
  checks run (:meth:`Facilitator.check`, ``validBefore`` within ``maxTimeoutSeconds``), the
  retirement is re-priced, the payer's balance and nonce read (a used nonce is taken only when
  the chain already holds this very transfer: a front-runner's); then the payment is recorded
  (the quote consumed: ``quote_id`` UNIQUE) with its signed payload, and the payer's transfer
  to the treasury taken as a ``transfer`` job. A refusal, before or by that job, records
  nothing (the row is forgotten; the quote may be used again).
- :meth:`Payments.advance` (the request, then the payment keeper by due time): ``paid`` only
  once the chain proves the transfer (:mod:`relayer.service.proofs`: the token's
  ``AuthorizationUsed`` and ``Transfer`` to the treasury in a successful transaction, ours or
  any sender's), with its transaction and the value received; ``failed`` once the chain shows
  it can never happen (the nonce cancelled or spent elsewhere, or unused past ``validBefore``)
  -> the treasury-signed retirement, whose salt derives from the payment id (at most one live
  job per payment); a retirement that can never execute -> a refund of what was received, a
  treasury-signed ``transferWithAuthorization`` back to the payer whose EIP-3009 nonce derives
  from the payment id (the token allows at most one), done once the chain proves it. One
  payment is driven by one actor at a time (an advisory lock), and a payment moves to
  ``refunding`` only while no retirement job can still execute, so it never ends both retired
  and refunded.

Amounts in USDC atomic units; times in unix seconds."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from eth_utils.crypto import keccak

from relayer.chain.errors import ChainRevert
from relayer.chain.signer import TreasurySigner
from relayer.domain import eip712, fees
from relayer.domain.eip712 import parse_signature, typed_data_digest
from relayer.domain.errors import Rejection, RelayerError, Unavailable
from relayer.domain.payment_states import PaymentState
from relayer.domain.proof import Standing, TransferClaim
from relayer.domain.schemas import ActionRequest
from relayer.domain.states import JobState
from relayer.domain.verify import (
    Refusal,
    TransferAuthorization,
    TransferRequirement,
    VerifiedTransfer,
    request_hash,
    transfer_bound_nonce,
    verify_transfer,
)
from relayer.domain.x402_wire import SCHEME, Payment, PaymentPayload, Requirements
from relayer.service.facilitator import NONCE_USED, VALID_BEFORE, Facilitator, nonce_used
from relayer.service.gas import GasPricer
from relayer.service.outcome import USED_OTHERWISE, RetireOutcome
from relayer.service.prepare import Prepare
from relayer.service.proofs import TransferProofs, search_from
from relayer.service.relay import Relay
from relayer.service.terms import Resolved, resolve
from relayer.store.relay_jobs import Job
from relayer.store.x402_payments import NewPayment, PaymentLedgerRow, PaymentRow, QuoteSpent, X402Payments

log = logging.getLogger(__name__)
P = PaymentState

QUOTE_VERSION: Final = "q1"
TRANSFER_GAS: Final = 100_000
"""Gas priced into the amount for the payment's own ``transferWithAuthorization`` (it uses
about 60 000; the rest is margin, as the retirement's budget has)."""
REFUND_LIFETIME_S: Final = 3600
RETRY_WINDOW_S: Final = 900
"""A paid payment whose retirement keeps failing on an outage is refunded this long after it
was recorded."""
EXPIRY_MARGIN_S: Final = 60
"""A failed retirement's treasury authorization must be this far past its ``validBefore``
(and unused on chain) before its payment is refunded."""
KEEPER_GRACE_S: Final = 5
KEEPER_BATCH: Final = 50
SUCCEEDED: Final = frozenset({JobState.INDEXED})
"""A treasury retirement's job states that retire its payment: indexed, its ``RetirementSettled``
log in the retirement index (a confirmed job is indexed within a block or two)."""
KEEPER_RETRY_S: Final = 2
"""Seconds the keeper puts a payment off after each step (every open payment gets its turn)."""
FRONT_RUN: Final = "front_run"
"""The note of a payment whose transfer another sender submitted before we took it (not a
failure: its proof is that sender's transaction)."""
VALID_BEFORE_SKEW_S: Final = 30
"""How far past ``maxTimeoutSeconds`` an authorization's ``validBefore`` may reach (the
client's clock may run a little ahead of ours)."""
FAILED: Final = frozenset({JobState.REJECTED, JobState.REVERTED, JobState.DROPPED})


def payment_salt(payment_id: uuid.UUID) -> bytes:
    """The salt of payment ``payment_id``'s retirement (one salt: one live job)."""
    return keccak(b"relayer/x402-payment/salt/v1" + payment_id.bytes)


def payment_request_key(payment_id: uuid.UUID) -> bytes:
    """The request key of payment ``payment_id``'s retirement."""
    return keccak(b"relayer/x402-payment/request/v1" + payment_id.bytes)


def refund_nonce(payment_id: uuid.UUID) -> bytes:
    """The EIP-3009 nonce of payment ``payment_id``'s refund: the token itself allows one."""
    return keccak(b"relayer/x402-refund/v1" + payment_id.bytes)


LEDGER_MAX: Final = 100_000
"""At most this many payments in one ``relayer ledger`` (the oldest first)."""


async def payment_ledger(
    store: X402Payments, chain_id: int, token: str, treasury: str, limit: int = LEDGER_MAX
) -> list[PaymentLedgerRow]:
    """Per payment of chain ``chain_id`` (oldest first, at most ``limit``), what the treasury
    received for it and what it paid out on its behalf (USDC ``token`` atomic units;
    ``relayer ledger``, and the test suite's check after every daemon).

    Raises:
        StoreUnavailable: the database failed.
    """
    ids = await store.payment_ids(chain_id, limit)
    keys = [(i, payment_salt(i), transfer_bound_nonce(token, treasury, refund_nonce(i))) for i in ids]
    return await store.ledger(chain_id, keys)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def quote_ref(
    secret: bytes, chain_id: int, request_key: bytes, req: Requirements, expires_at: int, nonce: bytes
) -> str:
    """``q1.<expires_at>.<nonce>.<mac>``: the MAC (HMAC-SHA256, first 16 bytes, base64url)
    binds the chain, the request's hash, the requirement's amount, asset, payTo and
    ``maxTimeoutSeconds``, the expiry and the random ``nonce`` (16 bytes, the quote's id)."""
    message = "|".join(
        (
            QUOTE_VERSION,
            str(chain_id),
            request_key.hex(),
            str(req.amount),
            req.asset.lower(),
            req.pay_to.lower(),
            str(req.max_timeout_s),
            str(expires_at),
            nonce.hex(),
        )
    ).encode()
    mac = hmac.new(secret, message, hashlib.sha256).digest()[:16]
    return f"{QUOTE_VERSION}.{expires_at}.{_b64(nonce)}.{_b64(mac)}"


@dataclass(frozen=True, slots=True)
class Offer:
    """One ``accepts`` entry of the retirement's 402 and what it pays for (``description``)."""

    requirements: Requirements
    description: str


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


class Payments:
    """The standard x402 payment of ``actions/retire`` (see the module)."""

    def __init__(
        self,
        relay: Relay,
        prepare: Prepare,
        gas: GasPricer,
        store: X402Payments,
        facilitator: Facilitator,
        proofs: TransferProofs,
        treasury: TreasurySigner | None,
        secret: bytes | None,
        lifetime_s: int,
        wait_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.relay = relay
        self.prepare = prepare
        self.gas = gas
        self.store = store
        self.facilitator = facilitator
        self.proofs = proofs
        self.treasury = treasury
        self.secret = secret
        self.lifetime_s = lifetime_s
        self.wait_s = wait_s
        self.clock = clock
        self.domain = facilitator.domain
        self.chain_id = relay.chain_id
        self.network = facilitator.network

    @property
    def enabled(self) -> bool:
        """A treasury key and a quote secret are configured."""
        return self.treasury is not None and self.secret is not None

    # ------------------------------------------------------------------ the 402

    async def offer(self, request: ActionRequest, now: int, *, quote: bool = True) -> Offer | None:
        """The ``exact`` requirement for ``request`` (None when the resource is not offered:
        no treasury or quote secret, or an input token other than USDC); with a fresh quote
        reference in ``extra.quoteRef`` unless ``quote`` is False (discovery).

        Raises:
            Rejection: the quote codes of ``request`` (as prepare-auth raises them).
            Unavailable: the chain node failed.
        """
        if not self.enabled or self.relay.supply.token(request.inputToken).key != "usdc":
            return None
        resolved = await self._resolved(request, now)
        prepared, transfer_gas = await asyncio.gather(
            self.prepare.authorization(resolved, now), self._transfer_gas_usdc()
        )
        amount = prepared.value + transfer_gas
        lifetime = min(self.lifetime_s, prepared.valid_before - now)
        extra: dict[str, Any] = {"name": self.domain.name, "version": self.domain.version}
        offered = Requirements(
            SCHEME, self.network, self.domain.address, amount, self._pay_to(), lifetime, extra
        )
        if quote:
            assert self.secret is not None
            ref = quote_ref(
                self.secret, self.chain_id, request_hash(request), offered, now + lifetime, os.urandom(16)
            )
            offered = dataclasses.replace(offered, extra={**extra, "quoteRef": ref})
        route = resolved.route
        what = route.carbon_class.symbol if route.carbon_class else f"listing {route.source_id}"
        description = f"Retire {prepared.terms.summary['amount']} t of {what} (carbon credits), gas included"
        return Offer(offered, description)

    @property
    def pay_to(self) -> str:
        """The treasury's address (checksummed): ``payTo``."""
        assert self.treasury is not None
        return self.treasury.address

    def _pay_to(self) -> str:
        return self.pay_to

    async def _transfer_gas_usdc(self) -> int:
        """The payment transfer's gas (:data:`TRANSFER_GAS` at today's fees, its L1 data and
        operator fees) in USDC atomic units, rounded up."""
        price, eth, (l1, operator) = await asyncio.gather(
            self.gas.price(), self.gas.eth_price(), self.gas.extra_wei(228, TRANSFER_GAS)
        )
        return fees.wei_in_usdc(TRANSFER_GAS * price.max_fee_per_gas + l1 + operator, eth.usdc)

    async def _resolved(self, request: ActionRequest, now: int) -> Resolved:
        """``request`` resolved and attributed as its body says (``from``, beneficiary), then
        paid and retired by the treasury.

        Raises:
            Rejection: the quote and attribution codes.
            Unavailable: the chain node failed.
        """
        r = await resolve(self.relay.supply, request, now)
        # the treasury pays and retires (the contract's retiring address is the payer); the
        # beneficiary stays the one the body names (``beneficiaryIsPayer``: its ``from``)
        return Resolved(self.pay_to, r.route, dataclasses.replace(r.details, retiring_address=self.pay_to))

    # ------------------------------------------------------------------ the paid request

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
                answer = await self._answer(existing)
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
        if not self.enabled:
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
            await self._note(
                row, {"code": FRONT_RUN, "message": "another sender submitted the authorization"}
            )
            return await self._answer(row)
        refused = await self._take_transfer(row, verified, now)
        if refused is not None:
            await self.store.forget(row.id, self.chain_id, verified.salt)
            log.info("x402 payment refused: nothing recorded", extra={"code": refused.reason})
            return refused
        return await self._answer(row)

    def _checked(
        self, request: ActionRequest, payment: Payment, now: int
    ) -> tuple[VerifiedTransfer, str] | Refusal:
        """The quote reference against this body and the echoed requirement, then the
        facilitator's pure checks with the quoted requirement, and ``validBefore`` within the
        quote's ``maxTimeoutSeconds`` (plus :data:`VALID_BEFORE_SKEW_S`); (the transfer, the
        quote's id)."""
        accepted, auth = payment.accepted, payment.authorization
        ref = str(accepted.extra.get("quoteRef", ""))
        parts = ref.split(".")
        if len(parts) != 4 or parts[0] != QUOTE_VERSION or not parts[1].isdigit():
            return Refusal("invalid_payment_requirements", "accepted.extra.quoteRef is missing or malformed")
        expires_at = int(parts[1])
        try:
            nonce = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
        except ValueError:
            return Refusal("invalid_payment_requirements", "accepted.extra.quoteRef is malformed")
        assert self.secret is not None
        expected = quote_ref(self.secret, self.chain_id, request_hash(request), accepted, expires_at, nonce)
        if not hmac.compare_digest(expected, ref):
            return Refusal(
                "invalid_payment_requirements",
                "the quote reference does not match this request and requirement: ask for a new one",
            )
        if expires_at <= now:
            return Refusal(
                "invalid_payment_requirements", "the quote reference has expired: ask for a new one"
            )
        if accepted.pay_to.lower() != self._pay_to().lower():
            return Refusal("invalid_payment_requirements", "payTo is not this operator's treasury")
        checked = self.facilitator.check(payment, now, pay_to_ours=self.pay_to)
        if isinstance(checked, Refusal):
            return checked
        if auth.valid_before > now + accepted.max_timeout_s + VALID_BEFORE_SKEW_S:
            return Refusal(
                VALID_BEFORE,
                "authorization.validBefore must be at most maxTimeoutSeconds "
                f"({accepted.max_timeout_s} s) ahead",
            )
        return checked, parts[2]

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
            resolved = await self._resolved(request, now)
            prepared = await self.prepare.authorization(resolved, now)
        except Rejection as exc:
            return Refusal(
                "invalid_payment_requirements", f"the retirement cannot execute now: {exc.message}"
            )
        if _cost(resolved, prepared.gas_allowance) > verified.value:
            return Refusal(
                "invalid_payment_requirements", "the retirement's price moved above the quote: ask again"
            )
        chain = self.relay.supply.chain
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

    async def _take_transfer(self, row: PaymentRow, verified: VerifiedTransfer, now: int) -> Refusal | None:
        """The payer's transfer to the treasury as a ``transfer`` job, linked to the payment;
        the refusal when the relay refused it before anything was signed (the payer's balance
        less its transfers in flight is short, or the simulation reverted: a short balance, a
        nonce used meanwhile). None when it was taken, or an upstream failed (the keeper takes
        it again)."""
        job: Job | None = None
        try:
            job = await self.relay.accept_transfer(verified, now)
        except ChainRevert as exc:
            job = await self.relay.jobs.find_by_salt(self.chain_id, verified.salt)
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

    async def _note(self, row: PaymentRow, record: dict[str, Any]) -> None:
        """Keep why the payment's transfer did not happen (``{code, message}``)."""
        await self.store.move(row.id, (P.ACCEPTED,), P.ACCEPTED, int(self.clock()), error=record)

    # ------------------------------------------------------------------ driving a payment

    async def _answer(self, row: PaymentRow) -> Paid | Refusal | None:
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
                outcome = await self.relay.outcomes.wait_transfer(row.transfer_job_id, remaining)
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
        transfer = None if row.transfer_job_id is None else await self.relay.jobs.get(row.transfer_job_id)
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
                outcome: RetireOutcome = await self.relay.outcomes.wait(row.retire_job_id, wait_s)
                retirement = outcome.body
            except RelayerError as exc:
                log.info("x402 payment's retirement failed", extra={"payment": str(row.id), "code": exc.code})
        refund = None if row.refund_job_id is None else await self.relay.jobs.get(row.refund_job_id)
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
            row = await self._retire(row, now)
        if row.state is P.REFUNDING:
            row = await self._refund(row, now)
        return row

    def _claim(self, row: PaymentRow) -> TransferClaim:
        """What the payment claims: its amount from the payer to the treasury under its nonce."""
        auth = row.payload.authorization()
        return TransferClaim(
            self.domain.address, row.payer, row.auth_nonce, auth.to, row.amount, auth.valid_before
        )

    async def _settle_transfer(self, row: PaymentRow, now: int) -> PaymentRow:
        """``accepted`` -> ``paid`` once the chain proves the transfer (our transaction or any
        other sender's, :mod:`relayer.service.proofs`), with its transaction and value;
        -> ``failed`` once the chain shows it can never happen (the nonce used otherwise, or
        unused past ``validBefore`` at the confirmed block): nothing was charged."""
        job = await self._transfer_job(row, now)
        if job is not None:
            try:
                outcome = await self.relay.outcomes.wait_transfer(job.id, 0)
            except Unavailable:
                return row
            if outcome.success:
                return await self._to_paid(row, outcome.tx_hash, now)
            if not outcome.final:
                return row
            if row.error is None:
                error = outcome.error or {"code": "transaction_reverted", "message": "the transfer reverted"}
                await self._note(row, {"code": error.get("code"), "message": error.get("message")})
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
                await self._note(row, record)
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
            return await self.relay.jobs.get(row.transfer_job_id)
        verified = self.facilitator.check(row.payload.payment(), now, pay_to_ours=self.pay_to)
        if isinstance(verified, Refusal):
            return None
        job = await self.relay.jobs.find_by_salt(self.chain_id, verified.salt)
        if job is None and row.error is None:
            refused = await self._take_transfer(row, verified, now)
            if refused is not None:  # the keeper's attempt: the row stays, failed once it can never pay
                await self._note(row, {"code": refused.reason, "message": refused.message})
            fresh = await self.store.get(row.id)
            return (
                None
                if fresh is None or fresh.transfer_job_id is None
                else await self.relay.jobs.get(fresh.transfer_job_id)
            )
        if job is not None:
            await self.store.move(row.id, (P.ACCEPTED,), P.ACCEPTED, now, transfer_job_id=job.id)
        return job

    async def _retire(self, row: PaymentRow, now: int) -> PaymentRow:
        """``paid``/``retiring``: link or make the treasury's retirement; ``retired`` when the
        retirement index holds its ``RetirementSettled`` log (its job indexed, or another
        sender's transaction settled it); ``refunding`` when it can never execute."""
        job = await self.relay.jobs.find_by_salt(self.chain_id, payment_salt(row.id))
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
            return await self._to_refund(row, {"code": outage.code, "message": outage.message}, now)
        except RelayerError as refusal:
            job = await self.relay.jobs.find_by_salt(self.chain_id, payment_salt(row.id))
            if job is not None and job.state not in FAILED:
                return (
                    await self.store.move(row.id, (P.PAID, P.RETIRING), P.RETIRING, now, retire_job_id=job.id)
                    or row
                )
            if job is not None:
                return await self._after_failed_retirement(row, job, now)
            return await self._to_refund(row, {"code": refusal.code, "message": refusal.message}, now)
        return (
            await self.store.move(row.id, (P.PAID, P.RETIRING), P.RETIRING, now, retire_job_id=made.id) or row
        )

    async def _make_retirement(self, row: PaymentRow, now: int) -> Job:
        """The treasury-signed retirement of the paid request (the OrderDesk pattern).

        Raises:
            RelayerError: the relay's refusals (the retirement cannot execute as paid).
            Unavailable: the node or the database failed.
        """
        treasury = self.treasury
        assert treasury is not None
        resolved = await self._resolved(row.request, now)
        prepared = await self.prepare.authorization(resolved, now, payment_salt(row.id))
        if _cost(resolved, prepared.gas_allowance) > row.amount:
            raise Rejection("insufficient_authorized_value", "the retirement now costs more than was paid")
        signature = parse_signature(treasury.sign_digest(typed_data_digest(prepared.typed_data)))
        return await self.relay.accept_authorization(
            resolved, self.prepare.signed(prepared, signature), payment_request_key(row.id), now
        )

    async def _after_failed_retirement(self, row: PaymentRow, job: Job, now: int) -> PaymentRow:
        """A failed retirement job: retired if the retirement index holds a ``RetirementSettled``
        log of its bound nonce (another sender settled the treasury's authorization); refunded
        once it can provably never execute (never signed, or expired and not settled); else
        left for a later step."""
        settled = await self.relay.outcomes.retirements.by_bound_nonce(self.chain_id, job.bound_nonce)
        if settled:
            return (
                await self.store.move(row.id, (P.PAID, P.RETIRING), P.RETIRED, now, retire_job_id=job.id)
                or row
            )
        if job.tx_hash is not None and now <= await self.store.expires_at(job.id) + EXPIRY_MARGIN_S:
            return row
        error = job.error or {"code": "transaction_reverted", "message": job.state.value}
        record = {"code": error.get("code"), "message": error.get("message")}
        return await self._to_refund(row, record, now, retire_job_id=job.id)

    async def _to_refund(
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
        return row if moved is None else await self._refund(moved, now)

    async def _refund(self, row: PaymentRow, now: int) -> PaymentRow:
        """``refunding``: the treasury's transfer of what it received back to the payer (nonce
        :func:`refund_nonce`, the operator pays the gas); ``refunded`` once the chain proves it."""
        job = None if row.refund_job_id is None else await self.relay.jobs.get(row.refund_job_id)
        if job is None or job.state is JobState.REJECTED:
            try:
                job = await self.relay.accept_transfer(self._refund_transfer(row, now), now)
            except RelayerError as exc:
                log.warning("x402 refund not taken yet", extra={"payment": str(row.id), "code": exc.code})
                return row
            row = await self.store.move(row.id, (P.REFUNDING,), P.REFUNDING, now, refund_job_id=job.id) or row
        if job.state is JobState.CONFIRMED:
            try:
                proven = (await self.relay.outcomes.wait_transfer(job.id, 0)).success
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
        for row in await self.store.due(now, KEEPER_BATCH):
            async with self.store.locked(row.id) as taken:
                if taken:
                    await self.advance(row.id)
                    done += 1
            await self.store.defer(row.id, int(self.clock()) + KEEPER_RETRY_S)
        return done


def _cost(resolved: Resolved, gas_allowance: int) -> int:
    """What the retirement costs now (the quoted total and the gas allowance, USDC atomic
    units): it must fit in the amount paid. The treasury signs more (the slippage budget of a
    class retirement); what is not spent comes back to it."""
    return resolved.route.quote.total + gas_allowance


@dataclass(frozen=True, slots=True)
class Payable:
    """A payment that may be taken: where its proof is searched from (a block number), and
    whether the chain already holds its transfer (``front_run``: no transfer job of ours)."""

    from_block: int
    front_run: bool


def _claim_of(verified: VerifiedTransfer) -> TransferClaim:
    """What a verified authorization claims: its value from the payer to ``to`` under its nonce."""
    return TransferClaim(
        verified.token, verified.payer, verified.nonce, verified.to, verified.value, verified.valid_before
    )


def _same_authorization(row: PaymentRow, verified: VerifiedTransfer) -> bool:
    return row.payer.lower() == verified.payer.lower() and row.auth_nonce == verified.nonce


def _quote_consumed() -> Refusal:
    return Refusal("quote_consumed", "this quote reference was already used by another payment")


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
