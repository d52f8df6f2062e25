"""The outcome of a relay job, waited for within a bound (settings ``settle_wait_s``):
settled with certificate entries (indexed, at the confirmation depth), at depth but not yet
indexed (``pending_index``), still on its way (``submitted``/``accepted``, answered 202 by the
API: a transaction mined above the depth is not named settled or pending), or the error
stored with the job, raised. Spec: actions/retire, States; transaction_reverted."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final, Literal

from relayer.chain.errors import ChainUnavailable
from relayer.chain.reads import ChainReads
from relayer.domain.errors import Rejection, RelayerError, Unavailable
from relayer.domain.states import JobState
from relayer.service.certificate import Certificates
from relayer.store.relay_jobs import Job, RelayJobs
from relayer.store.retirements import IndexedRetirement, RetirementStore

# How often a wait re-reads its job while the database is unavailable (seconds).
OUTAGE_RETRY_S: Final = 0.25
# How long a wait trusts the job's notifications before it re-reads the job anyway (seconds):
# every change of state is notified (the trigger), and a re-opened LISTEN connection wakes
# every waiter, so this only bounds what a lost notification costs.
POLL_FALLBACK_S: Final = 5.0
ANSWERING_STATES: Final = frozenset(
    {JobState.INDEXED.value, JobState.REJECTED.value, JobState.DROPPED.value, JobState.REVERTED.value}
)
"""The states a waiting request is woken for: the ones :meth:`Outcomes._answer` answers
from before its deadline (the others only change what it says when the wait runs out)."""

Status = Literal["settled", "pending_index", "submitted", "accepted"]


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
    ) -> None:
        self.jobs = jobs
        self.retirements = retirements
        self.reads = reads
        self.certificates = certificates
        self.settle_wait_s = settle_wait_s
        self._watch = watch
        self._draining = False
        self._waiting: set[asyncio.Event] = set()

    def drain(self) -> None:
        """The process is stopping: every wait, now and from now on, answers at once with
        what its job says (as when its wait runs out: ``submitted``/``accepted`` while it is
        on its way). The job is durable; the identical request, posted again to another
        process, gets the final answer."""
        self._draining = True
        for changed in self._waiting:
            changed.set()

    async def wait(self, job_id: int) -> RetireOutcome:
        """Wait (at most ``settle_wait_s``, or not at all once :meth:`drain` is called) until
        the job settles or fails, then answer.

        Raises:
            RelayerError: the error stored with a rejected job (its spec code), or
                ``transaction_reverted`` (``transactionHash``).
            Unavailable: the database was still failing when the wait ran out (failures
                before that are retried every :data:`OUTAGE_RETRY_S` seconds).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settle_wait_s
        with self._watch(job_id, ANSWERING_STATES) as changed:
            self._waiting.add(changed)
            try:
                return await self._wait(job_id, deadline, changed)
            finally:
                self._waiting.discard(changed)

    async def _wait(self, job_id: int, deadline: float, changed: asyncio.Event) -> RetireOutcome:
        loop = asyncio.get_running_loop()
        while True:
            changed.clear()  # before the read: a change from here on ends the wait below
            remaining = 0.0 if self._draining else deadline - loop.time()
            try:
                job = await self.jobs.get(job_id)
                assert job is not None
                answer = await self._answer(job, remaining)
            except Unavailable:
                # The job is recorded and its workers carry on without this request: a
                # short outage (a database restart) is ridden out within the wait.
                if remaining <= 0:
                    raise
                await asyncio.sleep(min(remaining, OUTAGE_RETRY_S))
                continue
            if answer is not None:
                return answer
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), max(0.0, min(remaining, POLL_FALLBACK_S)))

    async def _answer(self, job: Job, remaining: float) -> RetireOutcome | None:
        """The answer the job gives now, or None to keep waiting."""
        if job.state in (JobState.REJECTED, JobState.DROPPED) and job.error is not None:
            raise RelayerError.from_record(job.error)
        if job.state is JobState.REVERTED:
            return await self._reverted(job, remaining)
        if job.state is JobState.INDEXED:
            return self._body(job, "settled", job.tx_hash, await self._indexed(job))
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

    async def _indexed(self, job: Job) -> list[IndexedRetirement]:
        if job.tx_hash is None:
            return []
        return await self.retirements.by_transaction(job.chain_id, job.tx_hash)

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
