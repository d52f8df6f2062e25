"""Issue 20, the work per retirement: a gas plan, a fee ceiling and an allowance read the
fees, the pool's reserves, the ETH price and the L1 and operator fees at the head. When the
per-head ones are cached (the common case: a block's jobs share them), they are awaited one
after the other, with no task each; otherwise together. Both ways give the same answer. The
chain is a stand-in here (the reads' caching is tests/unit/test_read_cache.py's)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from contextlib import contextmanager
from typing import Any, cast

import pytest

from relayer.chain.costs import BaseCosts, FeedAnswer
from relayer.chain.executor import ExecutorChain, FeeMarket
from relayer.chain.reads import ChainReads
from relayer.config import Settings
from relayer.domain import fees
from relayer.service.gas import GasPricer


class _Chain:
    """The reads a plan makes, each answered at once except the operator fee, which waits
    for ``operator_gate``; ``fresh`` is what the cache would say of the per-head ones."""

    def __init__(self, fresh: bool) -> None:
        self.is_fresh = fresh
        self.operator_gate = asyncio.Event()
        self.operator_gate.set()

    # ExecutorChain
    def fee_market_fresh(self) -> bool:
        return self.is_fresh

    async def fee_market(self) -> FeeMarket:
        return FeeMarket(1_000_000, 50_000)

    # ChainReads
    def reserves_fresh(self) -> bool:
        return self.is_fresh

    async def reserves(self) -> fees.PoolReserves:
        return fees.PoolReserves(2_000_000_000_000, 5_000_000_000_000_000_000_000)

    # BaseCosts
    def fresh(self, unsigned_tx_size: int) -> bool:
        return self.is_fresh

    async def l1_fee(self, unsigned_tx_size: int) -> int:
        return 3 * unsigned_tx_size

    async def operator_fee(self, gas: int) -> int:
        await self.operator_gate.wait()
        return gas // 7

    async def eth_usd(self) -> FeedAnswer | None:
        return FeedAnswer(3_000_00000000, 8, 10**10)


def _pricer(chain: _Chain) -> GasPricer:
    return GasPricer(cast(ExecutorChain, chain), cast(ChainReads, chain), cast(BaseCosts, chain), Settings())


@contextmanager
def _tasks_counted() -> Generator[list[int], None, None]:
    """Counts the tasks the running loop creates meanwhile (its task factory)."""
    loop = asyncio.get_running_loop()
    made = [0]

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any
    ) -> asyncio.Task[Any]:
        made[0] += 1
        return asyncio.Task(coro, loop=loop, **kw)

    before = loop.get_task_factory()
    loop.set_task_factory(factory)  # type: ignore[arg-type]
    try:
        yield made
    finally:
        loop.set_task_factory(before)


async def _answers(pricer: GasPricer) -> tuple[Any, ...]:
    return (
        await pricer.plan(240_000, 900_000, True, 10_000_000, 612),
        await pricer.plan(240_000, 9 * 10**17, False, 10_000_000, 612),
        await pricer.ceiling(900_000, 264_000, True, 612),
        await pricer.ceiling(9 * 10**17, 264_000, False, 612),
        await pricer.extra_wei(612, 264_000),
    )


async def test_cached_reads_are_awaited_one_after_the_other_with_the_same_answers() -> None:
    fresh, cold = _Chain(fresh=True), _Chain(fresh=False)
    with _tasks_counted() as made:
        fast = await _answers(_pricer(fresh))
    assert made == [0]  # no task for reads that answer at once
    with _tasks_counted() as made:
        slow = await _answers(_pricer(cold))
    assert made[0] > 0  # together: a task each
    assert fast == slow


async def test_the_operator_fee_may_still_be_on_its_way_when_the_rest_is_cached() -> None:
    chain = _Chain(fresh=True)
    chain.operator_gate.clear()
    planned = asyncio.ensure_future(_pricer(chain).plan(240_000, 900_000, True, 10_000_000, 612))
    await asyncio.sleep(0)
    assert not planned.done()  # waits for the one read not cached
    chain.operator_gate.set()
    plan = await planned
    cold = await _pricer(_Chain(fresh=False)).plan(240_000, 900_000, True, 10_000_000, 612)
    assert plan == cold


@pytest.mark.parametrize("fresh", [True, False])
async def test_a_plan_prices_the_l1_and_operator_fees_in(fresh: bool) -> None:
    pricer = _pricer(_Chain(fresh))
    l1, operator = await pricer.extra_wei(612, 264_000)
    assert operator == 264_000 // 7
    assert l1 == fees.ceil_div(3 * fees.unsigned_tx_size(612) * pricer.settings.l1_fee_headroom_bps, fees.BPS)
