"""Exactly-once under the benchmark's load (issue 8): a short version of
``bench/relay_throughput.py``'s load (concurrent signed retirements against ``relayer serve``
and ``relayer work`` processes) with the faults of the fault tests thrown in while it runs:
identical replays of requests in flight, tampered replays of their salts, a SIGKILL of the
worker and then of the API process (each started again; clients re-post what got no answer,
as a wallet would). Every retirement must settle exactly once, on the chain and in Postgres,
no answer may be a 5xx, and the executor must pay for no revert. Figures printed (-s)."""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from relayer.chain import codec
from tests.exactly_once import assert_settled_exactly_once
from tests.helpers.relay import ProcessClient, signed_retirement
from tests.private import private_chain
from tests.processes import DaemonProcess, daemon_env

# alone: the benchmark's load with faults: it keeps both cores busy
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), pytest.mark.alone]

RETIREMENTS = 120
CONCURRENCY = 40
REPLAYS = 30
TAMPERED = 10
ANSWER_ATTEMPTS = 120  # re-posts of a request that got no answer (0.25 s apart): 30 s
_SETTLED = codec.event("RetirementSettlement", "RetirementSettled")


async def _answer(
    client: ProcessClient, body: dict[str, Any], answers: list[tuple[int, dict[str, Any]]], cut: list[int]
) -> None:
    """Post until the daemon answers (a connection refused or reset while a process is
    down, counted in ``cut``, or a retryable 503, is posted again): a wallet's retry, bounded."""
    for _ in range(ANSWER_ATTEMPTS):
        try:
            status, data = await client.post(body)
        except (aiohttp.ClientError, TimeoutError):
            cut.append(1)
            await asyncio.sleep(0.25)
            continue
        answers.append((status, data))
        if status == 503 and data.get("retryable"):
            await asyncio.sleep(0.25)
            continue
        return
    raise AssertionError(f"no answer after {ANSWER_ATTEMPTS} attempts")


async def _progress(db: Any, states: tuple[str, ...]) -> int:
    return int(
        await db.fetchval("SELECT count(*) FROM relay_jobs WHERE state = ANY($1::text[])", list(states))
    )


async def test_load_with_replays_and_crashes_settles_each_retirement_once(
    tmp_path: Path, admin_database_url: str, db_of: Any
) -> None:
    async with (
        private_chain(tmp_path, admin_database_url) as (info, dsn),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
    ):
        db, log = await db_of(dsn), tmp_path / "daemons.log"
        env = daemon_env(info, dsn)
        api = await DaemonProcess("serve", env, log).start()
        worker = await DaemonProcess("work", env, log).start()
        events: list[str] = []
        try:
            client = ProcessClient(session, api.base, info)
            bodies = [await signed_retirement(client, i % 3) for i in range(RETIREMENTS)]
            tampered = []
            for body in bodies[:TAMPERED]:
                other = copy.deepcopy(body)
                other["details"]["beneficiaryString"] = "someone else"
                tampered.append(other)
            answers: dict[int, list[tuple[int, dict[str, Any]]]] = {i: [] for i in range(RETIREMENTS)}
            replays: dict[int, list[tuple[int, dict[str, Any]]]] = {i: [] for i in range(REPLAYS)}
            forged: list[tuple[int, dict[str, Any]]] = []
            sem, cut = asyncio.Semaphore(CONCURRENCY), list[int]()

            async def load(i: int) -> None:
                async with sem:
                    await _answer(client, bodies[i], answers[i], cut)

            async def replay(i: int) -> None:
                await asyncio.sleep(0.05 * i)  # while the original is in flight
                await _answer(client, bodies[i], replays[i], cut)

            async def forge(body: dict[str, Any]) -> None:
                await _answer(client, body, forged, cut)

            async def crash() -> None:
                """SIGKILL the worker once a quarter of the jobs are sent, then the API once
                half are; each is started again at once."""
                started = time.monotonic()
                for share, process in ((4, worker), (2, api)):
                    while (
                        await _progress(db, ("submitted", "mined", "confirmed", "indexed"))
                        < RETIREMENTS // share
                    ):
                        assert time.monotonic() - started < 60, "the load made no progress"
                        await asyncio.sleep(0.02)
                    process.kill()
                    events.append(f"relayer {process.command} killed at {time.monotonic() - started:.1f} s")
                    await process.start()

            started = time.monotonic()
            await asyncio.gather(
                *(load(i) for i in range(RETIREMENTS)),
                *(replay(i) for i in range(REPLAYS)),
                *(forge(b) for b in tampered),
                crash(),
            )
            elapsed = time.monotonic() - started
        finally:
            codes = [p.stop() for p in (api, worker)]
        assert codes == [0, 0], log.read_text()[-3000:]

        # Every answer: no 5xx but a retryable 503; every original and replay settled, and
        # a replay answers the original's transaction; every tampered salt refused.
        everything = [a for got in (*answers.values(), *replays.values()) for a in got] + forged
        assert all(s < 500 or (s == 503 and d.get("retryable")) for s, d in everything), everything
        finals = {i: got[-1] for i, got in answers.items()}
        assert {(s, d.get("status")) for s, d in finals.values()} == {(200, "settled")}, finals
        for i, got in replays.items():
            assert got[-1][0] == 200 and got[-1][1]["transactionHash"] == finals[i][1]["transactionHash"], got
        assert all(400 <= s < 500 for s, _ in forged), forged

        await assert_settled_exactly_once(
            db, session, info, [d["transactionHash"] for _, d in finals.values()], RETIREMENTS
        )
        assert cut, "the API was killed with no request in flight: the test tests nothing"
        retried = sum(len(got) - 1 for got in answers.values())
        print(
            f"\nload of {RETIREMENTS} at concurrency {CONCURRENCY} with {REPLAYS} identical and {TAMPERED} "
            f"tampered replays; {'; '.join(events)}: all settled once in {elapsed:.1f} s, "
            f"{len(cut)} requests cut by the API's crash and posted again, {retried} retryable 503s, "
            "no other 5xx, no revert"
        )
