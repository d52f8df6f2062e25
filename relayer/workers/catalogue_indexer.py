"""The catalogue indexer: one per indexed chain (this daemon's chain and each of
``RELAYER_INDEX_CHAINS``). Each step reads its cursor, checks that the blocks it indexed are
still on the chain (else walks back to the common ancestor exactly as the chain follower does,
:class:`~relayer.workers.reorg.ReorgWatch`, and undoes what the lost blocks held: their rows
deleted, the touched listings folded again), and indexes the next confirmed range: credit
registrations, listing events (listings folded from them), credit transfers and — on chains
where this daemon does not relay, so no chain follower indexes them — ``RetirementSettled``
events.

Like the chain follower it indexes only the chain its database belongs to (the chain guard,
:class:`~relayer.workers.chain_guard.ChainGuard`, asked each step) and follows only reorgs
within its confirmation window: a deeper one, one below the node's finalized block or past
its memory halts it (``relayer_deep_reorg``, one log line) and undoes nothing until the node's
chain holds the indexed blocks again."""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from relayer.chain.catalogue import CatalogueChain, CatalogueLogs
from relayer.chain.errors import ChainUnavailable
from relayer.chain.reads import ChainReads
from relayer.chain.types import BlockHeader, SettledLog
from relayer.domain.confirmation import ConfirmationPolicy
from relayer.domain.errors import Unavailable
from relayer.domain.incidents import Incident
from relayer.domain.reorg import Ancestor
from relayer.metrics import Metrics
from relayer.store.catalogue import CatalogueStore, IndexBatch
from relayer.store.retirements import IndexedRetirement
from relayer.workers import OutageLog, retirement_row, sleep_or_stop
from relayer.workers.chain_guard import ChainGuard
from relayer.workers.reorg import Confirmed, ReorgHalt, ReorgWatch, policy_of, undo_or_halt

log = logging.getLogger(__name__)

CURSOR: Final = "catalogue"
CATALOGUE_HALT: Final = ReorgHalt(
    "catalogue",
    "deep reorg: the catalogue indexer halts and undoes nothing until the node's chain holds the "
    "indexed blocks again",
    halts_lanes=False,
)
MAX_RANGE: Final = 2_000
"""Blocks read by one ``eth_getLogs``."""


class CatalogueIndexer:
    """Indexes one chain's catalogue events into Postgres."""

    def __init__(
        self,
        chain: CatalogueChain,
        reads: ChainReads,
        store: CatalogueStore,
        metrics: Metrics,
        confirmations: int | ConfirmationPolicy,
        start_block: int,
        poll_interval_s: float,
        *,
        retirements: bool,
        guard: ChainGuard | None = None,
    ) -> None:
        self.chain = chain
        self.guard = guard
        self.chain_id = chain.node.chain_id
        self.reads = reads
        self.store = store
        self.metrics = metrics
        self.policy = policy_of(confirmations)
        self.confirmations = self.policy.window  # a followed reorg takes at most this many blocks
        self.confirmed = Confirmed(chain.blocks, self.policy)
        self.start_block = start_block
        self.poll_interval_s = poll_interval_s
        self.retirements = retirements
        # the blocks this indexer indexed: the window at the chain's block rate, bounded
        self.watch = ReorgWatch(chain.blocks, start_block - 1, self.policy.memory_blocks)
        self._resumed = False

    async def step(self) -> bool:
        """Undo a reorg of what was indexed, else index the next confirmed range, if any;
        whether there may be more to catch up."""
        head = await self.chain.blocks.head_block()
        if self.guard is not None:
            await self.guard.check("catalogue", now=head.number < (self.watch.seen_head or 0))
        cursor = await self.store.cursor(self.chain_id, CURSOR)
        done = self.start_block - 1 if cursor is None else cursor[0]
        if not self._resumed:
            ancestor = await self.watch.resume(cursor, head.number)
            if ancestor is not None:
                await self._rewind(ancestor, "at start")
                return True
            self._resumed = True
        else:
            self.watch.rewound(done)  # the chain follower may have undone blocks of this chain
            if await self.watch.reorged(head):
                await self._reorg(head)
                return True
            if self.watch.incident is not None:
                log.warning("deep reorg: the chain holds the indexed blocks again; indexing resumes")
                self.watch.incident = None
                self.metrics.deep_reorg.labels(str(self.chain_id), "catalogue").set(0)
        safe = await self.confirmed.through(head.number)
        if safe < done + 1:
            return False
        to_block = min(safe, done + MAX_RANGE)
        # the hash first: it keys the range's logs, which the chain follower's read shares
        to_hash = await self.chain.blocks.block_hash(to_block)
        logs = await self.chain.logs(done + 1, to_block, to_hash)
        rows = await self._retirements(logs) if self.retirements else []
        contracts = self.chain.node.contracts
        batch = IndexBatch(
            self.chain_id,
            contracts.marketplace,
            contracts.carbon_credits,
            logs.credits,
            logs.listings,
            logs.transfers,
            rows,
        )
        await self.store.save(batch, CURSOR, to_block, to_hash)
        for number, block_hash in sorted(logs.block_hashes.items()):
            self.watch.memory.remember(number, block_hash)
        self.watch.memory.remember(to_block, to_hash)
        self.metrics.catalogue_block.labels(str(self.chain_id)).set(to_block)
        return to_block < safe

    async def _reorg(self, head: BlockHeader) -> None:
        """Undo the reorg under ``head`` when it is within the confirmation window; else halt
        (the catalogue alone: :func:`undo_or_halt`)."""
        await undo_or_halt(head, self, CATALOGUE_HALT)

    async def _rewind(self, to: Ancestor, where: str) -> None:
        """Undo what the blocks above the common ancestor ``to`` held (rows deleted, touched
        listings folded again, the retirements when this indexer owns them, the cursor)."""
        await self.store.rewind(self.chain_id, to.number, to.block_hash, [CURSOR], self.retirements)
        self.watch.rewound(to.number)
        self._resumed = True
        log.warning(
            "catalogue reorg: undid the blocks above the common ancestor",
            extra={
                "chain_id": self.chain_id,
                "ancestor": to.number,
                "where": where,
                "within_memory": to.within_memory,
            },
        )
        self.metrics.reorgs.labels(str(self.chain_id)).inc()

    async def _retirements(self, logs: CatalogueLogs) -> list[IndexedRetirement]:
        if not logs.settled:
            return []
        stamps = await self.chain.blocks.stamps_of(logs.settled)
        return [await self._row(s, stamps[s.block_number]) for s in logs.settled]

    async def _row(self, entry: SettledLog, timestamp: int) -> IndexedRetirement:
        credit = await self.reads.credit(entry.retirement.token_id)
        return retirement_row(self.chain_id, entry, timestamp, credit)

    async def run(self, stop: asyncio.Event) -> None:
        """Step until ``stop``: at once while catching up, else every ``poll_interval_s``; an
        outage is logged once and retried."""
        outage = OutageLog(f"catalogue-{self.chain_id}")
        while not stop.is_set():
            more = False
            try:
                more = await self.step()
                outage.recovered()
            except Incident:
                pass  # logged once when it began, counted per step
            except Unavailable as exc:
                if isinstance(exc, ChainUnavailable):
                    self.metrics.rpc_errors.labels("catalogue").inc()
                outage.failed(exc)
            except Exception:
                log.exception("catalogue indexer step failed", extra={"chain_id": self.chain_id})
            if not more:
                await sleep_or_stop(stop, self.poll_interval_s)
