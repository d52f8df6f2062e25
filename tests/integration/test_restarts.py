"""Upstreams going away under load, with everything real: the RPC node cut off for longer
than the daemon's settle wait and each patience of its lane (shortened to seconds),
and Postgres (a cluster of this test's own) restarted under two daemons sharing one key.
Nothing is lost, answers meanwhile are the spec's retryable codes (never 500), the lease
never splits, and wake-ups resume without restarting a daemon. Counts printed (-s)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from relayer_dev import devdb
from tests.conftest import Daemon, free_port
from tests.helpers.jobs import wait_for_job
from tests.helpers.relay import signed_retirement
from tests.private import Anvil, daemon_settings, private_chain, serving
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _settled(status: int, body: dict[str, Any]) -> bool:
    return (status, body.get("status")) == (200, "settled")


def _retryable(status: int, body: dict[str, Any]) -> bool:
    """The outage's retryable answer: the 503 where the action lists it (actions/retire), else
    the retryable internal_error naming it as the cause (quote)."""
    if status == 503:
        return body.get("error") == "gas_estimate_unavailable"
    return (status, body.get("error"), body.get("cause")) == (
        500,
        "internal_error",
        "gas_estimate_unavailable",
    )


RPC_DOWN_S = 6.0
"""How long the node is away: longer than the settle wait and the lane's patience below (the
production defaults are 45 s, 10 s, 10 s and 30 s), so that while it is away the in-flight
requests' waits end, the lane re-sends, and it has been stalled long enough to fill holes or
replace (it must do neither)."""
PATIENCE = {"settle_wait_s": 4.0, "resend_after_s": 1.0, "hole_after_s": 2.0, "replace_after_s": 2.0}


async def test_the_rpc_node_down_longer_than_every_wait_loses_nothing(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_chain(tmp_path, admin_database_url) as (info, dsn):
        anvil = Anvil(info["rpcUrl"])
        rpc = urlsplit(info["rpcUrl"])
        proxy = TcpProxy(rpc.hostname or "127.0.0.1", rpc.port or 8545)
        await proxy.start()
        via_proxy = f"http://127.0.0.1:{proxy.port}"
        settings = daemon_settings(info, dsn, free_port(), rpc_url=via_proxy, **PATIENCE)
        assert max(PATIENCE.values()) < RPC_DOWN_S
        try:
            async with serving(settings, info) as d:
                anvil.automine(False)
                bodies = [await signed_retirement(d, i % 3) for i in range(5)]
                during = await signed_retirement(d, 0)  # posted while the node is away
                answers = [asyncio.create_task(d.post(b)) for b in bodies]
                for body in bodies:
                    await wait_for_job(d, body, {"submitted"})
                await proxy.cut()
                probes: list[tuple[int, dict[str, Any]]] = [await d.post(during)]
                started = time.monotonic()
                # From 2 s on: within a second of the cut a quote may still be served from chain
                # reads cached before it (ChainNode's read_ttl_s).
                await asyncio.sleep(1.5)
                while time.monotonic() - started < RPC_DOWN_S:
                    await asyncio.sleep(0.5)
                    probes.append(await d.get("/api/quote", carbonClass="RE", amount="1"))
                assert all(_retryable(s, b) for s, b in probes), probes
                await proxy.start()
                anvil.automine(True)
                anvil.mine()
                back = time.monotonic()
                for body in bodies:
                    await wait_for_job(d, body, {"indexed"})
                took = time.monotonic() - back
                first = await asyncio.gather(*answers)
                assert all(s in (200, 202) for s, _ in first), first  # settled, or still on its way
                # The refused one was retryable: the identical request, posted again, settles.
                finals = await asyncio.gather(*(d.post(b) for b in [*bodies, during]))
                assert all((s, r["status"]) == (200, "settled") for s, r in finals), finals
                assert d.internal_errors() == 0
                await _exactly_once(d, [*bodies, during])
                print(
                    f"\nRPC down {RPC_DOWN_S:.0f} s: {len(probes)} answers meanwhile, all retryable "
                    "(node down); "
                    f"6 settled once (5 in flight, indexed {took:.1f} s after it came back; 1 refused "
                    "meanwhile, settled when posted again)"
                )
        finally:
            await proxy.cut()


async def test_postgres_restarted_under_two_daemons_splits_no_lease_and_resumes_wake_ups(
    tmp_path: Path,
) -> None:
    # Outside pytest's temporary root: another pytest run resets that root to 0700 at start,
    # which would cut the server (running as its own user when we are root) off its files.
    cluster = Path(tempfile.mkdtemp(prefix="relayer-restart-pg-"))
    admin = await asyncio.to_thread(devdb.ensure_database_url, None, cluster)
    try:
        async with (
            private_chain(tmp_path, admin) as (info, dsn),
            serving(daemon_settings(info, dsn, free_port(), resend_after_s=1.0), info) as a,
            serving(daemon_settings(info, dsn, free_port(), resend_after_s=1.0), info) as b,
        ):
            daemons = [a, b]
            anvil = Anvil(info["rpcUrl"])
            anvil.automine(False)
            # In flight: recorded, signed and sent, waiting for a block when Postgres goes.
            bodies = [await signed_retirement(daemons[i % 2], i % 3) for i in range(20)]
            answers = [asyncio.create_task(daemons[i % 2].post(x)) for i, x in enumerate(bodies)]
            for body in bodies:
                await wait_for_job(a, body, {"submitted"})
            # Mid-load: posted while the server restarts.
            during = [await signed_retirement(daemons[i % 2], i % 3) for i in range(10)]
            fresh = [await signed_retirement(daemons[i % 2], i % 3) for i in range(10)]  # once it is back
            epoch = await _epoch(a)
            started = time.monotonic()
            restart = asyncio.create_task(asyncio.to_thread(devdb.restart_private_cluster, cluster))
            meanwhile = [asyncio.create_task(daemons[i % 2].post(x)) for i, x in enumerate(during)]
            await restart
            restarted_in = time.monotonic() - started
            anvil.automine(True)
            anvil.mine()
            # Once the server is back, a burst of new requests finds no dead pooled connection.
            back = await asyncio.gather(*(daemons[i % 2].post(x) for i, x in enumerate(fresh)))
            assert all(_settled(s, r) for s, r in back), back
            # Requests already recorded ride the restart out within their wait: none answers 503.
            first = await asyncio.gather(*answers)
            assert all((s, r.get("status")) == (200, "settled") for s, r in first), first
            settled_in = time.monotonic() - started
            # Requests posted meanwhile answer settled or the retryable 503, never a 500.
            second = await asyncio.gather(*meanwhile)
            assert all(_settled(s, r) or _retryable(s, r) for s, r in second), second
            retried = sum(1 for s, _ in second if s != 200)
            finals = await asyncio.gather(*(daemons[i % 2].post(x) for i, x in enumerate(during)))
            assert all((s, r["status"]) == (200, "settled") for s, r in finals), finals
            for d in daemons:
                assert d.runtime.notifications.reconnects >= 1  # LISTEN re-opened, no restart
                assert d.internal_errors() == 0
            status, after = await a.post(await signed_retirement(a, 0))  # a new request, after the restart
            assert (status, after["status"]) == (200, "settled"), after
            await _exactly_once(a, [*bodies, *during, *fresh])
            # The restart ended the lease session: it was taken again under a new epoch, by
            # exactly one of the two (each signature checks the epoch, so none straddles it).
            assert await _epoch(a) > epoch
            holders = [d for d in daemons if d.runtime.lease and d.runtime.lease.epoch is not None]
            assert len(holders) == 1
            print(
                f"\nPostgres restarted in {restarted_in:.1f} s under two daemons: {len(bodies)} in flight "
                f"settled once with no 503 ({settled_in:.1f} s after the restart began); "
                f"{len(during)} posted meanwhile: {len(during) - retried} settled, {retried} answered 503 "
                f"and settled on retry; {len(fresh)} posted once it was back settled with no 503; "
                f"lease epoch {epoch} -> {await _epoch(a)}, one holder, no nonce shared"
            )
    finally:
        await asyncio.to_thread(devdb.stop_private_cluster, cluster)
        shutil.rmtree(cluster, ignore_errors=True)


async def test_requests_in_flight_ride_out_a_3_s_database_outage(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_chain(tmp_path, admin_database_url) as (info, dsn):
        anvil = Anvil(info["rpcUrl"])
        db = urlsplit(dsn)
        proxy = TcpProxy(db.hostname or "127.0.0.1", db.port or 5432)
        await proxy.start()
        via_proxy = db._replace(netloc=db.netloc.replace(f":{db.port}", f":{proxy.port}")).geturl()
        try:
            async with serving(daemon_settings(info, via_proxy, free_port(), resend_after_s=1.0), info) as d:
                anvil.automine(False)
                bodies = [await signed_retirement(d, i % 3) for i in range(6)]
                answers = [asyncio.create_task(d.post(b)) for b in bodies]
                for body in bodies:
                    await wait_for_job(d, body, {"submitted"})
                await proxy.cut()
                await asyncio.sleep(3)  # every waiter re-reads its job at least twice meanwhile
                await proxy.start()
                back = time.monotonic()
                anvil.automine(True)
                anvil.mine()
                first = await asyncio.gather(*answers)
                assert all((s, r.get("status")) == (200, "settled") for s, r in first), first
                took = time.monotonic() - back
                assert d.internal_errors() == 0
                await _exactly_once(d, bodies)
                print(
                    f"\ndatabase cut for 3 s: {len(bodies)} in flight settled once with no 503, "
                    f"{took:.1f} s after it came back"
                )
        finally:
            await proxy.cut()


async def _epoch(d: Daemon) -> int:
    value = await d.runtime.db.fetchval("SELECT max(epoch) FROM executor_leases")
    assert value is not None
    return int(value)


async def _exactly_once(d: Daemon, bodies: list[dict[str, Any]]) -> None:
    """One job per salt, indexed; one transaction per job; no nonce shared by two jobs."""
    db = d.runtime.db
    for body in bodies:
        job = await db.fetchrow(
            "SELECT id, state FROM relay_jobs WHERE salt = $1", bytes.fromhex(body["salt"][2:])
        )
        assert job is not None
        assert job["state"] == "indexed"
        assert await db.fetchval("SELECT count(*) FROM relay_transactions WHERE job_id = $1", job["id"]) == 1
    shared = await db.fetchval(
        "SELECT count(*) FROM (SELECT nonce FROM relay_transactions GROUP BY nonce "
        "HAVING count(DISTINCT job_id) > 1) AS shared"
    )
    assert shared == 0
