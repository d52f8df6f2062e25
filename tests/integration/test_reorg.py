"""Reorgs of depth 1-3 (``anvil_reorg``), after indexing and before the confirmation depth,
each on a daemon and anvil of its own: the follower undoes what the lost blocks held, nothing
is reported settled that the chain does not hold at the depth, the same bytes are re-sent,
and every retirement ends settled exactly once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.conftest import Daemon
from tests.integration.test_lane import _job, _signed, _until
from tests.private import Anvil, private_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _on_chain(anvil: Anvil, tx_hash: str) -> int | None:
    """The block number holding ``tx_hash`` on the chain as it is now, if any."""
    receipt = anvil.rpc("eth_getTransactionReceipt", tx_hash)
    if receipt is None:
        return None
    block = anvil.rpc("eth_getBlockByNumber", receipt["blockNumber"], False)
    assert block["hash"] == receipt["blockHash"]
    return int(receipt["blockNumber"], 16)


async def _retirements(d: Daemon, tx_hash: str) -> int:
    count: int = await d.runtime.db.fetchval(
        "SELECT count(*) FROM retirements WHERE tx_hash = $1", bytes.fromhex(tx_hash[2:])
    )
    return count


@pytest.mark.parametrize("depth", [1, 2, 3])
async def test_a_reorg_after_indexing_undoes_the_settlement_until_the_chain_holds_it_again(
    tmp_path: Path, admin_database_url: str, depth: int
) -> None:
    async with private_daemon(tmp_path, admin_database_url, resend_after_s=1.0) as (d, anvil):
        body = await _signed(d, 0)
        status, first = await d.post(body)
        assert (status, first["status"]) == (200, "settled"), first
        tx_hash = first["transactionHash"]
        mined_in = _on_chain(anvil, tx_hash)
        assert mined_in is not None and await _retirements(d, tx_hash) == 1
        for _ in range(depth - 1):
            anvil.mine()  # bury it: the reorg takes `depth` blocks, the transaction's included
        anvil.automine(False)  # hold the re-sent transaction so the gap can be observed
        anvil.rpc("anvil_reorg", depth, [])
        started = time.monotonic()
        assert _on_chain(anvil, tx_hash) is None
        job = await _until(d, body, {"submitted"})
        undone_in = time.monotonic() - started
        assert job["block_number"] is None
        # While the chain does not hold it, nothing says settled.
        assert await _retirements(d, tx_hash) == 0
        status, cert = await d.get("/api/certificate", txHash=tx_hash)
        assert (status, cert["error"]) == (404, "retirement_not_found")
        while tx_hash not in anvil.pool():  # the same bytes, re-sent
            await asyncio.sleep(0.05)
        anvil.automine(True)
        anvil.mine()
        status, again = await d.post(body)
        assert (status, again["status"], again["transactionHash"]) == (200, "settled", tx_hash), again
        assert _on_chain(anvil, tx_hash) is not None
        assert await _retirements(d, tx_hash) == 1
        assert d.runtime.metrics.reorgs._value.get() >= 1
        print(f"\nreorg depth {depth} after indexing: undone in {undone_in:.1f} s, re-sent 1, settled once")


@pytest.mark.parametrize("depth", [1, 2, 3])
async def test_a_reorg_below_the_confirmation_depth_is_followed_and_settles(
    tmp_path: Path, admin_database_url: str, depth: int
) -> None:
    confirmations = depth + 2  # the reorg lands while the job is mined but not yet deep enough
    async with private_daemon(
        tmp_path, admin_database_url, resend_after_s=1.0, confirmations=confirmations
    ) as (d, anvil):
        body = await _signed(d, 0)
        answer = asyncio.create_task(d.post(body))
        job = await _until(d, body, {"mined"})
        tx_hash = "0x" + bytes(job["tx_hash"]).hex()
        for _ in range(depth - 1):
            anvil.mine()  # bury it, still below the depth
        await asyncio.sleep(0.3)
        assert (await _job(d, body))["state"] == "mined"  # not deep enough: not settled
        anvil.rpc("anvil_reorg", depth, [])  # the block with it is gone
        started = time.monotonic()
        await _until(d, body, {"submitted", "mined"})
        while _on_chain(anvil, tx_hash) is None:  # re-sent, and mined again by automine
            await asyncio.sleep(0.05)
        assert not answer.done()  # nothing answered while the chain did not hold it deep enough
        for _ in range(confirmations - 1):
            anvil.mine()  # blocks over it up to the depth
        status, result = await answer
        took = time.monotonic() - started
        assert (status, result["status"], result["transactionHash"]) == (200, "settled", tx_hash), result
        assert await _retirements(d, tx_hash) == 1
        assert d.runtime.metrics.reorgs._value.get() >= 1
        print(
            f"\nreorg depth {depth} below the depth ({confirmations}): followed, settled once in {took:.1f} s"
        )
