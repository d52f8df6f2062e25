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
  checks run (:meth:`Facilitator.check`), the retirement is re-priced, the payer's balance
  read; then the payment is recorded (the quote consumed: ``quote_id`` UNIQUE) with its
  signed payload, and the payer's transfer to the treasury taken as a ``transfer`` job.
- :meth:`Payments.advance` (the request, then the payment keeper): the transfer confirmed
  (or the authorization used by another sender: a front-runner can only move the funds to
  the treasury) -> the treasury-signed retirement, whose salt derives from the payment id
  (at most one live job per payment); a retirement that can never execute -> a refund, a
  treasury-signed ``transferWithAuthorization`` back to the payer whose EIP-3009 nonce derives
  from the payment id (the token allows at most one). One payment is driven by one actor at
  a time (an advisory lock), and a payment moves to ``refunding`` only while no retirement
  job can still execute, so it never ends both retired and refunded.

Amounts in USDC atomic units; times in unix seconds."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import json
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
from relayer.domain.addresses import checksum_address
from relayer.domain.eip712 import parse_signature, typed_data_digest
from relayer.domain.errors import Rejection, RelayerError, Unavailable
from relayer.domain.schemas import ActionRequest
from relayer.domain.states import JobState
from relayer.domain.verify import (
    TransferAuthorization,
    TransferRefusal,
    TransferRequirement,
    VerifiedTransfer,
    request_hash,
    verify_transfer,
)
from relayer.service.facilitator import SCHEME, Facilitator, Payment, Refused, Requirements
from relayer.service.gas import GasPricer
from relayer.service.outcome import RetireOutcome
from relayer.service.prepare import Prepare
from relayer.service.relay import Relay
from relayer.service.terms import Resolved, resolve
from relayer.store.relay_jobs import Job
from relayer.store.x402_payments import NewPayment, PaymentRow, QuoteSpent, X402Payments

log = logging.getLogger(__name__)

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
KEEPER_BATCH: Final = 20
SUCCEEDED: Final = frozenset({JobState.CONFIRMED, JobState.INDEXED})
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
        core = Requirements(SCHEME, self.network, self.domain.address, amount, self._pay_to(), lifetime)
        if quote:
            assert self.secret is not None
            ref = quote_ref(
                self.secret, self.chain_id, request_hash(request), core, now + lifetime, os.urandom(16)
            )
            extra["quoteRef"] = ref
        route = resolved.route
        what = route.carbon_class.symbol if route.carbon_class else f"listing {route.source_id}"
        description = f"Retire {prepared.terms.summary['amount']} t of {what} (carbon credits), gas included"
        return Offer(
            Requirements(SCHEME, self.network, self.domain.address, amount, self._pay_to(), lifetime, extra),
            description,
        )

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

    async def pay(
        self,
        request: ActionRequest,
        accepted: Requirements,
        authorization: TransferAuthorization,
        payload: dict[str, Any],
        now: int,
    ) -> Paid | Refused:
        """Take the payment of ``request`` (see the module) and answer it within the wait:
        :class:`Paid` once recorded (HTTP 200), :class:`Refused` (HTTP 402 with a fresh quote)
        when nothing was charged.

        Raises:
            Unavailable: the database or the node failed before the payment was recorded.
        """
        payload_hash = keccak(text=json.dumps(payload, sort_keys=True, separators=(",", ":")))
        existing = await self.store.by_authorization(self.chain_id, authorization.payer, authorization.nonce)
        if existing is not None:
            if existing.payload_hash != payload_hash:
                return Refused(
                    "invalid_exact_evm_nonce_already_used", "this authorization paid another request"
                )
            return await self._answer(existing)
        if not self.enabled:
            return Refused("unsupported_scheme", "this operator takes no standard x402 payments")
        checked = self._checked(request, accepted, authorization, now)
        if isinstance(checked, Refused):
            return checked
        verified, quote_id = checked
        if await self.store.quote_used(quote_id):
            return Refused("quote_consumed", "this quote reference was already used by another payment")
        refused = await self._payable(request, verified, now)
        if refused is not None:
            return refused
        new = NewPayment(
            uuid.uuid4(),
            self.chain_id,
            quote_id,
            request_hash(request),
            request.model_dump(mode="json", by_alias=True, exclude_none=True),
            payload,
            payload_hash,
            verified.payer,
            verified.nonce,
            verified.value,
        )
        try:
            row = await self.store.record(new, now)
        except QuoteSpent:
            return Refused("quote_consumed", "this quote reference was already used by another payment")
        if row.id == new.id:
            await self._take_transfer(row, verified, now)
        return await self._answer(row)

    def _checked(
        self, request: ActionRequest, accepted: Requirements, auth: TransferAuthorization, now: int
    ) -> tuple[VerifiedTransfer, str] | Refused:
        """The quote reference against this body and the echoed requirement, then the
        facilitator's pure checks with the quoted requirement; (the transfer, the quote's id)."""
        ref = str(accepted.extra.get("quoteRef", ""))
        parts = ref.split(".")
        if len(parts) != 4 or parts[0] != QUOTE_VERSION or not parts[1].isdigit():
            return Refused("invalid_payment_requirements", "accepted.extra.quoteRef is missing or malformed")
        expires_at = int(parts[1])
        try:
            nonce = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
        except ValueError:
            return Refused("invalid_payment_requirements", "accepted.extra.quoteRef is malformed")
        assert self.secret is not None
        core = Requirements(
            accepted.scheme,
            accepted.network,
            accepted.asset,
            accepted.amount,
            accepted.pay_to,
            accepted.max_timeout_s,
        )
        expected = quote_ref(self.secret, self.chain_id, request_hash(request), core, expires_at, nonce)
        if not hmac.compare_digest(expected, ref):
            return Refused(
                "invalid_payment_requirements",
                "the quote reference does not match this request and requirement: ask for a new one",
            )
        if expires_at <= now:
            return Refused(
                "invalid_payment_requirements", "the quote reference has expired: ask for a new one"
            )
        if accepted.pay_to.lower() != self._pay_to().lower():
            return Refused("invalid_payment_requirements", "payTo is not this operator's treasury")
        checked = self.facilitator.check(Payment(accepted, accepted, auth), now)
        if isinstance(checked, Refused):
            return checked
        return checked, parts[2]

    async def _payable(self, request: ActionRequest, verified: VerifiedTransfer, now: int) -> Refused | None:
        """Before any money moves: the retirement still executes within the amount paid, and
        the payer can pay (or already did: its authorization used on chain).

        Raises:
            Unavailable: the chain node failed.
        """
        try:
            resolved = await self._resolved(request, now)
            prepared = await self.prepare.authorization(resolved, now)
        except Rejection as exc:
            return Refused(
                "invalid_payment_requirements", f"the retirement cannot execute now: {exc.message}"
            )
        if _cost(resolved, prepared.gas_allowance) > verified.value:
            return Refused(
                "invalid_payment_requirements", "the retirement's price moved above the quote: ask again"
            )
        chain = self.relay.supply.chain
        held, used = await asyncio.gather(
            chain.balance_now(verified.token, verified.payer),
            chain.authorization_state(verified.token, verified.payer, verified.nonce),
        )
        if not used and held < verified.value:
            return Refused("insufficient_funds", "the payer's balance does not cover the amount")
        return None

    async def _take_transfer(self, row: PaymentRow, verified: VerifiedTransfer, now: int) -> None:
        """The payer's transfer to the treasury as a ``transfer`` job, linked to the payment.
        A refusal with no job leaves the payment ``accepted`` with its error: it fails once the
        authorization expired unused, and is paid (and retired) if another sender uses it."""
        job: Job | None = None
        try:
            job = await self.relay.accept_transfer(verified, now)
        except ChainRevert as exc:
            job = await self.relay.jobs.find_by_salt(self.chain_id, verified.salt)
            if job is None:
                await self._note(row, {"code": "insufficient_funds", "message": exc.message})
        except Unavailable:
            log.warning(
                "x402 payment waits for its upstream; the payment keeper takes it",
                extra={"payment": str(row.id)},
            )
        except RelayerError as exc:
            await self._note(row, {"code": exc.code, "message": exc.message})
        if job is not None:
            await self.store.move(
                row.id, ("accepted",), "accepted", int(self.clock()), transfer_job_id=job.id
            )

    async def _note(self, row: PaymentRow, record: dict[str, Any]) -> None:
        """Keep why the payment's transfer did not happen (``{code, message}``)."""
        await self.store.move(row.id, ("accepted",), "accepted", int(self.clock()), error=record)

    # ------------------------------------------------------------------ driving a payment

    async def _answer(self, row: PaymentRow) -> Paid | Refused:
        """Drive the payment within the wait (see :meth:`advance`) and answer from it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while True:
            remaining = max(0.0, deadline - loop.time())
            async with self.store.locked(row.id) as taken:
                if taken:
                    row = await self.advance(row.id, remaining)
            if taken or remaining <= 0:
                break
            await asyncio.sleep(min(0.2, remaining))  # the keeper holds it for a moment
        fresh = await self.store.get(row.id)
        assert fresh is not None
        return await self._paid(fresh, max(0.0, deadline - loop.time()))

    async def _paid(self, row: PaymentRow, wait_s: float) -> Paid | Refused:
        """The answer of a payment as it stands (waiting at most ``wait_s`` for a retirement
        on its way)."""
        transfer = None if row.transfer_job_id is None else await self.relay.jobs.get(row.transfer_job_id)
        paid = row.payment_tx is not None or row.state not in ("accepted", "failed")
        if not paid and (
            row.state == "failed" or (row.error and (transfer is None or transfer.state in FAILED))
        ):
            error = row.error or {}
            return Refused(_reason(error), str(error.get("message", "the payment did not happen")))
        tx = row.payment_tx if paid else (None if transfer is None else transfer.tx_hash)
        retirement: dict[str, Any] | None = None
        if row.retire_job_id is not None and row.state in ("retiring", "retired"):
            try:
                outcome: RetireOutcome = await self.relay.outcomes.wait(row.retire_job_id, wait_s)
                retirement = outcome.body
            except RelayerError as exc:
                log.info("x402 payment's retirement failed", extra={"payment": str(row.id), "code": exc.code})
        refund = None if row.refund_job_id is None else await self.relay.jobs.get(row.refund_job_id)
        return Paid(row, paid, tx, retirement, None if refund is None else refund.tx_hash)

    async def advance(self, payment_id: uuid.UUID, wait_s: float = 0.0) -> PaymentRow:
        """One step of a payment, by the holder of its lock: wait (at most ``wait_s``) for its
        transfer; once paid, make (or link) its retirement; a retirement that can never
        execute is refunded; a refund confirmed ends it. Returns the payment as it stands.

        Raises:
            Unavailable: the database failed.
        """
        row = await self.store.get(payment_id)
        assert row is not None
        now = int(self.clock())
        if row.state == "accepted":
            row = await self._settle_transfer(row, wait_s, now)
        if row.state in ("paid", "retiring"):
            row = await self._retire(row, now)
        if row.state == "refunding":
            row = await self._refund(row, now)
        return row

    async def _settle_transfer(self, row: PaymentRow, wait_s: float, now: int) -> PaymentRow:
        """``accepted`` -> ``paid`` when the funds are in the treasury; -> ``failed`` once the
        authorization expired unused and no transfer of it can come."""
        job = await self._transfer_job(row, now)
        if job is not None:
            try:
                outcome = await self.relay.outcomes.wait_transfer(job.id, wait_s)
            except Unavailable:
                return row
            if outcome.success:
                moved = await self.store.move(
                    row.id, ("accepted",), "paid", now, payment_tx=outcome.tx_hash or b""
                )
                return moved or row
            if not outcome.final:
                return row
            if row.error is None:
                error = outcome.error or {"code": "transaction_reverted", "message": "the transfer reverted"}
                await self._note(row, {"code": error.get("code"), "message": error.get("message")})
        auth = _authorization(row.payload)
        if auth.valid_before > now:
            return await self.store.get(row.id) or row
        token = self.domain.address
        if await self.relay.supply.chain.authorization_state(token, row.payer, row.auth_nonce):
            tx = await self.relay.outcomes.reads.authorization_used_tx(token, row.payer, row.auth_nonce)
            return await self.store.move(row.id, ("accepted",), "paid", now, payment_tx=tx or b"") or row
        return await self.store.move(row.id, ("accepted",), "failed", now) or row

    async def _transfer_job(self, row: PaymentRow, now: int) -> Job | None:
        """The payment's transfer job: linked, or made by a request that died before linking
        it (found by the authorization's salt), or taken again from the stored payload while
        the authorization is valid."""
        if row.transfer_job_id is not None:
            return await self.relay.jobs.get(row.transfer_job_id)
        verified = self.facilitator.check(_payment_of(row.payload), now)
        if isinstance(verified, Refused):
            return None
        job = await self.relay.jobs.find_by_salt(self.chain_id, verified.salt)
        if job is None and row.error is None:
            await self._take_transfer(row, verified, now)
            fresh = await self.store.get(row.id)
            return (
                None
                if fresh is None or fresh.transfer_job_id is None
                else await self.relay.jobs.get(fresh.transfer_job_id)
            )
        if job is not None:
            await self.store.move(row.id, ("accepted",), "accepted", now, transfer_job_id=job.id)
        return job

    async def _retire(self, row: PaymentRow, now: int) -> PaymentRow:
        """``paid``/``retiring``: link or make the treasury's retirement; ``retired`` when its
        job succeeded (or its authorization was used by another sender); ``refunding`` when it
        can never execute."""
        job = await self.relay.jobs.find_by_salt(self.chain_id, payment_salt(row.id))
        if job is not None and job.request_hash == payment_request_key(row.id):
            if job.state in SUCCEEDED:
                return (
                    await self.store.move(row.id, ("paid", "retiring"), "retired", now, retire_job_id=job.id)
                    or row
                )
            if job.state not in FAILED:
                return (
                    await self.store.move(row.id, ("paid", "retiring"), "retiring", now, retire_job_id=job.id)
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
                    await self.store.move(row.id, ("paid", "retiring"), "retiring", now, retire_job_id=job.id)
                    or row
                )
            if job is not None:
                return await self._after_failed_retirement(row, job, now)
            return await self._to_refund(row, {"code": refusal.code, "message": refusal.message}, now)
        return (
            await self.store.move(row.id, ("paid", "retiring"), "retiring", now, retire_job_id=made.id) or row
        )

    async def _make_retirement(self, row: PaymentRow, now: int) -> Job:
        """The treasury-signed retirement of the paid request (the OrderDesk pattern).

        Raises:
            RelayerError: the relay's refusals (the retirement cannot execute as paid).
            Unavailable: the node or the database failed.
        """
        treasury = self.treasury
        assert treasury is not None
        resolved = await self._resolved(ActionRequest.model_validate(row.request), now)
        prepared = await self.prepare.authorization(resolved, now, payment_salt(row.id))
        if _cost(resolved, prepared.gas_allowance) > row.amount:
            raise Rejection("insufficient_authorized_value", "the retirement now costs more than was paid")
        signature = parse_signature(treasury.sign_digest(typed_data_digest(prepared.typed_data)))
        return await self.relay.accept_authorization(
            resolved, self.prepare.signed(prepared, signature), payment_request_key(row.id), now
        )

    async def _after_failed_retirement(self, row: PaymentRow, job: Job, now: int) -> PaymentRow:
        """A failed retirement job: retired if its authorization was used by another sender;
        refunded once it can provably never execute (never signed, or expired and unused);
        else left for a later step."""
        treasury = self._pay_to()
        used = await self.relay.outcomes.reads.authorization_used(treasury, job.bound_nonce)
        if used:
            return (
                await self.store.move(row.id, ("paid", "retiring"), "retired", now, retire_job_id=job.id)
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
        ``error``) and take its refund."""
        log.warning(
            "x402 payment refunded: its retirement cannot execute",
            extra={"payment": str(row.id), "code": error.get("code")},
        )
        moved = await self.store.move(
            row.id,
            ("paid", "retiring"),
            "refunding",
            now,
            retire_job_id=retire_job_id,
            refund_valid_before=now + REFUND_LIFETIME_S,
            error=error,
        )
        return row if moved is None else await self._refund(moved, now)

    async def _refund(self, row: PaymentRow, now: int) -> PaymentRow:
        """``refunding``: the treasury's transfer of the amount back to the payer (nonce
        :func:`refund_nonce`, the operator pays the gas); ``refunded`` once confirmed."""
        job = None if row.refund_job_id is None else await self.relay.jobs.get(row.refund_job_id)
        if job is None or job.state is JobState.REJECTED:
            try:
                job = await self.relay.accept_transfer(self._refund_transfer(row, now), now)
            except RelayerError as exc:
                log.warning("x402 refund not taken yet", extra={"payment": str(row.id), "code": exc.code})
                return row
            row = await self.store.move(row.id, ("refunding",), "refunding", now, refund_job_id=job.id) or row
        if job.state is JobState.CONFIRMED:
            return await self.store.move(row.id, ("refunding",), "refunded", now) or row
        return row

    def _refund_transfer(self, row: PaymentRow, now: int) -> VerifiedTransfer:
        treasury = self.treasury
        assert treasury is not None and row.refund_valid_before is not None
        d, nonce = self.domain, refund_nonce(row.id)
        typed = eip712.transfer_with_authorization(
            chain_id=d.chain_id,
            usdc=d.address,
            payer=treasury.address,
            to=row.payer,
            value=row.amount,
            valid_after=0,
            valid_before=row.refund_valid_before,
            nonce=nonce,
            name=d.name,
            version=d.version,
        )
        signature = treasury.sign_digest(typed_data_digest(typed))
        auth = TransferAuthorization(
            treasury.address, row.payer, row.amount, 0, row.refund_valid_before, nonce, signature
        )
        verified = verify_transfer(auth, TransferRequirement(d.address, row.payer, row.amount), d, now)
        if isinstance(verified, TransferRefusal):
            raise Rejection("internal_error", f"the refund does not verify: {verified.message}")
        return verified

    async def resume(self) -> int:
        """The payment keeper's step: advance each payment not final recorded more than
        :data:`KEEPER_GRACE_S` ago (at most :data:`KEEPER_BATCH`, oldest first) whose lock is
        free; how many were advanced.

        Raises:
            Unavailable: the database failed.
        """
        now = int(self.clock())
        done = 0
        for row in await self.store.open(now - KEEPER_GRACE_S, KEEPER_BATCH):
            async with self.store.locked(row.id) as taken:
                if taken:
                    await self.advance(row.id)
                    done += 1
        return done


def _cost(resolved: Resolved, gas_allowance: int) -> int:
    """What the retirement costs now (the quoted total and the gas allowance, USDC atomic
    units): it must fit in the amount paid. The treasury signs more (the slippage budget of a
    class retirement); what is not spent comes back to it."""
    return resolved.route.quote.total + gas_allowance


def _reason(error: dict[str, Any]) -> str:
    """The x402 reason of a payment that did not happen."""
    code = str(error.get("code", ""))
    if code in ("insufficient_funds", "contract_revert"):
        return "insufficient_funds"
    if code == "invalid_auth_payload":
        return "invalid_exact_evm_payload_authorization_valid_before"
    return "invalid_transaction_state"


def _requirements(m: dict[str, Any]) -> Requirements:
    return Requirements(
        str(m["scheme"]),
        str(m["network"]),
        str(m["asset"]),
        int(m["amount"]),
        str(m["payTo"]),
        int(m["maxTimeoutSeconds"]),
        dict(m.get("extra") or {}),
    )


def _authorization(payload: dict[str, Any]) -> TransferAuthorization:
    """The stored PaymentPayload's authorization (as validated when it was recorded)."""
    a = payload["payload"]["authorization"]
    return TransferAuthorization(
        checksum_address(a["from"]),
        checksum_address(a["to"]),
        int(a["value"]),
        int(a["validAfter"]),
        int(a["validBefore"]),
        bytes.fromhex(a["nonce"][2:]),
        bytes.fromhex(payload["payload"]["signature"][2:]),
    )


def _payment_of(payload: dict[str, Any]) -> Payment:
    accepted = _requirements(payload["accepted"])
    return Payment(accepted, accepted, _authorization(payload))
