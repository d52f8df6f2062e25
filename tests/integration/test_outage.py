"""Upstream outages answer the spec's retryable 503 where the action lists it (else the
retryable internal_error naming the upstream), never an unhandled 500: a daemon (HTTP only)
reaches its chain node and its database through TCP forwarders that the test cuts and
restores."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import pytest
from aiohttp import web
from pydantic import SecretStr

from relayer.app import open_runtime, web_runner
from tests.conftest import Daemon, free_port
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration


@dataclass
class Site:
    base: str
    session: aiohttp.ClientSession
    rpc: TcpProxy
    db: TcpProxy
    daemon: Daemon

    async def get(self, path: str, **params: Any) -> tuple[int, dict[str, Any]]:
        async with self.session.get(f"{self.base}{path}", params=params) as r:
            return r.status, await r.json(content_type=None)

    async def post(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        async with self.session.post(f"{self.base}/api", json=body) as r:
            return r.status, await r.json(content_type=None)


@pytest.fixture
async def site(daemon: Daemon, database_url: str) -> AsyncIterator[Site]:
    rpc_url = urlsplit(daemon.runtime.settings.rpc_url)
    db_url = urlsplit(database_url)
    assert rpc_url.port and db_url.port and db_url.hostname, "outage tests need URL-form upstreams"
    rpc = TcpProxy(rpc_url.hostname or "127.0.0.1", rpc_url.port)
    db = TcpProxy(db_url.hostname, db_url.port)
    await rpc.start()
    await db.start()
    user = f"{db_url.username}@" if db_url.username else ""
    dsn = urlunsplit((db_url.scheme, f"{user}127.0.0.1:{db.port}", db_url.path, db_url.query, ""))
    port = free_port()
    settings = daemon.runtime.settings.model_copy(
        update={
            "database_url": SecretStr(dsn),
            "rpc_url": f"http://127.0.0.1:{rpc.port}",
            "http_port": port,
            "settle_wait_s": 5.0,
        }
    )
    async with open_runtime(settings, workers=False) as rt:
        runner = web_runner(rt)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                yield Site(f"http://127.0.0.1:{port}", session, rpc, db, daemon)
        finally:
            await rpc.start()  # let the runtime close its connections normally
            await db.start()
            await runner.cleanup()
    await rpc.cut()
    await db.cut()


# The actions whose codes (spec: Errors, per action) include the upstream 503.
_UPSTREAM_CODE_ACTIONS = ("prepare-auth", "actions/retire")


def _unavailable(status: int, body: dict[str, Any], upstream: str, action: str = "actions/retire") -> bool:
    """An outage's answer: the retryable 503 ``gas_estimate_unavailable`` where the action lists
    it, else the retryable ``internal_error`` (the only common code that says "retry") with the
    outage as ``cause``; both name the ``upstream``."""
    if action in _UPSTREAM_CODE_ACTIONS:
        expected: tuple[Any, ...] = (503, "gas_estimate_unavailable", upstream)
        return (status, body.get("error"), body.get("upstream")) == expected
    expected = (500, "internal_error", upstream, "gas_estimate_unavailable")
    return (status, body.get("error"), body.get("upstream"), body.get("cause")) == expected


def _retire(site: Site, **extra: Any) -> dict[str, Any]:
    return {
        "action": "actions/retire",
        "carbonClass": "NBO",
        "amount": "1",
        "from": site.daemon.chain["payers"][0]["address"],
        "details": {"beneficiaryIsPayer": True},
        **extra,
    }


async def test_a_node_outage_answers_503_and_recovers(site: Site) -> None:
    status, _ = await site.get("/api/quote", carbonClass="NBO", amount="1")
    assert status == 200
    await site.rpc.cut()
    await asyncio.sleep(1.1)  # past the per-head read cache's time limit
    payer = site.daemon.chain["payers"][0]["address"]
    actions = ("discover", "quote", "quote", "prepare-auth", "prepare/retire", "actions/retire")
    answers = await asyncio.gather(
        site.get("/api/discover"),
        site.get("/api/quote", carbonClass="NBO", amount="1"),
        site.get("/api/quote", listingId="1", amount="1"),
        site.get(
            "/api/prepare-auth",
            carbonClass="NBO",
            amount="1",
            **{"from": payer, "details.beneficiaryIsPayer": "true"},
        ),
        site.get("/api/prepare/retire", carbonClass="NBO", amount="1", **{"from": payer}),
        site.post(_retire(site)),
    )
    for action, (status, body) in zip(actions, answers, strict=True):
        assert _unavailable(status, body, "chain node", action), (action, status, body)
        assert body["x402FacilitatorVersion"] == 2 and "127.0.0.1" not in body["message"]
    status, ready = await site.get("/readyz")
    assert (status, ready["status"]) == (503, "not_ready")
    await site.rpc.start()
    status, body = await site.get("/api/quote", carbonClass="NBO", amount="1")
    assert status == 200, body


async def test_a_database_outage_answers_503_and_recovers(site: Site) -> None:
    status, body = await site.get("/api/certificate", txHash="0x" + "ab" * 32)
    assert (status, body["error"]) == (404, "retirement_not_found")
    status, challenge = await site.post(_retire(site))
    assert status == 402, challenge
    signed = challenge["actionsRetireRequest"]
    signed["authPayload"]["signature"] = "0x" + "11" * 64 + "1b"
    await site.db.cut()
    for status, body in await asyncio.gather(
        site.get("/api/certificate", txHash="0x" + "ab" * 32), site.post(signed)
    ):
        action = "actions/retire" if status == 503 else "certificate"
        assert _unavailable(status, body, "database", action), (status, body)
        assert "postgres" not in body["message"].lower()
    status, _ = await site.get("/api/quote", carbonClass="NBO", amount="1")
    assert status == 200  # the catalogue does not need the database
    status, ready = await site.get("/readyz")
    assert (status, ready["status"]) == (503, "not_ready")
    await site.db.start()
    status, body = await site.get("/api/certificate", txHash="0x" + "ab" * 32)
    assert (status, body["error"]) == (404, "retirement_not_found"), body


async def test_outages_are_answered_not_crashes(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    """discover lists no code of its own (spec: Errors): an outage answers the retryable
    internal_error naming the upstream, deliberately (no unhandled exception behind it)."""
    await site.rpc.cut()
    await site.db.cut()
    await asyncio.sleep(1.1)
    results = await asyncio.gather(*(site.get("/api/discover") for _ in range(5)))
    assert all(_unavailable(s, b, "chain node", "discover") for s, b in results), results
    assert not [r for r in caplog.records if r.getMessage() == "unhandled error"]
    async with site.session.get(f"{site.base}/metrics") as r:
        text = await r.text()
    assert 'relayer_http_error_responses_total{code="internal_error"} 5.0' in text
    assert "relayer_http_unhandled_errors_total 0.0" in text


@pytest.mark.parametrize("mode", ["html", "empty", "null", "0x", "array"])
async def test_a_node_that_answers_garbage_is_unavailable_not_a_crash(mode: str) -> None:
    """An HTML maintenance page, an empty body, a null result, "0x" from a lagging node or a
    bare array: each is the node failing (503), never an exception that would give a 500."""
    from relayer.chain import codec
    from relayer.chain.blocks import BlockReader
    from relayer.chain.errors import ChainUnavailable
    from relayer.chain.executor import ExecutorChain
    from relayer.chain.reads import ChainReads

    async def answer(request: web.Request) -> web.Response:
        call = await request.json()
        if mode == "html":
            return web.Response(text="<html>maintenance</html>", content_type="text/html")
        if mode == "empty":
            return web.Response(body=b"")
        if mode == "array":
            return web.json_response([1, 2])
        result = None if mode == "null" else "0x"
        if isinstance(call, list):  # a JSON-RPC batch
            return web.json_response([{"jsonrpc": "2.0", "id": c["id"], "result": result} for c in call])
        return web.json_response({"jsonrpc": "2.0", "id": call["id"], "result": result})

    runner, node = await _scripted_node(answer)
    contracts = node.contracts
    retire = codec.function("RetirementSettlement", "retireWithAuthorization")
    try:
        reads, executor, follower = ChainReads(node), ExecutorChain(node), BlockReader(node)
        for call in (
            reads.reserves,
            reads.classes,
            lambda: reads.permit_nonce(contracts.usdc),
            executor.fee_market,
            lambda: executor.mined_nonce(contracts.usdc),
            lambda: executor.pending_nonce(contracts.usdc),
            lambda: executor.estimate_gas(contracts.usdc, contracts.settlement, b"\x00" * 4),
            node.check,
            follower.head,
            follower.head_block,
            lambda: follower.block_hash(1),
            lambda: follower.block_timestamps({1, 2}),
            lambda: follower.block_receipts(1),
            lambda: follower.settled_logs(1, 2),
        ):
            with pytest.raises(ChainUnavailable):
                await call()
        # Batched: a garbled batch fails as a whole; a garbled answer to one call is that
        # call's failure, never a success.
        for batched in (
            lambda: executor.send_raw_many([b"\x02", b"\x03"]),
            lambda: executor.calls_succeed(
                contracts.usdc, [(contracts.settlement, b"\x00" * 4, 10**6, retire)] * 2
            ),
        ):
            try:
                outcomes = await batched()
            except ChainUnavailable:
                continue
            assert mode in ("null", "0x") and len(outcomes) == 2, outcomes
            assert all(isinstance(o, ChainUnavailable) or o is False for o in outcomes), outcomes
    finally:
        await node.close()
        await runner.cleanup()


async def test_json_rpc_batches_against_awkward_nodes() -> None:
    """Answers out of order, an unhashable or boolean id, a string error member: each call
    gets its own answer or error, never another's, never a crash. A node that refuses
    batches (one error object) gets the calls one by one; a failure after the first batch
    keeps the earlier batches' answers."""
    from relayer.chain.errors import ChainUnavailable
    from relayer.chain.node import BATCH_MAX

    mode = "shuffled"
    singles = 0

    async def answer(request: web.Request) -> web.Response:
        nonlocal singles
        call = await request.json()
        if not isinstance(call, list):
            singles += 1
            return web.json_response({"jsonrpc": "2.0", "id": call["id"], "result": "0x01"})
        if mode == "refuses":
            return web.json_response(
                {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "no"}}
            )
        if mode == "second fails" and len(call) < BATCH_MAX:
            return web.Response(status=502)
        replies: list[Any] = [
            {"jsonrpc": "2.0", "id": c["id"], "result": hex(c["id"] + 1)} for c in reversed(call)
        ]
        replies[0] = {"jsonrpc": "2.0", "id": call[-1]["id"], "error": "a bare string"}
        replies.append({"jsonrpc": "2.0", "id": [0], "result": "0x99"})  # unhashable
        replies.append({"jsonrpc": "2.0", "id": True, "result": "0x99"})  # True == 1
        return web.json_response(replies)

    runner, node = await _scripted_node(answer)
    calls = [("eth_blockNumber", [])] * 5
    try:
        got = await node.batch(calls)
        assert [a.get("result") for a in got] == ["0x1", "0x2", "0x3", "0x4", None]  # each its own
        assert got[-1]["error"] == "a bare string"
        mode = "refuses"
        assert [a["result"] for a in await node.batch(calls)] == ["0x01"] * 5 and singles == 5
        mode = "second fails"
        got = await node.batch([("eth_blockNumber", [])] * (BATCH_MAX + 3))
        assert all("result" in a for a in got[: BATCH_MAX - 1])  # the last one of each: the string error
        assert len(got) == BATCH_MAX + 3 and all("error" in a for a in got[BATCH_MAX - 1 :])
        with pytest.raises(ChainUnavailable):  # the first batch failed: nothing is known
            await node.batch([("eth_blockNumber", [])] * 3)
    finally:
        await node.close()
        await runner.cleanup()


async def _scripted_node(answer: Any) -> tuple[web.AppRunner, Any]:
    """A JSON-RPC node on loopback that answers with ``answer`` (an aiohttp handler), and a
    ChainNode on it (placeholder contract addresses); the caller closes both."""
    from relayer.chain.node import ChainNode
    from relayer.chain.types import Contracts

    app = web.Application()
    app.router.add_post("/", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    keys = ("usdc", "kvcm", "carbonCredits", "carbonClasses", "pool", "marketplace", "settlement")
    contracts = Contracts.from_deployment(dict.fromkeys(keys, "0x" + "11" * 20))
    return runner, ChainNode(f"http://127.0.0.1:{port}/", 84532, contracts)
