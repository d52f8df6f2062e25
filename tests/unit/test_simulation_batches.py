"""Issue 20, half the work per retirement: accepted jobs are simulated together
(``Simulator._estimate_at_head``), the jobs that come while a batch runs in the next one, with
no timer; a job the batch cannot tell about is simulated on its own. The queueing is pure
logic, tested here with a recording stand-in for the chain; that the prober's batch gives the
gas ``eth_estimateGas`` gives is tests/integration/test_batch_prober.py on anvil, and that a
daemon simulates without ``eth_estimateGas`` is tests/integration/test_shared_reads.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from relayer.chain.errors import ChainRevert, ChainUnavailable
from relayer.domain.states import JobState
from relayer.service import simulate
from relayer.service.simulate import SIMULATION_BATCH_MAX, Simulator
from relayer.store.relay_jobs import Job, NewJob

HEAD = 1_000
CAP = 1_500_000
TOKEN = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
EXECUTOR = "0x" + "ee" * 20


class _Chain:
    """The executor's chain as the simulator sees it: ``simulate_many`` records each batch and
    answers each call's gas (its call data's first byte times 1,000; None for a first byte of
    0), held while ``gate`` is clear; ``estimate_gas`` answers 7 or the revert in ``reverts``
    (call data to the block it reverts at: "any" or the head)."""

    def __init__(self) -> None:
        self.batches: list[list[bytes]] = []
        self.answered: list[int] = []
        self.blocks: list[int] = []
        self.estimates: list[tuple[bytes, int | None]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = False
        self.reverts: dict[bytes, str] = {}

    async def simulate_many(
        self, sender: str, calls: Sequence[tuple[str, bytes, Any]], gas_cap: int, block: int
    ) -> list[int | None]:
        assert sender == EXECUTOR and gas_cap == CAP
        self.batches.append([data for _to, data, _f in calls])
        self.blocks.append(block)
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise ChainUnavailable(detail="node down")
        self.answered.append(len(calls))
        return [data[0] * 1_000 or None for _to, data, _f in calls]

    async def estimate_gas(
        self, sender: str, to: str, data: bytes, function: str | None = None, *, block: int | None = None
    ) -> int:
        self.estimates.append((data, block))
        where = self.reverts.get(data)
        if where == "any" or (where == "head" and block == HEAD):
            raise ChainRevert(None, function, "reverted")
        return 7


def _simulator(chain: _Chain, warmed: list[tuple[list[int], int]] | None = None) -> Simulator:
    """The simulator on ``chain``; ``warmed`` records each warming of the plans' reads: the
    call data sizes, and how many batches the chain had answered when it began."""

    async def head() -> int:
        return HEAD

    async def warm(sizes: Any) -> None:
        if warmed is not None:
            warmed.append((sorted(sizes), len(chain.answered)))

    reads: Any = SimpleNamespace(node=SimpleNamespace(head=head))
    gas: Any = SimpleNamespace(settings=SimpleNamespace(gas_cap=CAP), warm=warm)
    return Simulator(chain, gas, SimpleNamespace(), EXECUTOR, TOKEN, lambda: None, reads, 84532)  # type: ignore[arg-type]


def _job(job_id: int, first_byte: int) -> Job:
    return Job(
        id=job_id, chain_id=84532, state=JobState.ACCEPTED, bound_nonce=b"\x00" * 32,
        salt=job_id.to_bytes(32, "big"), scheme="eip3009", payer=TOKEN, input_token=TOKEN,
        request_hash=b"\x00" * 32, settlement=TOKEN, call_data=bytes([first_byte, job_id % 256]),
        gas_allowance=0, quote_total=None, summary={}, error=None, gas_limit=None,
        max_fee_per_gas=None, max_priority_fee_per_gas=None, executor=None, executor_nonce=None,
        tx_hash=None, block_number=None, timestamps={}, kind="transfer",
    )  # fmt: skip


async def test_jobs_that_wait_together_are_simulated_in_one_batch_and_later_ones_in_the_next() -> None:
    chain = _Chain()
    simulator = _simulator(chain)
    chain.gate.clear()
    first = [asyncio.create_task(simulator._estimate_at_head(_job(i, 1 + i))) for i in range(3)]
    await asyncio.sleep(0)  # the first batch is out: all three
    await asyncio.sleep(0)
    later = [asyncio.create_task(simulator._estimate_at_head(_job(10 + i, 20 + i))) for i in range(2)]
    await asyncio.sleep(0)
    assert len(chain.batches) == 1  # the later jobs wait for the batch in flight
    chain.gate.set()
    gas = await asyncio.gather(*first, *later)
    assert gas == [1_000, 2_000, 3_000, 20_000, 21_000]
    assert [len(b) for b in chain.batches] == [3, 2] and chain.blocks == [HEAD, HEAD]
    assert chain.estimates == []  # no job asked on its own
    assert simulator._simulated_at == dict.fromkeys([0, 1, 2, 10, 11], HEAD)  # no re-check on that block


async def test_the_plans_reads_are_made_beside_each_batch_s_simulation_not_after() -> None:
    """Each batch warms what its jobs' plans read at the head (fees, reserves, the ETH price,
    the L1 fee of each call data size) while its simulation is under way."""
    chain, warmed = _Chain(), []
    simulator = _simulator(chain, warmed)
    chain.gate.clear()
    jobs = [asyncio.create_task(simulator._estimate_at_head(_job(i, 1 + i))) for i in range(2)]
    for _ in range(3):
        await asyncio.sleep(0)
    assert warmed == [([2, 2], 0)]  # begun while the batch's call is held
    chain.gate.set()
    await asyncio.gather(*jobs)
    assert chain.answered == [2]


async def test_a_batch_takes_at_most_its_bound_and_the_rest_go_in_the_next() -> None:
    chain = _Chain()
    simulator = _simulator(chain)
    count = SIMULATION_BATCH_MAX + 5
    gas = await asyncio.gather(*(simulator._estimate_at_head(_job(i, 1)) for i in range(count)))
    assert gas == [1_000] * count
    assert [len(b) for b in chain.batches] == [SIMULATION_BATCH_MAX, 5]


async def test_a_job_the_batch_cannot_tell_about_is_simulated_alone_and_a_revert_confirmed_at_latest() -> (
    None
):
    chain = _Chain()
    simulator = _simulator(chain)
    stale, reverting = _job(1, 0), _job(2, 0)
    chain.reverts = {stale.call_data: "head", reverting.call_data: "any"}
    good, moved_on, refused = await asyncio.gather(
        simulator._estimate_at_head(_job(3, 0)),
        simulator._estimate_at_head(stale),
        simulator._estimate_at_head(reverting),
        return_exceptions=True,
    )
    assert (good, moved_on) == (7, 7)  # reverted at the head, good at the latest block
    assert isinstance(refused, ChainRevert)
    assert len(chain.batches) == 1
    assert sorted(chain.estimates, key=repr) == sorted(
        [(bytes([0, 3]), HEAD), (stale.call_data, HEAD), (stale.call_data, None),
         (reverting.call_data, HEAD), (reverting.call_data, None)], key=repr
    )  # fmt: skip
    assert simulator._simulated_at == {3: HEAD}  # only a simulation at the head is remembered


async def test_a_failed_batch_fails_each_of_its_jobs_and_the_next_batch_runs() -> None:
    chain = _Chain()
    simulator = _simulator(chain)
    chain.fail_next = True
    chain.gate.clear()
    failed = [asyncio.create_task(simulator._estimate_at_head(_job(i, 1))) for i in range(2)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    next_one = asyncio.create_task(simulator._estimate_at_head(_job(5, 4)))
    chain.gate.set()
    outcomes = await asyncio.gather(*failed, return_exceptions=True)
    assert all(isinstance(o, ChainUnavailable) for o in outcomes)
    assert await next_one == 4_000
    assert chain.estimates == []


async def test_a_job_whose_request_went_does_not_hold_up_the_others() -> None:
    chain = _Chain()
    simulator = _simulator(chain)
    chain.gate.clear()
    gone = asyncio.create_task(simulator._estimate_at_head(_job(1, 1)))
    stays = asyncio.create_task(simulator._estimate_at_head(_job(2, 2)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    gone.cancel()
    chain.gate.set()
    assert await stays == 2_000
    with pytest.raises(asyncio.CancelledError):
        await gone


def _new(job: Job) -> NewJob:
    """The job to record that ``job`` is once recorded."""
    return NewJob(
        chain_id=job.chain_id, bound_nonce=job.bound_nonce, permit_key=None, salt=job.salt,
        scheme=job.scheme, payer=job.payer, input_token=job.input_token, auth_value=1,
        auth_expires_at=2**40, gas_allowance=0, request_hash=job.request_hash,
        settlement=job.settlement, call_data=job.call_data, summary={}, quote_total=0, kind=job.kind,
    )  # fmt: skip


async def test_a_job_takes_the_simulation_started_before_it_was_recorded() -> None:
    """The relay starts a job's batch simulation beside its reservation
    (``Simulator.speculate``): the recorded job takes that outcome, and joins no batch."""
    chain = _Chain()
    simulator = _simulator(chain)
    chain.gate.clear()
    job = replace(_job(1, 3), bound_nonce=b"\x01" * 32)
    simulator.speculate(_new(job))
    for _ in range(3):
        await asyncio.sleep(0)
    assert chain.batches == [[job.call_data]]  # out before the job is recorded
    estimate = asyncio.create_task(simulator._estimate_at_head(job))
    await asyncio.sleep(0)
    chain.gate.set()
    assert await estimate == 3_000
    assert chain.batches == [[job.call_data]]  # no second batch
    assert simulator._simulated_at == {1: HEAD} and not simulator._speculations


async def test_a_speculation_of_other_call_data_is_not_taken_and_the_oldest_untaken_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job whose call data is not the speculation's (another authorization of the same
    bound nonce) is simulated in a batch of its own; speculations no job took (refused
    requests) are cancelled past ``SPECULATIONS_KEPT``, and a failed one is never an
    unretrieved error."""
    monkeypatch.setattr(simulate, "SPECULATIONS_KEPT", 2)
    chain = _Chain()
    simulator = _simulator(chain)
    job = replace(_job(1, 3), bound_nonce=b"\x01" * 32)
    simulator.speculate(_new(replace(job, call_data=b"\x05\x01")))
    assert await simulator._estimate_at_head(job) == 3_000  # its own call's gas, not 5_000
    simulated = sorted(data for batch in chain.batches for data in batch)
    assert simulated == [job.call_data, b"\x05\x01"]  # each call simulated
    chain.gate.clear()
    untaken = [replace(_job(10 + i, 4), bound_nonce=bytes([10 + i]) * 32) for i in range(3)]
    dropped = None
    for j in untaken:
        simulator.speculate(_new(j))
        dropped = dropped or next(iter(simulator._speculations.values()))[1]
    kept = list(simulator._speculations.values())
    assert [k[0] for k in kept] == [j.call_data for j in untaken[1:]]
    chain.fail_next = True  # the kept ones' batch fails: no job awaits them, the error is retrieved
    chain.gate.set()
    await asyncio.wait([k[1] for k in kept], timeout=5)
    assert dropped is not None and dropped.cancelled()
    assert [type(k[1].exception()) for k in kept] == [ChainUnavailable] * 2
    assert chain.batches[-1] == [j.call_data for j in untaken[1:]]  # one batch, the dropped one not in it
