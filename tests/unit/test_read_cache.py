"""The node's single-flight read cache (relayer/chain/node.py): ``fresh`` says a read can be
awaited without a round trip or a wait only when it is loaded, current and not a failure."""

from __future__ import annotations

import asyncio
import time

import pytest

from relayer.chain.node import ChainNode
from relayer.chain.types import Contracts

_KEYS = ("usdc", "kvcm", "carbonCredits", "carbonClasses", "pool", "marketplace", "settlement")


def _node() -> ChainNode:
    contracts = Contracts.from_deployment(dict.fromkeys(_KEYS, "0x" + "11" * 20))
    return ChainNode("http://127.0.0.1:9/", 84532, contracts, read_ttl_s=60)  # never called


async def test_fresh_only_when_loaded_current_and_not_failed() -> None:
    node, loads = _node(), []
    node.observe_head(10)

    async def load() -> int:
        loads.append(1)
        return 7

    assert not node.fresh("a")
    assert await node.cached("a", load) == 7
    assert node.fresh("a") and not node.fresh("a", "b")
    assert await node.cached("a", load) == 7 and len(loads) == 1  # a hit: no second load

    gate = asyncio.Event()

    async def slow() -> int:
        await gate.wait()
        return 8

    pending = asyncio.ensure_future(node.cached("b", slow))
    await asyncio.sleep(0)
    assert not node.fresh("b")  # in flight: awaiting it would wait
    gate.set()
    assert await pending == 8 and node.fresh("a", "b")

    async def broken() -> int:
        raise RuntimeError("node down")

    with pytest.raises(RuntimeError):
        await node.cached("c", broken)
    assert not node.fresh("c")  # a failure is not cached

    node.observe_head(11)
    assert not node.fresh("a") and not node.fresh("b")  # a new head: all stale
    assert await node.cached("a", load) == 7 and len(loads) == 2


async def test_a_head_read_that_answers_late_never_rolls_the_head_back() -> None:
    """``observe_read_head``: a newer number is always observed; an older or equal one only
    when no read asked after it answered meanwhile (a reorg to a lower head is still seen)."""
    node, loads = _node(), []
    node.observe_head(10)

    async def load() -> int:
        loads.append(1)
        return 7

    first = time.monotonic()  # a read asked here answers late
    await asyncio.sleep(0.001)
    node.observe_read_head(12, time.monotonic())  # a later read answered first: newer
    assert await node.cached("a", load) == 7
    node.observe_read_head(11, first)  # the late answer: older, and a later read answered
    assert node.fresh("a") and await node.head() == 12, "not rolled back: the cache kept"
    node.observe_read_head(13, first)  # an asked-earlier read that is newer is still news
    assert not node.fresh("a") and await node.head() == 13
    await asyncio.sleep(0.001)
    node.observe_read_head(9, time.monotonic())  # asked after every answer: a reorg, observed
    assert await node.head() == 9
