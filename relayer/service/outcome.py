"""The outcome of a relay job, waited for within a bound (settings ``settle_wait_s``):
settled with certificate entries (indexed, at the confirmation depth), at depth but not yet
indexed (``pending_index``), still on its way (``submitted``/``accepted``, answered 202 by the
API: a transaction mined above the depth is not named settled or pending), or the error
stored with the job, raised. Spec: actions/retire, States; transaction_reverted."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from relayer.chain.errors import ChainUnavailable
from relayer.chain.reads import ChainReads
from relayer.coalesce import Coalescer
from relayer.domain.errors import Rejection, RelayerError, Unavailable
from relayer.domain.proof import Standing
from relayer.domain.states import JobState
from relayer.service.certificate import Certificates
from relayer.service.proofs import ConfirmedThrough, TransferProofs, blocks_deep
from relayer.store.relay_jobs import Job, RelayJobs
from relayer.store.retirements import IndexedRetirement, RetirementStore

# How often a wait re-reads its job while the database is unavailable (seconds).
OUTAGE_RETRY_S: Final = 0.25
# How long a wait trusts the job's notifications before it re-reads the job anyway (seconds):
# every change of state is notified (the trigger), and a re-opened LISTEN connection wakes
# every waiter, so this only bounds what a lost notification costs.
POLL_FALLBACK_S: Final = 5.0
READ_BATCH_MAX: Final = 200
"""Most waiting requests whose jobs one statement reads (:meth:`Outcomes.wait`): a block's
indexed jobs wake their requests together, and their reads share statements of at most this
many jobs (the rest go in the next)."""
ANSWERING_STATES: Final = frozenset(
    {JobState.INDEXED.value, JobState.REJECTED.value, JobState.DROPPED.value, JobState.REVERTED.value}
)
"""The states a waiting request is woken for: the ones :meth:`Outcomes._answer` answers
from before its deadline (the others only change what it says when the wait runs out)."""

TRANSFER_ANSWERING_STATES: Final = frozenset(
    {JobState.CONFIRMED.value, JobState.REJECTED.value, JobState.DROPPED.value, JobState.REVERTED.value}
)
"""The states a wait for a ``transfer`` job is woken for (a transfer is final at confirmed)."""

USED_OTHERWISE: Final = {
    "code": "authorization_used_otherwise",
    "message": "the chain shows the authorization's nonce used without this transfer (cancelled, "
    "or spent on another authorization), or no longer usable: nothing was paid",
}
"""The failure record of a transfer the chain proves can never happen."""

Status = Literal["settled", "pending_index", "submitted", "accepted"]
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class TransferOutcome:
    """What a ``transfer`` job answers (see :meth:`Outcomes.wait_transfer`).

    Attributes:
        job: the job as last read.
        success: the transfer happened: the chain holds its proof at the confirmation policy
            (:mod:`relayer.domain.proof`: the token's ``AuthorizationUsed`` and ``Transfer``
            logs of one transaction), in our transaction or another sender's
            (``front_run``). Never from a job's state or a used nonce alone.
        final: the answer stands (short of a reorg); False when the wait ran out first.
        tx_hash: the transaction that moved the funds (ours, or the front-runner's: never
            empty on success), our transaction for a revert or a pending answer, None when
            nothing was signed.
        front_run: another sender's transaction made the transfer.
        error: the ``{code, message, context}`` record of a failure: the job's, or
            :data:`USED_OTHERWISE` when the chain shows the nonce used without this transfer.
    """

    job: Job
    success: bool
    final: bool
    tx_hash: bytes | None
    front_run: bool = False
    error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class RetireOutcome:
    """What actions/retire answers when nothing failed: ``settled`` and ``pending_index`` are
    final answers; ``submitted`` and ``accepted`` mean the wait ran out first (post the
    identical request again for the final answer)."""

    status: Status
    body: dict[str, Any]

    @property
    def final(self) -> bool:
        return self.status in ("settled", "pending_index")


class Outcomes:
    """Waits for relay jobs to settle or fail."""

    def __init__(
        self,
        jobs: RelayJobs,
        retirements: RetirementStore,
        reads: ChainReads,
        certificates: Certificates,
        settle_wait_s: float,
        watch: Callable[[int, Collection[str]], AbstractContextManager[asyncio.Event]],
        confirmed: ConfirmedThrough | None = None,
    ) -> None:
        """``confirmed`` is the chain's confirmed-through function (default: one block, the
        head itself); the daemon passes its confirmation policy's (app.py)."""
        self.jobs = jobs
        self.proofs = TransferProofs(reads, confirmed or blocks_deep(1))
        self.retirements = retirements
        self.reads = reads
        self.certificates = certificates
        self.settle_wait_s = settle_wait_s
        self._watch = watch
        self._draining = False
        self._waiting: set[asyncio.Event] = set()
        # each woken request's job with its retirements: the reads that come while one
        # statement runs go together in the next (a block's answers in one or two statements)
        self._reads: Coalescer[int, tuple[Job, list[IndexedRetirement]] | None] = Coalescer(
            self._read_jobs, READ_BATCH_MAX
        )

    async def _read_jobs(self, job_ids: Sequence[int]) -> list[tuple[Job, list[IndexedRetirement]] | None]:
        """The jobs (with their retirements once indexed) of the waits that read together."""
        return await self.retirements.jobs_and_retirements(job_ids)

    @property
    def confirmed(self) -> ConfirmedThrough:
        """The confirmation policy transfers are judged by (:attr:`TransferProofs.confirmed`)."""
        return self.proofs.confirmed

    @confirmed.setter
    def confirmed(self, through: ConfirmedThrough) -> None:
        self.proofs.confirmed = through

    def drain(self) -> None:
        """The process is stopping: every wait, now and from now on, answers at once with
        what its job says (as when its wait runs out: ``submitted``/``accepted`` while it is
        on its way). The job is durable; the identical request, posted again to another
        process, gets the final answer."""
        self._draining = True
        for changed in self._waiting:
            changed.set()

    async def wait(
        self, job_id: int, wait_s: float | None = None, *, made_now: bool = False
    ) -> RetireOutcome:
        """Wait (at most ``wait_s``, default ``settle_wait_s``, or not at all once
        :meth:`drain` is called) until the job settles or fails, then answer. ``made_now``:
        the caller has just made the job (accepted or simulated, states that do not answer)
        and awaited nothing since, so nothing could have moved it to one that does: the
        first read is skipped (one database round trip a retirement). The requests woken
        together (a block's jobs indexed in one statement) read their jobs in one statement
        (at most :data:`READ_BATCH_MAX` a statement).

        Raises:
            RelayerError: the error stored with a rejected job (its spec code), or
                ``transaction_reverted`` (``transactionHash``).
            Unavailable: the database was still failing when the wait ran out (failures
                before that are retried every :data:`OUTAGE_RETRY_S` seconds).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.settle_wait_s if wait_s is None else wait_s)
        with self._watch(job_id, ANSWERING_STATES) as changed:
            self._waiting.add(changed)
            try:
                if made_now and not self._draining:
                    await self._changed_or_late(changed, deadline)
                return await self._wait(job_id, deadline, changed, self._reads, self._answer)
            finally:
                self._waiting.discard(changed)

    @staticmethod
    async def _changed_or_late(changed: asyncio.Event, deadline: float) -> None:
        """Wait until ``changed`` is set, :data:`POLL_FALLBACK_S` passed, or ``deadline``."""
        remaining = deadline - asyncio.get_running_loop().time()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), max(0.0, min(remaining, POLL_FALLBACK_S)))

    async def _wait(
        self,
        job_id: int,
        deadline: float,
        changed: asyncio.Event,
        read: Callable[[int], Awaitable[R | None]],
        answer: Callable[[R, float], Awaitable[T | None]],
    ) -> T:
        """Re-read the job (``read``: the job, or the job with its retirements) on each change
        until ``answer`` (:meth:`_answer`, :meth:`_transfer_answer`) gives one, with what
        remains of the wait (0 once it ran out or the process drains)."""
        loop = asyncio.get_running_loop()
        while True:
            changed.clear()  # before the read: a change from here on ends the wait below
            remaining = 0.0 if self._draining else deadline - loop.time()
            try:
                job = await read(job_id)
                if job is None:
                    raise LookupError(f"no relay job {job_id}")
                found = await answer(job, remaining)
            except Unavailable:
                # The job is recorded and its workers carry on without this request: a
                # short outage (a database restart) is ridden out within the wait.
                if remaining <= 0:
                    raise
                await asyncio.sleep(min(remaining, OUTAGE_RETRY_S))
                continue
            if found is not None:
                return found
            await self._changed_or_late(changed, deadline)

    async def wait_transfer(self, job_id: int, wait_s: float) -> TransferOutcome:
        """Wait (at most ``wait_s`` seconds, or not at all once :meth:`drain` is called) for a
        ``transfer`` job's answer: ``confirmed`` (success), ``rejected``/``dropped``/
        ``reverted`` (failure with the stored error or our transaction), each judged on the
        chain's proof where the transfer may have happened (see :meth:`_transfer_answer`):
        success names the transaction the chain holds with the token's ``AuthorizationUsed``
        and ``Transfer`` logs (ours, or a front-runner's), once it is confirmed (by the
        ``confirmed`` function: the depth, or the node's ``safe``/``finalized`` block under a
        tag); until then the answer is not final and carries that transaction's hash. A nonce
        used without this transfer is a final failure (:data:`USED_OTHERWISE`). When the wait
        runs out first the answer is not final (``final`` False) and carries our transaction
        hash once signed.

        Raises:
            LookupError: no such job.
            Unavailable: the database or the chain node was still failing when the wait ran
                out (failures before that are retried every :data:`OUTAGE_RETRY_S` seconds).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        with self._watch(job_id, TRANSFER_ANSWERING_STATES) as changed:
            self._waiting.add(changed)
            try:
                return await self._wait(job_id, deadline, changed, self.jobs.get, self._transfer_answer)
            finally:
                self._waiting.discard(changed)

    async def _transfer_answer(self, job: Job, remaining: float) -> TransferOutcome | None:
        """The answer a transfer job gives now, or None to keep waiting. A job whose
        transaction succeeded (confirmed) or may have been beaten by another sender (reverted,
        or refused by its simulation's revert) is judged on the chain's proof
        (:meth:`TransferProofs.judge_job`): success only when proven at the confirmation
        policy; a failure when the nonce is used without this transfer (cancelled, or spent on
        another authorization) or can no longer be used; otherwise not final."""
        state = job.state
        failed = state in (JobState.REVERTED, JobState.REJECTED, JobState.DROPPED)
        in_doubt = state in (JobState.CONFIRMED, JobState.REVERTED) or (
            state is JobState.REJECTED and (job.error or {}).get("code") == "contract_revert"
        )
        if not in_doubt:
            if failed:
                return TransferOutcome(job, False, True, job.tx_hash, error=job.error)
            return None if remaining > 0 else TransferOutcome(job, False, False, job.tx_hash)
        judged = await self.proofs.judge_job(job)
        proof = judged.proof
        if judged.standing is Standing.PAID:
            assert proof is not None
            return TransferOutcome(job, True, True, proof.tx_hash, front_run=proof.tx_hash != job.tx_hash)
        if judged.standing is Standing.NEVER:
            return TransferOutcome(job, False, True, job.tx_hash, error=USED_OTHERWISE)
        if judged.standing is Standing.PENDING or state is JobState.CONFIRMED:
            # proven above the confirmed block, a use not yet confirmed, or our confirmed
            # transaction not on the chain now (a reorg the follower has not undone)
            if remaining > 0:
                return None  # re-read on the next poll: the block gains confirmations
            tx = job.tx_hash if proof is None else proof.tx_hash
            return TransferOutcome(job, False, False, tx, front_run=proof is not None and tx != job.tx_hash)
        return TransferOutcome(job, False, True, job.tx_hash, error=job.error)

    async def _answer(
        self, read: tuple[Job, list[IndexedRetirement]], remaining: float
    ) -> RetireOutcome | None:
        """The answer the job gives now (read with its retirements once indexed), or None to
        keep waiting."""
        job, indexed = read
        if job.state in (JobState.REJECTED, JobState.DROPPED) and job.error is not None:
            raise RelayerError.from_record(job.error)
        if job.state is JobState.REVERTED:
            return await self._reverted(job, remaining)
        if job.state is JobState.INDEXED:
            return self._body(job, "settled", job.tx_hash, indexed)
        if remaining > 0:
            return None
        if job.state is JobState.CONFIRMED:  # at depth, not yet indexed (never below depth)
            return self._body(job, "pending_index", job.tx_hash, [])
        status: Status = "submitted" if job.tx_hash else "accepted"
        return RetireOutcome(
            status,
            {
                "status": status,
                "transactionHash": _hex(job.tx_hash),
                "jobId": job.id,
                "chainId": job.chain_id,
            },
        )

    async def _reverted(self, job: Job, remaining: float) -> RetireOutcome | None:
        """Anyone may submit a bound authorization; if another transaction settled it first,
        the payer's retirement exists: answer with that, never "re-sign"."""
        elsewhere = await self.retirements.by_bound_nonce(job.chain_id, job.bound_nonce)
        if elsewhere:
            return self._body(job, "settled", elsewhere[0].tx_hash, elsewhere)
        if remaining > 0 and await self._consumed_elsewhere(job):
            return None  # settled by another sender: wait for the indexer to see it
        raise Rejection("transaction_reverted", transactionHash=_hex(job.tx_hash))

    async def _consumed_elsewhere(self, job: Job) -> bool:
        """Whether the job's EIP-3009 authorization was used on-chain (by another transaction,
        since this one reverted) and only waits to be indexed."""
        if job.scheme != "eip3009":
            return False
        try:
            return await self.reads.authorization_used(job.payer, job.bound_nonce)
        except ChainUnavailable:
            return False

    def _body(
        self, job: Job, status: Status, tx_hash: bytes | None, found: list[IndexedRetirement]
    ) -> RetireOutcome:
        return RetireOutcome(
            status,
            {
                "status": status,
                "chainId": job.chain_id,
                "transactionHash": _hex(tx_hash),
                "retirements": [self.certificates.entry(r) for r in found],
                "submitted": job.summary,
            },
        )


def _hex(value: bytes | None) -> str | None:
    return None if value is None else "0x" + value.hex()
