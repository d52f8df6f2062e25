"""Several executor keys (issue 7), each with its own nonce lane and lease, on a chain of
its own: work spreads over the keys, a key whose balance falls below the floor is drained of
new work and reported while the other carries on, and two daemons on one database split the
keys with no overlap. Counts printed (-s)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from relayer.chain.reads import ETH_BALANCE_MAX_AGE_S
from tests.conftest import Daemon, free_port
from tests.helpers.relay import signed_retirement
from tests.private import Anvil, daemon_settings, private_chain, serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FLOOR = 10**18  # 1 ETH


def _keys(info: dict[str, Any]) -> dict[str, Any]:
    return {
        "executor_private_keys": info["spareExecutors"][0]["privateKey"],
        "min_executor_balance_wei": FLOOR,
    }


async def _executors_of(d: Daemon, bodies: list[dict[str, Any]]) -> list[str]:
    rows = await d.runtime.db.fetch(
        "SELECT executor FROM relay_jobs WHERE salt = ANY($1::bytea[])",
        [bytes.fromhex(b["salt"][2:]) for b in bodies],
    )
    return [r["executor"] for r in rows]


async def _leased(d: Daemon) -> list[str]:
    return [lease.executor for lease in d.runtime.leases if lease.epoch is not None]


async def test_a_key_below_the_floor_is_drained_and_the_other_carries_on(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_chain(tmp_path, admin_database_url) as (info, dsn):
        first, second = info["executor"]["address"], info["spareExecutors"][0]["address"]
        settings = daemon_settings(info, dsn, free_port(), **_keys(info))
        async with serving(settings, info) as d:
            anvil = Anvil(info["rpcUrl"])
            deadline = time.monotonic() + 10
            while len(await _leased(d)) < 2:  # the second key is taken after the spread
                assert time.monotonic() < deadline, "both leases not taken"
                await asyncio.sleep(0.1)
            # Nothing is mined until every job is signed: in flight, the work spreads by the
            # lanes' rule (one lane stays within half a batch of the other), whatever the order
            # the lanes step in. With blocks coming meanwhile (a block a second, as before), a
            # lane whose transactions were mined could take each trickle of jobs alone: on the
            # loaded CI machine one lane took all 20.
            anvil.automine(False)
            before = [await signed_retirement(d, i % 3) for i in range(20)]
            posts = [asyncio.ensure_future(d.post(b)) for b in before]
            salts = [bytes.fromhex(b["salt"][2:]) for b in before]
            deadline = time.monotonic() + 60
            signed = "SELECT count(*) FROM relay_jobs WHERE salt = ANY($1::bytea[]) AND executor IS NOT NULL"
            while await d.runtime.db.fetchval(signed, salts) < len(before):
                assert time.monotonic() < deadline, "not every job was signed"
                await asyncio.sleep(0.1)
            anvil.rpc("evm_setIntervalMining", 1)  # a block a second from now on
            answers = await asyncio.gather(*posts)
            assert all((s, r["status"]) == (200, "settled") for s, r in answers), answers
            spread = await _executors_of(d, before)
            assert set(spread) == {first, second}, spread  # both lanes took work
            # The second key falls below the floor mid-load: no new work for it.
            anvil.rpc("anvil_setBalance", second, hex(FLOOR // 2))
            anvil.mine()
            await asyncio.sleep(ETH_BALANCE_MAX_AGE_S)  # the balance read before it is reused this long
            after = [await signed_retirement(d, i % 3) for i in range(20)]
            answers = await asyncio.gather(*(d.post(b) for b in after))
            assert all((s, r["status"]) == (200, "settled") for s, r in answers), answers
            moved = await _executors_of(d, after)
            assert set(moved) == {first}, moved
            drained = d.runtime.metrics.executor_drained.labels("1")._value.get()
            assert drained == 1  # reported
            assert d.runtime.metrics.executor_drained.labels("0")._value.get() == 0
            print(
                f"\ntwo keys: {spread.count(first)}/{spread.count(second)} of 20 before; second key below "
                f"the floor: {moved.count(first)}/{moved.count(second)} of 20 after, all settled, "
                "drained reported"
            )


async def test_two_daemons_on_one_database_split_the_keys_with_no_overlap(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with (
        private_chain(tmp_path, admin_database_url) as (info, dsn),
        serving(daemon_settings(info, dsn, free_port(), **_keys(info)), info) as a,
        serving(daemon_settings(info, dsn, free_port(), **_keys(info)), info) as b,
    ):
        deadline = time.monotonic() + 15
        while len(await _leased(a)) + len(await _leased(b)) < 2:
            assert time.monotonic() < deadline, "keys not leased"
            await asyncio.sleep(0.1)
        await asyncio.sleep(2 * 2.0 + 0.5)  # past the spread: nothing more is taken
        held_a, held_b = await _leased(a), await _leased(b)
        assert len(held_a) == len(held_b) == 1 and set(held_a) != set(held_b), (held_a, held_b)
        bodies = [await signed_retirement(a, i % 3) for i in range(20)]
        answers = await asyncio.gather(*((a if i % 2 else b).post(x) for i, x in enumerate(bodies)))
        assert all((s, r["status"]) == (200, "settled") for s, r in answers), answers
        used = await _executors_of(a, bodies)
        shared = await a.runtime.db.fetchval(
            "SELECT count(*) FROM (SELECT executor, nonce FROM relay_transactions "
            "GROUP BY executor, nonce HAVING count(DISTINCT job_id) > 1) AS s"
        )
        assert shared == 0
        print(
            f"\ntwo daemons, two keys: one key each; 20 settled over keys {sorted(set(used))}, "
            "no nonce shared"
        )


async def test_a_key_the_settlement_does_not_accept_takes_no_work(
    tmp_path: Path, admin_database_url: str
) -> None:
    # anvil's account 6: funded, but never registered with setExecutor
    stranger = "0x92db14e403b83dfe3df233f83dfa3a0d7096f21ca9b0d6d6b8d88b2b4ec1564e"
    async with private_chain(tmp_path, admin_database_url) as (info, dsn):
        settings = daemon_settings(info, dsn, free_port(), executor_private_keys=stranger)
        async with serving(settings, info) as d:
            deadline = time.monotonic() + 10
            while len(await _leased(d)) < 2:
                assert time.monotonic() < deadline, "both leases not taken"
                await asyncio.sleep(0.1)
            bodies = [await signed_retirement(d, i % 3) for i in range(10)]
            answers = await asyncio.gather(*(d.post(b) for b in bodies))
            assert all((s, r["status"]) == (200, "settled") for s, r in answers), answers
            assert set(await _executors_of(d, bodies)) == {info["executor"]["address"]}
            assert d.runtime.metrics.executor_drained.labels("1")._value.get() == 1
            print("\nunregistered key: no work taken (reported drained); 10 settled through the other")


async def test_jobs_beyond_one_lanes_share_are_taken_by_the_other_lane_at_once(
    tmp_path: Path, admin_database_url: str
) -> None:
    """Both lanes read the same 20 simulated jobs and their shares (16 each); the first signs
    its 16 and the second, whose reads predate that, finds every job of its batch taken and
    signs none. The 4 left must not wait for a lane's idle timeout (1 s): the lane that
    signed wakes the other (stop 28's flake of the test above: one lane took all 20). The
    lanes are held off (their reads answer nothing) until all 20 are simulated; then each
    lane's re-check waits until both lanes have read (and every wake from before is
    cleared), and the second's until the first has signed, so the race is made, not waited
    for."""
    async with private_chain(tmp_path, admin_database_url) as (info, dsn):
        settings = daemon_settings(info, dsn, free_port(), **_keys(info))
        async with serving(settings, info) as d:
            anvil = Anvil(info["rpcUrl"])
            deadline = time.monotonic() + 10
            while len(await _leased(d)) < 2:
                assert time.monotonic() < deadline, "both leases not taken"
                await asyncio.sleep(0.1)
            anvil.automine(False)  # a block a second: the first lane's share stays in flight
            anvil.rpc("evm_setIntervalMining", 1)
            lane, simulator = d.runtime.lane, d.runtime.simulator
            real_next, real_recheck = lane.next_simulated, simulator.recheck
            real_sign, real_sign_batch = lane.sign_simulated, lane.sign_batch
            racing: list[str] = []  # the lanes whose re-check took part in the race, in order
            both_read, first_signed = asyncio.Event(), asyncio.Event()

            async def held_off(limit: int) -> list[Any]:
                jobs = await real_next(limit)
                return [] if len(jobs) < 20 and not racing else jobs  # none until all 20

            async def raced(batch: Any, sender: str) -> Any:
                if len(batch) == 16 and len(racing) < 2 and not first_signed.is_set():
                    racing.append(sender)
                    if len(racing) == 2:
                        await asyncio.sleep(0.2)  # the notifications of the last jobs land
                        for event in d.runtime.notifications._new_work:
                            event.clear()  # no wake from before the race is left pending
                        both_read.set()
                        await asyncio.wait_for(first_signed.wait(), 10)  # its reads now stale
                    else:
                        await asyncio.wait_for(both_read.wait(), 10)
                return await real_recheck(batch, sender)

            def watched(real: Any) -> Any:  # a lane's signing, in one statement or the general way
                async def signing(executor: str, *args: Any, **kwargs: Any) -> Any:
                    signed = await real(executor, *args, **kwargs)
                    if signed and racing and executor == racing[0]:
                        first_signed.set()
                    return signed

                return signing

            lane.next_simulated = held_off  # type: ignore[method-assign]
            lane.sign_simulated = watched(real_sign)  # type: ignore[method-assign]
            lane.sign_batch = watched(real_sign_batch)  # type: ignore[method-assign]
            simulator.recheck = raced  # type: ignore[method-assign]
            try:
                bodies = [await signed_retirement(d, i % 3) for i in range(20)]
                answers = await asyncio.gather(*(d.post(b) for b in bodies))
            finally:
                lane.next_simulated = real_next  # type: ignore[method-assign]
                lane.sign_simulated = real_sign  # type: ignore[method-assign]
                lane.sign_batch = real_sign_batch  # type: ignore[method-assign]
                simulator.recheck = real_recheck  # type: ignore[method-assign]
            assert all((s, r["status"]) == (200, "settled") for s, r in answers), answers
            assert len(racing) == 2 and first_signed.is_set(), f"the race was not made: {racing}"
            rows = await d.runtime.db.fetch(
                "SELECT executor, extract(epoch FROM signed_at)::float8 AS at FROM relay_jobs "
                "WHERE salt = ANY($1::bytea[])",
                [bytes.fromhex(b["salt"][2:]) for b in bodies],
            )
            spread = max(r["at"] for r in rows) - min(r["at"] for r in rows)
            per_key = {k: sum(1 for r in rows if r["executor"] == k) for k in racing}
            print(f"\nsigned over {spread:.3f} s, per key in the race's order {list(per_key.values())}")
            assert list(per_key.values()) == [16, 4], per_key
            assert spread < 0.5, f"the jobs left waited {spread:.3f} s: for an idle timeout"
