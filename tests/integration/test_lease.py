"""Leases that fence: a process whose lease session dropped cannot sign once another process
took the key, and two daemons on one key and one database never share a nonce."""

from __future__ import annotations

import asyncio
import time

import pytest

from relayer.app import open_runtime
from relayer.domain.errors import Rejection
from relayer.domain.states import JobState
from relayer.store.executor_lane import ExecutorLane, LeaseLost
from relayer.store.lease import ExecutorLease
from relayer.store.relay_jobs import NewJob
from tests.conftest import Daemon
from tests.helpers.relay import challenge, signed_request

pytestmark = pytest.mark.integration


async def _drop_session(daemon: Daemon, lease: ExecutorLease) -> None:
    """What a Postgres restart or a network cut does to the lease: its session is gone."""
    assert lease._conn is not None
    pid = lease._conn.get_server_pid()
    assert await daemon.runtime.db.fetchval("SELECT pg_terminate_backend($1)", pid)


async def _simulated_job_expiring_in(daemon: Daemon, chain_id: int, seconds: int) -> int:
    """A simulated job on ``chain_id`` (one no worker serves) whose authorization expires in
    ``seconds``."""
    salt = bytes([chain_id]) * 32
    new = NewJob(
        chain_id=chain_id, bound_nonce=b"fence" + salt, permit_key=None, salt=salt, scheme="eip3009",
        payer="0xpayer", input_token="0xusdc", auth_value=1, auth_expires_at=int(time.time()) + seconds,
        gas_allowance=0, request_hash=salt, settlement="0xsettlement", call_data=b"", summary={},
        quote_total=0,
    )  # fmt: skip
    job, _ = await daemon.runtime.jobs.reserve(new)
    assert await daemon.runtime.jobs.move(job.id, JobState.SIMULATED, gas_limit=100_000, max_fee_per_gas=1)
    return job.id


async def test_a_holder_whose_session_dropped_cannot_sign_after_a_takeover(daemon: Daemon) -> None:
    dsn = daemon.runtime.dsn
    first, second = ExecutorLease(dsn, 97, "0xexecutor"), ExecutorLease(dsn, 97, "0xexecutor")
    try:
        assert await first.try_acquire() and first.epoch is not None
        assert not await second.try_acquire()  # held
        stale_epoch = first.epoch
        await _drop_session(daemon, first)
        assert await second.try_acquire() and second.epoch == stale_epoch + 1
        assert not await first.alive()
        lane = ExecutorLane(daemon.runtime.db, 97)

        def must_not_sign(*_args: object) -> object:
            raise AssertionError("signed under a lease that moved on")

        expiring = await _simulated_job_expiring_in(daemon, 97, 10)
        with pytest.raises(LeaseLost):
            await lane.sign_simulated(
                "0xexecutor", stale_epoch, [1, expiring], must_not_sign, 20, Rejection("internal_error")
            )
        # the fence's refusal rolls back the whole signing transaction, its rejections too:
        # the new holder's lane rejects the expiring job, not the stale one
        job = await daemon.runtime.jobs.get(expiring)
        assert job is not None and job.state is JobState.SIMULATED
        assert not await lane.holds("0xexecutor", stale_epoch)
        assert await lane.holds("0xexecutor", second.epoch)
    finally:
        await first.release()
        await second.release()


@pytest.mark.timeout(120)
async def test_two_daemons_on_one_key_never_share_a_nonce_when_the_lease_moves(daemon: Daemon) -> None:
    executor = daemon.chain["executor"]["address"]
    async with open_runtime(daemon.runtime.settings, workers=True) as other:
        # The session daemon holds the key; the other stands by. Drop the holder's session.
        leases = [rt.lease for rt in (daemon.runtime, other) if rt.lease is not None]
        holder = next(lease for lease in leases if lease.epoch is not None)
        epoch = holder.epoch
        assert epoch is not None
        await _drop_session(daemon, holder)
        payers = daemon.chain["payers"]
        bodies = []
        for i in range(12):
            payer = payers[i % len(payers)]
            ch = await challenge(daemon, payer, carbonClass="RE", amount="0.01", inputToken="USDC")
            bodies.append(signed_request(ch, payer["privateKey"]))
        results = await asyncio.gather(*(daemon.post(b) for b in bodies))
        assert all((s, r.get("status")) == (200, "settled") for s, r in results), results
        taken = await daemon.runtime.db.fetchval(
            "SELECT epoch FROM executor_leases WHERE chain_id = $1 AND executor = $2", 84532, executor
        )
        assert taken > epoch  # the lease moved: someone took it again
    shared = await daemon.runtime.db.fetch(
        "SELECT nonce FROM relay_transactions WHERE executor = $1 "
        "GROUP BY nonce HAVING count(DISTINCT job_id) > 1",
        executor,
    )
    assert shared == []
    doubled = await daemon.runtime.db.fetch(
        "SELECT job_id FROM relay_transactions WHERE executor = $1 GROUP BY job_id HAVING count(*) > 1",
        executor,
    )
    assert doubled == []
