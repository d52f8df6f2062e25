"""The pre-sign check: a signing batch checked again at the latest block just before the
executor signs it (balances, supplies, the calls themselves, fee caps), so what changed since
acceptance is refused before the executor pays for a revert (spec: actions/retire;
contract_revert, insufficient_authorized_value, insufficient_listing_supply, below_min_fill,
insufficient_liquidity; issue 20: a re-check only when something changed). Accept-time
simulation is :mod:`relayer.service.simulate`, which owns this check and shares with it the
blocks its jobs were simulated and reserved at."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar, cast

from relayer.chain.calls import relayed_function
from relayer.chain.errors import ChainRevert, ChainUnavailable
from relayer.chain.executor import ExecutorChain
from relayer.chain.reads import ChainReads, StateNow
from relayer.chain.types import TokenBalance
from relayer.domain.amounts import format_tonnes
from relayer.domain.errors import Rejection, RelayerError, Unavailable
from relayer.domain.fill import Unfillable, check_fill, check_liquidity
from relayer.domain.marketplace import ListingInfo
from relayer.domain.retirement import SOURCE_CARBON_CLASS, SOURCE_LISTING
from relayer.domain.states import JobState
from relayer.service.gas import GasPlan
from relayer.service.supply import x402_fill_refusal
from relayer.store.relay_jobs import Job, RelayJobs, SupplyAhead, SupplyTake

log = logging.getLogger(__name__)

SUPPLY_REASONS: Final = frozenset(
    {Unfillable.SOLD_OUT, Unfillable.INSUFFICIENT_SUPPLY, Unfillable.BELOW_MIN_FILL}
)
"""The fill rule's refusals a signing batch makes itself, with the listing's codes; a cancelled or
expired listing is left to the batch's own execution (``contract_revert``)."""
SupplyKey = tuple[int, int, int]
"""(source, class or listing id, credit token id) of a job's supply."""
A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")
D = TypeVar("D")


class PreSignCheck:
    """Checks signing batches again just before they are signed.

    Args:
        simulated_at: job id -> the block this process simulated it at (shared with the
            simulator, which writes it; a check takes its jobs' entries out).
        reserved_at: job id -> the block its reservation read the payer's balance and its
            supply at (shared likewise).
        plan: a job's gas plan from a fresh estimate (the simulator's pricing).
        ceiling: the highest max fee per gas (wei) a job may be signed at with a gas limit.
    """

    def __init__(
        self,
        executor: ExecutorChain,
        jobs: RelayJobs,
        reads: ChainReads,
        chain_id: int,
        simulated_at: OrderedDict[int, int],
        reserved_at: OrderedDict[int, int],
        plan: Callable[[Job, int], Awaitable[GasPlan]],
        ceiling: Callable[[Job, int], Awaitable[int]],
    ) -> None:
        self.executor = executor
        self.jobs = jobs
        self.reads = reads
        self.chain_id = chain_id
        self._simulated_at = simulated_at
        self._reserved_at = reserved_at
        self.plan = plan
        self.ceiling = ceiling

    async def recheck(self, batch: Sequence[Job], sender: str) -> list[int]:
        """Check a signing batch again, at the latest block (asked first: one
        ``eth_blockNumber``; every read below is at that block), just before ``sender`` (the
        lane's executor) signs it: what changed since acceptance is refused now, before the
        executor pays for a revert. Returns the ids of the jobs still good, oldest first.

        - Each payer's jobs must fit, together and beside its jobs already signed, in its
          balance now (a payer who moved funds away after acceptance): the ones that do not
          are rejected with the token's ``ERC20InsufficientBalance``.
        - Each job's fill must fit in its listing's ``leftToSell`` or its class credit's
          liquidity now, beside the jobs of that supply mined since, signed already, or older
          (this batch's earlier jobs among them). One the supply cannot meet even beside the
          mined ones alone is rejected with the fill rule's code (insufficient_listing_supply,
          below_min_fill, insufficient_liquidity); one that fits only if a job ahead of it
          fails waits for a later batch.
        - Each job is executed again as ``sender`` at its gas limit, at that block (the whole
          batch in one ``eth_call``: :meth:`ExecutorChain.calls_succeed`, made while the state
          and the database's figures are read), unless this process simulated it at the very
          block that is the latest now (nothing changed on chain since: that execution would
          repeat the simulation's); one that fails is simulated again
          (``eth_estimateGas``): a revert rejects it (``contract_revert``); otherwise it is
          planned again and waits for a later batch. A job whose allowance now covers a
          lower fee cap (the L1 fee or the ETH price moved) is planned again from a fresh
          estimate too, or rejected with ``insufficient_authorized_value`` when its
          allowance no longer covers it.
        - A job whose check could not be made (the node failed) stays simulated for the next
          batch. Nothing refused here was signed: the identical request may be retried.
        - A job this process reserved and simulated at the block that is the latest now is
          not read again: its reservation checked its payer's
          balance beside every job of that payer in flight then, and its supply beside
          every job of that supply, at this very block, and the jobs reserved after it were
          checked beside it; nothing on chain changed since. Only its fee cap is checked
          again. A batch of such jobs costs no other read (issue 20: a re-check only when
          something changed).

        Raises:
            Unavailable: the database failed.
        """
        simulated_at = {job.id: self._simulated_at.pop(job.id, None) for job in batch}
        reserved_at = {job.id: self._reserved_at.pop(job.id, None) for job in batch}
        # each job's fee ceiling (its operator fee is a read at the head, one a gas limit) is
        # read beside the checks, not after them
        ceilings = asyncio.ensure_future(self._ceilings(batch))
        try:
            # the latest block first: the state, the database's figures and the executions
            # are then read together at it (one round of round trips, not two)
            latest = await self.reads.latest_block()
            rest = [j for j in batch if not simulated_at[j.id] == reserved_at[j.id] == latest]
            checked = await self._checked(rest, sender, simulated_at, latest)
        except ChainUnavailable:
            log.warning("re-check failed; the batch waits for the next one")
            return []
        finally:
            ceiling_of = await ceilings  # never raises: each job's failure is its own
        rechecked = {job.id for job in rest}
        checked.update((job.id, True) for job in batch if job.id not in rechecked)  # unchanged since
        ordered = [job for job in batch if job.id in checked]
        outcomes = await asyncio.gather(
            *(self._still_good(job, sender, checked[job.id], ceiling_of[job.id]) for job in ordered),
            return_exceptions=True,
        )
        good: list[int] = []
        for job, outcome in zip(ordered, outcomes, strict=True):
            if isinstance(outcome, Unavailable):
                log.warning("re-check failed; the job waits for the next batch", extra={"job_id": job.id})
            elif isinstance(outcome, RelayerError):
                log.warning("refused before signing", extra={"job_id": job.id, "error": outcome.code})
                await self.jobs.move(job.id, JobState.REJECTED, error=outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            elif outcome:
                good.append(job.id)
        return good

    async def _checked(
        self, batch: Sequence[Job], sender: str, simulated_at: dict[int, int | None], block: int
    ) -> dict[int, bool]:
        """The balance and supply checks of ``batch`` at ``block`` (the latest, just asked:
        the ones refused are rejected, the ones that must wait are left out), and the
        execution of its jobs at that block: job id -> whether its execution succeeds, for the
        jobs that passed. The state (the chain), what the signed and older jobs take (the
        database) and the executions (the chain) are read together, all at that block, in one
        round of round trips (the supply's figures read again only when a payer's refusal took
        back a job with supply, which they counted). Nothing read for an empty batch.

        Raises:
            ChainUnavailable: the chain node failed (the state's read or the executions).
            Unavailable: the database failed.
        """
        if not batch:
            return {}
        payers: dict[tuple[str, str], list[Job]] = {}
        for job in sorted(batch, key=lambda j: j.id):
            payers.setdefault((job.payer, job.input_token), []).append(job)
        held = sorted((job for job in batch if job.supply is not None), key=lambda j: j.id)
        state, committed, ahead, succeed = await _together(
            self._state_now(batch, block),
            self.jobs.committed(self.chain_id, list(payers), block),
            self._ahead(held, block),
            self._executions(batch, sender, block, simulated_at),
        )
        refused: dict[int, RelayerError] = {}
        fits = self._fits(payers, committed, state, refused)
        await self._reject(refused)
        if any(job.id in refused for job in held):
            # a refused job's supply was counted ahead of the jobs after it: read again
            ahead = await self._ahead(held, block)
        refused = {}
        fits = self._supply_fits([job for job in held if job.id in fits], ahead, state, refused, fits)
        await self._reject(refused)
        return {job.id: ok for job, ok in zip(batch, succeed, strict=True) if job.id in fits}

    async def _reject(self, refusals: dict[int, RelayerError]) -> None:
        """Move each job of ``refusals`` to rejected with its refusal, oldest first."""
        for job_id in sorted(refusals):
            await self.jobs.move(job_id, JobState.REJECTED, error=refusals[job_id])

    async def _ahead(self, held: Sequence[Job], block: int) -> dict[int, SupplyAhead] | None:
        """What other jobs take from each held supply before each of ``held``, as read at
        ``block`` (:meth:`RelayJobs.supply_ahead`); None when the database failed (their
        jobs wait for the next batch)."""
        if not held:
            return {}
        try:
            return await self.jobs.supply_ahead([job.id for job in held], block)
        except Unavailable:
            log.warning("supply re-check failed; its jobs wait for the next batch")
            return None

    async def _executions(
        self, jobs: Sequence[Job], sender: str, block: int, simulated_at: dict[int, int | None]
    ) -> list[bool]:
        """Whether each of ``jobs`` succeeds as ``sender`` at its gas limit at ``block`` (the
        latest, as the state was read): True without a call for a job simulated at ``block``
        itself, the others executed at ``block``, each as its own ``eth_call`` would (all in
        one ``eth_call`` of the batch prober: :meth:`ExecutorChain.calls_succeed`).

        Raises:
            Unavailable: the batch failed as a whole.
        """
        run = [job for job in jobs if simulated_at.get(job.id) != block]
        succeed = (
            await self.executor.calls_succeed(
                sender,
                [
                    (j.settlement, j.call_data, j.gas_limit or 0, relayed_function(j.kind, j.scheme))
                    for j in run
                ],
                block,
            )
            if run
            else []
        )
        executed = {job.id: ok for job, ok in zip(run, succeed, strict=True)}
        return [executed.get(job.id, True) for job in jobs]

    async def _state_now(self, batch: Sequence[Job], block: int) -> StateNow:
        """What the re-check of ``batch`` reads on chain, at ``block``: every payer's
        balance, every listing its jobs fill and (for a class fill) the classes, in one
        ``eth_call``.

        Raises:
            Unavailable: the chain node failed.
        """
        takes = [job.supply for job in batch if job.supply is not None]
        return await self.reads.state_now(
            [(job.input_token, job.payer) for job in batch],
            sorted({t.source_id for t in takes if t.source == SOURCE_LISTING}),
            any(t.source != SOURCE_LISTING for t in takes),
            block,
        )

    def _fits(
        self,
        payers: dict[tuple[str, str], list[Job]],
        committed: dict[tuple[str, str], int],
        state: StateNow,
        refusals: dict[int, RelayerError],
    ) -> set[int]:
        """The jobs whose payers can pay them (``payers``: each (payer, token)'s jobs, oldest
        first), beside what their signed jobs will take (``committed``, read at the state's
        block); the others' refusals go into ``refusals``. A payer with one job in the batch
        and none signed is not judged on its balance: its own execution reverts as the token
        would."""
        block = state.block
        fits: set[int] = set()
        for key, jobs in payers.items():
            spent = committed.get(key, 0)
            if len(jobs) == 1 and not spent:
                fits.add(jobs[0].id)
                continue
            balance = TokenBalance(state.balances[(key[1], key[0])], block)
            for job in jobs:
                if spent + job.auth_value > balance.amount:
                    refusals[job.id] = ChainRevert.insufficient_balance(
                        job.payer, max(0, balance.amount - spent), job.auth_value, function_name(job)
                    )
                    log.warning("refused before signing: the payer's balance fell", extra={"job_id": job.id})
                    continue
                spent += job.auth_value
                fits.add(job.id)
        return fits

    def _supply_fits(
        self,
        held: Sequence[Job],
        ahead: dict[int, SupplyAhead] | None,
        state: StateNow,
        refusals: dict[int, RelayerError],
        fits: set[int],
    ) -> set[int]:
        """``fits`` less the jobs of ``held`` (those that passed the payers' check and take
        supply, oldest first) whose fills their supply does not meet as read at the state's block, beside
        what other jobs take before them (``ahead``, read with no refusal of this batch
        recorded; None: not read, every one of them waits), oldest first; the ones it cannot
        meet go into ``refusals`` (what each would have taken is given back to the jobs after
        it), the ones that must wait are left out."""
        held_ids = {job.id for job in held}
        out = {job_id for job_id in fits if job_id not in held_ids}
        if ahead is None:
            return out
        figures = _supply_figures([job.supply for job in held if job.supply], state)
        released: dict[SupplyKey, int] = {}  # what this batch's earlier refused jobs gave back
        now = int(time.time())
        for job in held:
            assert job.supply is not None
            key = _key(job.supply)
            behind = ahead.get(job.id, SupplyAhead(0, 0))
            verdict = _supply_verdict(
                job.supply, figures.get(key), behind.mined_after, behind.ahead - released.get(key, 0), now
            )
            if verdict is True:
                out.add(job.id)
            elif verdict is False:
                log.info("waits for the jobs ahead of it on its supply", extra={"job_id": job.id})
            else:
                log.warning("refused before signing: its supply is taken", extra={"job_id": job.id})
                refusals[job.id] = verdict
                released[key] = released.get(key, 0) + job.supply.units
        return out

    async def _ceilings(self, jobs: Sequence[Job]) -> dict[int, int | BaseException]:
        """Each job's fee ceiling at its gas limit (:attr:`ceiling`), read together (their
        reads at the head go out together); a job's failure is its own, never raised."""
        got = await asyncio.gather(
            *(self.ceiling(job, job.gas_limit or 0) for job in jobs), return_exceptions=True
        )
        return {job.id: ceiling for job, ceiling in zip(jobs, got, strict=True)}

    async def _still_good(self, job: Job, sender: str, succeeds: bool, ceiling: int | BaseException) -> bool:
        """Whether ``job`` may be signed now: it ``succeeds`` at its gas limit (its
        ``eth_call`` as ``sender``) and its fee cap stays under what its allowance covers
        (``ceiling``, :attr:`ceiling` read beside the checks, or that read's failure).
        Otherwise it is simulated again (``eth_estimateGas``) and planned again, and False:
        it is signed in a later batch, once its call succeeds at the new plan's gas limit
        (a job is only ever signed at a gas limit just executed successfully).

        Raises:
            ChainRevert: it would revert now.
            Rejection: insufficient_authorized_value, gas_limit_exceeds_cap.
            Unavailable: the chain node or the database failed.
        """
        assert job.gas_limit is not None and job.max_fee_per_gas is not None
        if succeeds:
            if isinstance(ceiling, BaseException):
                raise ceiling
            if job.max_fee_per_gas <= ceiling:
                return True
        # The plan's margin applies to a fresh estimate, never to the old limit (which
        # already holds one): a re-plan does not inflate the gas limit.
        estimate = await self.executor.estimate_gas(sender, job.settlement, job.call_data, function_name(job))
        fresh = await self.plan(job, estimate)
        await self.jobs.replan(
            job.id,
            fresh.gas_limit,
            fresh.max_fee_per_gas,
            fresh.max_priority_fee_per_gas,
            fresh.allowance_wei,
        )
        return False


async def _together(a: Awaitable[A], b: Awaitable[B], c: Awaitable[C], d: Awaitable[D]) -> tuple[A, B, C, D]:
    """``a``, ``b``, ``c`` and ``d`` awaited together: once all have ended (none is left
    running), the first failure in that order is raised, else their values."""
    got = await asyncio.gather(a, b, c, d, return_exceptions=True)
    for outcome in got:
        if isinstance(outcome, BaseException):
            raise outcome
    return cast(tuple[A, B, C, D], tuple(got))


def _supply_figures(
    takes: Sequence[SupplyTake], state: StateNow
) -> dict[SupplyKey, ListingInfo | int | None]:
    """Each supply's figure in ``state``: its listing (None: no such listing), or its class
    credit's liquidity in credit units (absent: no such class credit)."""
    figures: dict[SupplyKey, ListingInfo | int | None] = {
        _key(t): state.listings.get(t.source_id) for t in takes if t.source == SOURCE_LISTING
    }
    for c in state.classes or []:
        for token_id, available in c.credits:
            figures[(SOURCE_CARBON_CLASS, c.class_id, token_id)] = available
    return figures


def _key(take: SupplyTake) -> SupplyKey:
    return (take.source, take.source_id, take.token_id)


def _supply_verdict(
    take: SupplyTake, figure: ListingInfo | int | None, mined_after: int, ahead: int, now: int
) -> bool | RelayerError:
    """Whether a fill of ``take`` may be signed beside what other jobs take from its supply
    first (credit units: ``mined_after`` by jobs mined after the figure's block, ``ahead`` by
    jobs in flight ahead of it): True, sign it; False, it waits (it fits only if a job ahead
    fails); a refusal, reject it (it does not fit even beside the mined ones). A supply the
    read did not find, or a cancelled or expired listing, is left to the batch's execution."""
    if figure is None:
        return True
    if isinstance(figure, int):
        left = check_liquidity(figure, take.units, reserved=mined_after)
        if left is not None:
            return Rejection("insufficient_liquidity", available=format_tonnes(left))
        return check_liquidity(figure, take.units, reserved=mined_after + ahead) is None
    definite = check_fill(figure, take.units, now, whole_tonnes_only=False, reserved=mined_after)
    if definite is not None:
        return (
            x402_fill_refusal(definite, take.source_id, None) if definite.reason in SUPPLY_REASONS else True
        )
    return check_fill(figure, take.units, now, whole_tonnes_only=False, reserved=mined_after + ahead) is None


def function_name(job: Job) -> str:
    """The name of the contract function a job's transaction calls (for the node's errors)."""
    return relayed_function(job.kind, job.scheme).name
