"""The gasless relay (spec: actions/retire; Authentication, Errors). It orchestrates I/O
around the pure verifier: check the authorization's shape (no I/O); answer an identical
request from its job; resolve the terms; verify; reserve the salt in Postgres; simulate and
price gas against the signed allowance; hand over to the broadcaster; wait for the outcome.
Nothing is signed unless the signed gas allowance covers ``gasLimit * maxFeePerGas`` at the
price the transaction is sent with."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from relayer.chain import calls
from relayer.chain.errors import ChainRevert
from relayer.domain.amounts import format_tonnes
from relayer.domain.budget import seconds_to_utc_midnight, utc_day
from relayer.domain.errors import Rejection, RelayerError, Unavailable
from relayer.domain.fill import check_fill, check_liquidity, fill_rule, liquidity_rule
from relayer.domain.schemas import ActionRequest
from relayer.domain.states import JobState
from relayer.domain.verify import (
    AUTH_EXPIRY_MARGIN_S,
    SignedAuthorization,
    VerifiedAuthorization,
    VerifiedTransfer,
    check_shape,
    request_hash,
    verify_signed,
)
from relayer.service.outcome import Outcomes, RetireOutcome
from relayer.service.prepare import Prepare
from relayer.service.proofs import search_from
from relayer.service.simulate import Simulator
from relayer.service.supply import FillRefuser, Supply, x402_fill_refusal
from relayer.service.terms import Resolved, resolve
from relayer.store.relay_jobs import (
    GasReservation,
    Job,
    NewJob,
    PayerBalance,
    PayerOverdrawn,
    PermitInUse,
    RelayJobs,
    SaltReused,
    SupplyCheck,
    SupplyTake,
)

log = logging.getLogger(__name__)


class Relay:
    """actions/retire."""

    def __init__(
        self,
        supply: Supply,
        prepare: Prepare,
        simulator: Simulator,
        jobs: RelayJobs,
        outcomes: Outcomes,
        min_executor_balance_wei: int = 0,
        executors: list[str] | None = None,
    ) -> None:
        self.min_executor_balance_wei = min_executor_balance_wei
        self.executors = executors or [simulator.executor_address]
        self.supply = supply
        self.prepare = prepare
        self.simulator = simulator
        self.jobs = jobs
        self.outcomes = outcomes
        self.chain_id = supply.chain_id
        self.settlement = supply.contracts.settlement

    async def retire(self, request: ActionRequest, now: int) -> RetireOutcome:
        """Relay a signed retirement and wait for its outcome (see :meth:`accept`).

        Raises:
            Rejection, Unavailable: as :meth:`accept`.
        """
        job, fresh = await self._accept(request, now)
        # a job made now is not answering yet: its first read is skipped (its watch is set
        # before anything could move it further than simulated)
        return await self.outcomes.wait(job.id, made_now=fresh)

    async def accept(self, request: ActionRequest, now: int) -> Job:
        """Take a signed retirement into the pipeline and return its job without waiting: the
        identical request's job, or a new one checked, reserved and simulated (the
        broadcaster signs and sends it). Without ``authPayload`` raises 402
        ``payment_required`` with the prepare-auth body.

        Raises:
            Rejection: the prepare-auth codes, invalid_input_token, payment_required,
                invalid_auth_payload, insufficient_authorized_value, params_mismatch,
                contract_revert (also when the payer's balance, less its other jobs in flight,
                does not cover the signed value: ``ERC20InsufficientBalance``),
                insufficient_listing_supply, below_min_fill (a listing's supply less what the
                jobs in flight take), insufficient_liquidity (a class credit's liquidity less
                what the jobs in flight take), transaction_reverted, gas_limit_exceeds_cap.
            Rejection: payment_unavailable when the executor's ETH balance is below
                ``min_executor_balance_wei``.
            Unavailable: the chain node or the database failed (nothing was signed).
        """
        return (await self._accept(request, now))[0]

    async def _accept(self, request: ActionRequest, now: int) -> tuple[Job, bool]:
        """:meth:`accept`'s job, and whether this call made it (or re-opened it) and simulated it."""
        try:
            token = self.supply.token(request.inputToken)
        except Rejection:
            raise Rejection("invalid_input_token", inputToken=request.inputToken) from None
        if request.authPayload is None:
            raise Rejection("payment_required", **await self.prepare.prepare_auth(request, now))
        shaped = check_shape(request, self.settlement, token.scheme)  # pure: before any I/O
        if isinstance(shaped, Rejection):
            raise shaped
        key = request_hash(request)

        async def reserved() -> tuple[Job, bool]:
            await self._executor_funded()
            resolved = await resolve(self.supply, request, now)
            return await self._reserved(resolved, shaped, key, now)

        return await self._take(reserved, shaped.salt, key, request.authPayload.nonce)

    async def accept_authorization(
        self,
        resolved: Resolved,
        authorization: SignedAuthorization,
        request_key: bytes,
        now: int,
        refuse: FillRefuser | None = None,
    ) -> Job:
        """The typed entry into the relay, for callers that resolved the retirement
        themselves (marketplace orders; the standard x402 path): the same checks, salt
        reservation, solvency rule, supply reservation, simulation and job as :meth:`accept`,
        without wire JSON. ``request_key`` (32 bytes) names the request: the same salt and
        key answer the same job (a retried order never makes a second one). A listing fill
        that the supply left beside the jobs in flight cannot meet raises what ``refuse``
        makes of it (default: the x402 codes).

        Raises:
            Rejection, ChainRevert, Unavailable: as :meth:`accept`.
        """

        async def reserved() -> tuple[Job, bool]:
            await self._executor_funded()
            return await self._reserved(resolved, authorization, request_key, now, refuse)

        received = _nonce_text(authorization.nonce)
        return (await self._take(reserved, authorization.salt, request_key, received))[0]

    async def accept_transfer(
        self,
        verified: VerifiedTransfer,
        now: int,
        *,
        api_key_id: int | None = None,
        gas_budget_wei: int | None = None,
    ) -> Job:
        """The typed entry of an EIP-3009 ``transferWithAuthorization`` (job kind
        ``transfer``: x402 settles, the retirement resource's payment pull, refunds): the
        authorization's job, or a new one checked, reserved and simulated (the broadcaster
        signs and sends it; it is final at ``confirmed``). The job's bound nonce and salt are
        derived from (token, from, nonce), so one authorization has at most one job whoever
        asks, whenever: a second call answers the first job (never a second transfer).
        ``api_key_id`` names who pays the gas (None: the operator). With ``gas_budget_wei``
        (that key's daily gas budget, wei per UTC day of ``now``), a new job is simulated
        first and reserves its fee ceiling (:meth:`Simulator.sponsored_cost`) of the budget in
        the transaction that records it (design: docs/design/x402-v2.md, C3). ``now`` in unix
        seconds.

        Raises:
            Rejection: ``invalid_auth_payload`` (the authorization expires within
                ``AUTH_EXPIRY_MARGIN_S`` of ``now``), ``payment_unavailable`` (every
                executor below its floor; fees above the sponsored ceiling),
                ``gas_limit_exceeds_cap``.
            ChainRevert: ``contract_revert``: the payer's balance, less its other jobs in
                flight, does not cover the value (``ERC20InsufficientBalance``, nothing
                recorded); or the simulation reverted (the job is rejected with it; an
                authorization already used or cancelled reverts here).
            GasBudgetExhausted: the key's budget for the day cannot take this transfer's fee
                ceiling (nothing recorded).
            Unavailable: the chain node or the database failed (nothing was signed).
        """
        existing = await self.jobs.find_by_salt(self.chain_id, verified.salt)
        if existing is not None and existing.state is not JobState.REJECTED:
            await self.simulator.resume(existing)  # an orphan of a process that died mid-check
            return existing
        if verified.expires_at <= now + AUTH_EXPIRY_MARGIN_S:
            raise Rejection(
                "invalid_auth_payload",
                "authorization expired or about to expire",
                validBefore=str(verified.valid_before),
            )
        await self._executor_funded()
        balance = await self._covered(
            verified.token, verified.payer, verified.value, lambda held: _transfer_overdrawn(verified, held)
        )
        new = _transfer_job(verified, api_key_id, search_from(balance.block_number))
        gas, estimate = await self._gas_reservation(new, gas_budget_wei, now)
        try:
            job, owned = await self.jobs.reserve(new, balance, gas=gas)
        except PayerOverdrawn as exc:
            raise _transfer_overdrawn(verified, max(0, exc.balance - exc.reserved)) from None
        except SaltReused as exc:  # only a job of the same authorization can hold its salt
            job, owned = exc.job, False
        log.info("accepted", extra={"job_id": job.id, "kind": job.kind, "new": owned})
        if owned:
            await self.simulator.simulate(job, estimate)
        return job

    async def _gas_reservation(
        self, new: NewJob, budget_wei: int | None, now: int
    ) -> tuple[GasReservation | None, int | RelayerError | None]:
        """What a new transfer reserves of its API key's daily gas budget (None: no key or no
        budget), and its simulation: its gas estimate, or its refusal (the job is then recorded
        and rejected with it, and reserves nothing: it is never sent).

        Raises:
            Unavailable: the chain node failed.
        """
        if new.api_key_id is None or budget_wei is None:
            return None, None
        try:
            estimate, ceiling = await self.simulator.sponsored_cost(new)
        except Unavailable:
            raise
        except RelayerError as refusal:
            return None, refusal
        day, retry = utc_day(now), seconds_to_utc_midnight(now)
        return GasReservation(new.api_key_id, day, ceiling, budget_wei, retry), estimate

    async def _take(
        self,
        reserved: Callable[[], Awaitable[tuple[Job, bool]]],
        salt: bytes,
        request_key: bytes,
        received: str | None,
    ) -> tuple[Job, bool]:
        """The job ``reserved`` checks and reserves (simulated when this call made it), or the
        live job of the identical request: the reservation finds that one itself (same
        authorization key), and when the checks or the reservation refuse (nothing recorded:
        a payer whose balance its own mined job spent, a quote that moved), the job that spent
        the salt answers (:meth:`_identical`). The salt is read only then: a new request makes
        no read for it. (job, whether this call owns it.)

        Raises:
            Rejection, ChainRevert, Unavailable: the refusal, when no identical request's job
                answers; a simulation's refusal (the job is rejected with it).
        """
        try:
            job, owned = await reserved()
        except RelayerError:
            existing = await self._identical(salt, request_key, received)
            if existing is None:
                raise
            return existing, False
        log.info("accepted", extra={"job_id": job.id, "kind": job.kind, "new": owned})
        if owned:
            await self.simulator.simulate(job)
        else:
            await self._answers(job)
        return job, owned

    async def _reserved(
        self,
        resolved: Resolved,
        authorization: SignedAuthorization,
        request_key: bytes,
        now: int,
        refuse: FillRefuser | None = None,
    ) -> tuple[Job, bool]:
        """Verify ``authorization`` against the terms of ``resolved``, check the payer can pay,
        and reserve the salt, the payer's funds and the supply: the job (to simulate when
        owned), and whether this call owns it (made or re-opened it now)."""
        terms = resolved.terms(self.chain_id, self.settlement, authorization.gas_allowance)
        verified = verify_signed(authorization, terms, now, request_key)
        if isinstance(verified, Rejection):
            raise verified
        # both read at the head: together; the payer's refusal first when both refuse
        balance, supply = await asyncio.gather(
            self._affordable(verified),
            self._supply_check(resolved, now, refuse or x402_fill_refusal),
            return_exceptions=True,
        )
        for outcome in (balance, supply):
            if isinstance(outcome, BaseException):
                raise outcome
        assert isinstance(balance, PayerBalance) and not isinstance(supply, BaseException)
        new = self._new_job(verified, terms.summary, resolved.route.quote.total)
        # its simulation (a read at the head) goes out now, beside the reservation; after the
        # payer's and the supply's checks, so a refused throwaway payer costs no simulation
        self.simulator.speculate(new)
        job, owned = await self._reserve(new, verified, balance, supply)
        if owned and supply is not None and supply.block_number == balance.block_number:
            # a job whose supply was not checked (no such listing) is always checked again
            self.simulator.reserved_at(job.id, balance.block_number)
        return job, owned

    async def _identical(self, salt: bytes, request_key: bytes, received: str | None) -> Job | None:
        """The live job of the identical request, answered from its job whatever live
        prices, supply or the clock say now: the same transaction hash, never a second
        broadcast. Raises ``params_mismatch`` when the salt was spent by another request."""
        existing = await self.jobs.find_by_salt(self.chain_id, salt)
        if existing is None or existing.state is JobState.REJECTED:
            return None
        if existing.request_hash != request_key:
            raise _mismatch(
                "this salt was already spent by another request", existing, received, existing.summary
            )
        await self._answers(existing)
        return existing

    async def _answers(self, existing: Job) -> None:
        """The identical request's job answers this one: simulated first if it is an orphan
        of a process that died mid-check."""
        await self.simulator.resume(existing)
        log.info(
            "identical request: its job answers",
            extra={"job_id": existing.id, "job_request_id": existing.request_id},
        )

    async def _executor_funded(self) -> None:
        """Refuse new work while every executor key's ETH balance is below the configured
        floor, rather than accept jobs they could strand (the identical request of a job
        already taken is still answered). One funded key is enough: the drained ones take
        no new work (see the broadcaster's lane board).

        Raises:
            Rejection: ``payment_unavailable`` (503, retryable).
            Unavailable: the chain node failed.
        """
        if not self.min_executor_balance_wei:
            return
        if len(self.executors) == 1:  # one read: no task for it
            balances = [await self.supply.chain.eth_balance(self.executors[0])]
        else:
            balances = await asyncio.gather(*(self.supply.chain.eth_balance(e) for e in self.executors))
        if max(balances) < self.min_executor_balance_wei:
            log.warning("every executor balance is below the floor: new work refused")
            raise Rejection(
                "payment_unavailable",
                "the executor's balance is below its operating floor; no new work is taken until the "
                "operator tops it up. Retry later.",
            )

    async def _affordable(self, verified: VerifiedAuthorization) -> PayerBalance:
        """The payer's token balance at a numbered block (cached per block and payer), checked
        against the signed value before anything is recorded: a payer that cannot pay (a
        throwaway key, say) costs no row, no simulation and at most one ``eth_call``.

        A balance not yet read at the cached head, or short at it (that head may predate the
        payer's funding), is read once at the node's latest block with that block's number
        (Multicall3: the payers asked together share one ``eth_call``): short there, the payer
        is refused; covered, that read and its block are the reservation's.

        Raises:
            ChainRevert: ``contract_revert`` with the token's ``ERC20InsufficientBalance``,
                as the simulation would have reverted.
            Unavailable: the chain node failed.
        """
        return await self._covered(
            verified.retirement.input_token,
            verified.payer,
            verified.value,
            lambda held: _overdrawn(verified, held),
        )

    async def _covered(
        self, token: str, payer: str, value: int, refuse: Callable[[int], Exception]
    ) -> PayerBalance:
        """``payer``'s balance of ``token`` at a numbered block, if it covers ``value`` (atomic
        units); else raises what ``refuse`` makes of what it holds (see :meth:`_affordable`).

        Raises:
            Exception: ``refuse(held)``.
            Unavailable: the chain node failed.
        """
        chain = self.supply.chain
        read = await chain.cached_balance(token, payer)
        if read is None or read.amount < value:
            read = await chain.balance_latest(token, payer)
            if read.amount < value:
                raise refuse(read.amount)
        return PayerBalance(read.amount, read.block_number)

    async def _supply_check(self, resolved: Resolved, now: int, refuse: FillRefuser) -> SupplyCheck | None:
        """How the route's supply is checked when its job is reserved: the listing (by the one
        fill rule) or the class credit's liquidity, read at the head block (one ``eth_call``,
        shared per block), less what the jobs in flight of that supply take. None when the
        read finds no such listing or class credit (the simulation refuses it).

        Raises:
            Unavailable: the chain node failed.
        """
        route = resolved.route
        if route.carbon_class is None:
            block = await self.supply.chain.node.head()
            listing = await self.supply.chain.listing(route.source_id, block=block)
            if listing is None:
                return None
            whole = route.credit.whole_tonnes_only

            def fill(reserved: int) -> None:
                refusal = check_fill(listing, route.units, now, whole_tonnes_only=whole, reserved=reserved)
                if refusal is not None:
                    raise refuse(refusal, route.source_id, route.credit)

            return SupplyCheck(block, fill_rule(listing, route.units, now, whole_tonnes_only=whole), fill)
        classes, block = await self.supply.chain.classes_at()  # shared per head, with its block
        held = [
            available
            for c in classes
            if c.class_id == route.source_id
            for token_id, available in c.credits
            if token_id == route.credit.token_id
        ]
        if not held:
            return None

        def redeem(reserved: int) -> None:
            left = check_liquidity(held[0], route.units, reserved=reserved)
            if left is not None:
                raise Rejection("insufficient_liquidity", available=format_tonnes(left))

        return SupplyCheck(block, liquidity_rule(held[0], route.units), redeem)

    def _new_job(
        self, verified: VerifiedAuthorization, summary: Mapping[str, Any], quote_total: int
    ) -> NewJob:
        """The job of ``verified``, to record."""
        r = verified.retirement
        return NewJob(
            chain_id=self.chain_id,
            bound_nonce=verified.bound_nonce,
            permit_key=verified.permit_key,
            salt=verified.salt,
            scheme=verified.scheme,
            payer=verified.payer,
            input_token=verified.retirement.input_token,
            auth_value=verified.value,
            auth_expires_at=verified.expires_at,
            gas_allowance=verified.gas_allowance,
            request_hash=verified.request_hash,
            settlement=self.settlement,
            call_data=_call_data(verified),
            summary=dict(summary),
            quote_total=quote_total,
            supply=SupplyTake(r.source, r.source_id, r.token_id, r.amount),
        )

    async def _reserve(
        self,
        new: NewJob,
        verified: VerifiedAuthorization,
        balance: PayerBalance,
        supply: SupplyCheck | None = None,
    ) -> tuple[Job, bool]:
        """Record ``new`` (``verified``'s job) and spend the salt, within what the payer's
        balance covers beside its other jobs in flight, and what its supply holds beside the
        jobs in flight of that supply; (job, whether this caller drives it)."""
        try:
            job, owned = await self.jobs.reserve(new, balance, supply)
        except PayerOverdrawn as exc:
            raise _overdrawn(verified, max(0, exc.balance - exc.reserved)) from None
        except PermitInUse:
            raise Rejection(
                "params_mismatch",
                "this permit nonce is already being spent by another request",
                expectedNonce="0x" + verified.bound_nonce.hex(),
                receivedNonce=_received_nonce(verified),
                submitted=new.summary,
            ) from None
        except SaltReused as exc:
            raise _mismatch(
                "salt already spent by another authorization", exc.job, _received_nonce(verified), new.summary
            ) from None
        if job.request_hash != verified.request_hash and not owned:
            raise _mismatch(
                "this authorization was already used for another request",
                job,
                _received_nonce(verified),
                new.summary,
            )
        return job, owned


def _call_data(v: VerifiedAuthorization) -> bytes:
    if v.scheme == "eip3009":
        return calls.retire_with_authorization(
            v.retirement, v.salt, v.payer, v.value, v.valid_after, v.valid_before, v.signature
        )
    return calls.retire_with_permit(v.retirement, v.salt, v.payer, v.value, v.valid_before, v.signature)


def _transfer_job(v: VerifiedTransfer, api_key_id: int | None, from_block: int) -> NewJob:
    """The job of a verified transfer: its call on the token (``settlement`` holds the call
    target), no allowance, the value as the quote total, no supply taken; its summary keeps
    the block its proof is searched from (``fromBlock``, :mod:`relayer.service.proofs`)."""
    call = calls.transfer_with_authorization(
        v.payer, v.to, v.value, v.valid_after, v.valid_before, v.nonce, v.signature
    )
    return NewJob(
        chain_id=v.chain_id,
        bound_nonce=v.bound_nonce,
        permit_key=None,
        salt=v.salt,
        scheme="eip3009",
        payer=v.payer,
        input_token=v.token,
        auth_value=v.value,
        auth_expires_at=v.expires_at,
        gas_allowance=0,
        request_hash=v.request_hash,
        settlement=v.token,
        call_data=call,
        summary={
            "kind": "transfer",
            "token": v.token,
            "from": v.payer,
            "to": v.to,
            "value": str(v.value),
            "validBefore": str(v.valid_before),
            "nonce": "0x" + v.nonce.hex(),
            "fromBlock": from_block,
        },
        quote_total=v.value,
        kind="transfer",
        api_key_id=api_key_id,
    )


def _transfer_overdrawn(v: VerifiedTransfer, available: int) -> ChainRevert:
    """The refusal of a transfer the payer cannot pay: what is ``available`` to it (atomic
    units) against the signed value, as the token would revert."""
    refusal = ChainRevert.insufficient_balance(v.payer, available, v.value, "transferWithAuthorization")
    refusal.message = (
        "the payer's balance, less what its authorizations in flight may still take, does not cover "
        "this transfer; nothing was broadcast"
    )
    return refusal


def _overdrawn(v: VerifiedAuthorization, available: int) -> ChainRevert:
    """The refusal of an authorization the payer cannot pay: what is ``available`` to it
    (atomic units) against the signed value, as the token would revert."""
    function = "retireWithAuthorization" if v.scheme == "eip3009" else "retireWithPermit"
    refusal = ChainRevert.insufficient_balance(v.payer, available, v.value, function)
    refusal.message = (
        "the payer's balance, less what its authorizations in flight may still take, does not cover "
        "this authorization; nothing was broadcast"
    )
    return refusal


def _nonce_text(nonce: bytes | int) -> str:
    """A signed nonce as the wire shows it: bytes32 hex (EIP-3009) or decimal (EIP-2612)."""
    return "0x" + nonce.hex() if isinstance(nonce, bytes) else str(nonce)


def _received_nonce(v: VerifiedAuthorization) -> str:
    return "0x" + v.bound_nonce.hex() if v.permit_nonce is None else str(v.permit_nonce)


def _mismatch(message: str, job: Job, received: str | None, summary: Mapping[str, Any]) -> Rejection:
    """``params_mismatch`` against the job that already holds the salt or authorization."""
    return Rejection(
        "params_mismatch",
        message,
        expectedNonce="0x" + job.bound_nonce.hex(),
        receivedNonce=received,
        submitted=dict(summary),
    )
