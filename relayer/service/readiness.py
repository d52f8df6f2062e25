"""The readiness policy behind ``/readyz``: when a process may be sent traffic (the API) or
counted as working (a worker). Any failure to find out is "not ready", never an error."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from relayer.chain.node import ChainNode
from relayer.config import ConfigError
from relayer.domain.errors import RelayerError
from relayer.store.identity import ChainIdentity
from relayer.store.pool import Database
from relayer.store.relay_jobs import RelayJobs
from relayer.store.status import StatusQueries


class Readiness:
    """Ready when: no task of the process has died; the database answers and its schema is
    at the packaged head; and at least one relayed chain is ready: its node answers the
    chain's id and the genesis the database recorded, and, in a worker, every executor key's
    lease on that chain is held by some live process (this one or another). A chain whose
    node is down or swapped stops that chain's work only, so it does not take the process
    out of service; :attr:`chains` says which chain is ready as of the last check.

    Args:
        tasks: the process's long-running tasks (read at each check).
        leased: the executor addresses whose leases must be held (a worker's keys; none in
            an API replica).
        others: the other relayed chains' nodes, each with the same ``leased`` keys.
    """

    def __init__(
        self,
        db: Database,
        jobs: RelayJobs,
        node: ChainNode,
        tasks: Sequence[asyncio.Task[None]],
        leased: Sequence[str],
        others: Sequence[ChainNode] = (),
    ) -> None:
        self.db = db
        self.jobs = jobs
        self.node = node
        self.nodes = [node, *others]
        self.tasks = tasks
        self.leased = list(leased)
        self.schema_at_head = False  # once at the head, a running version's schema stays there
        self.chains: dict[int, bool] = {}
        """Each relayed chain's readiness at the last check (empty before the first, or when
        the database failed it)."""

    async def __call__(self) -> bool:
        """Whether this process is ready now (see the class)."""
        self.chains = {}
        if any(task.done() for task in self.tasks):
            return False
        ops = StatusQueries(self.db)
        try:
            if not self.schema_at_head:
                self.schema_at_head = await ops.at_head()
                if not self.schema_at_head:
                    return False
            await self.jobs.count_by_state()
        except (RelayerError, ConfigError):
            return False
        ready = await asyncio.gather(*(self._chain_ready(ops, node) for node in self.nodes))
        self.chains = {node.chain_id: ok for node, ok in zip(self.nodes, ready, strict=True)}
        return any(ready)

    async def _chain_ready(self, ops: StatusQueries, node: ChainNode) -> bool:
        """Whether one relayed chain is ready (see the class)."""
        try:
            genesis = await node.check()
            if await ChainIdentity(self.db).record(node.chain_id, genesis) != genesis:
                return False
            if self.leased and await ops.leases_held(node.chain_id, self.leased) != set(self.leased):
                return False
        except (RelayerError, ConfigError):
            return False
        return True
