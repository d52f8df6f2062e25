"""Issue 20, half the work per retirement: the chain follower reads the receipts of a block
that lists transactions of ours with one ``eth_getBlockReceipts`` by the block's hash (the
blocks of one step in one JSON-RPC batch), never one ``eth_getTransactionReceipt`` each; a
node that refuses that method gets the per-transaction reads (remembered), and a node that
fails it otherwise gets it again next step. Counted through a JSON-RPC proxy in front of a
private anvil."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Daemon
from tests.helpers.daemons import behind_proxy
from tests.helpers.jobs import job_row, wait_for_job
from tests.helpers.relay import signed_retirement
from tests.private import Anvil
from tests.processes import RpcProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RECORDED = {"mined", "confirmed", "indexed"}


async def _pooled(anvil: Anvil, count: int, timeout_s: float = 20.0) -> set[str]:
    """The hashes in anvil's pool once it holds ``count`` transactions (bounded wait)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pool = await asyncio.to_thread(anvil.pool)
        if len(pool) >= count:
            return pool
        await asyncio.sleep(0.05)
    raise AssertionError(f"the pool holds {len(pool)} transactions, not {count}")


def _block(anvil: Anvil, tag: str = "latest") -> dict[str, Any]:
    block = anvil.rpc("eth_getBlockByNumber", tag, False)
    assert isinstance(block, dict)
    return block


def _receipt_calls(proxy: RpcProxy) -> list[tuple[str, str]]:
    return [(m, p) for m, p in proxy.calls if m in ("eth_getBlockReceipts", "eth_getTransactionReceipt")]


async def _settle(d: Daemon, anvil: Anvil, answers: list[asyncio.Task[Any]]) -> None:
    """Mine until every answer came, each ``settled``."""
    anvil.automine(True)
    anvil.mine()
    for answer in answers:
        status, result = await answer
        assert (status, result.get("status")) == (200, "settled"), result


async def test_our_transactions_in_a_block_cost_one_block_receipts_call_by_its_hash_and_no_receipt_each(
    tmp_path: Path, admin_database_url: str
) -> None:
    """K of ours mined in one block: the follower records them all after one
    ``eth_getBlockReceipts`` of that block's hash and no ``eth_getTransactionReceipt``; ours
    mined in two blocks that one step sees: both blocks' receipts in one request (a batch)."""
    async with behind_proxy(tmp_path, admin_database_url, workers=True) as (_info, proxy, d):
        anvil = Anvil(d.chain["rpcUrl"])
        bodies = [await signed_retirement(d, i % 3) for i in range(4)]
        anvil.automine(False)
        answers = [asyncio.create_task(d.post(b)) for b in bodies]
        ours = await _pooled(anvil, 4)
        proxy.calls.clear()
        anvil.mine()
        block = _block(anvil)
        assert ours <= set(block["transactions"])
        for body in bodies:
            await wait_for_job(d, body, RECORDED)
        await asyncio.sleep(0.5)  # a few more steps: none reads those receipts again
        one_block = _receipt_calls(proxy)

        # Two blocks of ours, one step: a block's gas holds two of them (anvil leaves the rest
        # in the pool for the next); the follower's block reads wait while both are mined.
        more = [await signed_retirement(d, i % 3) for i in range(4)]
        answers += [asyncio.create_task(d.post(b)) for b in more]
        pooled = await _pooled(anvil, 4)
        used = int(block["gasUsed"], 16) // 4  # a retirement's gas (the first block held only ours)
        limit = max(int(anvil.rpc("eth_getTransactionByHash", h)["gas"], 16) for h in pooled)
        # two fit, a third does not: by gas used (2 x used) or by the gas left for its limit
        anvil.rpc("evm_setBlockGasLimit", hex(2 * used + limit // 2))
        proxy.hold("eth_getBlockByNumber")
        await asyncio.sleep(0.3)  # a step under way ends (no new block): the next one waits
        proxy.calls.clear()
        proxy.requests.clear()
        anvil.rpc("anvil_mine", "0x2")
        proxy.release()
        second, third = _block(anvil, hex(int(block["number"], 16) + 1)), _block(anvil)
        for body in more:
            await wait_for_job(d, body, RECORDED)
        two_blocks = [r for r in proxy.requests if "eth_getBlockReceipts" in r]
        anvil.rpc("evm_setBlockGasLimit", hex(30_000_000))
        await _settle(d, anvil, answers)
        two_calls = _receipt_calls(proxy)
    assert one_block == [("eth_getBlockReceipts", json.dumps([block["hash"]]))], one_block
    assert [len(set(b["transactions"]) & pooled) for b in (second, third)] == [2, 2]
    assert two_blocks == [["eth_getBlockReceipts", "eth_getBlockReceipts"]], two_blocks
    assert sorted(two_calls) == sorted(
        ("eth_getBlockReceipts", json.dumps([b["hash"]])) for b in (second, third)
    ), two_calls


@pytest.mark.parametrize(
    "refusal",
    [
        {"code": -32601, "message": "the method eth_getBlockReceipts does not exist/is not available"},
        {"code": -32600, "message": "Unsupported method: eth_getBlockReceipts"},  # Alchemy's way
        {"code": -32602, "message": "Invalid params"},  # a node that takes block numbers only
    ],
    ids=["method-not-found", "invalid-request", "invalid-params"],
)
async def test_a_node_that_refuses_block_receipts_gets_one_receipt_call_each_from_then_on(
    tmp_path: Path, admin_database_url: str, refusal: dict[str, Any]
) -> None:
    """The node refuses ``eth_getBlockReceipts``: the follower reads the receipts of ours one
    ``eth_getTransactionReceipt`` each (one batch), records them, and never asks the refused
    method again in this process."""
    async with behind_proxy(tmp_path, admin_database_url, workers=True) as (_info, proxy, d):
        anvil = Anvil(d.chain["rpcUrl"])
        proxy.refused["eth_getBlockReceipts"] = refusal
        bodies = [await signed_retirement(d, i) for i in range(3)]
        anvil.automine(False)
        answers = [asyncio.create_task(d.post(b)) for b in bodies[:2]]
        await _pooled(anvil, 2)
        proxy.calls.clear()
        anvil.mine()
        for body in bodies[:2]:
            await wait_for_job(d, body, RECORDED)
        answers.append(asyncio.create_task(d.post(bodies[2])))
        await _pooled(anvil, 1)
        anvil.mine()
        await wait_for_job(d, bodies[2], RECORDED)
        await _settle(d, anvil, answers)
        calls = [m for m, _ in _receipt_calls(proxy)]
    assert calls == ["eth_getBlockReceipts"] + ["eth_getTransactionReceipt"] * 3, calls


async def test_a_node_failing_block_receipts_otherwise_is_asked_again_and_nothing_is_recorded_meanwhile(
    tmp_path: Path, admin_database_url: str
) -> None:
    """An error that is not a refusal of the method (the node lags: "header not found") is the
    node's failure: nothing is recorded, no receipt is read one by one, and once the node
    answers, the block's receipts record ours."""
    async with behind_proxy(tmp_path, admin_database_url, workers=True) as (_info, proxy, d):
        anvil = Anvil(d.chain["rpcUrl"])
        proxy.refused["eth_getBlockReceipts"] = {"code": -32000, "message": "header not found"}
        body = await signed_retirement(d, 0)
        anvil.automine(False)
        answer = asyncio.create_task(d.post(body))
        await _pooled(anvil, 1)
        proxy.calls.clear()
        anvil.mine()
        await asyncio.sleep(1.0)
        while_failing = [m for m, _ in _receipt_calls(proxy)]
        state = (await job_row(d, body))["state"]
        del proxy.refused["eth_getBlockReceipts"]
        await wait_for_job(d, body, RECORDED)
        await _settle(d, anvil, [answer])
        calls = [m for m, _ in _receipt_calls(proxy)]
    assert state == "submitted"
    assert len(while_failing) >= 2 and set(while_failing) == {"eth_getBlockReceipts"}, while_failing
    assert set(calls) == {"eth_getBlockReceipts"}, calls
