"""Issue 20, half the work per retirement: reads the accept path shares between retirements
(the same checks, fewer JSON-RPC calls), counted through a JSON-RPC proxy on a private chain."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from relayer.chain import codec, multicall
from relayer.chain.multicall import MULTICALL3
from relayer.chain.prober import runtime_code
from relayer.chain.reads import ETH_BALANCE_MAX_AGE_S
from tests.chain_helpers import transact_as_deployer
from tests.conftest import Daemon
from tests.helpers.daemons import behind_proxy
from tests.helpers.relay import challenge, signed_request
from tests.private import Anvil

_OPERATOR_FEE_SELECTOR = codec.function("GasPriceOracleDev", "getOperatorFee").selector.hex()


@pytest.fixture(autouse=True)
def _wide_gathering_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads asked together join one Multicall3 flush within its gathering window (3 ms);
    on a loaded 2-core machine a loop turn took longer than that (the operator fees' reads,
    a loop turn or two after the rest; 13 balances gathered at once), splitting what these
    tests count as one ``eth_call`` into two. The window is 50 ms here: what joins a flush is
    what is tested, not how fast the loop turns."""
    monkeypatch.setattr(multicall, "GATHER_S", 0.05)


async def test_balances_asked_together_share_one_eth_call_at_the_block_they_were_read_at(
    tmp_path: Path, admin_database_url: str
) -> None:
    """The payers' balances at the latest block are read in one Multicall3 ``eth_call``
    (placed by state override: the devnet has no Multicall3), each with the number of the
    block it was read at; the amounts are the token's own ``balanceOf``."""
    async with behind_proxy(tmp_path, admin_database_url, workers=False) as (info, proxy, d):
        reads = d.runtime.services.supply.chain
        usdc = info["contracts"]["usdc"]
        owners = [p["address"] for p in info["payers"]] + [Account.create().address for _ in range(5)]
        singly = [await reads.balance_now(usdc, o) for o in owners]
        head = await reads.latest_block()
        proxy.calls.clear()
        together = await asyncio.gather(*(reads.balance_latest(usdc, o) for o in owners))
        calls = list(proxy.calls)
    assert [b.amount for b in together] == singly and any(singly) and 0 in singly
    assert {b.block_number for b in together} == {head}  # one block per transaction: none mined since
    eth_calls = [json.loads(p) for m, p in calls if m == "eth_call"]
    assert len(eth_calls) == 1 and eth_calls[0][0]["to"] == MULTICALL3, calls
    assert len(eth_calls[0]) == 3 and MULTICALL3 in eth_calls[0][2]  # the code by state override
    assert [m for m, _ in calls if m not in ("eth_blockNumber", "eth_getBlockByNumber")] in (
        ["eth_call"],
        ["eth_getCode", "eth_call"],
    ), calls  # the gauges read the head meanwhile (its block: eth_getBlockByNumber)


async def test_a_payers_balance_at_accept_shares_the_blocks_eth_call_with_its_per_head_reads(
    tmp_path: Path, admin_database_url: str
) -> None:
    """At a new head, the balances read at accept and the block's per-head reads (here the
    carbon classes) go in one Multicall3 ``eth_call`` at the latest block, not one each."""
    async with behind_proxy(tmp_path, admin_database_url, workers=False) as (info, proxy, d):
        reads = d.runtime.services.supply.chain
        usdc, payer = info["contracts"]["usdc"], info["payers"][0]["address"]
        await asyncio.gather(reads.balance_latest(usdc, payer), reads.classes())  # warm
        Anvil(info["rpcUrl"]).mine()
        await reads.latest_block()  # the new head, seen
        proxy.calls.clear()
        balance, classes = await asyncio.gather(reads.balance_latest(usdc, payer), reads.classes())
        calls = list(proxy.calls)
    assert balance.amount > 0 and classes
    assert [m for m, _ in calls if m == "eth_call"] == ["eth_call"], calls


async def test_readers_of_a_credit_not_yet_known_share_one_eth_call(
    tmp_path: Path, admin_database_url: str
) -> None:
    """A burst of requests for a credit (its metadata, cached for good once read) reads it once,
    not once each (45 ``creditInfo`` calls for the first 300 retirements of the benchmark)."""
    async with behind_proxy(tmp_path, admin_database_url, workers=False) as (info, proxy, d):
        reads = d.runtime.services.supply.chain
        token_id = info["credits"][2]["tokenId"]
        proxy.calls.clear()
        credits = await asyncio.gather(*(reads.credit(token_id) for _ in range(20)))
        calls = list(proxy.calls)
        again = await reads.credit(token_id)
        after = len(proxy.calls)
    assert {c.project_id for c in credits} == {info["credits"][2]["projectId"]} and again == credits[0]
    selector = codec.function("CarbonCredits", "creditInfo").selector.hex()
    assert len([p for m, p in calls if m == "eth_call" and selector in p]) == 1, calls
    assert after == len(calls)  # known now: no call at all


def _probes(calls: list[tuple[str, str]]) -> list[list[Any]]:
    """The params of the prober's ``eth_call`` s carrying a ``retireWithAuthorization``'s
    call data among ``calls``, in order: a job's simulation (at its acceptance), then, when
    one is made, its execution before signing (at the block of the re-check's state read)."""
    selector = codec.function("RetirementSettlement", "retireWithAuthorization").selector.hex()
    return [json.loads(p) for m, p in calls if m == "eth_call" and selector in p]


def _a_block_comes_first(d: Daemon) -> Callable[[int], Awaitable[list[Any]]]:
    """The lane's read of the simulated jobs, a block mined (``evm_mine``) whenever it finds
    some: the re-check before signing then runs at a block after their simulation's."""
    rt = d.runtime
    real_next = rt.lane.next_simulated

    async def a_block_comes_first(limit: int) -> list[Any]:
        batch = await real_next(limit)
        if batch:
            await rt.node.request("evm_mine", [])
        return batch

    return a_block_comes_first


async def test_a_job_is_executed_again_before_signing_only_when_a_block_came_since_its_simulation(
    tmp_path: Path, admin_database_url: str
) -> None:
    """The re-check before signing executes a job again (at its gas limit, as the executor)
    only when the latest block is not the block it was simulated at: on the same block nothing
    changed on chain and that execution would repeat the simulation; after a new block it is
    made (griefing protection: the payer may have moved its funds meanwhile), in one
    ``eth_call`` of the batch prober placed at the executor's address by state override."""
    async with behind_proxy(tmp_path, admin_database_url, workers=True) as (info, proxy, d):
        payer = info["payers"][0]
        first, second = [signed_request(await challenge(d, payer, carbonClass="RE", amount="0.01",
                                                        inputToken="USDC"), payer["privateKey"])
                         for _ in range(2)]  # fmt: skip
        await asyncio.sleep(0.5)  # the follower has seen the head: the simulation's block is the latest
        proxy.calls.clear()
        status, answer = await d.post(first)
        assert (status, answer.get("status")) == (200, "settled"), answer
        same_block = _probes(list(proxy.calls))  # the simulation only

        rt = d.runtime
        real_next = rt.lane.next_simulated
        await asyncio.sleep(0.5)
        rt.lane.next_simulated = _a_block_comes_first(d)  # type: ignore[method-assign]
        proxy.calls.clear()
        try:
            status, answer = await d.post(second)
        finally:
            rt.lane.next_simulated = real_next  # type: ignore[method-assign]
        assert (status, answer.get("status")) == (200, "settled"), answer
        new_block = _probes(list(proxy.calls))  # the simulation, then the execution
    assert (len(same_block), len(new_block)) == (1, 2)
    simulation, execution = new_block
    assert int(execution[1], 16) > int(simulation[1], 16)  # at the block mined since
    executor = info["executor"]["address"]
    assert execution[2] == {executor: {"code": runtime_code()}} and execution[0]["to"] == executor


async def test_a_job_signed_in_the_block_it_was_reserved_at_is_read_again_only_for_that_blocks_number(
    tmp_path: Path, admin_database_url: str
) -> None:
    """The re-check before signing reads nothing of a job reserved (its payer's balance and
    its supply checked) and simulated at the block that is still the latest: one
    ``eth_blockNumber``, no state read (balances, listings, classes), no database read of
    the payer's signed jobs or the supply's jobs ahead, no execution. After a new block the
    job is checked again in full: the state read once, its execution made."""
    async with behind_proxy(tmp_path, admin_database_url, workers=True) as (info, proxy, d):
        payer = info["payers"][0]
        first, second = [signed_request(await challenge(d, payer, carbonClass="RE", amount="0.01",
                                                        inputToken="USDC"), payer["privateKey"])
                         for _ in range(2)]  # fmt: skip
        rt = d.runtime
        simulator = rt.simulator
        reads: list[str] = []
        real_state, real_committed, real_ahead = (
            simulator.reads.state_now,
            simulator.jobs.committed,
            simulator.jobs.supply_ahead,
        )

        def counted(name: str, real: Any) -> Any:
            async def read(*args: Any, **kwargs: Any) -> Any:
                reads.append(name)
                return await real(*args, **kwargs)

            return read

        simulator.reads.state_now = counted("state", real_state)  # type: ignore[method-assign]
        simulator.jobs.committed = counted("committed", real_committed)  # type: ignore[method-assign]
        simulator.jobs.supply_ahead = counted("ahead", real_ahead)  # type: ignore[method-assign]
        real_next = rt.lane.next_simulated
        try:
            await asyncio.sleep(0.5)  # the follower has seen the head: the reservation's is the latest
            proxy.calls.clear()
            status, answer = await d.post(first)
            assert (status, answer.get("status")) == (200, "settled"), answer
            same_block, reads[:] = list(reads), []
            unchanged = _probes(list(proxy.calls))[1:]  # after the simulation
            await asyncio.sleep(0.5)
            rt.lane.next_simulated = _a_block_comes_first(d)  # type: ignore[method-assign]
            proxy.calls.clear()
            status, answer = await d.post(second)
            assert (status, answer.get("status")) == (200, "settled"), answer
            new_block = list(reads)
            changed = _probes(list(proxy.calls))[1:]
        finally:
            rt.lane.next_simulated = real_next  # type: ignore[method-assign]
            simulator.reads.state_now = real_state  # type: ignore[method-assign]
            simulator.jobs.committed = real_committed  # type: ignore[method-assign]
            simulator.jobs.supply_ahead = real_ahead  # type: ignore[method-assign]
    assert same_block == [] and len(unchanged) == 0, (same_block, unchanged)
    assert new_block.count("state") == 1 and len(changed) == 1, (new_block, changed)


async def test_the_re_checks_reads_go_out_with_its_executions_at_the_block_asked_first(
    tmp_path: Path, admin_database_url: str
) -> None:
    """Before signing, the latest block is asked first, and the state (balances, listings,
    classes) and what the payers' signed jobs and the supply's jobs ahead take (the
    database) are read at it while the jobs are executed at it (the prober's ``eth_call``):
    one round of round trips after the block's number (issue 20: a signing batch's re-check
    under load), where the state's read went first and named the block of the rest. Here
    the state's and the database's reads wait until the execution has begun: one after the
    other, they would wait in vain."""
    async with behind_proxy(tmp_path, admin_database_url, workers=True) as (info, _proxy, d):
        payer = info["payers"][0]
        body = signed_request(
            await challenge(d, payer, carbonClass="RE", amount="0.01", inputToken="USDC"), payer["privateKey"]
        )
        rt = d.runtime
        simulator = rt.simulator
        executing = asyncio.Event()
        blocks: list[Any] = []
        real_state, real_committed, real_succeed, real_next = (
            simulator.reads.state_now,
            simulator.jobs.committed,
            simulator.executor.calls_succeed,
            rt.lane.next_simulated,
        )

        async def state_now(*args: Any) -> Any:
            await asyncio.wait_for(executing.wait(), 5)  # the execution is under way meanwhile
            state = await real_state(*args)
            blocks.append(("state", state.block))
            return state

        async def committed(*args: Any) -> Any:
            await asyncio.wait_for(executing.wait(), 5)
            blocks.append(("committed", args[-1]))
            return await real_committed(*args)

        async def calls_succeed(*args: Any) -> Any:
            executing.set()
            blocks.append(("executions", args[-1]))
            return await real_succeed(*args)

        simulator.reads.state_now = state_now  # type: ignore[method-assign]
        simulator.jobs.committed = committed  # type: ignore[method-assign]
        simulator.executor.calls_succeed = calls_succeed  # type: ignore[method-assign]
        rt.lane.next_simulated = _a_block_comes_first(d)  # type: ignore[method-assign]
        try:
            status, answer = await d.post(body)
        finally:
            simulator.reads.state_now = real_state  # type: ignore[method-assign]
            simulator.jobs.committed = real_committed  # type: ignore[method-assign]
            simulator.executor.calls_succeed = real_succeed  # type: ignore[method-assign]
            rt.lane.next_simulated = real_next  # type: ignore[method-assign]
    assert (status, answer.get("status")) == (200, "settled"), answer
    assert sorted(name for name, _ in blocks) == ["committed", "executions", "state"], blocks
    assert len({block for _, block in blocks}) == 1, blocks  # all at the block asked first


async def test_a_blocks_per_head_reads_share_one_eth_call_and_a_new_head_reads_them_again(
    tmp_path: Path, admin_database_url: str
) -> None:
    """The reads the jobs of one block share (fee schedule, pool reserves, classes, the
    ETH/USD feed, the L1 fee and the operator fee of each gas limit rounded up to 16,384 gas)
    go in one Multicall3 ``eth_call`` for all of them; asked again at the same head they cost
    nothing; a new head reads them again, all in one ``eth_call`` as soon as the head is seen
    (read ahead, before any is asked; the operator fees with them: the gas limits of a block's
    jobs, nearly each its own, share a few rounded ones), with the same answers as one call
    each."""
    async with behind_proxy(tmp_path, admin_database_url, workers=False) as (info, proxy, d):
        reads = d.runtime.services.supply.chain
        gas = d.runtime.services.relay.simulator.gas
        node = reads.node
        # per head only, for the count: no read is dropped for its age (read_ttl_s), and the
        # gauges' head read (every 5 s) is the one they already made, so no head read of theirs
        # answers after the test's own heads below (a real head observed after them would
        # drop this head's reads: it did once, under the CI rehearsal's load)
        node.read_ttl_s = 3600.0
        node.head_every_s = 3600.0

        async def block_reads() -> list[Any]:
            return list(
                await asyncio.gather(
                    reads.fee_schedule(),
                    reads.reserves(),
                    reads.classes(),
                    gas.eth_price(),
                    *(gas.extra_wei(900, limit) for limit in (300_000, 310_000, 320_000)),
                )
            )

        await block_reads()  # warm: the one-time lookups (Multicall3's code, the oracle's)
        head = await reads.latest_block()
        node.observe_head(head + 1000)  # a new head: every per-head read is stale
        proxy.calls.clear()
        first = await block_reads()
        at_first = list(proxy.calls)
        again = await block_reads()
        at_again = list(proxy.calls)[len(at_first) :]
        node.observe_head(head + 1001)
        proxy.calls.clear()
        await reads.fee_schedule()  # one read: the block's whole working set comes with it
        after_one = list(proxy.calls)
        rest = await block_reads()
        after_rest = list(proxy.calls)
        settlement, pool = info["contracts"]["settlement"], info["contracts"]["pool"]
        singly = [
            await node.call(settlement, codec.function("RetirementSettlement", "fees")),
            await node.call(pool, codec.function("UsdcKvcmPool", "getReserves")),
        ]
        proxy.calls.clear()
        node.observe_head(head + 1002)  # seen, and nothing asked yet: read ahead at once
        for _ in range(100):
            if proxy.calls:
                break
            await asyncio.sleep(0.01)
        ahead = list(proxy.calls)
        assert await reads.fee_schedule() == first[0] and list(proxy.calls) == ahead  # cached
    assert [m for m, _ in ahead] == ["eth_call"], ahead
    assert [m for m, _ in at_first] == ["eth_call"], at_first
    assert json.loads(at_first[0][1])[0]["to"] == MULTICALL3
    assert again == first and at_again == [], at_again
    assert [m for m, _ in after_one] == ["eth_call"], after_one
    assert after_rest == after_one, after_rest  # the operator fees came with the rest
    assert _OPERATOR_FEE_SELECTOR in after_one[0][1] and _OPERATOR_FEE_SELECTOR in at_first[0][1]
    assert rest == first
    fees = first[0]
    figures = (fees.class_fee_bps, fees.class_fee_floor_usdc)
    figures += (fees.listing_fee_bps, fees.listing_fee_floor_usdc)
    assert figures == singly[0]
    assert (first[1].usdc, first[1].kvcm) == singly[1]


async def test_the_operator_fee_is_the_oracles_at_the_gas_limit_rounded_up_to_16384_gas(
    tmp_path: Path, admin_database_url: str
) -> None:
    """The operator fee a plan prices in is the oracle's ``getOperatorFee`` at the gas limit
    rounded up to a multiple of 16,384 gas: never below the gas limit's own fee, above it by
    at most the fee of 16,383 gas, and the gas limits within one step share one read."""
    async with behind_proxy(tmp_path, admin_database_url, workers=False) as (info, proxy, d):
        costs = d.runtime.services.relay.simulator.gas.costs
        node = d.runtime.services.supply.chain.node
        node.read_ttl_s = node.head_every_s = 3600.0  # per head only, for the count
        oracle = "0x420000000000000000000000000000000000000F"
        transact_as_deployer(info, oracle, "GasPriceOracleDev", "setOperatorFee", 3_000_000, 7)
        fee_of = codec.function("GasPriceOracleDev", "getOperatorFee")
        exact = {g: (await node.call(oracle, fee_of, g))[0] for g in (300_000, 311_296, 311_297)}
        await costs.operator_fee(1)  # warm: the one-time lookup of the oracle's code
        node.observe_head(await node.head() + 1000)  # a new head: nothing cached
        proxy.calls.clear()
        shared = await asyncio.gather(costs.operator_fee(300_000), costs.operator_fee(311_296))
        calls = list(proxy.calls)
        above = await costs.operator_fee(311_297)
    assert shared == [exact[311_296], exact[311_296]] and exact[311_296] > exact[300_000] > 7
    assert exact[311_296] - exact[300_000] == (311_296 - 300_000) * 3  # 3 wei a gas (Isthmus)
    assert above == 327_680 * 3 + 7 and above > exact[311_297]
    calls = [(m, p) for m, p in calls if m not in ("eth_blockNumber", "eth_getBlockByNumber")]  # the gauges'
    assert [m for m, _ in calls] == ["eth_call"], calls
    assert calls[0][1].count(_OPERATOR_FEE_SELECTOR + f"{311_296:064x}") == 1  # one read for both
    assert _OPERATOR_FEE_SELECTOR + f"{300_000:064x}" not in calls[0][1]


async def test_the_recheck_reads_its_balances_listings_and_classes_in_one_eth_call_at_one_block(
    tmp_path: Path, admin_database_url: str
) -> None:
    """What the re-check before signing reads on chain (every payer's balance, the listings its
    jobs fill, the classes) is one Multicall3 ``eth_call`` at the latest block, which also
    gives that block's number (no ``eth_blockNumber``); the figures are the contracts' own,
    and a listing that does not exist is None (not a failure of the others)."""
    async with behind_proxy(tmp_path, admin_database_url, workers=False) as (info, proxy, d):
        reads = d.runtime.services.supply.chain
        usdc = info["contracts"]["usdc"]
        owners = [p["address"] for p in info["payers"]] + [Account.create().address]
        singly = [await reads.balance_now(usdc, o) for o in owners]
        classes = await reads.classes()
        listing = (await reads.listings())[0]
        await reads.state_now([(usdc, owners[0])], [], False)  # warm: Multicall3's code looked up
        head = await reads.latest_block()
        proxy.calls.clear()
        state = await reads.state_now([(usdc, o) for o in owners], [listing.listing_id, 10**9], True)
        calls = list(proxy.calls)
    assert [m for m, _ in calls] == ["eth_call"], calls
    assert json.loads(calls[0][1])[0]["to"] == MULTICALL3
    assert state.block == head
    assert [state.balances[(usdc, o)] for o in owners] == singly and any(singly)
    assert state.listings == {listing.listing_id: listing, 10**9: None}
    assert state.classes == classes


BLOCK_S = 0.2
"""The block time of the tests of reads per block (Base's 200 ms blocks)."""
LOOKS_A_BLOCK = 4
"""The head reads of the whole process a block at most: the follower's clock looks about twice
before each block is due and once as it comes (relayer.domain.head_clock), and every other
reader shares those reads or reads within the poll cadence (half a block)."""
AT_BLOCK_TIME = {"block_time_ms": int(BLOCK_S * 1000), "block_poll_interval_s": None}


@asynccontextmanager
async def _mining(info: dict[str, Any]) -> AsyncIterator[list[int]]:
    """The private chain mines a block every :data:`BLOCK_S` (the test's clock, not anvil's
    automine) while inside; yields a one-element list: the blocks mined so far."""
    anvil = Anvil(info["rpcUrl"])
    await asyncio.to_thread(anvil.automine, False)
    mined = [0]
    stop = asyncio.Event()

    async def mine() -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            await asyncio.to_thread(anvil.mine)
            mined[0] += 1
            next_at += BLOCK_S
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    task = asyncio.create_task(mine())
    try:
        yield mined
    finally:
        stop.set()
        await task
        await asyncio.to_thread(anvil.automine, True)


def _head_reads(calls: list[tuple[str, str]]) -> int:
    """The reads of the chain's head among ``calls``: ``eth_blockNumber`` and the latest block."""
    return sum(
        m == "eth_blockNumber" or (m == "eth_getBlockByNumber" and json.loads(p)[0] == "latest")
        for m, p in calls
    )


def _count(calls: list[tuple[str, str]], method: str) -> int:
    return sum(m == method for m, _ in calls)


def _print_reads(what: str, calls: list[tuple[str, str]], seconds: float, blocks: int) -> None:
    """The calls per method over the window (pytest -s)."""
    methods = sorted({m for m, _ in calls}, key=lambda m: -_count(calls, m))
    print(
        f"\n{what}: {blocks} blocks in {seconds:.2f} s, {_head_reads(calls)} head reads; "
        + ", ".join(f"{m} {_count(calls, m)}" for m in methods)
    )


async def test_an_idle_daemon_reads_the_head_a_few_times_a_block_for_the_whole_process(
    tmp_path: Path, admin_database_url: str
) -> None:
    """With 200 ms blocks and nothing to relay, the whole process (follower, catalogue
    indexer, gauges, the node's cached head) reads the head at most four times a block
    (:data:`LOOKS_A_BLOCK`); the indexers read each new confirmed block's logs once between them (one
    ``eth_getLogs``) and the confirmed block's hash from that head, not again; the executor's
    balance at most once every ``ETH_BALANCE_MAX_AGE_S``."""
    async with (
        behind_proxy(tmp_path, admin_database_url, workers=True, **AT_BLOCK_TIME) as (info, proxy, d),
        _mining(info) as mined,
    ):
        await asyncio.sleep(1.0)  # the workers started and follow the mined blocks
        proxy.calls.clear()
        first, started = mined[0], time.monotonic()
        await asyncio.sleep(4.0)
        calls, seconds, blocks = list(proxy.calls), time.monotonic() - started, mined[0] - first
        followed = d.runtime.metrics.indexed_block.labels(str(d.runtime.settings.chain_id))._value.get()
        head = int(await asyncio.to_thread(Anvil(info["rpcUrl"]).rpc, "eth_blockNumber"), 16)
    _print_reads("idle", calls, seconds, blocks)
    assert followed >= head - 3  # the follower kept up meanwhile
    assert blocks >= 10
    assert _head_reads(calls) <= LOOKS_A_BLOCK * blocks + 2, calls
    assert _count(calls, "eth_getLogs") <= blocks + 1, calls
    by_number = [
        p for m, p in calls if m == "eth_getBlockByNumber" and json.loads(p)[0] not in ("latest", "0x0")
    ]
    assert len(by_number) <= 2, by_number  # a block the head read missed, now and then
    assert _count(calls, "eth_getBalance") <= seconds / ETH_BALANCE_MAX_AGE_S + 1, calls


async def test_with_work_the_daemon_reads_the_head_a_few_times_a_block_and_fees_once_a_head(
    tmp_path: Path, admin_database_url: str
) -> None:
    """With 200 ms blocks and retirements under way, the head is still read at most four
    times a block for the whole process (the accept path, the simulations and the workers
    share it), the fee history at most once a head, the executor's balance (the accept
    path's and the lanes' floor check) at most once every ``ETH_BALANCE_MAX_AGE_S``, and each
    new confirmed block's logs once; every retirement settles."""
    async with behind_proxy(tmp_path, admin_database_url, workers=True, **AT_BLOCK_TIME) as (info, proxy, d):
        bodies = [
            signed_request(
                await challenge(d, payer, carbonClass="RE", amount="0.01", inputToken="USDC"),
                payer["privateKey"],
            )
            for payer in info["payers"]
            for _ in range(3)
        ]
        async with _mining(info) as mined:
            await asyncio.sleep(1.0)
            proxy.calls.clear()
            first, started = mined[0], time.monotonic()
            answers = await asyncio.gather(*(d.post(body) for body in bodies))
            await asyncio.sleep(1.0)  # and the reads after the work
            calls, seconds, blocks = list(proxy.calls), time.monotonic() - started, mined[0] - first
    _print_reads(f"{len(bodies)} retirements", calls, seconds, blocks)
    assert [(s, a.get("status")) for s, a in answers] == [(200, "settled")] * len(bodies), answers
    assert blocks >= 5
    assert _head_reads(calls) <= LOOKS_A_BLOCK * blocks + 2, calls
    assert _count(calls, "eth_feeHistory") <= blocks + 1, calls
    assert _count(calls, "eth_getBalance") <= seconds / ETH_BALANCE_MAX_AGE_S + 1, calls
    assert _count(calls, "eth_getLogs") <= blocks + 1, calls


async def test_the_followers_logs_of_a_range_are_read_beside_its_receipts_and_confirmation(
    tmp_path: Path, admin_database_url: str
) -> None:
    """A follower step that indexes a range asks for its ``RetirementSettled`` logs as it
    starts, beside the scan of the head's receipts and the confirmation of the jobs mined
    (issue 20: a block's answers waited for the scan, the confirmation, then the logs' read,
    then the index, one after the other); the index takes that read (one ``eth_getLogs``)."""
    async with behind_proxy(tmp_path, admin_database_url, workers=True) as (info, proxy, d):
        payer = info["payers"][0]
        body = signed_request(
            await challenge(d, payer, carbonClass="RE", amount="0.01", inputToken="USDC"), payer["privateKey"]
        )
        rt = d.runtime
        events: list[tuple[str, int]] = []
        real_logs, real_confirm = rt.blocks.settled_logs, rt.jobs.confirm_mined

        async def settled_logs(from_block: int, to_block: int, to_hash: bytes | None = None) -> Any:
            events.append(("logs", to_block))
            return await real_logs(from_block, to_block, to_hash)

        async def confirm_mined(chain_id: int, through: int) -> Any:
            events.append(("confirm", through))
            await asyncio.sleep(0.05)  # a slow write: the logs' read is under way meanwhile
            events.append(("confirmed", through))
            return await real_confirm(chain_id, through)

        rt.blocks.settled_logs = settled_logs  # type: ignore[method-assign]
        rt.jobs.confirm_mined = confirm_mined  # type: ignore[method-assign]
        try:
            proxy.calls.clear()
            status, answer = await d.post(body)
            calls = list(proxy.calls)
        finally:
            rt.blocks.settled_logs = real_logs  # type: ignore[method-assign]
            rt.jobs.confirm_mined = real_confirm  # type: ignore[method-assign]
    assert (status, answer.get("status")) == (200, "settled"), answer
    confirms = [i for i, (kind, _) in enumerate(events) if kind == "confirm"]
    assert confirms, events
    for i in confirms:  # the range that step indexes was asked for before its confirmation
        through = events[i][1]
        assert ("logs", through) in events[:i], events
    mined = int(answer["retirements"][0]["blockNumber"])
    # one eth_getLogs a range: the index took the read made ahead
    ranges = [json.loads(p)[0] for m, p in calls if m == "eth_getLogs"]
    assert sum(int(r["fromBlock"], 16) <= mined <= int(r["toBlock"], 16) for r in ranges) == 1, ranges
