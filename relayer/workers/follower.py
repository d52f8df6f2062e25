"""The chain follower: one loop per new head that (0) notices a reorg (a head whose hash or
parent hash is not the one it saw at that height) and undoes what the lost blocks held, back
to the common ancestor (the walk back it shares with the catalogue indexer,
:class:`~relayer.workers.reorg.ReorgWatch`); (1) reads the receipts of new blocks once per block and moves the
jobs they settle to mined or reverted; (2) finds what took each journaled nonce the chain
passed without its transaction (:class:`~relayer.workers.nonces.NonceAudit`); (3) confirms jobs
buried under the configured depth; and (4) indexes RetirementSettled events of confirmed blocks
into Postgres (cursor = block number and hash) and marks their jobs indexed (settled).

It follows only the chain its database belongs to and only reorgs within the confirmation
window: each step asks the chain guard first (:class:`~relayer.workers.chain_guard.ChainGuard`,
at once on a head below one seen or a reorg), and a reorg deeper than the window, below the
node's finalized block or past its memory halts it (an incident: one log line, the
``relayer_deep_reorg`` gauge, the lanes halted) instead of rewinding settled history, until
the node's chain holds the remembered blocks again."""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from relayer.chain.blocks import BlockReader
from relayer.chain.errors import ChainUnavailable
from relayer.chain.reads import ChainReads
from relayer.chain.types import BlockHeader, Receipt, SettledLog
from relayer.domain.errors import Unavailable
from relayer.domain.incidents import Incident
from relayer.domain.reorg import Ancestor, confirmed_through, is_confirmed
from relayer.domain.states import JobState
from relayer.metrics import Metrics
from relayer.store import reorg
from relayer.store.executor_lane import ExecutorLane, PendingTx
from relayer.store.relay_jobs import RelayJobs
from relayer.store.retirements import IndexedRetirement, RetirementStore
from relayer.workers import OutageLog, retirement_row, sleep_or_stop
from relayer.workers.chain_guard import ChainGuard
from relayer.workers.nonces import NonceAudit
from relayer.workers.reorg import ReorgWatch

log = logging.getLogger(__name__)

CURSOR: Final = "retirements"
MAX_RECEIPT_BLOCKS: Final = 64
MAX_LOG_RANGE: Final = 2_000


class ChainFollower:
    """Receipts, confirmations and the retirement index for one chain."""

    def __init__(
        self,
        chain: BlockReader,
        reads: ChainReads,
        jobs: RelayJobs,
        lane: ExecutorLane,
        retirements: RetirementStore,
        metrics: Metrics,
        confirmations: int,
        start_block: int,
        poll_interval_s: float,
        guard: ChainGuard | None = None,
    ) -> None:
        self.chain = chain
        self.guard = guard
        self.chain_id = chain.node.chain_id
        self.reads = reads
        self.jobs = jobs
        self.lane = lane
        self.retirements = retirements
        self.metrics = metrics
        self.confirmations = confirmations
        self.start_block = start_block
        self.poll_interval_s = poll_interval_s
        self._scanned: int | None = None  # receipts read up to here
        self._indexed: int | None = None  # retirements indexed up to here (the cursor)
        self.watch = ReorgWatch(chain, start_block - 1)  # the blocks as this follower saw them
        self.nonces = NonceAudit(chain, lane, metrics, self._record)  # what took each passed nonce

    async def step(self) -> None:
        """One pass: a reorg undone, receipts of new blocks, confirmations, indexing (all
        bounded). Costs one ``eth_getBlockByNumber`` and nothing else while the head stands
        still and nothing is left to catch up."""
        head = await self.chain.head_block()
        if self.guard is not None:
            await self.guard.check("follower", now=head.number < (self.watch.seen_head or 0))
        if self._indexed is None or self._scanned is None:
            await self._resume(head)
        elif await self.watch.reorged(head):
            await self._reorg(head)
        elif self.watch.incident is not None:
            self._resolved()
        elif head.number == self._scanned and not is_confirmed(
            self._indexed + 1, head.number, self.confirmations
        ):
            return
        if not self.watch.saw(head):
            return  # the chain moved again since the head was read: the next step sees it
        assert self._indexed is not None and self._scanned is not None
        indexed = self._indexed
        if head.number > self._scanned and not await self._scan(head):
            return  # the chain moved under this step: the next one sees the reorg from its head
        safe = min(confirmed_through(head.number, self.confirmations), self._scanned)
        await self.nonces.step(safe)
        for job in await self.jobs.confirm_mined(self.chain_id, safe):
            self.metrics.job_transitions.labels("confirmed").inc()
            log.info("confirmed", extra={"job_id": job.id})
        if safe > indexed:
            await self._index(indexed + 1, min(safe, indexed + MAX_LOG_RANGE))

    async def _reorg(self, head: BlockHeader) -> None:
        """Follow the reorg under ``head`` (rewind to the common ancestor) when it is within
        the confirmation window; else halt.

        Raises:
            Incident: the node answers another chain (the guard, asked at once), or the reorg
                is deeper than the window, below the finalized block or past memory.
        """
        if self.guard is not None:
            await self.guard.check("follower", now=True)
        if self.watch.incident is None:
            to = await self.watch.ancestor(head.number)
            why = self.watch.judge(to, self.confirmations, await self.chain.finalized())
            if why is None:
                await self._rewind(to, f"head {head.number}")
                return
            self.watch.incident = why
            self.metrics.deep_reorg.labels(str(self.chain_id), "follower").set(1)
            if self.guard is not None:
                self.guard.open("follower", why)
            log.error(
                "deep reorg: the follower halts and rewinds nothing (the lanes halt too) until the "
                "node's chain holds the remembered blocks again",
                extra={"chain_id": self.chain_id, "head": head.number, "ancestor": to.number, "reason": why},
            )
        self.metrics.halted_steps.labels("follower", "deep_reorg").inc()
        raise Incident("deep_reorg", self.watch.incident, chain_id=self.chain_id)

    def _resolved(self) -> None:
        """The node's chain holds the remembered blocks again: the deep reorg incident ends."""
        log.warning("deep reorg: the node's chain holds the remembered blocks again; the follower resumes")
        self.watch.incident = None
        self.metrics.deep_reorg.labels(str(self.chain_id), "follower").set(0)
        if self.guard is not None:
            self.guard.close("follower")

    async def _resume(self, head: BlockHeader) -> None:
        """Start from the index cursor; if the chain no longer holds the cursor's block (a
        reorg while no follower ran), rewind as far as a reorg is followed."""
        cursor = await self.retirements.cursor(self.chain_id, CURSOR)
        self._indexed = self.start_block - 1 if cursor is None else cursor[0]
        self._scanned = self._indexed
        ancestor = await self.watch.resume(cursor, head.number)
        if ancestor is not None:
            await self._rewind(ancestor, "at start")

    async def _rewind(self, to: Ancestor, where: str) -> None:
        """Undo everything above the common ancestor ``to`` (jobs, transactions, the index)."""
        assert self._indexed is not None and self._scanned is not None
        ancestor = to.number
        undone = await reorg.rewind(self.jobs.db, self.chain_id, ancestor, to.block_hash)
        self.watch.rewound(ancestor)
        self._scanned, self._indexed = min(self._scanned, ancestor), min(self._indexed, ancestor)
        self.metrics.reorgs.inc()
        for _ in undone.jobs:
            self.metrics.job_transitions.labels(JobState.SUBMITTED.value).inc()
        log.warning(
            "reorg: undid the blocks above the common ancestor",
            extra={
                "ancestor": ancestor,
                "where": where,
                "within_memory": to.within_memory,
                "jobs": len(undone.jobs),
                "transactions": undone.transactions,
                "retirements": undone.retirements,
            },
        )

    async def _scan(self, head: BlockHeader) -> bool:
        """Read the receipts of the blocks after the last scanned, up to ``head`` (at most
        :data:`MAX_RECEIPT_BLOCKS`) when something is in flight; False when a block read is
        not the one remembered at its height (the chain moved since ``head`` was read: the
        blocks before it stay scanned, the rest wait for the next step)."""
        assert self._scanned is not None
        pending = await self.lane.pending()
        last = min(head.number, self._scanned + MAX_RECEIPT_BLOCKS)
        if pending:
            for number in range(self._scanned + 1, last + 1):
                if not await self._receipts(number, pending):
                    self._scanned = number - 1
                    return False
        self._scanned = last
        return True

    async def _receipts(self, number: int, pending: dict[bytes, PendingTx]) -> bool:
        """Mark our transactions mined in block ``number``: a job's (any of its same-nonce
        replacements) moves it to mined or reverted; a no-op that stood in for a job drops
        it; every no-op's cost is counted. The block's transactions and their jobs are
        written in one database transaction (a few round trips, not two per transaction):
        a crash never leaves a transaction (or a no-op) recorded mined with its job still
        waiting.

        The block's hash is checked against the memory, never written to it: read by number,
        it may already be the new chain's while the head read before it was the old one's
        (False then, nothing recorded). A hash the memory does not hold is not checked; what
        it records is undone by number with the rest when the next head shows the reorg."""
        ours = []
        for receipt in await self.chain.block_receipts(number):
            if self.watch.memory.agrees(number, receipt.block_hash) is False:
                return False
            tx = pending.get(receipt.tx_hash)
            if tx is not None:
                ours.append((receipt, tx))
        await self._record(ours)
        return True

    async def _record(self, ours: list[tuple[Receipt, PendingTx]]) -> None:
        """Record receipts of our transactions (see :meth:`_receipts`), in one database
        transaction."""
        moves: dict[JobState, list[tuple[int, int, bytes, bytes]]] = {
            JobState.MINED: [],
            JobState.REVERTED: [],
        }
        for receipt, tx in ours:
            if tx.kind == "relay":
                assert tx.job_id is not None
                target = JobState.MINED if receipt.status == 1 else JobState.REVERTED
                moves[target].append((tx.job_id, receipt.block_number, receipt.block_hash, receipt.tx_hash))
        stood_in = [tx.job_id for _, tx in ours if tx.kind == "noop" and tx.job_id is not None]
        moved = await self.lane.record_mined(
            [(r.tx_hash, r.block_number, r.gas_used, r.paid_wei, r.status == 1) for r, _ in ours],
            moves,
            stood_in,
        )
        for receipt, tx in ours:
            succeeded = receipt.status == 1
            self.metrics.gas_paid_wei.labels(tx.kind, "success" if succeeded else "reverted").inc(
                receipt.paid_wei
            )
            if tx.kind == "noop":
                self.metrics.noop_cost_wei.inc(receipt.paid_wei)
        for job in moved.pop(JobState.DROPPED, []):
            self.metrics.job_transitions.labels(JobState.DROPPED.value).inc()
            log.warning("dropped: a no-op took its nonce", extra={"job_id": job.id})
        for target, jobs in moved.items():
            for job in jobs:
                self.metrics.job_transitions.labels(target.value).inc()
                if target is JobState.MINED and job.kind == "retire":  # a transfer's gas is sponsored
                    self.metrics.allowance_received_wei.inc(job.allowance_wei or 0)
                self.metrics.observe_stage(
                    "submitted_to_mined",
                    job.timestamps["submitted_at"] or job.timestamps["signed_at"],
                    job.timestamps["mined_at"] or job.timestamps["submitted_at"],
                )
                log.info(target.value, extra={"job_id": job.id, "block": job.block_number})

    async def _index(self, from_block: int, to_block: int) -> None:
        logs = await self.chain.settled_logs(from_block, to_block)
        stamps = await self.chain.block_timestamps({entry.block_number for entry in logs}) if logs else {}
        rows = [await self._row(entry, stamps[entry.block_number]) for entry in logs]
        to_hash = await self.chain.block_hash(to_block)
        if self.watch.memory.agrees(to_block, to_hash) is False:
            return  # the chain moved since the head was read: the next step sees the reorg
        await self.retirements.save(self.chain_id, CURSOR, to_block, to_hash, rows)
        self._indexed = to_block
        self.metrics.indexed_block.set(to_block)
        for job in await self.jobs.mark_indexed(self.chain_id, sorted({r.tx_hash for r in rows})):
            self.metrics.job_transitions.labels("indexed").inc()
            self.metrics.observe_stage(
                "mined_to_indexed", job.timestamps["mined_at"], job.timestamps["indexed_at"]
            )
            log.info("indexed", extra={"job_id": job.id})

    async def _row(self, entry: SettledLog, timestamp: int) -> IndexedRetirement:
        credit = await self.reads.credit(entry.retirement.token_id)
        return retirement_row(self.chain_id, entry, timestamp, credit)

    async def run(self, stop: asyncio.Event) -> None:
        """Step every ``poll_interval_s`` until ``stop``; an outage is logged once and
        retried, any other failure is logged with its traceback and retried."""
        outage = OutageLog("follower")
        while not stop.is_set():
            try:
                await self.step()
                outage.recovered()
            except Incident:
                pass  # logged once when it began, counted per step
            except Unavailable as exc:
                if isinstance(exc, ChainUnavailable):
                    self.metrics.rpc_errors.labels("follower").inc()
                outage.failed(exc)
            except Exception:
                log.exception("follower step failed")
            await sleep_or_stop(stop, self.poll_interval_s)
