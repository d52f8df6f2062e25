"""Reorgs of depth 1-3 (``anvil_reorg``), after indexing and before the confirmation depth,
each on a daemon and anvil of its own. Within the confirmation window (the confirmation
depth), the follower undoes what the lost blocks held, exactly once: nothing is reported
settled that the chain does not hold at the depth, the same bytes are re-sent, and every
retirement ends settled exactly once. Deeper than the window (depth 2 and 3 with 1
confirmation), it halts instead (issue 18): nothing settled is rewound, no retirement
deleted, nothing sent, one log line and the ``relayer_deep_reorg`` gauge say why."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from tests.conftest import Daemon
from tests.helpers.jobs import job_row, wait_for_job
from tests.helpers.relay import signed_retirement
from tests.helpers.reorgs import halted, on_chain, retirements_of
from tests.private import private_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.mark.parametrize("depth", [1, 2, 3])
async def test_a_reorg_after_indexing_within_the_window_undoes_the_settlement_until_the_chain_holds_it_again(
    tmp_path: Path, admin_database_url: str, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    # The window is the confirmation depth: with `depth` confirmations, a reorg of `depth`
    # blocks just takes the settled job's block, and is followed (undone exactly once).
    async with private_daemon(tmp_path, admin_database_url, resend_after_s=1.0, confirmations=depth) as (
        d,
        anvil,
    ):
        body = await signed_retirement(d, 0)
        answer = asyncio.create_task(d.post(body))
        await wait_for_job(d, body, {"mined", "confirmed", "indexed"})
        for _ in range(depth - 1):
            anvil.mine()  # bury it to the depth: settled
        status, first = await answer
        assert (status, first["status"]) == (200, "settled"), first
        tx_hash = first["transactionHash"]
        mined_in = on_chain(anvil, tx_hash)
        assert mined_in is not None and await retirements_of(d, tx_hash) == 1
        anvil.automine(False)  # hold the re-sent transaction so the gap can be observed
        with caplog.at_level(logging.INFO):
            anvil.rpc("anvil_reorg", depth, [])
            started = time.monotonic()
            assert on_chain(anvil, tx_hash) is None
            job = await wait_for_job(d, body, {"submitted"})
            undone_in = time.monotonic() - started
            assert job["block_number"] is None
            # While the chain does not hold it, nothing says settled.
            assert await retirements_of(d, tx_hash) == 0
            status, cert = await d.get("/api/certificate", txHash=tx_hash)
            assert (status, cert["error"]) == (404, "retirement_not_found")
            while tx_hash not in anvil.pool():  # the same bytes, re-sent
                await asyncio.sleep(0.05)
            anvil.automine(True)
            for _ in range(depth):
                anvil.mine()  # the re-sent transaction, then blocks over it to the depth
            status, again = await d.post(body)
            undone = [
                r for r in caplog.records if r.name.endswith("follower") and "reorg: undid" in r.getMessage()
            ]
            reorged = [
                (r.job_id, r.tx_hash, r.request_id)  # type: ignore[attr-defined]
                for r in caplog.records
                if r.getMessage() == "reorged"
            ]
        assert (status, again["status"], again["transactionHash"]) == (200, "settled", tx_hash), again
        assert job["request_id"] is not None  # the one line about the job names its request
        assert reorged == [(job["id"], tx_hash, job["request_id"])], reorged
        assert on_chain(anvil, tx_hash) is not None
        assert await retirements_of(d, tx_hash) == 1
        assert [(r.ancestor, r.jobs) for r in undone] == [(mined_in - 1, 1)], "undone exactly once"  # type: ignore[attr-defined]
        assert halted(d) == 0.0
        print(
            f"\nreorg depth {depth} after indexing, window {depth}: "
            f"undone once in {undone_in:.1f} s, settled once"
        )


@pytest.mark.parametrize("depth", [1, 2, 3])
async def test_a_reorg_below_the_confirmation_depth_is_followed_and_settles(
    tmp_path: Path, admin_database_url: str, depth: int
) -> None:
    confirmations = depth + 2  # the reorg lands while the job is mined but not yet deep enough
    async with private_daemon(
        tmp_path, admin_database_url, resend_after_s=1.0, confirmations=confirmations
    ) as (d, anvil):
        body = await signed_retirement(d, 0)
        answer = asyncio.create_task(d.post(body))
        job = await wait_for_job(d, body, {"mined"})
        tx_hash = "0x" + bytes(job["tx_hash"]).hex()
        for _ in range(depth - 1):
            anvil.mine()  # bury it, still below the depth
        await asyncio.sleep(0.3)
        assert (await job_row(d, body))["state"] == "mined"  # not deep enough: not settled
        anvil.rpc("anvil_reorg", depth, [])  # the block with it is gone
        started = time.monotonic()
        await wait_for_job(d, body, {"submitted", "mined"})
        while on_chain(anvil, tx_hash) is None:  # re-sent, and mined again by automine
            await asyncio.sleep(0.05)
        assert not answer.done()  # nothing answered while the chain did not hold it deep enough
        for _ in range(confirmations - 1):
            anvil.mine()  # blocks over it up to the depth
        status, result = await answer
        took = time.monotonic() - started
        assert (status, result["status"], result["transactionHash"]) == (200, "settled", tx_hash), result
        assert await retirements_of(d, tx_hash) == 1
        assert d.runtime.metrics.reorgs.labels(str(d.runtime.settings.chain_id))._value.get() >= 1
        print(
            f"\nreorg depth {depth} below the depth ({confirmations}): followed, settled once in {took:.1f} s"
        )


async def _until_indexed(d: Daemon, number: int, timeout_s: float = 10.0) -> None:
    """Until the follower and the catalogue indexer have indexed through block ``number``
    (seen it as their head, with confirmations 1): a reorg then is judged from that head by
    both, not from an older one the slower worker last saw."""
    deadline = time.monotonic() + timeout_s
    catalogue = d.runtime.metrics.catalogue_block.labels(str(d.runtime.settings.chain_id))
    while (
        d.runtime.metrics.indexed_block.labels(str(d.runtime.settings.chain_id))._value.get() < number
        or catalogue._value.get() < number
    ):
        assert time.monotonic() < deadline, "the follower or the catalogue indexer did not index the head"
        await asyncio.sleep(0.02)


def _sends(d: Daemon) -> int:
    """Transactions the lanes broadcast so far (first sends, re-sends, replacements, no-ops)."""
    return int(
        sum(
            s.value
            for m in d.runtime.metrics.broadcasts.collect()
            for s in m.samples
            if s.name.endswith("_total")
        )
    )


@pytest.mark.parametrize("depth", [2, 3])
async def test_a_reorg_deeper_than_the_window_after_indexing_halts_the_follower_and_the_lanes(
    tmp_path: Path, admin_database_url: str, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    async with private_daemon(tmp_path, admin_database_url, resend_after_s=1.0, confirmations=1) as (
        d,
        anvil,
    ):
        body = await signed_retirement(d, 0)
        status, first = await d.post(body)
        assert (status, first["status"]) == (200, "settled"), first
        tx_hash = first["transactionHash"]
        mined_in = on_chain(anvil, tx_hash)
        assert mined_in is not None and await retirements_of(d, tx_hash) == 1
        for _ in range(depth - 1):
            anvil.mine()  # bury it: the reorg takes `depth` blocks, the transaction's included
        await _until_indexed(d, mined_in + depth - 1)  # the follower saw the old chain's head
        sends = _sends(d)
        with caplog.at_level(logging.INFO):
            anvil.rpc("anvil_reorg", depth, [])  # deeper than the window of 1 block
            assert on_chain(anvil, tx_hash) is None
            deadline = time.monotonic() + 10
            while halted(d) != 1.0:
                assert time.monotonic() < deadline, "the follower did not halt"
                await asyncio.sleep(0.05)
            await asyncio.sleep(3.0)  # a few resend periods: still nothing sent
            undone = [r for r in caplog.records if "reorg: undid" in r.getMessage()]
            halts = [r for r in caplog.records if r.getMessage().startswith("deep reorg: the follower halts")]
            job = await job_row(d, body)
            print(
                f"\nreorg depth {depth} after indexing, window 1: judged "
                f"{[getattr(r, 'reason', '') for r in halts]}, reorgs undone {len(undone)}, "
                f"jobs rewound {sum(int(getattr(r, 'jobs', 0)) for r in undone)}, job {job['state']}, "
                f"retirements {await retirements_of(d, tx_hash)}, sends {_sends(d) - sends}"
            )
            assert undone == [], "nothing settled is rewound"
            assert len(halts) == 1, [r.getMessage() for r in halts]
            assert f"a reorg of {depth} blocks" in halts[0].reason
            assert job["state"] == "indexed" and await retirements_of(d, tx_hash) == 1
            status, again = await d.post(body)
            assert (status, again["status"], again["transactionHash"]) == (200, "settled", tx_hash), again
            assert d.runtime.metrics.reorgs.labels(str(d.runtime.settings.chain_id))._value.get() == 0
            assert _sends(d) == sends, "the lanes halt: nothing is re-sent"
            assert tx_hash not in anvil.pool()
            assert halted(d) == 1.0
