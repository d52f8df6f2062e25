"""The signing batch's decision per job (relayer/service/simulate.py ``_still_good``), with
the chain and the store replaced by recorders (the decision is pure logic; the integration
tests run it against anvil and Postgres): a job is signed only at a gas limit whose call
just succeeded under a fee cap its allowance covers, and a re-plan starts from a fresh
estimate, never from the old limit (which already carries the plan's margin)."""

from __future__ import annotations

from typing import Any

from relayer.chain.reads import StateNow
from relayer.chain.types import ClassInfo
from relayer.domain.states import JobState
from relayer.service.gas import GasPlan
from relayer.service.simulate import Simulator
from relayer.store.relay_jobs import Job, SupplyAhead, SupplyTake

ESTIMATE = 300_000
OLD_LIMIT = 360_000  # an earlier estimate plus the 20 % margin


class Recorder:
    def __init__(self, ceiling: int) -> None:
        self.ceiling_wei = ceiling
        self.estimates = 0
        self.planned: list[int] = []
        self.replanned: list[tuple[Any, ...]] = []

    async def estimate_gas(self, *_args: Any) -> int:
        self.estimates += 1
        return ESTIMATE

    async def ceiling(self, *_args: Any) -> int:
        return self.ceiling_wei

    async def plan(self, estimate: int, *_args: Any) -> GasPlan:
        self.planned.append(estimate)
        return GasPlan(estimate * 12 // 10, 5, 1, 10**12)

    async def replan(self, *args: Any) -> None:
        self.replanned.append(args)


def _simulator(rec: Recorder) -> Simulator:
    return Simulator(rec, rec, rec, "0xexecutor", "0xusdc", lambda: None, rec, 84532)  # type: ignore[arg-type]


async def _still_good(rec: Recorder, job: Job, succeeds: bool) -> bool:
    """The decision, with the job's fee ceiling read as the re-check reads it beside the checks."""
    simulator = _simulator(rec)
    assert job.gas_limit is not None
    return await simulator.presign._still_good(
        job, "0xexecutor", succeeds, await simulator._ceiling(job, job.gas_limit)
    )


def _job(max_fee: int) -> Job:
    stamps: dict[str, float | None] = {}
    return Job(
        1, 84532, JobState.SIMULATED, b"k", b"s", "eip3009", "0xpayer", "0xusdc", b"h", "0xsettlement",
        b"\x00" * 4, 10**6, 10**6, {}, None, OLD_LIMIT, max_fee, 1, None, None, None, None, stamps,
    )  # fmt: skip


async def test_a_job_whose_call_succeeds_under_the_ceiling_is_signed_as_planned() -> None:
    rec = Recorder(ceiling=10)
    assert await _still_good(rec, _job(max_fee=10), True) is True
    assert (rec.estimates, rec.planned, rec.replanned) == (0, [], [])


async def test_a_lower_ceiling_replans_from_a_fresh_estimate_and_waits_for_the_next_batch() -> None:
    rec = Recorder(ceiling=9)  # the L1 fee or the ETH price moved: the fee cap no longer fits
    assert await _still_good(rec, _job(max_fee=10), True) is False
    assert rec.planned == [ESTIMATE]  # not OLD_LIMIT: no margin on top of a margin
    assert rec.replanned[0][1] == ESTIMATE * 12 // 10


async def test_a_failed_call_is_never_signed_in_this_batch_even_if_the_estimate_fits() -> None:
    rec = Recorder(ceiling=10)
    assert await _still_good(rec, _job(max_fee=10), False) is False
    assert rec.estimates == 1 and rec.planned == [ESTIMATE] and len(rec.replanned) == 1


PAYER_A, PAYER_B = "0x" + "aa" * 20, "0x" + "bb" * 20


class _Store:
    """The store as the re-check reads it: the payers' signed jobs take nothing; the jobs
    ahead of each job on its supply are the older ones of the batch not yet rejected (as
    SUPPLY_AHEAD counts them); each read and rejection recorded."""

    def __init__(self, batch: list[Job]) -> None:
        self.batch = batch
        self.rejected: list[int] = []
        self.ahead_reads = 0

    async def committed(self, *_args: Any) -> dict[tuple[str, str], int]:
        return {}

    async def supply_ahead(self, job_ids: list[int], _block: int) -> dict[int, SupplyAhead]:
        self.ahead_reads += 1
        live = [j for j in self.batch if j.id not in self.rejected]
        return {
            i: SupplyAhead(0, sum(j.supply.units for j in live if j.id < i and j.supply is not None))
            for i in job_ids
        }

    async def move(self, job_id: int, state: JobState, **_kw: Any) -> None:
        assert state is JobState.REJECTED
        self.rejected.append(job_id)


class _Chain:
    """The state at block 7: payer A holds 15 (its two jobs take 10 each), the class credit
    holds 2,000 units; every execution succeeds."""

    async def state_now(self, *args: Any) -> StateNow:
        assert args[-1] == 7  # at the block asked
        credit = ClassInfo(1, "RE", "Renewable", 10**18, 1, ((5, 2_000),))
        return StateNow(7, {("0xusdc", PAYER_A): 15, ("0xusdc", PAYER_B): 10}, {}, [credit])

    async def calls_succeed(self, _sender: str, calls: list[Any], block: int | None = None) -> list[bool]:
        assert block == 7  # at the block asked, the state's
        return [True] * len(calls)


def _held(job_id: int, payer: str) -> Job:
    stamps: dict[str, float | None] = {}
    return Job(
        job_id, 84532, JobState.SIMULATED, b"k", b"s", "eip3009", payer, "0xusdc", b"h", "0xsettlement",
        b"\x00" * 4, 10**6, 10**6, {}, None, OLD_LIMIT, 5, 1, None, None, None, None, stamps,
        auth_value=10, supply=SupplyTake(0, 1, 5, 1_000),
    )  # fmt: skip


async def test_a_job_its_payer_cannot_pay_gives_its_supply_back_to_the_jobs_after_it() -> None:
    """Payer A's second job (2) is refused (its balance covers one); its 1,000 units were
    counted ahead of job 3 when the supply's figures were read beside the executions, so
    they are read again once it is rejected: job 3 fits beside job 1 alone (2,000 units)."""
    batch = [_held(1, PAYER_A), _held(2, PAYER_A), _held(3, PAYER_B)]
    store, chain = _Store(batch), _Chain()
    simulator = Simulator(chain, Recorder(10), store, "0xexecutor", "0xusdc", lambda: None, chain, 84532)  # type: ignore[arg-type]
    checked = await simulator.presign._checked(batch, "0xexecutor", {}, 7)  # block 7, the latest
    assert checked == {1: True, 3: True}
    assert store.rejected == [2] and store.ahead_reads == 2
