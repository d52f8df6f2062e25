"""Issue 20, accepted -> submitted: the broadcaster signs the next batch while the one before it
is still on its way to the node (sends in nonce order, each batch journaled before it is
sent). Measured by order, not time: a send held at the node does not hold the next signing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from eth_utils.crypto import keccak

from relayer.chain.errors import ChainUnavailable, SendOutcome
from relayer.workers.lane_keeper import LaneKeeper
from tests.conftest import free_port
from tests.helpers.relay import challenge, signed_request
from tests.private import daemon_settings, private_chain, serving


async def _states(dsn: str) -> list[tuple[str, bytes | None]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT state, tx_hash FROM relay_jobs ORDER BY id")
    finally:
        await conn.close()
    return [(str(r["state"]), None if r["tx_hash"] is None else bytes(r["tx_hash"])) for r in rows]


async def _two_retirements(d: Any, info: dict[str, Any]) -> list[dict[str, Any]]:
    """Two signed retirements of the class credit "RE", by the devnet's first two payers."""
    bodies = []
    for payer in info["payers"][:2]:
        terms = await challenge(d, payer, carbonClass="RE", amount="0.01", inputToken="USDC")
        bodies.append(signed_request(terms, payer["privateKey"]))
    return bodies


async def _until(check: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


async def test_the_next_batch_is_signed_while_the_batch_before_is_still_being_sent(
    tmp_path: Path, admin_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first job's broadcast is held at the node; a second job accepted meanwhile is
    signed (journaled) before that broadcast returns, and its bytes go out after the first's:
    both settle, sent in the order they were signed, each exactly once. (The lane's upkeep,
    which waits for the sends before it, is kept from coming due meanwhile.)"""
    monkeypatch.setattr(LaneKeeper, "upkeep_due", lambda _self: False)
    async with (
        private_chain(tmp_path, admin_database_url) as (info, dsn),
        serving(daemon_settings(info, dsn, free_port()), info) as d,
    ):
        executor = d.runtime.executor
        real = executor.send_raw_many
        release = asyncio.Event()
        sent: list[bytes] = []

        async def held(raws: Sequence[bytes]) -> list[SendOutcome | ChainUnavailable]:
            first = not sent
            sent.extend(raws)
            if first:
                await release.wait()
            return await real(raws)

        executor.send_raw_many = held  # type: ignore[method-assign]
        bodies = await _two_retirements(d, info)
        first = asyncio.create_task(d.post(bodies[0]))

        async def first_on_its_way() -> bool:
            return bool(sent)

        await _until(first_on_its_way, "the first job was never sent")
        second = asyncio.create_task(d.post(bodies[1]))

        async def second_signed() -> bool:
            states = await _states(dsn)
            return len(states) == 2 and states[1][0] == "signed"

        try:
            await _until(second_signed, "the second job was not signed while the first send was held")
            assert len(sent) == 1  # the first broadcast has not returned: the second waits behind it
        finally:
            release.set()
        answers = await asyncio.gather(first, second)
        states = await _states(dsn)
    assert [a.get("status") for _s, a in answers] == ["settled", "settled"], answers
    assert [keccak(raw) for raw in sent] == [h for _s, h in states]  # in order, once each


async def test_the_next_batch_goes_out_while_the_broadcast_before_is_still_being_recorded(
    tmp_path: Path, admin_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record of the first job's broadcast (its move to submitted) is held in the
    database; a second job accepted meanwhile is signed and its bytes reach the node before
    that record ends (a broadcast waits for the node to have the batch before it, not for the
    database to record it). Both settle, each sent once, in the order they were signed."""
    monkeypatch.setattr(LaneKeeper, "upkeep_due", lambda _self: False)
    async with (
        private_chain(tmp_path, admin_database_url) as (info, dsn),
        serving(daemon_settings(info, dsn, free_port()), info) as d,
    ):
        executor, lane = d.runtime.executor, d.runtime.lane
        real_send, real_mark = executor.send_raw_many, lane.mark_broadcast
        release = asyncio.Event()
        sent: list[bytes] = []
        marks: list[int] = []

        async def send(raws: Sequence[bytes]) -> list[SendOutcome | ChainUnavailable]:
            sent.extend(raws)
            return await real_send(raws)

        async def held(txs: Sequence[object]) -> object:
            marks.append(len(txs))
            if len(marks) == 1:
                await release.wait()
            return await real_mark(txs)  # type: ignore[arg-type]

        executor.send_raw_many = send  # type: ignore[method-assign]
        lane.mark_broadcast = held  # type: ignore[method-assign]
        bodies = await _two_retirements(d, info)
        first = asyncio.create_task(d.post(bodies[0]))

        async def first_recording() -> bool:
            return bool(marks)

        await _until(first_recording, "the first broadcast was never recorded")
        second = asyncio.create_task(d.post(bodies[1]))

        async def second_sent() -> bool:
            return len(sent) == 2

        try:
            await _until(second_sent, "the second job's bytes waited for the record of the first's")
        finally:
            release.set()
        answers = await asyncio.gather(first, second)
        states = await _states(dsn)
    assert [a.get("status") for _s, a in answers] == ["settled", "settled"], answers
    assert [keccak(raw) for raw in sent] == [h for _s, h in states]  # in order, once each
