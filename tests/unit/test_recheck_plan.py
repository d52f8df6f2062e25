"""The signing batch's decision per job (relayer/service/simulate.py ``_still_good``), with
the chain and the store replaced by recorders (the decision is pure logic; the integration
tests run it against anvil and Postgres): a job is signed only at a gas limit whose call
just succeeded under a fee cap its allowance covers, and a re-plan starts from a fresh
estimate, never from the old limit (which already carries the plan's margin)."""

from __future__ import annotations

from typing import Any

from relayer.domain.states import JobState
from relayer.service.gas import GasPlan
from relayer.service.simulate import Simulator
from relayer.store.relay_jobs import Job

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


def _job(max_fee: int) -> Job:
    stamps: dict[str, float | None] = {}
    return Job(
        1, 84532, JobState.SIMULATED, b"k", b"s", "eip3009", "0xpayer", "0xusdc", b"h", "0xsettlement",
        b"\x00" * 4, 10**6, 10**6, {}, None, OLD_LIMIT, max_fee, 1, None, None, None, None, stamps,
    )  # fmt: skip


async def test_a_job_whose_call_succeeds_under_the_ceiling_is_signed_as_planned() -> None:
    rec = Recorder(ceiling=10)
    assert await _simulator(rec)._still_good(_job(max_fee=10), "0xexecutor", True) is True
    assert (rec.estimates, rec.planned, rec.replanned) == (0, [], [])


async def test_a_lower_ceiling_replans_from_a_fresh_estimate_and_waits_for_the_next_batch() -> None:
    rec = Recorder(ceiling=9)  # the L1 fee or the ETH price moved: the fee cap no longer fits
    assert await _simulator(rec)._still_good(_job(max_fee=10), "0xexecutor", True) is False
    assert rec.planned == [ESTIMATE]  # not OLD_LIMIT: no margin on top of a margin
    assert rec.replanned[0][1] == ESTIMATE * 12 // 10


async def test_a_failed_call_is_never_signed_in_this_batch_even_if_the_estimate_fits() -> None:
    rec = Recorder(ceiling=10)
    assert await _simulator(rec)._still_good(_job(max_fee=10), "0xexecutor", False) is False
    assert rec.estimates == 1 and rec.planned == [ESTIMATE] and len(rec.replanned) == 1
