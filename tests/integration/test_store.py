"""The store against a real Postgres: notifications come from the trigger on every new job
and every change of state, and errors are stored as records without HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from relayer.domain.errors import Rejection, RelayerError
from relayer.domain.states import JobState
from relayer.logs import request_scope
from relayer.store.pool import Database, StoreUnavailable
from relayer.store.relay_jobs import NewJob
from tests.conftest import Daemon
from tests.helpers.jobs import new_job

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def _logged(database_url: str) -> AsyncIterator[tuple[Database, list[str]]]:
    """A pool of one connection to ``database_url`` and the statements sent on it."""
    db = await Database.connect(database_url, min_size=1, max_size=1)
    statements: list[str] = []
    try:
        async with db.connection() as conn:
            conn.add_query_logger(lambda record: statements.append(record.query))
        yield db, statements
    finally:
        await db.close()


async def _changed(notifications: Any, job_id: int, timeout_s: float) -> None:
    """Return when ``job_id`` changes or after ``timeout_s`` seconds."""
    with notifications.watch(job_id) as event, contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)


def _job(salt: bytes) -> NewJob:
    """A job on chain 98 (a chain no worker serves, so only this test moves these jobs)."""
    return new_job(salt, tag=b"notify")


async def test_every_state_change_wakes_the_waiters_of_its_job(daemon: Daemon) -> None:
    jobs, notifications = daemon.runtime.jobs, daemon.runtime.notifications
    job, _ = await jobs.reserve(_job(b"\x05" * 32))
    for target, fields in (
        (JobState.SIMULATED, {"gas_limit": 100_000, "max_fee_per_gas": 7}),
        (JobState.REJECTED, {"error": Rejection("gas_limit_exceeds_cap", gasCap=1)}),
    ):
        # Waiting far longer than the test allows: only a NOTIFY can end it in time.
        waiter = asyncio.create_task(_changed(notifications, job.id, 60))
        await asyncio.sleep(0.05)
        moved = await jobs.move(job.id, target, **fields)  # type: ignore[arg-type]
        assert moved is not None and moved.state is target
        await asyncio.wait_for(waiter, 10)
    assert moved.gas_limit == 100_000 and moved.max_fee_per_gas == 7  # kept across moves
    assert moved.timestamps["simulated_at"] is not None and moved.timestamps["signed_at"] is None


async def test_the_broadcasters_wake_for_a_job_simulated_not_for_every_step(daemon: Daemon) -> None:
    """A broadcaster step costs database round trips: it is woken by a job that became
    simulated (through Postgres, so a ``work`` process sees what a ``serve`` process did),
    not by the other steps of the jobs (rejected, mined, confirmed, indexed, ...)."""
    jobs, notifications = daemon.runtime.jobs, daemon.runtime.notifications
    first, _ = await jobs.reserve(_job(b"\x0d" * 32))
    second, _ = await jobs.reserve(_job(b"\x0e" * 32))
    new_work, other = notifications.new_work(), notifications.new_work()  # two broadcasters'
    await asyncio.sleep(0.3)  # the reservations' notifications (accepted) are in
    new_work.clear()
    other.clear()
    await jobs.move(first.id, JobState.REJECTED, error=Rejection("gas_limit_exceeds_cap", gasCap=1))
    await asyncio.sleep(0.5)
    assert not new_work.is_set(), "a rejection woke the broadcasters"
    await jobs.move(second.id, JobState.SIMULATED, gas_limit=100_000, max_fee_per_gas=7)
    await asyncio.wait_for(new_work.wait(), 10)
    new_work.clear()  # one broadcaster took the wake-up: the other still has its own
    assert other.is_set()


async def test_a_rejection_is_stored_as_a_record_without_http(daemon: Daemon) -> None:
    jobs = daemon.runtime.jobs
    job, _ = await jobs.reserve(_job(b"\x06" * 32))
    await jobs.move(job.id, JobState.REJECTED, error=Rejection("gas_limit_exceeds_cap", gasCap=1))
    stored = json.loads(
        await daemon.runtime.db.fetchval("SELECT error FROM relay_jobs WHERE id = $1", job.id)
    )
    assert stored == {
        "code": "gas_limit_exceeds_cap",
        "message": Rejection("gas_limit_exceeds_cap").message,
        "context": {"gasCap": 1},
    }
    assert await jobs.move(job.id, JobState.SIGNED) is None  # rejected -> signed is not allowed


async def test_a_job_keeps_the_id_of_the_request_that_made_it(daemon: Daemon) -> None:
    """Made while a request is served, a job stores its id (workers in any process log it);
    made outside one, none; the column takes only what the API keeps of a client's id."""
    jobs = daemon.runtime.jobs
    with request_scope("client:req/1=+_.-"):
        served, _ = await jobs.reserve(_job(b"\x0a" * 32))
    unserved, _ = await jobs.reserve(_job(b"\x0b" * 32))
    assert (served.request_id, unserved.request_id) == ("client:req/1=+_.-", None)
    read = await jobs.find_by_salt(98, b"\x0a" * 32)
    assert read is not None and read.request_id == "client:req/1=+_.-"
    for bad in ("a b", "x" * 65, "", "é", "a\nb"):
        with pytest.raises(asyncpg.CheckViolationError):
            await daemon.runtime.db.execute(
                "UPDATE relay_jobs SET request_id = $2 WHERE id = $1", served.id, bad
            )


async def test_wake_ups_resume_after_the_listen_session_is_dropped(daemon: Daemon) -> None:
    """A database restart drops the LISTEN session: it is re-opened without a daemon restart
    and state changes wake their waiters again."""
    jobs, notifications = daemon.runtime.jobs, daemon.runtime.notifications
    assert notifications._conn is not None
    before = notifications.reconnects
    pid = notifications._conn.get_server_pid()
    assert await daemon.runtime.db.fetchval("SELECT pg_terminate_backend($1)", pid)
    for _ in range(100):  # bounded: 10 s
        if notifications.reconnects > before:
            break
        await asyncio.sleep(0.1)
    assert notifications.reconnects == before + 1
    assert notifications._conn is not None and notifications._conn.get_server_pid() != pid
    job, _ = await jobs.reserve(_job(b"\x07" * 32))
    waiter = asyncio.create_task(_changed(notifications, job.id, 60))
    await asyncio.sleep(0.05)
    await jobs.move(job.id, JobState.REJECTED, error=Rejection("contract_revert"))
    await asyncio.wait_for(waiter, 10)


async def test_a_connection_asyncpg_lost_track_of_is_discarded_not_pooled_again(daemon: Daemon) -> None:
    db = daemon.runtime.db
    with pytest.raises(StoreUnavailable):
        async with db.connection() as conn:
            pid = await conn.fetchval("SELECT pg_backend_pid()")
            raise asyncpg.InternalClientError("cannot switch to state 12; another operation is in progress")
    for _ in range(100):  # the server notices the closed socket within milliseconds
        if not await db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"backend {pid} still connected: the broken connection went back to the pool")
    assert await db.fetchval("SELECT 1") == 1


async def test_a_pooled_connection_goes_back_without_a_reset_round_trip_and_never_inside_a_transaction(
    daemon: Daemon,
) -> None:
    """Releasing a pooled connection sends no statement (asyncpg's reset would cost one
    round trip after every query); a transaction left open on it is still rolled back."""
    from relayer.store.pool import Database

    db = await Database.connect(daemon.runtime.dsn, 1, 1)  # one connection: the same one each time
    sent: list[str] = []
    try:
        async with db.connection() as conn:
            conn.add_query_logger(lambda record: sent.append(record.query))
        for _ in range(3):
            assert await db.fetchval("SELECT 1") == 1
        assert sent == ["SELECT 1"] * 3, sent
        async with db.connection() as conn:  # left inside a transaction by a failed caller
            await conn.execute("BEGIN")
            await conn.execute("CREATE TEMPORARY TABLE left_open (x int)")
        async with db.connection() as conn:
            assert await conn.fetchval("SELECT to_regclass('left_open')") is None  # rolled back
            assert not conn.is_in_transaction()
    finally:
        await db.close()


async def test_a_change_between_the_waiters_read_and_its_wait_is_not_missed(daemon: Daemon) -> None:
    """A request reads its job, then waits for a change: a change that lands in between
    (its NOTIFY delivered before the wait began) must still end the wait at once, not after
    the 5 s fallback poll."""
    rt = daemon.runtime
    outcomes = rt.services.relay.outcomes
    job, _ = await rt.jobs.reserve(_job(b"\x07" * 32))
    real_get = outcomes.retirements.jobs_and_retirements
    reads = 0

    async def get_then_change(job_ids: Sequence[int]) -> Any:
        nonlocal reads
        reads += 1
        seen = await real_get(job_ids)
        if reads == 1:  # the job changes right after this read; its NOTIFY arrives at once
            await rt.jobs.move(job.id, JobState.REJECTED, error=Rejection("gas_limit_exceeds_cap", gasCap=1))
            await asyncio.sleep(0.3)
        return seen

    outcomes.retirements.jobs_and_retirements = get_then_change  # type: ignore[method-assign]
    started = asyncio.get_running_loop().time()
    try:
        with pytest.raises(RelayerError) as refused:
            await outcomes.wait(job.id)
    finally:
        outcomes.retirements.jobs_and_retirements = real_get  # type: ignore[method-assign]
    assert refused.value.code == "gas_limit_exceeds_cap"
    assert asyncio.get_running_loop().time() - started < 2.0


async def test_a_job_made_now_is_read_once_its_answer_comes_not_before(daemon: Daemon) -> None:
    """The request that made a job (``made_now``) skips the first read of it: the job is read
    once, when the change that answers it wakes the wait (twice when the waiter only knows
    the id); a wait that runs out reads it once to say where it is."""
    rt = daemon.runtime
    outcomes = rt.services.relay.outcomes
    real_get = outcomes.retirements.jobs_and_retirements
    reads = 0

    async def counted(job_ids: Sequence[int]) -> Any:
        nonlocal reads
        reads += len(job_ids)
        return await real_get(job_ids)

    outcomes.retirements.jobs_and_retirements = counted  # type: ignore[method-assign]
    try:
        for salt, fresh, expected in ((b"\x31", True, 1), (b"\x32", False, 2)):
            reads = 0
            job, _ = await rt.jobs.reserve(_job(salt * 32))
            waiting = asyncio.ensure_future(outcomes.wait(job.id, 10, made_now=fresh))
            await asyncio.sleep(0.3)
            await rt.jobs.move(job.id, JobState.SIMULATED, gas_limit=100_000, max_fee_per_gas=7)
            await asyncio.sleep(0.3)  # not an answering state: no read
            await rt.jobs.move(job.id, JobState.REJECTED, error=Rejection("gas_limit_exceeds_cap", gasCap=1))
            with pytest.raises(RelayerError) as refused:
                await asyncio.wait_for(waiting, 10)
            assert refused.value.code == "gas_limit_exceeds_cap"
            assert reads == expected, (fresh, reads)
        reads = 0
        job, _ = await rt.jobs.reserve(_job(b"\x33" * 32))
        answer = await outcomes.wait(job.id, 0.3, made_now=True)
        assert (answer.status, reads) == ("accepted", 1)
    finally:
        outcomes.retirements.jobs_and_retirements = real_get  # type: ignore[method-assign]


async def test_a_waiter_for_answers_sleeps_through_the_steps_between(daemon: Daemon) -> None:
    """Notifications name the new state: a request waiting for its answer is woken by
    indexed, rejected, dropped or reverted, not by each step in between; a payload without
    a state still wakes it."""
    from relayer.service.outcome import ANSWERING_STATES

    rt = daemon.runtime
    db, notifications = rt.db, rt.notifications
    with notifications.watch(424242, ANSWERING_STATES) as answered, notifications.watch(424242) as any_step:
        for payload, wakes in (
            ("424242:simulated", False),
            ("424242:signed", False),
            ("424242:indexed", True),
        ):
            answered.clear()
            any_step.clear()
            await db.execute("SELECT pg_notify('relay_job_states', $1)", payload)
            await asyncio.wait_for(any_step.wait(), 10)  # delivered
            assert answered.is_set() is wakes, payload
        answered.clear()
        await db.execute("SELECT pg_notify('relay_job_states', '424242')")
        await asyncio.wait_for(answered.wait(), 10)
    job, _ = await rt.jobs.reserve(_job(b"\x08" * 32))
    with notifications.watch(job.id, ANSWERING_STATES) as answered:
        await rt.jobs.move(job.id, JobState.SIMULATED, gas_limit=100_000, max_fee_per_gas=7)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(answered.wait(), 0.5)
        await rt.jobs.move(job.id, JobState.REJECTED, error=Rejection("gas_limit_exceeds_cap", gasCap=1))
        await asyncio.wait_for(answered.wait(), 10)  # the trigger names the state


@pytest.mark.parametrize("kind", ["retire", "transfer"])
async def test_only_a_change_that_wakes_someone_is_notified(daemon: Daemon, kind: str) -> None:
    """Migration 0021: a job's insert and its steps are not notified, only the states that
    wake someone: simulated (the broadcasters' new work) and the states that answer a waiting
    request of its kind (ANSWERING_STATES; TRANSFER_ANSWERING_STATES for a transfer). Nothing
    goes out on the channel of the releases before migration 0008 any more."""
    from relayer.service.outcome import ANSWERING_STATES, TRANSFER_ANSWERING_STATES
    from relayer.store.notify import NEW_WORK_STATE

    rt = daemon.runtime
    heard: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    listener = await asyncpg.connect(rt.dsn)
    for channel in ("relay_jobs", "relay_job_states"):
        await listener.add_listener(channel, lambda _c, _p, ch, payload: heard.put_nowait((ch, payload)))
    try:
        job, _ = await rt.jobs.reserve(_job(b"\x5a" * 32 if kind == "retire" else b"\x5b" * 32))
        await rt.db.execute("UPDATE relay_jobs SET kind = $2 WHERE id = $1", job.id, kind)
        path = ["simulated", "signed", "submitted", "mined", "confirmed", "indexed", "submitted", "reverted"]
        if kind == "transfer":
            path.remove("indexed")  # a transfer is final at confirmed
        for state in path:  # the trigger alone is under test: the moves are bare updates
            await rt.db.execute("UPDATE relay_jobs SET state = $2 WHERE id = $1", job.id, state)
        await rt.db.execute("UPDATE relay_jobs SET state = 'reverted' WHERE id = $1", job.id)  # no change
        await rt.db.execute("SELECT pg_notify('relay_job_states', 'end')")
        got = []
        while (item := await asyncio.wait_for(heard.get(), 10)) != ("relay_job_states", "end"):
            got.append(item)
    finally:
        await listener.close()
    answering = ANSWERING_STATES if kind == "retire" else TRANSFER_ANSWERING_STATES
    woken = [s for s in path if s == NEW_WORK_STATE or s in answering]
    assert got == [("relay_job_states", f"{job.id}:{s}") for s in woken]
    assert woken == (
        ["simulated", "indexed", "reverted"] if kind == "retire" else ["simulated", "confirmed", "reverted"]
    )


def _reserving(tag: bytes, which: str, payer: str, take: Any, value: int = 2_500_000) -> NewJob:
    salt = tag * 32
    return NewJob(
        chain_id=97, bound_nonce=b"lock" + which.encode() + salt, permit_key=None, salt=salt,
        scheme="eip3009", payer=payer, input_token="0xusdc", auth_value=value,
        auth_expires_at=int(time.time()) + 3_600, gas_allowance=0, request_hash=salt,
        settlement="0xsettlement", call_data=b"", summary={}, quote_total=0, supply=take,
    )  # fmt: skip


def _short(reserved: int) -> None:
    raise Rejection("insufficient_liquidity", available=str(reserved))


@pytest.mark.parametrize("which", ["payer", "supply"])
async def test_a_reservation_waits_for_the_last_release_s_lock_and_counts_what_it_committed(
    database_url: str, which: str
) -> None:
    """The one-statement reservation (migration 0020) queues on the lock the last release's
    statements take (same key: a rolling upgrade still serialises), and its sum, taken after
    the lock is granted, counts the reservation committed while it waited: here that one
    leaves no room, so it is refused with that sum, and records nothing."""
    from relayer.domain.fill import liquidity_rule
    from relayer.store import relay_jobs as store
    from relayer.store.pool import Database
    from relayer.store.relay_jobs import PayerOverdrawn, RelayJobs, SupplyTake

    payer = "0x" + which.encode().hex().ljust(40, "0")
    take = SupplyTake(source=1, source_id=7 if which == "payer" else 8, token_id=11, units=1_500)
    if which == "payer":
        lock_args: tuple[Any, ...] = (store.LOCK_PAYER, 97, payer, "0xusdc")
        balance, supply = store.PayerBalance(amount=4_000_000, block_number=0), None
    else:
        lock_args = (store.LOCK_SUPPLY, 97, take.source, take.source_id, take.token_id)
        balance = None
        supply = store.SupplyCheck(0, liquidity_rule(2_000, take.units), _short)
    first = await asyncpg.connect(database_url)
    db = await Database.connect(database_url, min_size=1, max_size=1)
    second = _reserving(b"\x02", which, payer, take)
    try:
        holding = first.transaction()
        await holding.start()
        await first.execute(*lock_args)  # the last release's lock statement
        await first.fetchrow(store.INSERT_JOB, *store._job_args(_reserving(b"\x01", which, payer, take)))
        reserving = asyncio.ensure_future(RelayJobs(db).reserve(second, balance, supply))
        await asyncio.sleep(0.3)
        assert not reserving.done(), "the reservation did not wait for the same key's lock"
        await holding.commit()
        if which == "payer":
            with pytest.raises(PayerOverdrawn) as overdrawn:
                await asyncio.wait_for(reserving, 10)
            assert (overdrawn.value.balance, overdrawn.value.reserved) == (4_000_000, 2_500_000)
        else:
            with pytest.raises(Rejection) as short:
                await asyncio.wait_for(reserving, 10)
            assert short.value.code == "insufficient_liquidity"
            assert short.value.context["available"] == str(take.units)  # the committed fill
        assert (
            await first.fetchval("SELECT count(*) FROM relay_jobs WHERE bound_nonce = $1", second.bound_nonce)
            == 0
        )
        assert await first.fetchval("SELECT count(*) FROM spent_salts WHERE salt = $1", second.salt) == 0
    finally:
        await first.close()
        await db.close()


async def test_what_a_supply_reserves_is_its_jobs_in_flight_and_mined_after_the_block_read(
    database_url: str,
) -> None:
    """The supply's sum under its lock (migration 0022: two sums, one over each partial index):
    the units of the supply's other jobs in flight whose authorization has not expired, plus
    those mined after the block the figure was read at; never the job's own, another supply's,
    an expired one's or a job mined at or below that block. The statement twin agrees."""
    from relayer.store import relay_jobs as store
    from relayer.store.relay_jobs import SupplyTake

    take = SupplyTake(source=0, source_id=31, token_id=5, units=0)
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():  # rolled back: nothing is left for other tests
            layout = [  # (state, units, block, expires in seconds, another supply)
                ("accepted", 1, None, 3_600, False), ("simulated", 2, None, 3_600, False),
                ("signed", 4, None, 3_600, False), ("submitted", 8, None, 3_600, False),
                ("submitted", 16, None, -3_600, False),  # expired: can no longer take anything
                ("mined", 32, 11, 3_600, False), ("confirmed", 64, 12, 3_600, False),
                ("indexed", 128, 10, 3_600, False),  # mined at the block read: the figure shows it
                ("indexed", 256, 9, 3_600, False), ("rejected", 512, None, 3_600, False),
                ("signed", 1_024, None, 3_600, True),
            ]  # fmt: skip
            for n, (state, units, block, expires_in, other) in enumerate(layout):
                supply = dataclasses.replace(take, source_id=32 if other else 31, units=units)
                new = dataclasses.replace(
                    _reserving(bytes([0x40 + n]), "sum", "0xsum", supply),
                    chain_id=93,
                    auth_expires_at=int(time.time()) + expires_in,
                )
                row = await conn.fetchrow(store.INSERT_JOB, *store._job_args(new))
                moved = "UPDATE relay_jobs SET state = $2, block_number = $3 WHERE id = $1"
                await conn.execute(moved, row["id"], state, block)
            own = _reserving(b"\x4f", "sum", "0xsum", dataclasses.replace(take, units=2_048))
            await conn.fetchrow(store.INSERT_JOB, *store._job_args(dataclasses.replace(own, chain_id=93)))
            args = (93, take.source, take.source_id, take.token_id, 10, own.bound_nonce)
            expected = 1 + 2 + 4 + 8 + 32 + 64
            function = "SELECT relay_supply_reserved($1, $2, $3, $4, $5, $6)"
            assert await conn.fetchval(function, *args) == expected
            assert await conn.fetchval(store.RESERVED_SUPPLY, *args) == expected
            raise _RollBack
    except _RollBack:
        pass
    finally:
        await conn.close()


async def test_what_takes_a_supply_before_each_job_of_a_signing_batch(database_url: str) -> None:
    """SUPPLY_AHEAD, per job of a batch that takes supply: ``mined_after``, the units of its
    supply's other jobs mined after the block read; ``ahead``, those signed or sent and not
    mined, and the older ones not yet signed, whose authorization has not expired. Never
    another supply's, a younger unsigned job's or a rejected one's."""
    from relayer.store import relay_jobs as store
    from relayer.store.relay_jobs import SupplyTake

    take = SupplyTake(source=0, source_id=41, token_id=5, units=0)
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():  # rolled back: nothing is left for other tests
            layout = [  # (name, state, units, block, expires in seconds, another supply)
                ("old", "accepted", 1, None, 3_600, False),
                ("signed", "signed", 2, None, 3_600, False),
                ("expired", "submitted", 4, None, -3_600, False),
                ("mined", "mined", 8, 11, 3_600, False),
                ("at_block", "indexed", 16, 10, 3_600, False),
                ("b1", "simulated", 32, None, 3_600, False),
                ("between", "simulated", 64, None, 3_600, False),
                ("b2", "simulated", 128, None, 3_600, False),
                ("young", "accepted", 256, None, 3_600, False),
                ("other", "submitted", 512, None, 3_600, True),
                ("rejected", "rejected", 1_024, None, 3_600, False),
            ]  # fmt: skip
            ids = {}
            for n, (name, state, units, block, expires_in, other) in enumerate(layout):
                supply = dataclasses.replace(take, source_id=42 if other else 41, units=units)
                new = dataclasses.replace(
                    _reserving(bytes([0x60 + n]), "ahead", "0xahead", supply),
                    chain_id=93,
                    auth_expires_at=int(time.time()) + expires_in,
                )
                ids[name] = (await conn.fetchrow(store.INSERT_JOB, *store._job_args(new)))["id"]
                moved = "UPDATE relay_jobs SET state = $2, block_number = $3 WHERE id = $1"
                await conn.execute(moved, ids[name], state, block)
            bare = _reserving(b"\x6f", "ahead", "0xahead", None)  # a job that takes no supply
            ids["bare"] = (await conn.fetchrow(store.INSERT_JOB, *store._job_args(bare)))["id"]
            rows = await conn.fetch(store.SUPPLY_AHEAD, [ids["b1"], ids["b2"], ids["bare"]], 10)
            got = {r["id"]: (r["mined_after"], r["ahead"]) for r in rows}
            assert got == {ids["b1"]: (8, 1 + 2), ids["b2"]: (8, 1 + 2 + 32 + 64)}
            raise _RollBack
    except _RollBack:
        pass
    finally:
        await conn.close()


async def test_what_a_payer_reserves_and_what_its_signed_jobs_commit(database_url: str) -> None:
    """A payer's sums (migration 0023: each part over its partial index). Under the payer's
    lock, a reservation counts the payer's other jobs of that token in flight whose
    authorization has not expired, and those mined after the block read. A signing batch's
    check counts, per (payer, token), the jobs signed or sent and not expired, and those mined
    after the block read. Never another token's, another payer's, a rejected or an expired job."""
    from relayer.store import relay_jobs as store
    from relayer.store.pool import Database
    from relayer.store.relay_jobs import RelayJobs

    layout = [  # (payer, token, state, value, block, expires in seconds)
        ("0xpa", "0xusdc", "accepted", 1, None, 3_600),
        ("0xpa", "0xusdc", "simulated", 2, None, 3_600),
        ("0xpa", "0xusdc", "signed", 4, None, 3_600),
        ("0xpa", "0xusdc", "submitted", 8, None, 3_600),
        ("0xpa", "0xusdc", "submitted", 16, None, -3_600),  # expired
        ("0xpa", "0xusdc", "mined", 32, 11, 3_600),
        ("0xpa", "0xusdc", "indexed", 64, 10, 3_600),  # at the block read: the balance shows it
        ("0xpa", "0xusdc", "rejected", 128, None, 3_600),
        ("0xpa", "0xkvcm", "signed", 256, None, 3_600),  # another token
        ("0xpb", "0xusdc", "confirmed", 512, 12, 3_600),  # another payer
    ]
    db = await Database.connect(database_url, min_size=1, max_size=1)
    try:
        for n, (payer, token, state, value, block, expires_in) in enumerate(layout):
            new = dataclasses.replace(
                _reserving(bytes([0x80 + n]), "payer", payer, None, value),
                chain_id=92,
                input_token=token,
                auth_expires_at=int(time.time()) + expires_in,
            )
            row = await db.fetchrow(store.INSERT_JOB, *store._job_args(new))
            moved = "UPDATE relay_jobs SET state = $2, block_number = $3 WHERE id = $1"
            await db.execute(moved, row["id"], state, block)
        args = (92, "0xpa", "0xusdc", 10, b"none")
        expected = 1 + 2 + 4 + 8 + 32
        function = "SELECT relay_payer_reserved($1, $2, $3, $4, $5)"
        async with db.transaction() as conn:  # the function's lock is the transaction's
            assert await conn.fetchval(function, *args) == expected
        assert await db.fetchval(store.RESERVED_BY_PAYER, *args) == expected
        wanted = [("0xpa", "0xusdc"), ("0xpa", "0xkvcm"), ("0xpb", "0xusdc"), ("0xpc", "0xusdc")]
        committed = await RelayJobs(db).committed(92, wanted, 10)
        assert committed == {("0xpa", "0xusdc"): 4 + 8 + 32, ("0xpa", "0xkvcm"): 256, ("0xpb", "0xusdc"): 512}
    finally:
        await db.execute("DELETE FROM relay_jobs WHERE chain_id = 92")
        await db.close()


class _RollBack(Exception):
    pass


async def test_a_reservation_is_one_statement_that_commits_without_waiting_for_its_flush(
    database_url: str,
) -> None:
    """A reservation with the payer's and the supply's checks is one round trip, its own
    transaction (migration 0020); it turns synchronous commit off for that transaction
    only (see ``RESERVE``): the supply's lock is never held through a WAL flush; a later
    synchronous commit (the job's simulation, its signing) flushes the WAL through it."""
    from relayer.domain.fill import liquidity_rule
    from relayer.store import relay_jobs as store
    from relayer.store.relay_jobs import NewJob, RelayJobs, SupplyTake

    async with _logged(database_url) as (db, statements):
        salt = b"\x0c" * 32
        new = NewJob(
            chain_id=95, bound_nonce=b"async" + salt, permit_key=None, salt=salt, scheme="eip3009",
            payer="0xasync", input_token="0xusdc", auth_value=1, auth_expires_at=int(time.time()) + 3_600,
            gas_allowance=0, request_hash=salt, settlement="0xsettlement", call_data=b"", summary={},
            quote_total=0, supply=SupplyTake(source=1, source_id=9, token_id=11, units=1),
        )  # fmt: skip
        balance = store.PayerBalance(amount=10, block_number=0)
        supply = store.SupplyCheck(0, liquidity_rule(5, 1), _short)
        job, owned = await RelayJobs(db).reserve(new, balance, supply)
        assert owned and job.state is JobState.ACCEPTED
        assert statements == [store.RESERVE], statements  # 5 round trips before migration 0020
        again, owned = await RelayJobs(db).reserve(new, balance, supply)  # the identical request
        assert (again.id, owned) == (job.id, False)
        async with db.connection() as conn:
            assert await conn.fetchval("SHOW synchronous_commit") == "on"  # for that transaction only
            async with conn.transaction():
                other = dataclasses.replace(new, bound_nonce=b"async2", salt=b"\x0d" * 32)
                await conn.fetchrow(
                    store.RESERVE, *store._job_args(other), None, None, None, None, None, None
                )
                assert await conn.fetchval("SHOW synchronous_commit") == "off"
            assert await conn.fetchval("SHOW synchronous_commit") == "on"


async def test_a_refused_reservation_records_nothing_and_says_why(database_url: str) -> None:
    """Each refusal the one statement raises rolls the whole reservation back and comes out
    as the caller's error: the payer overdrawn (with what its other jobs take), the salt of
    another authorization (with that job), the supply short (the check's own refusal, given
    what the other jobs of the supply take)."""
    from relayer.domain.fill import liquidity_rule
    from relayer.store import relay_jobs as store
    from relayer.store.pool import Database
    from relayer.store.relay_jobs import PayerOverdrawn, RelayJobs, SaltReused, SupplyTake

    db = await Database.connect(database_url, min_size=1, max_size=2)
    jobs = RelayJobs(db)
    payer = "0x" + b"refusal".hex().ljust(40, "0")
    take = SupplyTake(source=0, source_id=3, token_id=12, units=400)
    try:
        first, _ = await jobs.reserve(_reserving(b"\x21", "refused", payer, take, value=600))
        with pytest.raises(PayerOverdrawn) as overdrawn:
            await jobs.reserve(
                _reserving(b"\x22", "refused", payer, take, value=500), store.PayerBalance(1_000, 0)
            )
        assert overdrawn.value.reserved == 600
        stolen = _reserving(b"\x23", "refused", payer, take)
        stolen = dataclasses.replace(stolen, salt=first.salt)
        with pytest.raises(SaltReused) as reused:
            await jobs.reserve(stolen)
        assert reused.value.job.id == first.id
        with pytest.raises(Rejection) as short:
            await jobs.reserve(
                _reserving(b"\x24", "refused", payer, take),
                supply=store.SupplyCheck(0, liquidity_rule(700, 400), _short),
            )
        assert (short.value.code, short.value.context["available"]) == ("insufficient_liquidity", "400")
        fits, owned = await jobs.reserve(
            _reserving(b"\x25", "refused", payer, take),
            supply=store.SupplyCheck(0, liquidity_rule(800, 400), _short),
        )
        assert owned
        async with db.connection() as conn:
            kept = await conn.fetch("SELECT bound_nonce FROM relay_jobs WHERE payer = $1 ORDER BY id", payer)
            assert [bytes(r["bound_nonce"]) for r in kept] == [first.bound_nonce, fits.bound_nonce]
            salts = await conn.fetchval(
                "SELECT count(*) FROM spent_salts s JOIN relay_jobs j ON j.id = s.job_id WHERE j.payer = $1",
                payer,
            )
            assert salts == 2
    finally:
        await db.close()


async def test_the_database_s_supply_rule_is_the_fill_rule_s_mirror(database_url: str) -> None:
    """Migration 0020's relay_supply_admits gives SupplyRule.admits's answer (which gives the
    fill rule's and the liquidity rule's: tests/unit/test_fill_rule.py) on every case of a
    grid of supplies, fills, minimums and reservations, the edges included."""
    import itertools

    from relayer.domain.fill import SupplyRule

    values = (0, 1, 999, 1_000, 1_001, 2_000, 10**30)
    cases = [
        (SupplyRule(left, units, min_fill, possible), reserved)
        for left, units, min_fill, reserved in itertools.product(values, values, (0, 1, 1_000, 2_000), values)
        for possible in (True, False)
    ]
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT relay_supply_admits(l, u, m, p, r) AS ok FROM unnest($1::numeric[], $2::numeric[],"
            " $3::numeric[], $4::boolean[], $5::numeric[]) WITH ORDINALITY AS c(l, u, m, p, r, i) ORDER BY i",
            [rule.left for rule, _ in cases], [rule.units for rule, _ in cases],
            [rule.min_fill for rule, _ in cases], [rule.possible for rule, _ in cases], [r for _, r in cases],
        )  # fmt: skip
    finally:
        await conn.close()
    assert len(rows) == len(cases)
    wrong = [(rule, r) for (rule, r), row in zip(cases, rows, strict=True) if row["ok"] is not rule.admits(r)]
    assert not wrong, wrong[:5]


async def test_a_ranges_retirements_its_cursor_and_its_jobs_move_to_indexed_are_one_statement(
    daemon: Daemon, database_url: str
) -> None:
    """The follower's index of a range (issue 20: mined -> indexed under load) is one round
    trip: the retirements inserted (idempotent), the cursor advanced and the confirmed jobs of
    their transactions moved to indexed, in one statement, atomic as one. Five round trips
    before (BEGIN, the retirements, the cursor, COMMIT, then the jobs)."""
    from relayer.store.retirements import IndexedRetirement, RetirementStore

    chain_id, tx_hash = 97, b"\x97" * 32  # a chain no worker serves
    job, _ = await daemon.runtime.jobs.reserve(dataclasses.replace(_job(b"\x97" * 32), chain_id=chain_id))
    confirmed = "UPDATE relay_jobs SET state = 'confirmed', tx_hash = $2, mined_at = now() WHERE id = $1"
    await daemon.runtime.db.execute(confirmed, job.id, tx_hash)
    retirement = IndexedRetirement(
        chain_id=chain_id, tx_hash=tx_hash, retirement_index=0, block_number=12, block_hash=b"\x12" * 32,
        log_index=3, block_timestamp=1_700_000_000, payer="0xpayer", beneficiary="nul\ufffdname",
        input_token="0xusdc", value=10**30, fee=7, retirement_cost=2**200, refunded=0, gas_allowance=5,
        source=1, source_id=9, credit_token="0xcredit", token_id=2**255, amount_units=1000,
        project_id="VCS-1", vintage=2020, registry="VCS", bound_nonce=b"\x01" * 32,
        details={"retirementMessage": "ok \u00e9"},
    )  # fmt: skip
    async with _logged(database_url) as (db, statements):
        store = RetirementStore(db)
        assert await store.save(chain_id, "test-cursor", 11, b"\x11" * 32, [], []) == []  # prepares it
        statements.clear()
        moved = await store.save(chain_id, "test-cursor", 12, b"\x12" * 32, [retirement], [tx_hash])
        assert len(statements) == 1, statements
        assert [(j.id, j.state) for j in moved] == [(job.id, JobState.INDEXED)]
        assert await store.by_transaction(chain_id, tx_hash) == [retirement]
        again = await store.save(chain_id, "test-cursor", 10, b"\x10" * 32, [retirement], [tx_hash])
        assert again == []  # idempotent, and the cursor never rewinds
        cursor = "SELECT block_number, block_hash FROM indexer_cursor WHERE chain_id = $1 AND name = $2"
        assert tuple(await db.fetchrow(cursor, chain_id, "test-cursor")) == (12, b"\x12" * 32)
        assert await store.save(chain_id, "test-cursor", 13, b"\x13" * 32, [], []) == []  # the cursor alone
        assert tuple(await db.fetchrow(cursor, chain_id, "test-cursor")) == (13, b"\x13" * 32)


async def test_jobs_and_their_retirements_are_read_in_one_statement_in_the_order_asked(
    daemon: Daemon, database_url: str
) -> None:
    """The answers' read (issue 20: a block's indexed jobs wake their requests together) is
    one statement for many jobs: each id's job in the order asked (a repeated id answered
    twice, an unknown one None), an indexed job with its transaction's retirements by index,
    a job not indexed with none even when its transaction has retirements."""
    from relayer.store.retirements import IndexedRetirement, RetirementStore

    chain_id, tx_hash = 96, b"\x96" * 32  # a chain no worker serves
    indexed, _ = await daemon.runtime.jobs.reserve(dataclasses.replace(_job(b"\x96" * 32), chain_id=chain_id))
    mined, _ = await daemon.runtime.jobs.reserve(dataclasses.replace(_job(b"\x95" * 32), chain_id=chain_id))
    stamp = "UPDATE relay_jobs SET state = $3, tx_hash = $2, mined_at = now() WHERE id = $1"
    await daemon.runtime.db.execute(stamp, indexed.id, tx_hash, "indexed")
    await daemon.runtime.db.execute(stamp, mined.id, tx_hash, "mined")  # a replacement's view
    retirements = [
        IndexedRetirement(
            chain_id=chain_id, tx_hash=tx_hash, retirement_index=i, block_number=12, block_hash=b"\x12" * 32,
            log_index=3 + i, block_timestamp=1_700_000_000, payer="0xpayer", beneficiary=f"b{i}",
            input_token="0xusdc", value=10**30, fee=7, retirement_cost=2**200, refunded=0, gas_allowance=5,
            source=1, source_id=9, credit_token="0xcredit", token_id=2**255, amount_units=1000 + i,
            project_id="VCS-1", vintage=2020, registry="VCS", bound_nonce=bytes([i + 1]) * 32,
            details={"retirementMessage": "ok"},
        )
        for i in range(2)
    ]  # fmt: skip
    async with _logged(database_url) as (db, statements):
        store = RetirementStore(db)
        await store.save(chain_id, "test-answers", 12, b"\x12" * 32, retirements[::-1], [])
        statements.clear()
        missing = indexed.id + 10**9
        read = await store.jobs_and_retirements([mined.id, indexed.id, missing, mined.id])
        assert len(statements) == 1, statements
        assert read[2] is None
        assert [(got[0].id, got[0].state, got[1]) for got in read if got is not None] == [
            (mined.id, JobState.MINED, []),
            (indexed.id, JobState.INDEXED, retirements),
            (mined.id, JobState.MINED, []),
        ]
        assert await store.jobs_and_retirements([]) == []
        assert await store.job_and_retirements(indexed.id) == read[1]
        assert await store.job_and_retirements(missing) is None


async def test_the_requests_woken_together_read_their_jobs_together(daemon: Daemon) -> None:
    """Requests waiting for jobs that one statement moves to an answering state (the
    follower's index of a block) read their jobs in one or two statements between them, not
    one each (issue 20: a block's answers went out one database round trip after another),
    and each gets its own job's answer."""
    rt = daemon.runtime
    outcomes = rt.services.relay.outcomes
    jobs = [(await rt.jobs.reserve(_job(bytes([0x60 + i]) * 32)))[0] for i in range(12)]
    real_read = outcomes.retirements.jobs_and_retirements
    batches: list[list[int]] = []

    async def counted(job_ids: Sequence[int]) -> Any:
        batches.append(list(job_ids))
        return await real_read(job_ids)

    outcomes.retirements.jobs_and_retirements = counted  # type: ignore[method-assign]
    try:
        waits = [asyncio.ensure_future(outcomes.wait(job.id, 10, made_now=True)) for job in jobs]
        await asyncio.sleep(0.3)
        assert batches == []  # made now: nothing read before a change
        errors = [json.dumps(Rejection("gas_limit_exceeds_cap", gasCap=i).record()) for i in range(len(jobs))]
        await rt.db.execute(
            "UPDATE relay_jobs AS j SET state = 'rejected', error = e.error::jsonb, updated_at = now()"
            " FROM unnest($1::bigint[], $2::text[]) AS e(id, error) WHERE j.id = e.id",
            [job.id for job in jobs],
            errors,
        )
        outcomes_ = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 10)
    finally:
        outcomes.retirements.jobs_and_retirements = real_read  # type: ignore[method-assign]
    assert [(o.code, o.context.get("gasCap")) if isinstance(o, RelayerError) else o for o in outcomes_] == [
        ("gas_limit_exceeds_cap", i) for i in range(len(jobs))
    ]
    assert sorted(i for batch in batches for i in batch) == sorted(job.id for job in jobs)
    assert len(batches) <= 2, batches


async def test_a_blocks_transactions_are_recorded_mined_and_their_jobs_moved_in_one_statement(
    daemon: Daemon, database_url: str
) -> None:
    """The follower's record of a block (issue 20: four round trips a block before: BEGIN, the
    transactions, the jobs, COMMIT) is one statement (migration 0024's relay_record_mined):
    each transaction marked with its block, gas and cost; each job moved to mined (stamped)
    or reverted with its block, hash and transaction, only from a state the table allows;
    the jobs whose nonces no-ops took moved to dropped; the moved jobs returned by state."""
    from relayer.store.executor_lane import ExecutorLane

    chain_id = 95  # a chain no worker serves
    made = [
        (
            await daemon.runtime.jobs.reserve(
                dataclasses.replace(_job(bytes([0x90 + i]) * 32), chain_id=chain_id)
            )
        )[0]
        for i in range(5)
    ]
    mined, reverted, dropped, unmoved, _stays = made
    states = ("submitted", "submitted", "signed", "indexed", "submitted")
    for job, state in zip(made, states, strict=True):
        await daemon.runtime.db.execute("UPDATE relay_jobs SET state = $2 WHERE id = $1", job.id, state)
    txs = [bytes([0xA0 + i]) * 32 for i in range(5)]
    for job, tx in zip(made, txs, strict=True):
        await daemon.runtime.db.execute(
            "INSERT INTO relay_transactions (tx_hash, job_id, chain_id, executor, nonce, raw_tx, gas_limit,"
            " max_fee_per_gas, max_priority_fee_per_gas) VALUES ($1, $2, $3, '0xexec', $4, '\\x00', 1, 1, 1)",
            tx, job.id, chain_id, job.id,
        )  # fmt: skip
    async with _logged(database_url) as (db, statements):
        lane = ExecutorLane(db, chain_id)
        assert await lane.record_mined([(b"\x00" * 32, 1, 1, 1, True)], {}) == {}  # prepares it
        statements.clear()
        block_hash = b"\x77" * 32
        moved = await lane.record_mined(
            [(txs[0], 77, 50_000, 10**18, True), (txs[1], 77, 60_000, 2 * 10**18, False),
             (txs[3], 77, 1, 1, True)],
            {
                JobState.MINED: [(mined.id, 77, block_hash, txs[0]), (unmoved.id, 77, block_hash, txs[3])],
                JobState.REVERTED: [(reverted.id, 77, block_hash, txs[1])],
            },
            [dropped.id],
        )  # fmt: skip
        assert len(statements) == 1, statements
        assert {state: [j.id for j in jobs] for state, jobs in moved.items()} == {
            JobState.MINED: [mined.id],
            JobState.REVERTED: [reverted.id],
            JobState.DROPPED: [dropped.id],
        }
        assert moved[JobState.MINED][0].block_number == 77 and moved[JobState.MINED][0].timestamps["mined_at"]
        rows = {
            r["id"]: r
            for r in await db.fetch(
                "SELECT id, state, block_number, block_hash, tx_hash, mined_at FROM relay_jobs"
                " WHERE id = ANY($1)",
                [j.id for j in made],
            )
        }
        assert [rows[j.id]["state"] for j in made] == ["mined", "reverted", "dropped", "indexed", "submitted"]
        assert (rows[mined.id]["block_number"], bytes(rows[mined.id]["block_hash"])) == (77, block_hash)
        assert bytes(rows[reverted.id]["tx_hash"]) == txs[1] and rows[reverted.id]["mined_at"] is None
        marks = {
            bytes(r["tx_hash"]): tuple(r)[1:]
            for r in await db.fetch(
                "SELECT tx_hash, mined_block, gas_used, paid_wei, succeeded FROM relay_transactions"
                " WHERE tx_hash = ANY($1)",
                txs,
            )
        }
        assert marks[txs[0]] == (77, 50_000, 10**18, True)
        assert marks[txs[1]] == (77, 60_000, 2 * 10**18, False)
        assert marks[txs[4]] == (None, None, None, None)
        assert await lane.record_mined([], {JobState.MINED: []}) == {}
