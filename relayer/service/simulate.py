"""Simulation of an accepted relay job, from its row alone: ``eth_estimateGas`` as the
executor, the gas cap, and fees the job's signed allowance covers; then the job is
``simulated`` (the broadcaster signs it) or ``rejected`` with the refusal's code (nothing was
signed: the identical request may be retried). Also resumes jobs whose owner died between
reserving and simulating. Spec: actions/retire; contract_revert, gas_limit_exceeds_cap,
gas_estimate_unavailable, insufficient_authorized_value."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Final

from relayer.chain.errors import ChainRevert
from relayer.chain.executor import ExecutorChain
from relayer.domain.errors import RelayerError, Unavailable
from relayer.domain.states import JobState
from relayer.service.gas import GasPricer
from relayer.store.relay_jobs import Job, RelayJobs

log = logging.getLogger(__name__)

ORPHAN_AFTER_S: Final = 10.0
"""A job in ``accepted`` this long has lost its owner (simulating takes a few RPC calls)."""
ORPHAN_BATCH: Final = 20


class Simulator:
    """Simulates accepted jobs and wakes the broadcaster for the ones it may sign."""

    def __init__(
        self,
        executor: ExecutorChain,
        gas: GasPricer,
        jobs: RelayJobs,
        executor_address: str,
        usdc: str,
        wake_broadcaster: Callable[[], None],
    ) -> None:
        self.executor = executor
        self.gas = gas
        self.jobs = jobs
        self.executor_address = executor_address
        self.usdc = usdc
        self._wake_broadcaster = wake_broadcaster

    async def simulate(self, job: Job) -> None:
        """Simulate, cap gas, price it against the job's signed allowance, then mark it
        simulated and wake the broadcaster.

        Raises:
            RelayerError: the refusal (contract_revert, gas_limit_exceeds_cap,
                insufficient_authorized_value, an outage's 503), after the job was moved to
                rejected with it.
        """
        try:
            function = "retireWithAuthorization" if job.scheme == "eip3009" else "retireWithPermit"
            estimate = await self.executor.estimate_gas(
                self.executor_address, job.settlement, job.call_data, function
            )
            plan = await self.gas.plan(
                estimate,
                job.gas_allowance,
                job.input_token == self.usdc,
                job.quote_total or 0,
                len(job.call_data),
            )
        except RelayerError as refusal:
            await self.jobs.move(job.id, JobState.REJECTED, error=refusal)
            raise
        moved = await self.jobs.move(
            job.id,
            JobState.SIMULATED,
            gas_limit=plan.gas_limit,
            max_fee_per_gas=plan.max_fee_per_gas,
            max_priority_fee_per_gas=plan.max_priority_fee_per_gas,
            allowance_wei=plan.allowance_wei,
        )
        if moved is not None:
            self._wake_broadcaster()

    async def recheck(self, batch: Sequence[Job]) -> list[int]:
        """Simulate a signing batch again, at the latest block, just before it is signed:
        what changed since acceptance (the payer moved its funds away, cancelled the
        authorization, a listing sold out) is refused now, before the executor pays for a
        revert. Returns the ids of the jobs still good; the others are moved to rejected
        with the revert (``contract_revert``: nothing was signed, the identical request may
        be retried). One ``eth_estimateGas`` per job, concurrently.

        Raises:
            Unavailable: the chain node or the database failed (nothing was rejected for it).
        """
        outcomes = await asyncio.gather(*(self._still_good(job) for job in batch), return_exceptions=True)
        good: list[int] = []
        for job, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, ChainRevert):
                log.warning(
                    "refused before signing: the settlement would revert now",
                    extra={"job_id": job.id, "error_name": outcome.error_name},
                )
                await self.jobs.move(job.id, JobState.REJECTED, error=outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                good.append(job.id)
        return good

    async def _still_good(self, job: Job) -> None:
        function = "retireWithAuthorization" if job.scheme == "eip3009" else "retireWithPermit"
        await self.executor.estimate_gas(self.executor_address, job.settlement, job.call_data, function)

    async def resume(self, job: Job) -> None:
        """Simulate ``job`` if it is an orphan (in ``accepted`` for :data:`ORPHAN_AFTER_S`),
        taking it over first; otherwise leave it to its owner.

        Raises:
            RelayerError: as :meth:`simulate`.
        """
        if job.state is JobState.ACCEPTED:
            claimed = await self.jobs.claim_orphan(job.id, ORPHAN_AFTER_S)
            if claimed is not None:
                log.warning("resuming a job its owner left in accepted", extra={"job_id": job.id})
                await self.simulate(claimed)

    async def sweep(self) -> int:
        """Take over and simulate the jobs left in ``accepted`` by processes that died;
        returns how many. A refusal is stored with its job (the identical request answers it).

        Raises:
            Unavailable: the database failed before anything was taken.
        """
        orphans = await self.jobs.claim_orphans(ORPHAN_AFTER_S, ORPHAN_BATCH)
        for job in orphans:
            log.warning("resuming a job its owner left in accepted", extra={"job_id": job.id})
            try:
                await self.simulate(job)
            except Unavailable:
                raise
            except RelayerError:
                pass  # stored with the job
        return len(orphans)
