"""relayer.coalesce.Coalescer: items asked for one at a time are run in batches with no timer
(the first at once, the ones that came meanwhile together next, at most the bound a batch);
each caller gets its own result or its batch's failure; a caller that goes leaves the others'
batch alone; a cancelled batch task cancels every waiting caller."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from relayer.coalesce import Coalescer


class _Doubler:
    """Records each batch and answers each item doubled, while ``gate`` is set."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: Exception | None = None

    async def __call__(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        await self.gate.wait()
        if self.fail is not None:
            failure, self.fail = self.fail, None
            raise failure
        return [2 * i for i in items]


async def test_the_first_runs_at_once_and_the_ones_that_came_meanwhile_go_together_next() -> None:
    run = _Doubler()
    coalesce = Coalescer(run, max_batch=3)
    run.gate.clear()
    first = asyncio.ensure_future(coalesce(1))
    await asyncio.sleep(0)
    later = [asyncio.ensure_future(coalesce(i)) for i in (2, 3, 4, 5)]
    await asyncio.sleep(0)
    assert run.batches == [[1]]  # no timer: the first did not wait for company
    run.gate.set()
    assert await first == 2
    assert [await f for f in later] == [4, 6, 8, 10]
    assert run.batches == [[1], [2, 3, 4], [5]]  # at most 3 a batch, in the order they came


async def test_a_failed_batch_fails_each_of_its_callers_and_the_next_batch_runs() -> None:
    run = _Doubler()
    coalesce = Coalescer(run, max_batch=8)
    run.gate.clear()
    failing = [asyncio.ensure_future(coalesce(i)) for i in (1, 2)]
    await asyncio.sleep(0)
    after = asyncio.ensure_future(coalesce(3))
    run.fail = RuntimeError("node down")
    run.gate.set()
    for future in failing:
        with pytest.raises(RuntimeError, match="node down"):
            await future
    assert await after == 6
    assert run.batches == [[1, 2], [3]]


async def test_a_caller_that_goes_leaves_its_batch_to_the_others() -> None:
    run = _Doubler()
    coalesce = Coalescer(run, max_batch=8)
    run.gate.clear()
    gone, staying = asyncio.ensure_future(coalesce(1)), asyncio.ensure_future(coalesce(2))
    await asyncio.sleep(0)
    gone.cancel()
    run.gate.set()
    assert await staying == 4
    assert gone.cancelled()


async def test_a_cancelled_batch_task_cancels_every_caller_waiting() -> None:
    run = _Doubler()
    coalesce = Coalescer(run, max_batch=1)
    run.gate.clear()
    callers = [asyncio.ensure_future(coalesce(i)) for i in (1, 2)]
    await asyncio.sleep(0)
    assert coalesce._task is not None
    coalesce._task.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    assert all(c.cancelled() for c in callers)


def test_a_batch_holds_at_least_one() -> None:
    with pytest.raises(ValueError):
        Coalescer(_Doubler(), max_batch=0)
