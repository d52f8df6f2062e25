"""Simulation of an accepted relay job, from its row alone: its call executed as the
executor within the gas cap (with the jobs accepted meanwhile, in one batch prober
``eth_call``; ``eth_estimateGas`` for a job that batch cannot tell about), the gas cap, and
fees the job's signed allowance covers; then the job is ``simulated`` (the broadcaster signs
it) or ``rejected`` with the refusal's code (nothing was signed: the identical request may be
retried). Also resumes jobs whose owner died between reserving and simulating; the check
again just before signing is :mod:`relayer.service.recheck`. Spec:
actions/retire; contract_revert, gas_limit_exceeds_cap, gas_estimate_unavailable,
insufficient_authorized_value."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Final

from relayer.chain.calls import relayed_function
from relayer.chain.errors import ChainRevert
from relayer.chain.executor import ExecutorChain
from relayer.chain.reads import ChainReads
from relayer.coalesce import Coalescer
from relayer.domain.budget import transfer_gas_ceiling
from relayer.domain.errors import RelayerError, Unavailable
from relayer.domain.states import JobState
from relayer.service.gas import GasPlan, GasPricer
from relayer.service.recheck import PreSignCheck, function_name
from relayer.store.relay_jobs import Job, NewJob, RelayJobs, SimulatedPlan
from relayer.tasks import retrieved

log = logging.getLogger(__name__)

ORPHAN_AFTER_S: Final = 10.0
"""A job in ``accepted`` this long has lost its owner (simulating takes a few RPC calls)."""
ORPHAN_BATCH: Final = 20
SIMULATION_BATCH_MAX: Final = 64
"""Most jobs simulated in one batch (one JSON-RPC batch of prober ``eth_call`` s)."""
SIMULATED_AT_KEPT: Final = 10_000
"""Most jobs whose simulation block this process remembers (the oldest are forgotten: those
jobs are executed again before signing)."""
SPECULATIONS_KEPT: Final = 1_024
"""Simulations started for jobs about to be recorded (:meth:`Simulator.speculate`) that no
recorded job took yet, at most: the oldest is dropped (cancelled) past this many (a request
refused after its simulation started leaves one behind)."""
MOVE_BATCH_MAX: Final = 256
"""Most jobs moved to simulated in one statement."""


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
        reads: ChainReads,
        chain_id: int,
    ) -> None:
        self.reads = reads
        self.chain_id = chain_id
        self.executor = executor
        self.gas = gas
        self.jobs = jobs
        self.executor_address = executor_address
        self.usdc = usdc
        self._wake_broadcaster = wake_broadcaster
        self._simulated_at: OrderedDict[int, int] = OrderedDict()
        # job id -> the block its reservation read the payer's balance and its supply at
        self._reserved_at: OrderedDict[int, int] = OrderedDict()
        # (head block, gas limit or None: not told) of each job, one prober call a batch
        self._simulations = Coalescer(self._simulate_batch, SIMULATION_BATCH_MAX)
        # whether each (job id, plan) moved to simulated, one statement a batch
        self._moves = Coalescer(self._move_simulated, MOVE_BATCH_MAX)
        # bound nonce -> (call data, its batch simulation started before the job was recorded)
        self._speculations: OrderedDict[bytes, tuple[bytes, asyncio.Future[tuple[int, int | None]]]] = (
            OrderedDict()
        )
        self.presign = PreSignCheck(
            executor, jobs, reads, chain_id, self._simulated_at, self._reserved_at, self._plan, self._ceiling
        )

    def speculate(self, new: NewJob) -> None:
        """Start the batch simulation of ``new`` before it is recorded (a read at the head,
        beside the relay's reads and reservation, which take about as long): the job recorded
        from it takes that outcome when it is simulated (:meth:`simulate`) instead of joining
        a batch then. The checks are the same; only their order in time changes: nothing is
        signed before the job is recorded, simulated and checked again. A speculation no job
        takes (the request was refused) is dropped past :data:`SPECULATIONS_KEPT`."""
        task = asyncio.ensure_future(self._simulations(new))
        task.add_done_callback(retrieved)
        old = self._speculations.pop(new.bound_nonce, None)
        if old is not None:
            old[1].cancel()  # an identical request's, racing: the later one stands
        self._speculations[new.bound_nonce] = (new.call_data, task)
        while len(self._speculations) > SPECULATIONS_KEPT:
            self._speculations.popitem(last=False)[1][1].cancel()

    async def sponsored_cost(self, new: NewJob) -> tuple[int, int]:
        """(gas estimate, fee ceiling in wei) of a sponsored transfer not yet recorded: its
        simulation as the executor (``eth_estimateGas``), and the most its transaction can
        cost the executor: the gas limit planned from that estimate at the sponsored fee
        ceiling (no bump goes above it) plus the L1 data fee bound and operator fee
        (design: docs/design/x402-v2.md, C3; what its API key's daily budget reserves).

        Raises:
            ChainRevert: the simulation reverted.
            Rejection: gas_limit_exceeds_cap.
            Unavailable: the chain node failed.
        """
        function = relayed_function(new.kind, new.scheme).name
        estimate = await self.executor.estimate_gas(
            self.executor_address, new.settlement, new.call_data, function
        )
        gas_limit = self.gas.sponsored_gas_limit(estimate)
        l1, operator = await self.gas.extra_wei(len(new.call_data), gas_limit)
        return estimate, transfer_gas_ceiling(gas_limit, self.gas.sponsored_ceiling(), l1 + operator)

    async def simulate(self, job: Job, estimate: int | RelayerError | None = None) -> None:
        """Simulate, cap gas, price it against the job's signed allowance (a ``transfer`` job:
        at most the sponsored fee ceiling, ``facilitator_max_fee_per_gas_wei``), then mark it
        simulated and wake the broadcaster. ``estimate``: the job's simulation already made
        (:meth:`sponsored_cost`): its gas, or its refusal; None: simulate now.

        Raises:
            RelayerError: the refusal (contract_revert, gas_limit_exceeds_cap,
                insufficient_authorized_value, payment_unavailable for a transfer while fees
                are above its ceiling, an outage's 503), after the job was moved to rejected
                with it.
        """
        try:
            if isinstance(estimate, RelayerError):
                raise estimate
            if estimate is None:
                estimate = await self._estimate_at_head(job)
            plan = await self._plan(job, estimate)
        except RelayerError as refusal:
            await self.jobs.move(job.id, JobState.REJECTED, error=refusal)
            raise
        moved = await self._moves(
            SimulatedPlan(
                job.id,
                plan.gas_limit,
                plan.max_fee_per_gas,
                plan.max_priority_fee_per_gas,
                plan.allowance_wei,
            )
        )
        if moved:
            self._wake_broadcaster()

    async def _estimate_at_head(self, job: Job) -> int:
        """The job's simulation as the executor at the head block the node's cache holds,
        remembered as the block the job was simulated at (see :meth:`recheck`): its call
        executed within the gas cap together with the jobs that came meanwhile
        (:meth:`_batched`), and its gas limit from the gas it consumed; a job that batch
        cannot tell about (a revert, out of gas within the cap, a node without state
        overrides) is simulated on its own (``eth_estimateGas``), and a revert there is
        confirmed at the latest block before it refuses the job (that head may predate what
        the payer did since).

        Raises:
            ChainRevert: the simulation reverted at the latest block.
            Unavailable: the chain node failed.
        """
        head, batched = await self._batched(job)
        if batched is not None:
            self._remember(job.id, head)
            return batched
        function = function_name(job)
        try:
            estimate = await self.executor.estimate_gas(
                self.executor_address, job.settlement, job.call_data, function, block=head
            )
        except ChainRevert:
            return await self.executor.estimate_gas(
                self.executor_address, job.settlement, job.call_data, function
            )
        self._remember(job.id, head)
        return estimate

    async def _move_simulated(self, plans: Sequence[SimulatedPlan]) -> list[bool]:
        return await self.jobs.move_simulated(plans)

    def _remember(self, job_id: int, block: int) -> None:
        self._simulated_at[job_id] = block
        while len(self._simulated_at) > SIMULATED_AT_KEPT:
            self._simulated_at.popitem(last=False)

    def reserved_at(self, job_id: int, block: int) -> None:
        """Job ``job_id`` was reserved now by this process, the payer's balance and the job's
        supply (if it takes any) both read at ``block`` and checked in its reservation
        (:meth:`RelayJobs.reserve`): at that block the re-check's balance and supply checks
        hold for it (see :meth:`recheck`). At most :data:`SIMULATED_AT_KEPT` are kept."""
        self._reserved_at[job_id] = block
        while len(self._reserved_at) > SIMULATED_AT_KEPT:
            self._reserved_at.popitem(last=False)

    async def _batched(self, job: Job) -> tuple[int, int | None]:
        """(head block, the job's gas limit or None) from the batch simulation the job joins:
        the first job waiting starts a batch at once, and the jobs that come while it runs go
        together in the next (at most :data:`SIMULATION_BATCH_MAX` a batch); no job waits
        for a timer.

        Raises:
            Unavailable: the chain node failed (the whole batch).
        """
        speculation = self._speculations.pop(job.bound_nonce, None)
        if speculation is not None and speculation[0] == job.call_data and not speculation[1].cancelled():
            return await speculation[1]
        return await self._simulations(job)

    async def _simulate_batch(self, batch: Sequence[Job | NewJob]) -> list[tuple[int, int | None]]:
        """Each job's (head block, gas limit or None) from one prober ``eth_call`` at the head,
        with what the jobs' plans read at the head read beside it (:meth:`GasPricer.warm`).

        Raises:
            Unavailable: the chain node failed (the whole batch).
        """
        head = await self.reads.node.head()
        gas, _warm = await asyncio.gather(
            self.executor.simulate_many(
                self.executor_address,
                [(j.settlement, j.call_data, relayed_function(j.kind, j.scheme)) for j in batch],
                self.gas.settings.gas_cap,
                head,
            ),
            self.gas.warm(len(j.call_data) for j in batch),  # the plans' reads, beside it
        )
        return [(head, limit) for limit in gas]

    async def recheck(self, batch: Sequence[Job], sender: str) -> list[int]:
        """The pre-sign check of a signing batch (:meth:`PreSignCheck.recheck`, which shares
        this simulator's memory of the blocks its jobs were simulated and reserved at)."""
        return await self.presign.recheck(batch, sender)

    async def _plan(self, job: Job, estimate: int) -> GasPlan:
        """The job's gas plan from a simulation's ``estimate``: within its signed allowance, or
        (a transfer, whose gas no allowance pays) within the sponsored fee ceiling.

        Raises:
            Rejection: as :meth:`GasPricer.plan` or :meth:`GasPricer.plan_sponsored`.
            Unavailable: the chain node failed.
        """
        if job.kind == "transfer":
            return await self.gas.plan_sponsored(estimate)
        pays_usdc, size = job.input_token == self.usdc, len(job.call_data)
        return await self.gas.plan(estimate, job.gas_allowance, pays_usdc, job.quote_total or 0, size)

    async def _ceiling(self, job: Job, gas_limit: int) -> int:
        """The highest max fee per gas (wei) the job may be signed at with ``gas_limit``."""
        if job.kind == "transfer":
            return self.gas.sponsored_ceiling()
        pays_usdc, size = job.input_token == self.usdc, len(job.call_data)
        return await self.gas.ceiling(job.gas_allowance, gas_limit, pays_usdc, size)

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

    async def sweep(self, stop: asyncio.Event | None = None) -> int:
        """Take over and simulate the jobs of this chain left in ``accepted`` by processes
        that died; returns how many. A refusal is stored with its job (the identical request
        answers it). Once ``stop`` is set the jobs taken and not yet simulated are handed back
        (orphans again at once, for the next process).

        Raises:
            Unavailable: the database failed before anything was taken.
        """
        orphans = await self.jobs.claim_orphans(self.chain_id, ORPHAN_AFTER_S, ORPHAN_BATCH)
        for position, job in enumerate(orphans):
            if stop is not None and stop.is_set():
                rest = [j.id for j in orphans[position:]]
                await self.jobs.hand_back_orphans(rest, ORPHAN_AFTER_S)
                log.info("stopping: orphaned jobs handed back", extra={"count": len(rest)})
                return position
            log.warning("resuming a job its owner left in accepted", extra={"job_id": job.id})
            try:
                await self.simulate(job)
            except Unavailable:
                raise
            except RelayerError:
                pass  # stored with the job
        return len(orphans)
