"""Every executor nonce accounted for. When the chain's nonce passes a journaled transaction
that did not mine, something else took its nonce:

- :class:`NonceAudit` (in the chain follower) finds what: one of ours at that nonce (a
  replacement, or a transaction the follower did not look for) is recorded mined as a receipt
  would be; none of ours (the executor key used elsewhere: by hand, by a process restored
  from an old database, on the new fork after a reorg) is a foreign use, logged and counted
  (``relayer_foreign_nonces_total``). Either way the transactions left at that nonce are
  passed: never re-sent, looked for or counted in flight again. Only nonces the chain holds
  at the confirmation depth are judged, so a shallow reorg cannot fake a foreign use; and a
  nonce is judged foreign only when two looks at least :data:`FOREIGN_AFTER_S` apart both
  find none of ours (a node may count a nonce taken by the block it is still mining before
  it serves that block's receipts: anvil at 200 ms blocks did, once in 12,000 soak
  retirements, and the job was dropped although its own transaction had settled).
- :class:`LostNonces` (in the broadcaster, under its lease) takes each job whose every
  transaction was passed: signed again at a new nonce (the same call) while its authorization
  lives and its call still succeeds, or ended (``dropped``) with its reason: the
  authorization expires too soon (``nonce_taken``), a no-op was already to stand in for it
  (its own error), or the call reverts now (the revert, e.g. the authorization used).

A job thus never waits for a transaction that can no longer mine, and the journal's live
window is bounded by the chain's nonce and the job's authorization, not by a clock."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, Literal

from relayer.chain.blocks import BlockReader
from relayer.chain.calls import relayed_function
from relayer.chain.errors import ChainRevert
from relayer.chain.executor import ExecutorChain
from relayer.chain.types import Receipt
from relayer.domain.errors import Rejection, RelayerError, Unavailable
from relayer.metrics import Metrics
from relayer.store.executor_lane import ExecutorLane, LostJob, NonceTx, PendingTx, SignedTx
from relayer.store.relay_jobs import Job

log = logging.getLogger(__name__)

MAX_NONCES: Final = 32
"""At most this many passed nonces of one lane are judged per audit."""
FOREIGN_AFTER_S: Final = 1.0
"""A nonce no transaction of ours took is judged foreign only when a look at least this many
seconds after the first (every read made again) still finds none of ours."""
LOST_EVERY_S: Final = 1.0
"""The broadcaster looks for lost jobs at most this often."""
LOST_BATCH: Final = 16
"""At most this many lost jobs are signed again or ended per look."""
NONCE_TAKEN: Final = Rejection(
    "invalid_auth_payload",
    "a transaction this relay did not sign took the executor nonce of this retirement, and its "
    "authorization expires before it could be signed again; nothing was spent: run prepare-auth "
    "again and sign a new authorization",
    reason="nonce_taken",
)

Record = Callable[[list[tuple[Receipt, PendingTx]]], Awaitable[None]]
"""How the follower records receipts of ours (jobs moved, costs counted)."""


class NonceAudit:
    """Finds what took each journaled nonce the chain passed (see the module)."""

    def __init__(self, chain: BlockReader, lane: ExecutorLane, metrics: Metrics, record: Record) -> None:
        self.chain = chain
        self.lane = lane
        self.metrics = metrics
        self.record = record
        # (executor, nonce) -> monotonic time a look first found none of ours at it; bounded:
        # only the nonces judged in the last look are kept (at most MAX_NONCES per executor)
        self._suspects: dict[tuple[str, int], float] = {}

    @property
    def suspects(self) -> bool:
        """Whether a passed nonce awaits its second look (see :data:`FOREIGN_AFTER_S`): the
        follower audits again even while the chain stands still."""
        return bool(self._suspects)

    async def step(self, through: int) -> None:
        """Judge the nonces the chain holds through block ``through`` (at the confirmation
        depth, receipts read) that still have a journaled transaction neither mined nor
        passed. Costs one database read, and one ``eth_getTransactionCount`` per executor
        with such a transaction (the follower calls it once per new head).

        Raises:
            Unavailable: the chain node or the database failed (judged again next time).
        """
        if through < 0:
            return
        suspects, self._suspects = self._suspects, {}
        for executor, lowest in (await self.lane.lowest_open()).items():
            count = await self.chain.transaction_count(executor, through)
            if count <= lowest:
                continue
            for nonce in await self.lane.open_below(executor, count, MAX_NONCES):
                await self._judge(executor, nonce, through, suspects.get((executor, nonce)))

    async def _judge(self, executor: str, nonce: int, through: int, suspected_at: float | None) -> None:
        """What took ``nonce`` of ``executor`` (passed at block ``through``): record ours,
        or count a foreign use (when a look made at least :data:`FOREIGN_AFTER_S` after
        ``suspected_at``, the monotonic time an earlier look first found none of ours, still
        finds none); then pass what is left at it."""
        txs = await self.lane.at_nonce(executor, nonce)
        found: dict[bytes, Receipt] = {}
        if not any(t.mined_block is not None for t in txs):
            found = await self.chain.receipts([t.tx_hash for t in txs])
        taken = taken_by(txs, found, through)
        if taken == "unsure":
            return  # the chain moved under this look: judged again next time
        if taken == "foreign" and not foreign_confirmed(suspected_at, time.monotonic()):
            self._suspects[(executor, nonce)] = time.monotonic() if suspected_at is None else suspected_at
            return  # looked at again (every read made again) before it is judged foreign
        if taken == "ours":
            ours = [(found[t.tx_hash], _pending(t)) for t in txs if t.tx_hash in found]
            await self.record(ours)
            log.info(
                "an executor nonce passed with a transaction of ours not yet recorded: recorded mined",
                extra={"executor": executor, "nonce": nonce, "tx_hash": "0x" + ours[0][0].tx_hash.hex()},
            )
        passed = await self.lane.mark_passed(executor, nonce)
        if taken == "foreign":
            self.metrics.foreign_nonces.inc()
            jobs = sorted({t.job_id for t in txs if t.job_id is not None})
            log.warning(
                "a transaction not in the journal took an executor nonce: its job is signed again or ends",
                extra={"executor": executor, "nonce": nonce, "jobs": jobs, "passed": passed},
            )


class LostNonces:
    """Signs again, or ends, the jobs whose nonce a foreign transaction took (see the module)."""

    def __init__(
        self,
        chain: ExecutorChain,
        lane: ExecutorLane,
        metrics: Metrics,
        executor: str,
        sign: Callable[[Job, int], SignedTx],
        expiry_margin_s: float,
    ) -> None:
        self.chain = chain
        self.lane = lane
        self.metrics = metrics
        self.executor = executor
        self.sign = sign
        self.expiry_margin_s = expiry_margin_s
        self._next = 0.0

    async def step(self, epoch: int) -> list[SignedTx]:
        """At most every :data:`LOST_EVERY_S`: end the lost jobs that cannot be signed again
        and sign the others at new nonces of this lane (journaled, not yet sent).

        Raises:
            LeaseLost: another process took the lease; nothing was signed.
            Unavailable: the chain node or the database failed.
        """
        if time.monotonic() < self._next:
            return []
        self._next = time.monotonic() + LOST_EVERY_S
        lost = await self.lane.lost(LOST_BATCH)
        if not lost:
            return []
        now = time.time()
        again: list[LostJob] = []
        for item in lost:
            if ends(item.job.error is not None, item.expires_at, now, self.expiry_margin_s):
                await self._end(item.job, NONCE_TAKEN)
            else:
                again.append(item)
        good = await self._still_good([item.job for item in again])
        signed = await self.lane.resign_lost(self.executor, epoch, good, self.sign)
        for tx in signed:
            log.warning(
                "signed again at a new nonce (a foreign transaction took its nonce)",
                extra={"job_id": tx.job_id, "nonce": tx.nonce, "executor": self.executor},
            )
        return signed

    async def _still_good(self, jobs: list[Job]) -> list[int]:
        """The ids of ``jobs`` whose call succeeds now as this lane's executor at their gas
        limit (all in one ``eth_call``: :mod:`relayer.chain.prober`); a job whose call reverts ends with the
        revert, one whose check could not be made waits for the next look."""
        if not jobs:
            return []
        calls = [
            (job.settlement, job.call_data, job.gas_limit or 0, relayed_function(job.kind, job.scheme))
            for job in jobs
        ]
        good: list[int] = []
        for job, ok in zip(jobs, await self.chain.calls_succeed(self.executor, calls), strict=True):
            if ok:
                good.append(job.id)
                continue
            try:
                await self.chain.estimate_gas(self.executor, job.settlement, job.call_data, _function(job))
            except ChainRevert as revert:
                await self._end(job, revert)
            except Unavailable:
                pass
        return good

    async def _end(self, job: Job, error: RelayerError) -> None:
        ended = await self.lane.drop_lost(job.id, error)
        if ended is not None:
            self.metrics.job_transitions.labels("dropped").inc()
            log.warning(
                "dropped: a foreign transaction took its nonce and it cannot be signed again",
                extra={"job_id": job.id, "error": (ended.error or {}).get("code")},
            )


def taken_by(
    txs: Sequence[NonceTx], receipts: Mapping[bytes, Receipt], through: int
) -> Literal["recorded", "ours", "foreign", "unsure"]:
    """What took a nonce the chain passed at block ``through``, given every transaction
    journaled at it and the receipts the chain holds of them now: one already recorded
    mined; one of ours mined at or below ``through`` (to record); none of ours (a foreign
    transaction); or a receipt above ``through`` (the chain moved under the look: unsure)."""
    if any(t.mined_block is not None for t in txs):
        return "recorded"
    if any(r.block_number > through for r in receipts.values()):
        return "unsure"
    return "ours" if any(t.tx_hash in receipts for t in txs) else "foreign"


def foreign_confirmed(suspected_at: float | None, now: float) -> bool:
    """Whether a look at monotonic time ``now`` that finds none of ours at a passed nonce
    judges it foreign: only when an earlier look, at ``suspected_at`` (None: none did), found
    none either, at least :data:`FOREIGN_AFTER_S` before."""
    return suspected_at is not None and now - suspected_at >= FOREIGN_AFTER_S


def ends(standing_in: bool, expires_at: int, now: float, margin_s: float) -> bool:
    """Whether a lost job ends instead of being signed again: a no-op was already to stand
    in for it (``standing_in``), or its authorization expires (unix seconds) within
    ``margin_s`` of ``now`` (it would not be signed now)."""
    return standing_in or expires_at <= now + margin_s


def _pending(tx: NonceTx) -> PendingTx:
    return PendingTx(tx.job_id, tx.kind)


def _function(job: Job) -> str:
    return relayed_function(job.kind, job.scheme).name
