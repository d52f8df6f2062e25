"""Reorgs at Base's block rate since Denim (issue 20, item 2): a block every 200 ms, the
confirmation a time (``RELAYER_CONFIRMATION=8``: 8 s = 40 blocks of 200 ms, the reorg memory
80 blocks), the follower polling at half a block. Reorgs of depth 1, 5 and 30 blocks that take
the block holding a retirement are each undone exactly once, the same bytes re-sent and settled
once, and nothing is answered ``settled`` before the chain holds it 40 blocks deep.

The test is the block producer: it mines a block every 200 ms (``evm_mine``), and stops once
the retirement's block is ``depth`` blocks deep, so that ``anvil_reorg(depth)`` takes it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.jobs import job_row, wait_for_job
from tests.helpers.relay import signed_retirement
from tests.helpers.reorgs import halted, on_chain, retirements_of
from tests.private import Anvil, private_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BLOCK_S = 0.2
CONFIRMATION_S = 8
WINDOW = 40  # 8 s of 200 ms blocks


class Miner:
    """A block every :data:`BLOCK_S` seconds; with ``bury`` set, it stops once the first block
    holding a transaction is ``bury`` blocks deep (that block counting as the first)."""

    def __init__(self, anvil: Anvil) -> None:
        self.anvil = anvil
        self.bury: int | None = None
        self.held = asyncio.Event()  # set while it stopped as ``bury`` asked
        self.buried_in: int | None = None

    async def run(self) -> None:
        while True:
            if not self.held.is_set():
                await asyncio.to_thread(self.anvil.mine)
                self._after_block()
            await asyncio.sleep(BLOCK_S)

    def _after_block(self) -> None:
        if self.bury is None:
            return
        head = int(self.anvil.rpc("eth_blockNumber"), 16)
        block = self.anvil.rpc("eth_getBlockByNumber", hex(head), False)
        if self.buried_in is None and block["transactions"]:
            self.buried_in = head
        if self.buried_in is not None and head - self.buried_in + 1 >= self.bury:
            self.bury = None
            self.held.set()

    def resume(self) -> None:
        self.held.clear()


@contextlib.asynccontextmanager
async def mining(anvil: Anvil) -> AsyncIterator[Miner]:
    anvil.automine(False)
    miner = Miner(anvil)
    task = asyncio.create_task(miner.run())
    try:
        yield miner
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        anvil.automine(True)


@pytest.mark.parametrize("depth", [1, 5, 30])
async def test_at_200_ms_blocks_a_reorg_within_the_window_is_undone_exactly_once_and_never_settled_early(
    tmp_path: Path, admin_database_url: str, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    async with (
        private_daemon(
            tmp_path,
            admin_database_url,
            resend_after_s=1.0,
            confirmations=None,
            confirmation=str(CONFIRMATION_S),
            block_poll_interval_s=None,  # half a block
        ) as (d, anvil),
        mining(anvil) as miner,
    ):
        policy = d.runtime.settings.confirmation_policy()
        assert (policy.depth, policy.memory_blocks, d.runtime.settings.poll_interval_s()) == (WINDOW, 80, 0.1)
        body = await signed_retirement(d, 0)
        miner.bury = depth
        answer = asyncio.create_task(d.post(body))
        await asyncio.wait_for(miner.held.wait(), 30)
        job = await wait_for_job(d, body, {"mined"})
        tx_hash = "0x" + bytes(job["tx_hash"]).hex()
        mined_in = on_chain(anvil, tx_hash)
        assert mined_in == miner.buried_in
        await asyncio.sleep(0.5)  # the follower sees the held head
        assert (await job_row(d, body))["state"] == "mined" and not answer.done(), "not deep enough"
        with caplog.at_level(logging.INFO):
            anvil.rpc("anvil_reorg", depth, [])  # the block with it, and those over it, are gone
            assert on_chain(anvil, tx_hash) is None
            miner.resume()
            started = time.monotonic()
            await wait_for_job(d, body, {"submitted"})
            assert not answer.done()
            status, result = await answer
            took = time.monotonic() - started
            head = int(anvil.rpc("eth_blockNumber"), 16)
            again_in = on_chain(anvil, tx_hash)
            undone = [
                r for r in caplog.records if r.name.endswith("follower") and "reorg: undid" in r.getMessage()
            ]
        assert (status, result["status"], result["transactionHash"]) == (200, "settled", tx_hash), result
        assert again_in is not None and head - again_in + 1 >= WINDOW, "settled only 40 blocks deep"
        assert [(r.ancestor, r.jobs) for r in undone] == [(mined_in - 1, 1)], "undone exactly once"  # type: ignore[attr-defined]
        assert await retirements_of(d, tx_hash) == 1
        assert halted(d) == 0.0
        print(
            f"\n200 ms blocks, reorg depth {depth}, window {WINDOW} blocks ({CONFIRMATION_S} s): "
            f"undone once, settled once {took:.1f} s after the reorg, {head - again_in + 1} blocks deep"
        )
