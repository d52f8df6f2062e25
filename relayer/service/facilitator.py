"""The standard x402 v2 facilitator (scheme ``exact``, EIP-3009 ``transferWithAuthorization``)
over the relay (design: docs/design/x402-v2.md, C2). ``verify`` runs the pure checks, then
one balance read; ``settle`` takes the verified transfer into the relay's pipeline (journal
before broadcast, nonce lanes, fee bumping, reorg handling) as a ``transfer`` job and waits a
bounded time for its answer. One authorization is one job whoever asks, so a repeated settle
of the same payload answers from the same job: never a second transfer.

The answers are typed (:class:`Verdict`, :class:`Settlement`) with the x402 spec's reason
names; :mod:`relayer.api.facilitator` parses the wire and renders the bodies."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from relayer.chain.errors import ChainRevert
from relayer.domain.errors import Rejection, RelayerError, Unavailable
from relayer.domain.states import UNSIGNED, JobState
from relayer.domain.verify import (
    AUTH_EXPIRY_MARGIN_S,
    TokenDomain,
    TransferAuthorization,
    TransferRefusal,
    TransferRequirement,
    VerifiedTransfer,
    verify_transfer,
)
from relayer.service.outcome import TransferOutcome
from relayer.service.relay import Relay
from relayer.store.relay_jobs import Job

log = logging.getLogger(__name__)

X402_VERSION: Final = 2
SCHEME: Final = "exact"
NONCE_USED: Final = "invalid_exact_evm_nonce_already_used"
VALID_BEFORE: Final = "invalid_exact_evm_payload_authorization_valid_before"


@dataclass(frozen=True, slots=True)
class Requirements:
    """x402 ``PaymentRequirements`` (or the payload's echoed ``accepted``), typed: addresses
    as given (compared case-insensitively), ``amount`` in atomic units."""

    scheme: str
    network: str
    asset: str
    amount: int
    pay_to: str
    max_timeout_s: int
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Payment:
    """One verify or settle request: the requirements the resource server asks for, the
    ``accepted`` entry the client echoed, and the client's signed authorization."""

    requirements: Requirements
    accepted: Requirements
    authorization: TransferAuthorization


@dataclass(frozen=True, slots=True)
class Refused:
    """A refusal: an x402 reason name and a sentence for people."""

    reason: str
    message: str


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
    ) -> None:
        self.relay = relay
        self.domain = domain
        self.executors = list(executors)
        self.settle_wait_s = settle_wait_s
        self.expiry_margin_s = max(expiry_margin_s, AUTH_EXPIRY_MARGIN_S)  # what the relay takes
        self.network = f"eip155:{domain.chain_id}"

    def check(self, payment: Payment, now: int) -> VerifiedTransfer | Refused:
        """The pure checks, cheapest first (scheme, network, the requirements against what
        the client accepted and the token served, then :func:`verify_transfer`: recipient,
        exact value, validity window, signature). No I/O."""
        req, acc = payment.requirements, payment.accepted
        if req.scheme != SCHEME or acc.scheme != SCHEME:
            return Refused("unsupported_scheme", f"only scheme {SCHEME!r} is supported")
        if req.network != self.network or acc.network != self.network:
            return Refused("invalid_network", f"only network {self.network} is served")
        if req.asset.lower() != self.domain.address.lower():
            return Refused("invalid_payment_requirements", "the asset is not the token served")
        if _core(req) != _core(acc):
            return Refused("invalid_payment_requirements", "accepted does not match the requirements")
        name, version = req.extra.get("name"), req.extra.get("version")
        if name is None or version is None:
            return Refused("missing_eip712_domain", "extra.name and extra.version are required")
        if (name, version) != (self.domain.name, self.domain.version):
            return Refused("invalid_payment_requirements", "extra.name/version is not the token's domain")
        requirement = TransferRequirement(req.asset, req.pay_to, req.amount)
        out = verify_transfer(
            payment.authorization, requirement, self.domain, now, margin_s=self.expiry_margin_s
        )
        if isinstance(out, TransferRefusal):
            return Refused(out.reason, out.message)
        return out

    async def verify(self, payment: Payment, now: int) -> Verdict:
        """The pure checks, then two reads at the latest block, in parallel: the payer's
        balance and the token's ``authorizationState`` of the nonce (no simulation)."""
        payer = payment.authorization.payer
        checked = self.check(payment, now)
        if isinstance(checked, Refused):
            return Verdict(False, payer, checked.reason, checked.message)
        chain = self.relay.supply.chain
        try:
            held, used = await asyncio.gather(
                chain.balance_now(checked.token, payer),
                chain.authorization_state(checked.token, payer, checked.nonce),
            )
        except RelayerError as exc:
            log.warning("facilitator verify failed", extra={"error": exc.code})
            return Verdict(False, payer, "unexpected_verify_error", "the chain node could not be read")
        if used:
            return Verdict(False, payer, NONCE_USED, "the authorization's nonce is already used")
        if held < checked.value:
            return Verdict(False, payer, "insufficient_funds", "the payer's balance does not cover the value")
        return Verdict(True, payer)

    async def settle(
        self, payment: Payment, now: int, api_key_id: int | None = None, gas_budget_wei: int | None = None
    ) -> Settlement:
        """The pure checks, then the relay's ``transfer`` job (the same job for the same
        authorization), waited for at most ``settle_wait_s``: confirmed is success; still on
        its way once signed is ``settlement_pending`` with the hash; never signed within the
        wait, the job is cancelled (it can then never be sent) and the answer is a failure.
        A new job of API key ``api_key_id`` reserves its fee ceiling of the key's daily
        ``gas_budget_wei`` (design C3).

        Raises:
            GasBudgetExhausted: the key's budget for the day cannot take this transfer
                (nothing recorded; HTTP 429 ``gas_budget_exhausted``).
        """
        payer = payment.authorization.payer
        try:
            checked = await self._settleable(payment, now)
            if isinstance(checked, Refused):
                return Settlement(False, payer, reason=checked.reason, message=checked.message)
            job = await self._job(checked, now, api_key_id, gas_budget_wei)
            if isinstance(job, Settlement):
                return job
            outcome = await self.relay.outcomes.wait_transfer(job.id, self.settle_wait_s)
        except Rejection as exc:
            return _refused_settle(payer, exc)
        except Unavailable as exc:
            log.warning("facilitator settle failed", extra={"error": exc.code})
            return Settlement(False, payer, reason="unexpected_settle_error", message=exc.message)
        if not outcome.final and outcome.tx_hash is None:
            outcome = await self._cancel_unsigned(outcome)
        return _settled(payer, checked.value, outcome)

    async def _settleable(self, payment: Payment, now: int) -> VerifiedTransfer | Refused:
        """:meth:`check`, except that a payload already taken (its job exists) is answered
        from its job even once its window has closed: a repeated settle of a pending payment
        gets the final answer, whenever it comes.

        Raises:
            Unavailable: the database failed.
        """
        checked = self.check(payment, now)
        if not isinstance(checked, Refused) or checked.reason != VALID_BEFORE:
            return checked
        then = self.check(payment, payment.authorization.valid_after)  # as when it was valid
        if isinstance(then, Refused):
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
    if outcome.job.state in (JobState.REVERTED, JobState.REJECTED) and (outcome.error or {}).get("code") in (
        None,
        "contract_revert",
        "transaction_reverted",
    ):
        return Settlement(False, payer, tx, reason="invalid_transaction_state", message=message)
    return Settlement(False, payer, tx, reason="unexpected_settle_error", message=message)


def _refused_settle(payer: str, exc: Rejection) -> Settlement:
    """The settle answer of a relay refusal before anything was signed."""
    reason = VALID_BEFORE if exc.code == "invalid_auth_payload" else "unexpected_settle_error"
    return Settlement(False, payer, reason=reason, message=exc.message)
