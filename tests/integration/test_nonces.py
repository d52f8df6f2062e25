"""Every executor nonce accounted for (issue 18), each on a daemon and anvil of its own: a
transaction the relay did not sign (the executor key used by hand) takes a nonce the lane
journaled for a job, without a reorg and after one; and a journaled transaction older than a
day. The job is signed again at a new nonce and settles while its authorization lives, or
ends with its reason; it never stays ``submitted``. Counts and times are printed (-s)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Daemon
from tests.helpers.jobs import job_row, wait_for_job
from tests.helpers.relay import signed_retirement
from tests.private import Anvil, private_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

# The relay's own bytes are not re-sent within a test (the foreign transaction gets there first).
HELD = {"resend_after_s": 120.0, "replace_after_s": 120.0}
BACKDATE = "UPDATE relay_transactions SET created_at = now() - interval '2 days' WHERE job_id = $1"


def _by_hand(d: Daemon, anvil: Anvil, nonce: int) -> str:
    """Sign a zero-value self-transfer with the executor key at ``nonce`` (as an operator would
    by hand, outside the relay) and return its raw bytes (0x hex)."""
    signer = d.runtime.signers[0]
    base = int(anvil.rpc("eth_getBlockByNumber", "latest", False)["baseFeePerGas"], 16)
    raw, _hash = signer.sign(
        to=signer.address, data=b"", nonce=nonce, gas=21_000,
        max_fee_per_gas=4 * base + 10**9, max_priority_fee_per_gas=10**9,
    )  # fmt: skip
    return "0x" + raw.hex()


def _foreign_uses(d: Daemon) -> float:
    value: float = d.runtime.metrics.foreign_nonces._value.get()
    return value


async def _expire_in(d: Daemon, job: Any, seconds: int) -> int:
    """Leave the job's authorization ``seconds`` to live, as time passing would: the daemon
    judges expiry by the job's recorded ``auth_expires_at`` against its own clock (wall time,
    and the database's ``now()``), never by a block's timestamp. Returns the new expiry."""
    expires = int(time.time()) + seconds
    query = "UPDATE relay_jobs SET auth_expires_at = $2 WHERE id = $1"
    await d.runtime.db.execute(query, job["id"], expires)
    return expires


async def _stuck(d: Daemon) -> int:
    """Jobs still waiting for a transaction (signed or submitted)."""
    count: int = await d.runtime.db.fetchval(
        "SELECT count(*) FROM relay_jobs WHERE state IN ('signed', 'submitted')"
    )
    return count


async def _take_its_nonce(d: Daemon, anvil: Anvil, body: dict[str, Any]) -> Any:
    """Hold the job's transaction out of the pool and mine one signed by hand at its nonce."""
    job = await wait_for_job(d, body, {"submitted"})
    anvil.rpc("anvil_dropTransaction", "0x" + bytes(job["tx_hash"]).hex())
    anvil.rpc("eth_sendRawTransaction", _by_hand(d, anvil, int(job["executor_nonce"])))
    anvil.mine()
    return job


async def test_a_foreign_transaction_at_a_journaled_nonce_gets_the_job_signed_again(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(tmp_path, admin_database_url, **HELD) as (d, anvil):
        anvil.automine(False)
        body = await signed_retirement(d, 0)
        answer = asyncio.create_task(d.post(body))
        first = await _take_its_nonce(d, anvil, body)
        started = time.monotonic()
        again = await wait_for_job(d, body, {"signed", "submitted"}, timeout_s=25)
        while bytes(again["tx_hash"]) == bytes(first["tx_hash"]):
            assert time.monotonic() - started < 25, f"stuck in {again['state']} at {first['executor_nonce']}"
            await asyncio.sleep(0.05)
            again = await job_row(d, body)
        resigned_in = time.monotonic() - started
        assert int(again["executor_nonce"]) == int(first["executor_nonce"]) + 1
        anvil.automine(True)
        anvil.mine()
        status, result = await answer
        assert (status, result["status"]) == (200, "settled"), result
        assert result["transactionHash"] == "0x" + bytes(again["tx_hash"]).hex()
        assert _foreign_uses(d) == 1 and await _stuck(d) == 0
        print(f"\nforeign nonce: signed again in {resigned_in:.1f} s, settled 1, stuck 0, foreign uses 1")


async def test_a_foreign_transaction_at_the_nonce_of_an_expiring_authorization_ends_the_job(
    tmp_path: Path, admin_database_url: str
) -> None:
    # One with less than the signing margin (20 s) left is not signed again (its no-op is not
    # due yet: 1 s before expiry).
    overrides = {**HELD, "noop_before_expiry_s": 1.0}
    async with private_daemon(tmp_path, admin_database_url, **overrides) as (d, anvil):
        anvil.automine(False)
        body = await signed_retirement(d, 0)
        answer = asyncio.create_task(d.post(body))
        job = await wait_for_job(d, body, {"submitted"})
        await _expire_in(d, job, 19)  # within the margin now
        await _take_its_nonce(d, anvil, body)
        started = time.monotonic()
        status, result = await answer
        ended_in = time.monotonic() - started
        ended = (status, result.get("error"), result.get("reason"))
        assert ended == (400, "invalid_auth_payload", "nonce_taken"), (status, result)
        assert (await job_row(d, body))["state"] == "dropped"
        assert _foreign_uses(d) == 1 and await _stuck(d) == 0
        print(f"\nforeign nonce, authorization expiring: dropped 1 in {ended_in:.1f} s, stuck 0")


async def test_after_a_reorg_a_foreign_transaction_at_a_reverted_relays_nonce_gets_it_signed_again(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(tmp_path, admin_database_url, resend_after_s=1.0) as (d, anvil):
        body = await signed_retirement(d, 0)
        status, first = await d.post(body)
        assert (status, first["status"]) == (200, "settled"), first
        job = await job_row(d, body)
        anvil.automine(False)
        # The new fork holds a transaction signed by hand at the relay's nonce instead.
        anvil.rpc("anvil_reorg", 1, [[_by_hand(d, anvil, int(job["executor_nonce"])), 0]])
        started = time.monotonic()
        deadline = started + 25
        while (await job_row(d, body))["executor_nonce"] == job["executor_nonce"]:
            state = (await job_row(d, body))["state"]
            assert time.monotonic() < deadline, f"stuck in {state} at nonce {job['executor_nonce']}"
            await asyncio.sleep(0.05)
        resigned_in = time.monotonic() - started
        anvil.automine(True)
        anvil.mine()
        status, again = await d.post(body)
        assert (status, again["status"]) == (200, "settled"), again
        assert again["transactionHash"] != first["transactionHash"]
        assert _foreign_uses(d) == 1 and await _stuck(d) == 0
        print(f"\nreorg, foreign nonce: signed again in {resigned_in:.1f} s, settled once, stuck 0")


async def test_a_journaled_transaction_older_than_a_day_is_still_sent_again(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(tmp_path, admin_database_url, resend_after_s=1.0) as (d, anvil):
        anvil.automine(False)
        body = await signed_retirement(d, 0)
        answer = asyncio.create_task(d.post(body))
        job = await wait_for_job(d, body, {"submitted"})
        tx_hash = "0x" + bytes(job["tx_hash"]).hex()
        await d.runtime.db.execute(BACKDATE, job["id"])
        anvil.rpc("anvil_dropTransaction", tx_hash)
        started = time.monotonic()
        while tx_hash not in anvil.pool():
            assert time.monotonic() - started < 20, "a transaction older than a day is never sent again"
            await asyncio.sleep(0.05)
        resent_in = time.monotonic() - started
        anvil.mine()
        status, result = await answer
        assert (status, result["status"], result["transactionHash"]) == (200, "settled", tx_hash), result
        assert await _stuck(d) == 0
        print(f"\nolder than a day: re-sent in {resent_in:.1f} s, settled 1, stuck 0")


async def test_a_job_past_its_authorization_never_stays_submitted_whatever_its_age(
    tmp_path: Path, admin_database_url: str
) -> None:
    overrides = {"noop_before_expiry_s": 22.0, "resend_after_s": 1.0}
    async with private_daemon(tmp_path, admin_database_url, **overrides) as (d, anvil):
        anvil.automine(False)
        body = await signed_retirement(d, 0)
        answer = asyncio.create_task(d.post(body))
        job = await wait_for_job(d, body, {"submitted"})
        await d.runtime.db.execute(BACKDATE, job["id"])
        anvil.rpc("anvil_dropTransaction", "0x" + bytes(job["tx_hash"]).hex())
        expires = await _expire_in(d, job, 24)  # its no-op is due in 2 s (22 s before expiry)
        deadline = expires + 5
        noop = None
        while noop is None:
            assert time.time() < deadline, "the job stays submitted past its authorization's expiry"
            noop = await d.runtime.db.fetchrow(
                "SELECT * FROM relay_transactions WHERE job_id = $1 AND kind = 'noop'", job["id"]
            )
            await asyncio.sleep(0.1)
        anvil.mine()
        status, result = await answer
        assert (status, result["error"]) == (503, "gas_estimate_unavailable"), result
        assert (await job_row(d, body))["state"] == "dropped"
        assert await _stuck(d) == 0
        before = expires - time.time()
        print(f"\npast its authorization, older than a day: dropped 1, {before:.0f} s before expiry, stuck 0")
