"""The standard x402 v2 facilitator (scheme ``exact``, EIP-3009 ``transferWithAuthorization``)
over the relay (design: docs/design/x402-v2.md, C2).

``verify`` runs the pure checks, then the spec's simulation: the payer's balance and one
``eth_call`` of ``transferWithAuthorization`` from an executor, in one JSON-RPC batch; the
balance is compared to the value less what the payer's jobs not yet mined may still take.

``settle`` takes the verified transfer into the relay's pipeline (journal before broadcast,
nonce lanes, fee bumping, reorg handling) as a ``transfer`` job and waits a bounded time for
its answer. One authorization is one job whoever asks, so a repeated settle of the same
payload answers from the same job: never a second transfer. A front-runner who sends the
payer's authorization to the token first makes ours revert (or its simulation): the answer is
success with **that** transaction once it is confirmed as our own would be (the chain's
confirmation depth, or the node's ``safe``/``finalized`` block under a tag), and
``settlement_pending`` with its hash until then.

Cancelled settles: a job not signed within the wait is moved to ``rejected`` (the broadcaster
can then never send it) and the answer is a failure, so a failure is never followed by a
charge. A later settle of the same payload is a **new attempt** (the rejected job is reopened
and checked again, under the same payment identifier too): the payer signed it, and a client
that retries wants it paid; it is answered truthfully, and still at most once.

``payment-identifier``: the id is scoped ``facilitator:<api key id>`` and bound to the exact
payload (:mod:`relayer.store.payment_ids`). It is looked up first (a resend may no longer
verify): another payload → ``payment_identifier_conflict`` (409); this payload with a live
job → that job's answer, recomputed. A new id is claimed after the pure checks and before
the job is made; the job is linked right after it is made. Races: two requests with the same
id and different payloads both claim, the primary key lets one win, the other reads the
winner's hash and is refused before anything of it is recorded; the same id and payload
twice both reach the one job of their authorization (the salt's uniqueness). A claim whose
settle failed before making a job (insufficient funds, an outage) keeps the id bound to that
payload: resending it is a new attempt, another payload under it a conflict.

The answers are typed (:class:`Verdict`, :class:`Settlement`) with the x402 spec's reason
names; :mod:`relayer.api.facilitator` parses the wire and renders the bodies."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final

from relayer.chain import calls
from relayer.chain.errors import ChainRevert
from relayer.domain.errors import Rejection, RelayerError, Unavailable
from relayer.domain.states import UNSIGNED, JobState
from relayer.domain.verify import (
    AUTH_EXPIRY_MARGIN_S,
    Refusal,
    TokenDomain,
    TransferRequirement,
    VerifiedTransfer,
    verify_transfer,
)
from relayer.domain.x402_wire import SCHEME, Payment, Requirements
from relayer.service.outcome import USED_OTHERWISE, TransferOutcome
from relayer.service.relay import Relay
from relayer.store.payment_ids import PaymentIds
from relayer.store.relay_jobs import Job

log = logging.getLogger(__name__)

NONCE_USED: Final = "invalid_exact_evm_nonce_already_used"
VALID_BEFORE: Final = "invalid_exact_evm_payload_authorization_valid_before"
CONFLICT: Final = "payment_identifier_conflict"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer of verify: ``valid``, the payer, and the reason when invalid."""

    valid: bool
    payer: str
    reason: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    """The answer of settle: ``success``; ``transaction`` the hash (``0x…``; empty when
    nothing was sent); ``reason`` on failure (``settlement_pending`` when the transaction is
    not yet confirmed: settle the same payload again for the final answer)."""

    success: bool
    payer: str
    transaction: str = ""
    amount: int | None = None
    reason: str | None = None
    message: str | None = None


class Facilitator:
    """Verify and settle standard ``exact`` payments in the served token on the relay's chain."""

    def __init__(
        self,
        relay: Relay,
        domain: TokenDomain,
        executors: list[str],
        settle_wait_s: float,
        expiry_margin_s: int,
        payment_ids: PaymentIds | None = None,
        own_accounts: Collection[str] = (),
        served_networks: Sequence[str] = (),
    ) -> None:
        """``own_accounts``: the operator's other accounts and contracts (the treasury, the
        protocol's contracts), refused as ``payTo`` with the executors and the token;
        ``served_networks``: every network the daemon's facilitator settles (CAIP-2, this one
        among them; default this one), named when a payment's network is none of them."""
        self.relay = relay
        self.payment_ids = payment_ids
        self.domain = domain
        self.executors = list(executors)
        self.settle_wait_s = settle_wait_s
        self.expiry_margin_s = max(expiry_margin_s, AUTH_EXPIRY_MARGIN_S)  # what the relay takes
        self.network = f"eip155:{domain.chain_id}"
        self.served_networks = list(served_networks) or [self.network]
        self.ours = frozenset(a.lower() for a in (*executors, *own_accounts, domain.address))

    def check(
        self, payment: Payment, now: int, *, pay_to_ours: str | None = None
    ) -> VerifiedTransfer | Refusal:
        """The pure checks, cheapest first (scheme, network, the requirements against what
        the client accepted and the token served, a payment that would only cost our gas
        (:meth:`pointless`), then :func:`verify_transfer`: recipient, exact value, validity
        window, signature). ``pay_to_ours``: the one account of ours this payment may pay
        (the retirement resource's treasury). No I/O."""
        req, acc = payment.requirements, payment.accepted
        if req.scheme != SCHEME or acc.scheme != SCHEME:
            return Refusal("unsupported_scheme", f"only scheme {SCHEME!r} is supported")
        if req.network != self.network or acc.network != self.network:
            return Refusal("invalid_network", _only(self.served_networks))
        if req.asset.lower() != self.domain.address.lower():
            return Refusal("invalid_payment_requirements", "the asset is not the token served")
        if _core(req) != _core(acc):
            return Refusal("invalid_payment_requirements", "accepted does not match the requirements")
        name, version = req.extra.get("name"), req.extra.get("version")
        if name is None or version is None:
            return Refusal("missing_eip712_domain", "extra.name and extra.version are required")
        if (name, version) != (self.domain.name, self.domain.version):
            return Refusal("invalid_payment_requirements", "extra.name/version is not the token's domain")
        pointless = self.pointless(req, payment.authorization.payer, pay_to_ours)
        if pointless is not None:
            return pointless
        requirement = TransferRequirement(req.asset, req.pay_to, req.amount)
        out = verify_transfer(
            payment.authorization, requirement, self.domain, now, margin_s=self.expiry_margin_s
        )
        if isinstance(out, Refusal):
            return out
        return out

    def pointless(self, req: Requirements, payer: str, pay_to_ours: str | None = None) -> Refusal | None:
        """A payment that only costs the executor gas: an amount of 0, or ``payTo`` the payer
        itself, an executor, the token, or another account of ours (the treasury, the
        protocol's contracts) other than ``pay_to_ours``; None when it is a payment."""
        if req.amount <= 0:
            return Refusal("invalid_payment_requirements", "the amount must be above 0")
        pay_to = req.pay_to.lower()
        if pay_to == payer.lower():
            return Refusal("invalid_payment_requirements", "payTo is the payer itself: nothing would move")
        if pay_to in self.ours and pay_to != (pay_to_ours or "").lower():
            return Refusal(
                "invalid_payment_requirements", "payTo is the token or one of this facilitator's own accounts"
            )
        return None

    async def verify(self, payment: Payment, now: int) -> Verdict:
        """The pure checks, then the spec's simulation: the payer's balance and one
        ``eth_call`` of ``transferWithAuthorization`` from an executor, both at the latest
        block in one JSON-RPC batch (:meth:`ChainReads.preview_transfer`). Reasons, in this
        order: the call reverts on the used (or cancelled) nonce →
        ``invalid_exact_evm_nonce_already_used``; the balance less what the payer's jobs not
        yet mined may still take (read first) is below the value → ``insufficient_funds``; any
        other revert → ``invalid_transaction_state``; the node or database failing →
        ``unexpected_verify_error``. Verify records nothing."""
        payer = payment.authorization.payer
        checked = self.check(payment, now)
        if isinstance(checked, Refusal):
            return Verdict(False, payer, checked.reason, checked.message)
        call = calls.transfer_with_authorization(
            payer,
            checked.to,
            checked.value,
            checked.valid_after,
            checked.valid_before,
            checked.nonce,
            checked.signature,
        )
        try:
            held_back = await self.relay.jobs.in_flight(
                checked.chain_id, payer, checked.token, checked.bound_nonce
            )
            preview = await self.relay.supply.chain.preview_transfer(
                checked.token, payer, self.executors[0], call
            )
        except RelayerError as exc:
            log.warning("facilitator verify failed", extra={"error": exc.code})
            return Verdict(
                False, payer, "unexpected_verify_error", "the chain node or the database could not be read"
            )
        if preview.revert is not None and nonce_used(preview.revert):
            return Verdict(False, payer, NONCE_USED, "the authorization's nonce is already used")
        if preview.balance - held_back < checked.value:
            message = "the payer's balance, less its transfers in flight, does not cover the value"
            return Verdict(False, payer, "insufficient_funds", message)
        if preview.revert is not None:
            return Verdict(False, payer, "invalid_transaction_state", _revert_text(preview.revert))
        return Verdict(True, payer)

    async def settle(
        self, payment: Payment, now: int, api_key_id: int | None = None, gas_budget_wei: int | None = None
    ) -> Settlement:
        """Settle ``payment`` (``now`` in unix seconds; ``api_key_id`` pays the gas and scopes
        the payment identifier: ``facilitator:<api_key_id>``; a new job of that key reserves its
        fee ceiling of the key's daily ``gas_budget_wei``, design C3).

        With a payment identifier, it is looked up first (the spec: before verification, a
        resend may no longer verify): bound to another payload → :class:`Rejection`
        ``payment_identifier_conflict`` (HTTP 409); bound to this payload with a live job →
        that job's answer, recomputed (pending becomes final). Otherwise the pure checks, the
        identifier claimed (the first claim of an id wins; a loser with another payload is a
        conflict, nothing of it recorded), then the relay's ``transfer`` job (the same job for
        the same authorization), linked to the identifier and waited for at most
        ``settle_wait_s``: confirmed is success; still on its way once signed is
        ``settlement_pending`` with the hash; never signed within the wait, the job is
        cancelled (it can then never be sent) and the answer is a failure.

        Raises:
            Rejection: ``payment_identifier_conflict`` only (every other refusal is the
                answer's ``reason``).
            GasBudgetExhausted: the key's budget for the day cannot take this transfer
                (nothing recorded; HTTP 429 ``gas_budget_exhausted``).
        """
        payer = payment.authorization.payer
        scope = f"facilitator:{api_key_id}"
        try:
            known = await self._known(payment, scope)
            if known is not None:
                return await self._answer(known, payer, known.auth_value)
            checked = await self._settleable(payment, now)
            if isinstance(checked, Refusal):
                return Settlement(False, payer, reason=checked.reason, message=checked.message)
            await self._claim(payment, scope)
            job = await self._job(checked, now, api_key_id, gas_budget_wei)
            if isinstance(job, Settlement):
                return job
            if payment.identifier is not None and self.payment_ids is not None:
                await self.payment_ids.link_job(scope, payment.identifier.id, job.id)
            return await self._answer(job, payer, checked.value)
        except Rejection as exc:
            if exc.code == CONFLICT:
                raise
            return _refused_settle(payer, exc)
        except Unavailable as exc:
            log.warning("facilitator settle failed", extra={"error": exc.code})
            return Settlement(False, payer, reason="unexpected_settle_error", message=exc.message)

    async def _answer(self, job: Job, payer: str, value: int) -> Settlement:
        """Wait for ``job`` (at most ``settle_wait_s``) and answer; an unsigned job is then
        cancelled (see :meth:`_cancel_unsigned`).

        Raises:
            Unavailable: the database or the node was still failing when the wait ran out.
        """
        outcome = await self.relay.outcomes.wait_transfer(job.id, self.settle_wait_s)
        if not outcome.final and outcome.tx_hash is None:
            outcome = await self._cancel_unsigned(outcome)
        return _settled(payer, value, outcome)

    async def _known(self, payment: Payment, scope: str) -> Job | None:
        """The live job of this payment's identifier when it is bound to this very payload;
        None when there is no identifier, it is new, its payload made no job yet, or its job
        was rejected (then the payload is settled as a new attempt).

        Raises:
            Rejection: ``payment_identifier_conflict``: the id is bound to another payload.
            Unavailable: the database failed.
        """
        ident = payment.identifier
        if ident is None or self.payment_ids is None:
            return None
        found = await self.payment_ids.find(scope, ident.id)
        if found is None:
            return None
        if found.payload_hash != ident.payload_hash:
            raise _conflict()
        job = None if found.job_id is None else await self.relay.jobs.get(found.job_id)
        return None if job is None or job.state is JobState.REJECTED else job

    async def _claim(self, payment: Payment, scope: str) -> None:
        """Bind the payment's identifier to its payload, unless it is bound already: to the
        same payload is fine (a retry, or a concurrent twin: both reach the one job of the
        authorization); to another → conflict, before anything of this payload is recorded.

        Raises:
            Rejection: ``payment_identifier_conflict``.
            Unavailable: the database failed.
        """
        ident = payment.identifier
        if ident is None or self.payment_ids is None:
            return
        row = await self.payment_ids.claim(scope, ident.id, ident.payload_hash)
        if row.payload_hash != ident.payload_hash:
            raise _conflict()

    async def _settleable(self, payment: Payment, now: int) -> VerifiedTransfer | Refusal:
        """:meth:`check`, except that a payload already taken (its job exists) is answered
        from its job even once its window has closed: a repeated settle of a pending payment
        gets the final answer, whenever it comes.

        Raises:
            Unavailable: the database failed.
        """
        checked = self.check(payment, now)
        if not isinstance(checked, Refusal) or checked.reason != VALID_BEFORE:
            return checked
        then = self.check(payment, payment.authorization.valid_after)  # as when it was valid
        if isinstance(then, Refusal):
            return checked
        job = await self.relay.jobs.find_by_salt(then.chain_id, then.salt)
        return checked if job is None or job.state is JobState.REJECTED else then

    async def _job(
        self, verified: VerifiedTransfer, now: int, api_key_id: int | None, gas_budget_wei: int | None
    ) -> Job | Settlement:
        """The authorization's job, or the failure answer when the relay refused it."""
        job: Job | None
        try:
            job = await self.relay.accept_transfer(
                verified, now, api_key_id=api_key_id, gas_budget_wei=gas_budget_wei
            )
        except ChainRevert as exc:
            # recorded: the simulation reverted (its outcome says why, or shows a front-run);
            # not recorded: the payer's balance, less its transfers in flight, is short
            job = await self.relay.jobs.find_by_salt(verified.chain_id, verified.salt)
            if job is None:
                return Settlement(False, verified.payer, reason="insufficient_funds", message=exc.message)
        if str(job.summary.get("to", "")).lower() != verified.to.lower() or job.auth_value != verified.value:
            # another authorization with the same (from, nonce): the token will never run this one
            message = "another authorization with this nonce was settled"
            return Settlement(False, verified.payer, reason=NONCE_USED, message=message)
        return job

    async def _cancel_unsigned(self, outcome: TransferOutcome) -> TransferOutcome:
        """A job not signed within the wait is moved to rejected (the broadcaster cannot sign
        it afterwards), so a failure answer is never followed by a charge; if it was signed
        meanwhile, its pending answer with the hash."""
        job = outcome.job
        if job.state in UNSIGNED and job.state is not JobState.REJECTED:
            reason = Rejection("payment_unavailable", "not signed within the facilitator's settle wait")
            moved = await self.relay.jobs.move(job.id, JobState.REJECTED, error=reason)
            if moved is not None:
                return TransferOutcome(moved, False, True, None, error=reason.record())
        return await self.relay.outcomes.wait_transfer(job.id, 0)


def _only(networks: Sequence[str]) -> str:
    """``only network eip155:84532 is served``, or ``only networks … and … are served``."""
    if len(networks) == 1:
        return f"only network {networks[0]} is served"
    return f"only networks {' and '.join(networks)} are served"


def nonce_used(revert: ChainRevert) -> bool:
    """Whether a ``transferWithAuthorization`` revert says the authorization's nonce is used
    or cancelled: the devnet token's ``AuthorizationAlreadyUsed`` error, or FiatToken's
    (Circle USDC) ``"FiatTokenV2: authorization is used or canceled"``."""
    if revert.error_name == "AuthorizationAlreadyUsed":
        return True
    return "authorization is used" in _revert_text(revert).lower()


def _revert_text(revert: ChainRevert) -> str:
    """A revert's reason for people: the ``Error(string)`` reason, the node's message, or the
    custom error's name."""
    reason = revert.info["decoded"]["args"].get("reason") or revert.info.get("reason")
    return str(reason or revert.error_name or "the transfer would revert")[:200]


def _conflict() -> Rejection:
    return Rejection(
        CONFLICT,
        "this payment identifier was already used with another payment payload; "
        "use a new identifier for a new payment",
    )


def _core(r: Requirements) -> tuple[str, str, str, int, str, int]:
    return (r.scheme, r.network, r.asset.lower(), r.amount, r.pay_to.lower(), r.max_timeout_s)


def _hex(tx_hash: bytes | None) -> str:
    return "" if not tx_hash else "0x" + tx_hash.hex()


def _settled(payer: str, value: int, outcome: TransferOutcome) -> Settlement:
    """The settle answer of a transfer job's outcome."""
    tx = _hex(outcome.tx_hash)
    if outcome.success:
        return Settlement(True, payer, tx, amount=value)
    if not outcome.final:
        return Settlement(False, payer, tx, reason="settlement_pending", message="not yet confirmed")
    message = str((outcome.error or {}).get("message") or outcome.job.state.value)
    code = (outcome.error or {}).get("code")
    if code == USED_OTHERWISE["code"] or (
        outcome.job.state in (JobState.REVERTED, JobState.REJECTED)
        and code in (None, "contract_revert", "transaction_reverted")
    ):
        return Settlement(False, payer, tx, reason="invalid_transaction_state", message=message)
    return Settlement(False, payer, tx, reason="unexpected_settle_error", message=message)


def _refused_settle(payer: str, exc: Rejection) -> Settlement:
    """The settle answer of a relay refusal before anything was signed."""
    reason = VALID_BEFORE if exc.code == "invalid_auth_payload" else "unexpected_settle_error"
    return Settlement(False, payer, reason=reason, message=exc.message)
