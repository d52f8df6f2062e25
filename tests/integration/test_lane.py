"""Fault tests of the executor lane, each on a daemon and anvil of its own, bounded in time:
a hole made by hand, a broadcast dropped from the pool, a transaction the node refuses for
its fee, the base fee raised under pending transactions, and a fee spike beyond the signed
allowance until the authorization expires. Counts and recovery times are printed (-s)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from relayer.domain import fees
from tests.conftest import Daemon
from tests.helpers.jobs import job_row, wait_for_job
from tests.helpers.relay import signed_retirement
from tests.private import private_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST_LANE = {"resend_after_s": 1.0, "replace_after_s": 1.0, "hole_after_s": 1.0}


async def _txs(d: Daemon, kind: str | None = None) -> list[Any]:
    return await d.runtime.db.fetch(
        "SELECT * FROM relay_transactions WHERE ($1::text IS NULL OR kind = $1) ORDER BY nonce, created_at",
        kind,
    )


async def _noop_cost_at_least(d: Daemon, wei: int, timeout_s: float = 5.0) -> float:
    """``relayer_executor_noop_cost_wei_total`` once it reaches ``wei`` (or its value at the
    bound): the follower adds a mined no-op's cost right after it records the receipt."""
    deadline = time.monotonic() + timeout_s
    while (cost := d.runtime.metrics.noop_cost_wei._value.get()) < wei and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return float(cost)


async def _until_replaced(d: Daemon, job_id: int, count: int, timeout_s: float = 15.0) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = await d.runtime.db.fetch(
            "SELECT * FROM relay_transactions WHERE job_id = $1 ORDER BY created_at", job_id
        )
        if len(rows) >= count:
            return rows
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} has {len(rows)} transactions, not {count}")


def _ceiling(d: Daemon, job: Any) -> int:
    """The highest max fee per gas the job's signed allowance covers (USDC)."""
    reserves = fees.PoolReserves(1, 1)
    eth_price = d.runtime.settings.eth_price_usdc
    return fees.max_fee_covered(int(job["gas_allowance"]), int(job["gas_limit"]), eth_price, True, reserves)


async def test_a_hole_in_the_lane_is_filled_and_the_job_behind_it_settles(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(tmp_path, admin_database_url, **FAST_LANE) as (d, _anvil):
        executor = d.chain["executor"]["address"]
        # A journaled nonce that no transaction holds: the next job signs one above it.
        bump = (
            "UPDATE executor_nonces SET next_nonce = next_nonce + 1 WHERE executor = $1 RETURNING next_nonce"
        )
        deadline = time.monotonic() + 10
        while await d.runtime.db.fetchval(bump, executor) is None:  # the lane is not reconciled yet
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        started = time.monotonic()
        status, result = await d.post(await signed_retirement(d, 0))
        recovery = time.monotonic() - started
        assert (status, result["status"]) == (200, "settled"), result
        noops = await _txs(d, "noop")
        assert len(noops) == 1 and noops[0]["job_id"] is None and noops[0]["mined_block"] is not None
        relays = await _txs(d, "relay")
        assert [r["nonce"] for r in relays] == [noops[0]["nonce"] + 1]
        print(f"\nhole: settled 1, no-ops 1, recovered in {recovery:.1f} s")


async def test_a_broadcast_dropped_from_the_pool_is_sent_again(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(tmp_path, admin_database_url, **FAST_LANE) as (d, anvil):
        anvil.automine(False)
        body = await signed_retirement(d, 0)
        answer = asyncio.create_task(d.post(body))
        job = await wait_for_job(d, body, {"submitted"})
        tx_hash = "0x" + bytes(job["tx_hash"]).hex()
        assert tx_hash in anvil.pool()
        anvil.rpc("anvil_dropTransaction", tx_hash)
        assert tx_hash not in anvil.pool()
        started = time.monotonic()
        while tx_hash not in anvil.pool():  # bounded by the test timeout
            await asyncio.sleep(0.05)
        resent_in = time.monotonic() - started
        anvil.mine()
        status, result = await answer
        assert (status, result["status"], result["transactionHash"]) == (200, "settled", tx_hash), result
        assert len(await _txs(d)) == 1  # the same bytes, not a second transaction
        print(f"\ndropped: settled 1, re-sent 1 (same bytes) after {resent_in:.1f} s")


async def test_a_transaction_refused_for_its_fee_is_replaced_within_its_allowance(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(tmp_path, admin_database_url, **FAST_LANE) as (d, anvil):
        anvil.automine(False)
        body = await signed_retirement(d, 0)
        answer = asyncio.create_task(d.post(body))
        job = await wait_for_job(d, body, {"submitted"})
        first = "0x" + bytes(job["tx_hash"]).hex()
        ceiling = _ceiling(d, job)
        base = (int(job["max_fee_per_gas"]) + ceiling) // 2
        assert int(job["max_fee_per_gas"]) < base < ceiling
        anvil.rpc("anvil_dropTransaction", first)
        anvil.mine(base_fee=base)  # now the node refuses its bytes: fee cap below the base fee
        anvil.rpc("anvil_setNextBlockBaseFeePerGas", hex(base))
        started = time.monotonic()
        rows = await _until_replaced(d, job["id"], 2)
        replaced_in = time.monotonic() - started
        replacement = rows[-1]
        assert replacement["nonce"] == rows[0]["nonce"] and rows[0]["replaced_by"] == replacement["tx_hash"]
        assert base <= int(replacement["max_fee_per_gas"]) <= ceiling
        assert int(replacement["max_fee_per_gas"]) >= fees.bumped(int(job["max_fee_per_gas"]))
        anvil.mine(base_fee=base)
        status, result = await answer
        assert (status, result["status"]) == (200, "settled"), result
        assert result["transactionHash"] == "0x" + bytes(replacement["tx_hash"]).hex()
        print(f"\nrefused: settled 1, replaced 1 after {replaced_in:.1f} s within the allowance")


async def test_raised_base_fee_replaces_pending_transactions_and_all_settle(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(tmp_path, admin_database_url, **FAST_LANE) as (d, anvil):
        anvil.automine(False)
        bodies = [await signed_retirement(d, i) for i in range(3)]
        answers = [asyncio.create_task(d.post(b)) for b in bodies]
        jobs = [await wait_for_job(d, b, {"submitted"}) for b in bodies]
        base = min((int(j["max_fee_per_gas"]) + _ceiling(d, j)) // 2 for j in jobs)
        assert all(int(j["max_fee_per_gas"]) < base for j in jobs)
        anvil.mine(base_fee=base)  # none fits any more
        anvil.rpc("anvil_setNextBlockBaseFeePerGas", hex(base))
        started = time.monotonic()
        for job in jobs:
            await _until_replaced(d, job["id"], 2)
        replaced_in = time.monotonic() - started
        anvil.mine(base_fee=base)
        results = await asyncio.gather(*answers)
        assert all((s, r["status"]) == (200, "settled") for s, r in results), results
        replaced = sum(1 for r in await _txs(d, "relay") if r["replaced_by"] is not None)
        assert replaced == 3 and await _txs(d, "noop") == []
        print(f"\nbase fee raised: settled 3, replaced 3 after {replaced_in:.1f} s, no-ops 0")


async def test_a_fee_spike_beyond_the_allowance_until_expiry_drops_the_job_and_fills_its_nonce(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(tmp_path, admin_database_url, **FAST_LANE) as (d, anvil):
        anvil.automine(False)
        body = await signed_retirement(d, 0)
        answer = asyncio.create_task(d.post(body))
        job = await wait_for_job(d, body, {"submitted"})
        spike = 10 * _ceiling(d, job)
        anvil.mine(base_fee=spike)
        anvil.rpc("anvil_setNextBlockBaseFeePerGas", hex(spike))
        # Then the authorization is about to expire: 31 s left, within the no-op's 30 s before
        # expiry in 1 s; as time passing would leave it (expiry is judged by the job's recorded
        # auth_expires_at against the daemon's clock, not by a block's timestamp).
        expiry = "UPDATE relay_jobs SET auth_expires_at = $2 WHERE id = $1"
        await d.runtime.db.execute(expiry, job["id"], int(time.time()) + 31)
        started = time.monotonic()
        deadline = time.monotonic() + 30
        while not await _txs(d, "noop") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        [noop] = await _txs(d, "noop")
        filled_in = time.monotonic() - started
        assert noop["job_id"] == job["id"] and noop["nonce"] == job["executor_nonce"]
        assert int(noop["max_fee_per_gas"]) >= spike  # the executor pays the market for it
        anvil.mine(base_fee=spike)
        status, result = await answer
        assert (status, result["error"], result["reason"]) == (
            503,
            "gas_estimate_unavailable",
            "fees_above_allowance",
        )
        assert (await job_row(d, body))["state"] == "dropped"
        # The follower counts the no-op's cost just after it commits the drop (the same step,
        # after that statement returns): the row can be read first, so wait for the count.
        cost = await _noop_cost_at_least(d, 21_000 * spike)
        assert cost >= 21_000 * spike
        # Fees come back down: a later job is unaffected.
        anvil.automine(True)
        anvil.rpc("anvil_setNextBlockBaseFeePerGas", hex(1_000))
        status, later = await d.post(await signed_retirement(d, 1))
        assert (status, later["status"]) == (200, "settled"), later
        print(f"\nfee spike: dropped 1, no-ops 1 after {filled_in:.1f} s costing {cost} wei, later settled 1")
