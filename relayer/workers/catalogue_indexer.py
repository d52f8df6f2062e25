"""The catalogue indexer: one per indexed chain (this daemon's chain and each of
``RELAYER_INDEX_CHAINS``). Each step reads its cursor, checks that the cursor's block is still
on the chain (else rewinds what it indexed by :data:`REWIND_DEPTH` blocks: re-indexing is
idempotent), and indexes the next confirmed range: credit registrations, listing events
(listings folded from them), credit transfers and — on chains where this daemon does not
relay, so no chain follower indexes them — ``RetirementSettled`` events."""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from relayer.chain.catalogue import CatalogueChain, CatalogueLogs
from relayer.chain.errors import ChainUnavailable
from relayer.chain.reads import ChainReads
from relayer.chain.types import SettledLog
from relayer.domain.errors import Unavailable
from relayer.metrics import Metrics
from relayer.store.catalogue import CatalogueStore, IndexBatch
from relayer.store.retirements import IndexedRetirement
from relayer.workers import OutageLog, retirement_row, sleep_or_stop

log = logging.getLogger(__name__)

CURSOR: Final = "catalogue"
MAX_RANGE: Final = 2_000
"""Blocks read by one ``eth_getLogs``."""
REWIND_DEPTH: Final = 128
"""How far back a reorg under the cursor rewinds (beyond the confirmation depth)."""


class CatalogueIndexer:
    """Indexes one chain's catalogue events into Postgres."""

    def __init__(
        self,
        chain: CatalogueChain,
        reads: ChainReads,
        store: CatalogueStore,
        metrics: Metrics,
        confirmations: int,
        start_block: int,
        poll_interval_s: float,
        *,
        retirements: bool,
    ) -> None:
        self.chain = chain
        self.chain_id = chain.node.chain_id
        self.reads = reads
        self.store = store
        self.metrics = metrics
        self.confirmations = confirmations
        self.start_block = start_block
        self.poll_interval_s = poll_interval_s
        self.retirements = retirements

    async def step(self) -> bool:
        """Index the next confirmed range, if any; whether there may be more to catch up."""
        head = await self.chain.blocks.head()
        safe = head - self.confirmations + 1
        cursor = await self.store.cursor(self.chain_id, CURSOR)
        done = self.start_block - 1 if cursor is None else cursor[0]
        reorged = (
            cursor is not None
            and cursor[1] is not None
            and 0 <= done <= head
            and await self.chain.blocks.block_hash(done) != cursor[1]
        )
        if reorged:
            ancestor = max(self.start_block - 1, done - REWIND_DEPTH)
            await self.store.rewind(self.chain_id, ancestor, None, [CURSOR], self.retirements)
            log.warning("catalogue reorg: rewound", extra={"chain_id": self.chain_id, "ancestor": ancestor})
            self.metrics.reorgs.inc()
            return True
        if safe <= done:
            return False
        to_block = min(safe, done + MAX_RANGE)
        logs = await self.chain.logs(done + 1, to_block)
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
        await self.store.save(batch, CURSOR, to_block, await self.chain.blocks.block_hash(to_block))
        self.metrics.catalogue_block.labels(str(self.chain_id)).set(to_block)
        return to_block < safe

    async def _retirements(self, logs: CatalogueLogs) -> list[IndexedRetirement]:
        if not logs.settled:
            return []
        stamps = await self.chain.blocks.block_timestamps({s.block_number for s in logs.settled})
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
            except Unavailable as exc:
                if isinstance(exc, ChainUnavailable):
                    self.metrics.rpc_errors.labels("catalogue").inc()
                outage.failed(exc)
            except Exception:
                log.exception("catalogue indexer step failed", extra={"chain_id": self.chain_id})
            if not more:
                await sleep_or_stop(stop, self.poll_interval_s)
