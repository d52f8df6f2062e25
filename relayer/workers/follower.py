"""The chain follower: one loop per new head that (0) notices a reorg (a head whose hash or
parent hash is not the one it saw at that height) and undoes what the lost blocks held, back
to the common ancestor (the walk back it shares with the catalogue indexer,
:class:`~relayer.workers.reorg.ReorgWatch`); (1) finds our in-flight transactions among the
transaction hashes of the new blocks (the head's come with it; skipped blocks in one batch)
and reads the receipts of the blocks that list one of them (one ``eth_getBlockReceipts`` by
block hash each, in one batch), parsing ours only, moving the jobs they settle to mined or
reverted; (2) finds what took each journaled nonce the chain passed without
its transaction (:class:`~relayer.workers.nonces.NonceAudit`); (3) confirms jobs under the
confirmation policy (seconds of blocks, or the node's safe/finalized head:
:class:`~relayer.workers.reorg.Confirmed`); and (4) indexes RetirementSettled events of
confirmed blocks (``eth_getLogs`` filtered by the settlement's address) into Postgres (cursor =
block number and hash) and marks their jobs indexed (settled). Its lag behind the head
(blocks), the blocks it followed and its CPU time are metrics.

It follows only the chain its database belongs to and only reorgs within the confirmation
window: each step asks the chain guard first (:class:`~relayer.workers.chain_guard.ChainGuard`,
at once on a head below one seen or a reorg), and a reorg deeper than the window, below the
node's finalized block or past its memory halts it (an incident: one log line, the
``relayer_deep_reorg`` gauge, the lanes halted) instead of rewinding settled history, until
the node's chain holds the remembered blocks again."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from typing import Final

from relayer.chain.blocks import BlockReader
from relayer.chain.errors import ChainUnavailable
from relayer.chain.reads import ChainReads
from relayer.chain.types import BlockHeader, Receipt, SettledLog
from relayer.domain.confirmation import ConfirmationPolicy
from relayer.domain.errors import Unavailable
from relayer.domain.head_clock import HeadClock
from relayer.domain.incidents import Incident
from relayer.domain.reorg import Ancestor
from relayer.domain.states import JobState
from relayer.logs import job_fields
from relayer.metrics import Metrics
from relayer.store import reorg
from relayer.store.executor_lane import ExecutorLane, PendingTx
from relayer.store.relay_jobs import MovedJob, RelayJobs
from relayer.store.retirements import IndexedRetirement, RetirementStore
from relayer.tasks import retrieved
from relayer.workers import OutageLog, retirement_row, sleep_or_stop
from relayer.workers.chain_guard import ChainGuard
from relayer.workers.nonces import NonceAudit
from relayer.workers.reorg import Confirmed, ReorgHalt, ReorgWatch, policy_of, undo_or_halt

log = logging.getLogger(__name__)

CURSOR: Final = "retirements"
FOLLOWER_HALT: Final = ReorgHalt(
    "follower",
    "deep reorg: the follower halts and rewinds nothing (the lanes halt too) until the node's chain "
    "holds the remembered blocks again",
    halts_lanes=True,
)
MAX_RECEIPT_BLOCKS: Final = 64
MAX_LOG_RANGE: Final = 2_000
CURSOR_EVERY_S: Final = 1.0
"""The index cursor of blocks that hold no retirement is written at most this often (seconds);
a block with one is written at once. A restart re-reads at most this long of empty blocks."""
NONCE_AUDIT_EVERY_S: Final = 1.0
"""The nonce audit (:class:`NonceAudit`: a database read, and a nonce read per executor with a
transaction open) runs at most this often (seconds), not every block."""


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
        confirmations: int | ConfirmationPolicy,
        start_block: int,
        poll_interval_s: float,
        guard: ChainGuard | None = None,
        clock: HeadClock | None = None,
    ) -> None:
        self.chain = chain
        self.guard = guard
        self.chain_id = chain.node.chain_id
        self.reads = reads
        self.jobs = jobs
        self.lane = lane
        self.retirements = retirements
        self.metrics = metrics
        self.policy = policy_of(confirmations)
        self.confirmations = self.policy.window  # a followed reorg takes at most this many blocks
        self.confirmed = Confirmed(chain, self.policy)
        self.start_block = start_block
        self.poll_interval_s = poll_interval_s
        # when to look for the next head (None: every poll_interval_s after a step)
        self.clock = clock
        self._scanned: int | None = None  # receipts read up to here
        self._indexed: int | None = None  # retirements indexed up to here (the cursor)
        self._cursor_written = float("-inf")  # monotonic time the cursor was last written
        self._logs_ahead: asyncio.Future[list[SettledLog]] | None = None  # see _read_logs_ahead
        self._audited = float("-inf")  # monotonic time of the last nonce audit
        # a pass skipped the audit (one ran within the second): the next pass audits, whether
        # or not a new head came (a head that stands still must not leave a passed nonce unjudged)
        self._audit_owed = False
        # blocks of the jobs this follower recorded mined (a heap), confirmed once the
        # confirmation reaches them; every mined job is looked for after a start or a rewind
        self._mined_blocks: list[int] = []
        self._confirm_all = True
        # the blocks as this follower saw them: the window at the chain's block rate, bounded
        self.watch = ReorgWatch(chain, start_block - 1, self.policy.memory_blocks)
        self.nonces = NonceAudit(chain, lane, metrics, self._record)  # what took each passed nonce

    async def step(self) -> None:
        """One pass (:meth:`_step`); its CPU time, the blocks it moved past and the lag behind
        the head are metrics."""
        cpu, scanned = time.thread_time(), self._scanned
        try:
            await self._step()
        finally:
            self.metrics.follower_cpu_seconds.labels(str(self.chain_id)).inc(time.thread_time() - cpu)
            if scanned is not None and self._scanned is not None and self._scanned > scanned:
                self.metrics.follower_blocks.labels(str(self.chain_id)).inc(self._scanned - scanned)

    async def _step(self) -> None:
        """One pass: a reorg undone, receipts of our transactions in new blocks, confirmations,
        indexing (all bounded). Costs one ``eth_getBlockByNumber`` and nothing else while the
        head stands still and nothing is left to catch up."""
        if self.clock is None:
            head = await self.chain.head_block()
        else:  # a read of its own at every look (shared with whoever reads the head meanwhile)
            head = await self.chain.head_block(self.clock.fine_s / 2)
            self.clock.observe(time.monotonic(), head.number)
        if self.guard is not None:
            await self.guard.check("follower", now=head.number < (self.watch.seen_head or 0))
        if self._indexed is None or self._scanned is None:
            await self._resume(head)
        elif await self.watch.reorged(head):
            await self._reorg(head)
        elif self.watch.incident is not None:
            self._resolved()
        elif (
            not self._audit_owed
            and not self.nonces.suspects  # a nonce awaits its second look
            and head.number == self._scanned
            and await self.confirmed.through(head.number) <= self._indexed
        ):
            return
        if not self.watch.saw(head):
            return  # the chain moved again since the head was read: the next step sees it
        assert self._indexed is not None and self._scanned is not None
        indexed = self._indexed
        self._read_logs_ahead(head, indexed)
        if head.number > self._scanned and not await self._scan(head):
            return  # the chain moved under this step: the next one sees the reorg from its head
        self.metrics.follower_lag.labels(str(self.chain_id)).set(head.number - self._scanned)
        safe = min(await self.confirmed.through(head.number), self._scanned)
        self._audit_owed = time.monotonic() - self._audited < NONCE_AUDIT_EVERY_S
        if not self._audit_owed:
            await self.nonces.step(safe)
            self._audited = time.monotonic()
        await self._confirm(safe)
        if safe > indexed:
            await self._index(indexed + 1, min(safe, indexed + MAX_LOG_RANGE))

    def _read_logs_ahead(self, head: BlockHeader, indexed: int) -> None:
        """Start the read of the ``RetirementSettled`` logs this step will index (blocks after
        ``indexed`` up to the confirmed block under ``head``, as far as the scan will reach),
        so that it runs beside the scan and the confirmation, whose reads and writes it does
        not need; :meth:`_index` then takes it from the node's log feed (the same range at the
        same hash: one read). Only under a depth policy (the confirmed block is known without
        a read) and when the range's last block is remembered; otherwise :meth:`_index` reads
        after them as before. A read this step ends up not using is never waited for (the
        feed keeps it a moment for whoever asks), and its failure is its reader's."""
        assert self._scanned is not None
        through = self.confirmed.known_through(head.number)
        if through is None:
            return
        safe = min(through, max(self._scanned, self._scan_reach(head)))
        if safe <= indexed:
            return
        to_block = min(safe, indexed + MAX_LOG_RANGE)
        to_hash = self.watch.memory.get(to_block)
        if to_hash is None:
            return
        read = asyncio.ensure_future(self.chain.settled_logs(indexed + 1, to_block, to_hash))
        read.add_done_callback(retrieved)
        self._logs_ahead = read  # held until the next step's: the loop keeps only weak references

    async def _confirm(self, safe: int) -> None:
        """Move the mined jobs at or below block ``safe`` to confirmed: one database write, only
        when a job this follower recorded mined is at or below it (or after a start or a rewind,
        when any may be: then the blocks of every job still mined are read, so a job mined
        before the start is confirmed when its block is), never for the blocks between."""
        if not self._confirm_all and not (self._mined_blocks and self._mined_blocks[0] <= safe):
            return
        for job in await self.jobs.confirm_mined(self.chain_id, safe):
            self.metrics.job_transitions.labels("confirmed").inc()
            log.info("confirmed", extra=job_fields(job, settled=job.kind == "transfer"))
        if self._confirm_all:  # after a start or a rewind: wait on the blocks of every mined job
            self._mined_blocks = await self.jobs.mined_blocks(self.chain_id)  # (another process's too)
            heapq.heapify(self._mined_blocks)
            self._confirm_all = False
        while self._mined_blocks and self._mined_blocks[0] <= safe:
            heapq.heappop(self._mined_blocks)

    async def _reorg(self, head: BlockHeader) -> None:
        """Follow the reorg under ``head`` (rewind to the common ancestor) when it is within
        the confirmation window; else halt, the lanes too (:func:`undo_or_halt`)."""
        await undo_or_halt(head, self, FOLLOWER_HALT)

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
        self._confirm_all, self._mined_blocks, self._cursor_written = True, [], float("-inf")
        self.metrics.reorgs.labels(str(self.chain_id)).inc()
        for job in undone.jobs:
            self.metrics.job_transitions.labels(JobState.SUBMITTED.value).inc()
            log.info("reorged", extra=job_fields(job, state=JobState.SUBMITTED.value, ancestor=ancestor))
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
        """Record our transactions mined in the blocks after the last scanned, up to ``head``
        (at most :data:`MAX_RECEIPT_BLOCKS`), when something is in flight: our hashes are
        looked up among each block's transaction hashes (the head's come with it, the blocks
        between in one batch), and the receipts of the blocks that list one are read (one
        batch), only ours parsed. False, nothing recorded, when the blocks read are not one
        chain with ``head`` and the memory, or a receipt is missing or not in the block that
        listed it (the chain moved since ``head`` was read: the next step sees the reorg from
        its head). Receipts are read by block hash: a block reorged away meanwhile that the
        node still holds by its hash gives its receipts, recorded in that block, and the next
        step's reorg rewinds them like any other."""
        assert self._scanned is not None
        pending = await self.lane.pending()
        last = self._scan_reach(head)
        if pending:
            headers = await self._headers(range(self._scanned + 1, last + 1), head)
            if headers is None or not await self._receipts(headers, pending):
                return False
            for header in headers:  # one chain with the head: remembered for the walk back
                self.watch.memory.remember(header.number, header.hash)
        self._scanned = last
        return True

    def _scan_reach(self, head: BlockHeader) -> int:
        """The last block a scan up to ``head`` records (at most :data:`MAX_RECEIPT_BLOCKS`)."""
        assert self._scanned is not None
        return min(head.number, self._scanned + MAX_RECEIPT_BLOCKS)

    async def _headers(self, numbers: range, head: BlockHeader) -> list[BlockHeader] | None:
        """The headers of blocks ``numbers`` (the head's as read, the others in one batch),
        oldest first; None when they do not link up by parent hash or one disagrees with the
        memory."""
        read = await self.chain.headers([n for n in numbers if n != head.number])
        headers = read + ([head] if head.number in numbers else [])
        for older, newer in itertools.pairwise(headers):
            if newer.parent_hash != older.hash:
                return None
        if any(self.watch.memory.agrees(h.number, h.hash) is False for h in headers):
            return None
        return headers

    async def _receipts(self, headers: list[BlockHeader], pending: dict[bytes, PendingTx]) -> bool:
        """Mark our transactions listed in ``headers`` mined: a job's (any of its same-nonce
        replacements) moves it to mined or reverted; a no-op that stood in for a job drops
        it; every no-op's cost is counted. The receipts are those of the blocks that list one
        of ours, one ``eth_getBlockReceipts`` by block hash each in one batch (only ours
        parsed; one ``eth_getTransactionReceipt`` each on a node that refuses it:
        :meth:`~relayer.chain.blocks.BlockReader.receipts_in`), written with their jobs in one
        database transaction (a crash never leaves a transaction, or a no-op, recorded mined
        with its job still waiting). False, nothing recorded, when a receipt is missing or not
        in the block (number and hash) that listed it."""
        ours = {"0x" + tx_hash.hex(): tx_hash for tx_hash in pending}
        where = {ours[t]: h for h in headers for t in h.transactions & ours.keys()}
        if not where:
            return True
        listed: dict[bytes, list[bytes]] = {}
        for tx_hash, header in where.items():
            listed.setdefault(header.hash, []).append(tx_hash)
        receipts = await self.chain.receipts_in(listed)
        for tx_hash, header in where.items():
            receipt = receipts.get(tx_hash)
            if receipt is None or (receipt.block_number, receipt.block_hash) != (header.number, header.hash):
                return False
        await self._record([(receipts[tx_hash], pending[tx_hash]) for tx_hash in where])
        return True

    async def _record(self, ours: list[tuple[Receipt, PendingTx]]) -> None:
        """Record receipts of our transactions (see :meth:`_receipts`), in one database
        transaction (nothing to do for none)."""
        if not ours:
            return
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
            log.warning("dropped: a no-op took its nonce", extra=job_fields(job))
        for target, jobs in moved.items():
            for job in jobs:
                if target is JobState.MINED and job.block_number is not None:
                    heapq.heappush(self._mined_blocks, job.block_number)
                self.metrics.job_transitions.labels(target.value).inc()
                if target is JobState.MINED and job.kind == "retire":  # a transfer's gas is sponsored
                    self.metrics.allowance_received_wei.inc(job.allowance_wei or 0)
                self.metrics.observe_stage(
                    "submitted_to_mined",
                    job.timestamps["submitted_at"] or job.timestamps["signed_at"],
                    job.timestamps["mined_at"] or job.timestamps["submitted_at"],
                )
                log.info(target.value, extra=job_fields(job, block=job.block_number))

    async def _index(self, from_block: int, to_block: int) -> None:
        """Index the ``RetirementSettled`` logs of blocks ``from_block`` through ``to_block``
        (one ``eth_getLogs``, shared with the catalogue indexer's read of the same range at
        the same hash of ``to_block``; their blocks' timestamps from the logs, or read), move
        the cursor to ``to_block`` and the confirmed jobs of their transactions to indexed (one
        statement: :data:`~relayer.store.retirements.SAVE_INDEXED`); nothing when the chain
        moved since the head was read."""
        to_hash = self.watch.memory.get(to_block) or await self.chain.block_hash(to_block)
        logs = await self.chain.settled_logs(from_block, to_block, to_hash)
        stamps = await self.chain.stamps_of(logs) if logs else {}
        rows = [await self._row(entry, stamps[entry.block_number]) for entry in logs]
        if any(self.watch.memory.agrees(e.block_number, e.block_hash) is False for e in logs):
            return  # the chain moved since the head was read: the next step sees the reorg
        if self.watch.memory.agrees(to_block, to_hash) is False:
            return  # the chain moved since the head was read: the next step sees the reorg
        moved: list[MovedJob] = []
        if rows or time.monotonic() - self._cursor_written >= CURSOR_EVERY_S:
            # the retirements, the cursor and the move of their jobs to indexed: one statement
            settled = sorted({r.tx_hash for r in rows})
            moved = await self.retirements.save(self.chain_id, CURSOR, to_block, to_hash, rows, settled)
            self._cursor_written = time.monotonic()
        self._indexed = to_block
        self.metrics.indexed_block.labels(str(self.chain_id)).set(to_block)
        for job in moved:
            self.metrics.job_transitions.labels("indexed").inc()
            self.metrics.observe_stage(
                "mined_to_indexed", job.timestamps["mined_at"], job.timestamps["indexed_at"]
            )
            log.info("indexed", extra=job_fields(job, settled=True))

    async def _row(self, entry: SettledLog, timestamp: int) -> IndexedRetirement:
        credit = await self.reads.credit(entry.retirement.token_id)
        return retirement_row(self.chain_id, entry, timestamp, credit)

    async def run(self, stop: asyncio.Event) -> None:
        """Step until ``stop``: when the clock says the next head is due (without a clock,
        every ``poll_interval_s``); an outage is logged once and retried (at the slow
        cadence), any other failure is logged with its traceback and retried."""
        outage = OutageLog("follower")
        while not stop.is_set():
            wait_s = self.poll_interval_s
            try:
                await self.step()
                outage.recovered()
                if self.clock is not None:
                    wait_s = self.clock.wait_s(time.monotonic())
            except Incident:
                pass  # logged once when it began, counted per step
            except Unavailable as exc:
                if isinstance(exc, ChainUnavailable):
                    self.metrics.rpc_errors.labels("follower").inc()
                outage.failed(exc)
            except Exception:
                log.exception("follower step failed")
            await sleep_or_stop(stop, wait_s)
