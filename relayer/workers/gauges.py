"""The operator gauges worker: every :data:`GAUGE_INTERVAL_S` it reads the figures the
metrics show as gauges again (jobs by state, the database pool, nonce lag, indexer lag,
executor balances). A source that fails keeps its last values: a gauge never stops the
daemon."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Final

from relayer.chain.blocks import BlockReader
from relayer.chain.node import ChainNode
from relayer.chain.reads import ChainReads
from relayer.domain.errors import RelayerError
from relayer.domain.states import JobState
from relayer.metrics import Metrics
from relayer.store.pool import Database
from relayer.store.relay_jobs import RelayJobs
from relayer.store.status import OPEN_STATES, StatusQueries
from relayer.workers import sleep_or_stop

GAUGE_INTERVAL_S: Final = 5.0
"""How often the operator gauges are read again (database and chain heads), seconds."""


class Gauges:
    """Reads the operator gauges of one process into ``metrics``.

    Args:
        executors: the executor keys' addresses, the first key first (gauge label: its index).
        extra_nodes: the index chains' nodes (only a worker reaches them; may be empty).
        balances: read each executor key's balance (a worker: the API replicas leave it to
            the workers).
        gas_budget_class: the gas a retirement is budgeted, to count the retirements a
            balance covers.
    """

    def __init__(
        self,
        db: Database,
        jobs: RelayJobs,
        metrics: Metrics,
        node: ChainNode,
        reads: ChainReads,
        blocks: BlockReader,
        extra_nodes: Sequence[ChainNode],
        executors: Sequence[str],
        *,
        balances: bool,
        gas_budget_class: int,
    ) -> None:
        self.db = db
        self.jobs = jobs
        self.metrics = metrics
        self.node = node
        self.reads = reads
        self.blocks = blocks
        self.extra_nodes = extra_nodes
        self.executors = executors
        self.balances = balances
        self.gas_budget_class = gas_budget_class

    async def run(self, stop: asyncio.Event) -> None:
        """Every :data:`GAUGE_INTERVAL_S` until ``stop``: jobs by state and the oldest per
        open state, the database pool, each executor lane's unmined nonces, each indexer's
        lag behind its chain's head, and (in a worker) each executor key's balance and how
        many retirements it covers. A failing source keeps its last values."""
        while not stop.is_set():
            for refresh in (self._jobs, self._lanes, self._indexers, self._balances):
                with contextlib.suppress(RelayerError):  # that upstream is down: keep the last values
                    await refresh()
            pool = self.db.pool
            in_use = pool.get_size() - pool.get_idle_size()
            self.metrics.db_pool.labels("in_use").set(in_use)
            self.metrics.db_pool.labels("idle").set(pool.get_idle_size())
            self.metrics.db_pool.labels("max").set(pool.get_max_size())
            await sleep_or_stop(stop, GAUGE_INTERVAL_S)

    async def _jobs(self) -> None:
        counts = await self.jobs.count_by_state()
        for state in JobState:
            self.metrics.jobs_by_state.labels(state.value).set(counts.get(state.value, 0))
        oldest = await StatusQueries(self.db).oldest_by_state()
        for open_state in OPEN_STATES:
            self.metrics.oldest_job_age.labels(open_state).set(oldest.get(open_state, 0.0))

    async def _lanes(self) -> None:
        in_flight = await StatusQueries(self.db).in_flight()
        for index, address in enumerate(self.executors):
            lag = in_flight.get((self.node.chain_id, address.lower()), 0)
            self.metrics.nonce_lag.labels(str(index)).set(lag)

    async def _indexers(self) -> None:
        heads = {self.node.chain_id: await self.blocks.head()}  # the indexers' head reads, shared
        for extra in self.extra_nodes:
            heads[extra.chain_id] = await BlockReader(extra).head()
        for cursor in await StatusQueries(self.db).cursors():
            if cursor.chain_id in heads:
                lag = max(0, heads[cursor.chain_id] - cursor.block_number)
                self.metrics.indexer_lag.labels(str(cursor.chain_id), cursor.name).set(lag)

    async def _balances(self) -> None:
        if not self.balances:
            return
        gas_price = int(await self.node.request("eth_gasPrice", []), 16)
        per_retirement = max(1, self.gas_budget_class * gas_price)
        for index, address in enumerate(self.executors):
            balance = await self.reads.eth_balance(address)
            self.metrics.executor_balance_wei.labels(str(index)).set(balance)
            self.metrics.executor_covered.labels(str(index)).set(balance // per_retirement)
