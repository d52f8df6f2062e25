"""The block interval the daemon measures from a chain's newest headers (issue 20, item 2), on
a real anvil mining a block every 200 ms: its timestamps are whole seconds, so the measure is
the span of 64 blocks (12.8 s) and lands within a block-time-and-a-bit of 200 ms."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from relayer.chain.blocks import BlockReader
from relayer.chain.node import ChainNode
from relayer.chain.types import Contracts
from relayer_dev import devnet
from relayer_dev.ports import free_port

# alone: measures the block time it is given: a busy machine skews the figure
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120), pytest.mark.alone]

NOWHERE = "0x" + "00" * 20


async def test_a_200_ms_devnet_measures_about_200_ms_from_its_newest_64_headers(tmp_path: Path) -> None:
    port = free_port()
    anvil = devnet.start_anvil(tmp_path, port, 84532, 0.2)
    node = ChainNode(devnet.rpc_url(port), 84532, Contracts(*[NOWHERE] * 7))
    try:
        reader = BlockReader(node)
        started = time.monotonic()
        while await reader.head() < 70 and time.monotonic() - started < 60:
            await asyncio.sleep(0.5)
        calls: list[str] = []
        batch = node.batch

        async def counted(items: list[tuple[str, list[object]]]) -> list[dict[str, object]]:
            calls.extend(method for method, _ in items)
            return await batch(items)

        node.batch = counted  # type: ignore[method-assign]
        measured = await reader.block_time_ms()
    finally:
        await node.close()
        anvil.terminate()
        anvil.wait(timeout=10)
    print(f"\nmeasured {measured} ms over 64 blocks of 200 ms")
    assert measured is not None and 170 <= measured <= 240
    assert calls == ["eth_getBlockByNumber"] * 64  # one bounded batch
