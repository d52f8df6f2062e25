"""Marketplace orders never strand (issue 17): every failure after an order's quote is consumed
ends the order FAILED with its reason and the way to a new quote, or is attempted again until it
has its one relay job; a crash at any step resumes. On a private chain and database, through the
daemon's own runtime and HTTP (and, for SIGKILL, ``relayer all`` processes).

The "process died after recording the order" state is also made directly, by recording an order
through the store exactly as ``POST /orders`` does, backdated past the keeper's grace period."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from eth_account import Account

from relayer.admin import create_api_key
from relayer.app import Runtime, open_runtime, web_runner
from relayer.chain.reads import ETH_BALANCE_MAX_AGE_S
from relayer.service.market.orders import ORDER_GRACE_S, order_salt
from relayer.store.pool import Database
from relayer_dev.deploy import UPDATED_LISTING_ID
from tests.conftest import free_port
from tests.private import daemon_settings, private_chain
from tests.processes import DaemonProcess, RpcProxy, daemon_env, simulation_of_jobs
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SOURCE = f"listing-84532-0x{UPDATED_LISTING_ID:064x}"


@dataclass
class Desk:
    """A daemon (runtime and HTTP) whose chain node is reached through ``node`` (a proxy that a
    test can cut), and an API key."""

    base: str
    rt: Runtime
    session: aiohttp.ClientSession
    key: str
    node: TcpProxy
    info: dict[str, Any]

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {self.key}"}
        async with self.session.post(f"{self.base}{path}", json=body, headers=headers) as r:
            return r.status, await r.json(content_type=None)

    async def order(self, order_id: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.key}"}
        async with self.session.get(f"{self.base}/orders/{order_id}", headers=headers) as r:
            assert r.status == 200
            body: dict[str, Any] = await r.json()
            return body

    async def quote(self, tonnes: str = "1") -> dict[str, Any]:
        """A quote of the updated listing (waiting, bounded, for the indexer to show it)."""
        deadline = time.monotonic() + 30
        while True:
            status, quote = await self.post(
                "/quotes", {"asset_price_source_id": SOURCE, "quantity_tonnes": tonnes}
            )
            if status != 404 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert status == 201, quote
        return quote

    async def recorded_order(self, quote: dict[str, Any]) -> uuid.UUID:
        """Consume ``quote`` and record its order as ``POST /orders`` does, then "die": the order
        has no job, and is older than the keeper's grace period."""
        key_id = await self.rt.db.fetchval(
            "SELECT api_key_id FROM quotes WHERE uuid = $1", uuid.UUID(quote["uuid"])
        )
        order_id = uuid.uuid4()
        recorded_at = int(time.time()) - ORDER_GRACE_S - 1
        await self.rt.marketplace.desk.orders.place(
            order_id,
            uuid.UUID(quote["uuid"]),
            int(key_id),
            "Stranded buyer",
            self.info["payers"][0]["address"],
            "",
            None,
            recorded_at,
        )
        return order_id

    async def jobs_of(self, order_id: uuid.UUID) -> int:
        return int(
            await self.rt.db.fetchval("SELECT count(*) FROM relay_jobs WHERE salt = $1", order_salt(order_id))
        )


async def _until(desk: Desk, order_id: str, statuses: set[str], timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    order = await desk.order(order_id)
    while order["status"] not in statuses and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        order = await desk.order(order_id)
    assert order["status"] in statuses, order
    return order


@contextlib.asynccontextmanager
async def open_desk(
    info: dict[str, Any], dsn: str, treasury_key: str, *, workers: bool
) -> AsyncIterator[Desk]:
    """The daemon on ``dsn`` with treasury ``treasury_key``, its node behind a cuttable proxy."""
    rpc_port = int(info["rpcUrl"].rsplit(":", 1)[1])
    node = TcpProxy("127.0.0.1", rpc_port)
    port = free_port()
    settings = daemon_settings(
        info,
        dsn,
        port,
        rpc_url=f"http://127.0.0.1:{await node.start()}",
        treasury_private_key=treasury_key,
        rate_limit="off",
    )
    key = await create_api_key(settings, f"orders-{uuid.uuid4().hex[:6]}")
    async with open_runtime(settings, workers=workers) as rt:
        runner = web_runner(rt)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                yield Desk(f"http://127.0.0.1:{port}", rt, session, key, node, info)
        finally:
            await node.start()  # the runtime closes through it
            await runner.cleanup()
            await node.cut()


async def test_a_treasury_short_of_usdc_refuses_before_the_quote_is_spent_and_a_revert_fails_the_order(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    info, dsn = chain_and_db
    empty_treasury = Account.create().key.hex()
    async with open_desk(info, dsn, empty_treasury, workers=True) as desk:
        quote = await desk.quote()
        orders_before = await desk.rt.db.fetchval("SELECT count(*) FROM orders")
        status, refused = await desk.post("/orders", {"quote_uuid": quote["uuid"], "beneficiary_name": "B"})
        assert (status, refused["code"]) == (503, "orders_unavailable"), refused
        consumed = await desk.rt.db.fetchval(
            "SELECT consumed_at FROM quotes WHERE uuid = $1", uuid.UUID(quote["uuid"])
        )
        assert consumed is None, "the quote stays usable"
        assert await desk.rt.db.fetchval("SELECT count(*) FROM orders") == orders_before

        # The treasury drained between the check and the relay (a recorded order, attempted now):
        # the relay refuses it as the token would revert; the order fails with the reason.
        order_id = await desk.recorded_order(quote)
        assert (await desk.order(str(order_id)))["status"] == "SUBMITTED"
        await desk.rt.marketplace.desk.resume()  # or the keeper's step, whichever comes first
        order = await desk.order(str(order_id))
        assert order["status"] == "FAILED" and order["error"]["code"] == "contract_revert", order
        assert "POST /quotes" in order["error"]["next"] and SOURCE in order["error"]["next"]
        assert await desk.jobs_of(order_id) == 0
        assert await desk.rt.marketplace.desk.resume() == 0, "a failed order is not attempted again"


async def test_node_paused_mid_order_leaves_it_submitted_then_it_completes_once(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    info, dsn = chain_and_db
    async with open_desk(info, dsn, info["treasury"]["privateKey"], workers=True) as desk:
        posted, recorded = await desk.quote(), await desk.quote()
        await desk.node.cut()
        # Past the node read cache's life (ChainNode.read_ttl_s, 1 s): the order's listing and
        # treasury reads must reach the node, which is gone.
        await asyncio.sleep(desk.rt.node.read_ttl_s + 0.5)
        status, answer = await desk.post("/orders", {"quote_uuid": posted["uuid"], "beneficiary_name": "B"})
        consumed = await desk.rt.db.fetchval(
            "SELECT consumed_at FROM quotes WHERE uuid = $1", uuid.UUID(posted["uuid"])
        )
        waiting: list[str] = []
        if status == 503:  # the reads before the quote is consumed failed: nothing consumed
            assert consumed is None, "nothing was consumed before the node answered"
        else:  # they were answered (a read shared with another caller): recorded, and waiting
            assert status == 201 and answer["status"] == "SUBMITTED" and answer["error"] is None, answer
            waiting.append(answer["id"])

        # The node stops after the order was recorded: the order waits, it does not fail.
        order_id = await desk.recorded_order(recorded)
        waiting.append(str(order_id))
        await desk.rt.marketplace.desk.resume()
        order = await desk.order(str(order_id))
        assert order["status"] == "SUBMITTED" and order["error"] is None, order
        await asyncio.sleep(3)  # the keeper meets the outage too
        assert [(await desk.order(o))["status"] for o in waiting] == ["SUBMITTED"] * len(waiting)
        await desk.node.start()
        for o in waiting:
            order = await _until(desk, o, {"COMPLETED", "FAILED"})
            assert order["status"] == "COMPLETED", order
            assert await desk.jobs_of(uuid.UUID(o)) == 1


async def test_database_restart_mid_order_then_it_completes_once(
    chain_and_db: tuple[dict[str, Any], str], admin_database_url: str
) -> None:
    info, dsn = chain_and_db
    host, port = dsn.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
    db_proxy = TcpProxy(host, int(port))
    proxied = dsn.replace(f"{host}:{port}", f"127.0.0.1:{await db_proxy.start()}")
    try:
        async with open_desk(info, proxied, info["treasury"]["privateKey"], workers=True) as desk:
            quote = await desk.quote()
            order_id = await desk.recorded_order(quote)
            await db_proxy.cut()  # the database goes away before the keeper's attempt
            await asyncio.sleep(4)
            await db_proxy.start()
            order = await _until(desk, str(order_id), {"COMPLETED", "FAILED"})
            assert order["status"] == "COMPLETED", order
            assert await desk.jobs_of(order_id) == 1
    finally:
        await db_proxy.start()
        await db_proxy.cut()


async def test_two_concurrent_orders_on_one_quote_make_one_job(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    info, dsn = chain_and_db
    async with open_desk(info, dsn, info["treasury"]["privateKey"], workers=True) as desk:
        quote = await desk.quote()
        body = {"quote_uuid": quote["uuid"], "beneficiary_name": "Racer"}
        (s1, a), (s2, b) = await asyncio.gather(desk.post("/orders", body), desk.post("/orders", body))
        assert sorted([s1, s2]) == [201, 409], (a, b)
        placed = a if s1 == 201 else b
        order = await _until(desk, placed["id"], {"COMPLETED", "FAILED"})
        assert order["status"] == "COMPLETED", order
        assert await desk.jobs_of(uuid.UUID(placed["id"])) == 1


async def _wait_for(db: Database, query: str, *args: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await db.fetchval(query, *args):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached within {timeout_s} s: {query}")


async def test_sigkill_between_order_and_job_then_a_restart_completes_each_order_once(
    tmp_path: Path, admin_database_url: str, db_of: Any
) -> None:
    """``relayer all`` SIGKILLed (1) after recording the order, before its relay job (the
    executor-balance read that precedes the reservation is held), and (2) after the job was
    recorded, before the order was linked to it (the simulation is held). Each restarted
    daemon's keeper completes the order with exactly one job."""
    async with (
        private_chain(tmp_path, admin_database_url) as (info, dsn),
        RpcProxy(info["rpcUrl"]) as proxy,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
    ):
        db, log = await db_of(dsn), tmp_path / "daemon.log"
        env = daemon_env(
            info,
            dsn,
            rpc_url=proxy.url,
            treasury_private_key=info["treasury"]["privateKey"],
            min_executor_balance_wei=1,
            # the restarted keeper takes the order over this long after it was recorded (10 s
            # in production, asserted in tests/unit/test_config.py); longer than the killed
            # daemon needs to reach the held step, so its own keeper never gets there first
            order_grace_s=4,
        )
        settings = daemon_settings(info, dsn, free_port())
        key = await create_api_key(settings, "sigkill")
        headers = {"Authorization": f"Bearer {key}"}
        daemon = await DaemonProcess("all", env, log).start()

        async def post(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            async with session.post(f"{daemon.base}{path}", json=body, headers=headers) as r:
                return r.status, await r.json(content_type=None)

        placed: list[uuid.UUID] = []
        for hold, reached in (
            ("eth_getBalance", "SELECT count(*) FROM orders WHERE quote_uuid = $1"),
            ("simulation", "SELECT count(*) FROM orders WHERE quote_uuid = $1"),
        ):
            deadline = time.monotonic() + 30
            while True:  # the restarted daemon's indexer shows the listing
                status, quote = await post(
                    "/quotes", {"asset_price_source_id": SOURCE, "quantity_tonnes": "1"}
                )
                if status != 404 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert status == 201, quote
            if hold == "simulation":
                proxy.hold_calls(simulation_of_jobs(info["executor"]["address"]))
            else:
                proxy.hold(hold)
            # past the read caches' ages (a head's reads 1 s, the executor's balance
            # ETH_BALANCE_MAX_AGE_S): the next read of it is held
            await asyncio.sleep(max(1.5, ETH_BALANCE_MAX_AGE_S + 0.5))
            answer = asyncio.create_task(
                post("/orders", {"quote_uuid": quote["uuid"], "beneficiary_name": "K"})
            )
            quote_uuid = uuid.UUID(quote["uuid"])
            await _wait_for(db, reached, quote_uuid)
            if hold == "simulation":
                order_id = await db.fetchval("SELECT id FROM orders WHERE quote_uuid = $1", quote_uuid)
                await _wait_for(db, "SELECT count(*) FROM relay_jobs WHERE salt = $1", order_salt(order_id))
            daemon.kill()
            proxy.release()
            await asyncio.gather(answer, return_exceptions=True)  # its connection died with it
            order_id = await db.fetchval("SELECT id FROM orders WHERE quote_uuid = $1", quote_uuid)
            assert await db.fetchval("SELECT job_id FROM orders WHERE id = $1", order_id) is None
            jobs = await db.fetchval("SELECT count(*) FROM relay_jobs WHERE salt = $1", order_salt(order_id))
            assert jobs == (0 if hold == "eth_getBalance" else 1), "killed at the intended step"
            placed.append(order_id)
            daemon = await DaemonProcess("all", env, log).start()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                async with session.get(f"{daemon.base}/orders/{order_id}", headers=headers) as r:
                    order = await r.json()
                if order["status"] in ("COMPLETED", "FAILED"):
                    break
                await asyncio.sleep(0.2)
            assert order["status"] == "COMPLETED", (hold, order)
            assert (
                await db.fetchval("SELECT count(*) FROM relay_jobs WHERE salt = $1", order_salt(order_id))
                == 1
            )
        assert daemon.stop() == 0
        assert len(set(placed)) == 2
