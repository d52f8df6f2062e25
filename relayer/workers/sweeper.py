"""The sweeper: every few seconds it takes over and simulates the jobs that processes which
died between reserving and simulating left in ``accepted`` (the identical request resumes
them too). Nothing ends in a 500 for a crash: each such job is simulated, then signed or
refused with its own code; on shutdown the jobs taken and not yet simulated are handed back.
It also purges jobs rejected before signing once their retention period is over, so refused
requests leave bounded rows."""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from relayer.domain.errors import Unavailable
from relayer.service.simulate import Simulator
from relayer.store.relay_jobs import RelayJobs
from relayer.workers import OutageLog, sleep_or_stop

log = logging.getLogger(__name__)

SWEEP_EVERY_S: Final = 2.0
PURGE_BATCH: Final = 500


class Sweeper:
    """Resumes orphaned accepted jobs."""

    def __init__(self, simulator: Simulator, jobs: RelayJobs, rejected_retention_s: float) -> None:
        self.simulator = simulator
        self.jobs = jobs
        self.rejected_retention_s = rejected_retention_s

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every :data:`SWEEP_EVERY_S` until ``stop`` (an outage is logged once)."""
        outage = OutageLog("sweeper")
        while not stop.is_set():
            try:
                resumed = await self.simulator.sweep(stop)
                purged = await self.jobs.purge_rejected(
                    self.simulator.chain_id, self.rejected_retention_s, PURGE_BATCH
                )
                outage.recovered()
                if resumed:
                    log.info("resumed orphaned jobs", extra={"count": resumed})
                if purged:
                    log.info("purged rejected jobs past their retention", extra={"count": purged})
            except Unavailable as exc:
                outage.failed(exc)
            await sleep_or_stop(stop, SWEEP_EVERY_S)
