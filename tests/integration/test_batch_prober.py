"""Issue 20, half the work per retirement: the re-check before signing executes a whole batch
in one ``eth_call`` (the batch prober placed at the executor's address by state override)
with the verdicts of one independent ``eth_call`` each, on a private chain, counted through a
JSON-RPC proxy; a node that refuses state overrides gets one ``eth_call`` each."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from eth_abi.exceptions import DecodingError
from eth_account import Account

from relayer.chain import codec
from relayer.chain.calls import relayed_function
from relayer.chain.executor import ExecutorChain
from relayer.chain.node import ChainNode
from relayer.chain.prober import PROBER_GAS_MAX, runtime_code
from relayer.chain.types import Contracts
from relayer.domain import eip712
from tests.private import Anvil, private_chain
from tests.processes import RpcProxy

pytestmark = pytest.mark.integration

TRANSFER = relayed_function("transfer", "eip3009")  # a transfer job's transferWithAuthorization
RECEIVE = codec.function("UsdcEip3009", "receiveWithAuthorization")  # only the payee may call it
GAS = 200_000
Call = tuple[str, bytes, int, codec.FunctionAbi]


@asynccontextmanager
async def _executor(
    tmp_path: Path, admin_database_url: str
) -> AsyncIterator[tuple[dict[str, Any], RpcProxy, ExecutorChain]]:
    """A private chain, a JSON-RPC proxy counting the calls to it, and the executor's chain
    access through the proxy."""
    async with private_chain(tmp_path, admin_database_url) as (info, _dsn), RpcProxy(info["rpcUrl"]) as proxy:
        node = ChainNode(proxy.url, 84532, Contracts.from_deployment(info["contracts"]))
        try:
            yield info, proxy, ExecutorChain(node)
        finally:
            await node.close()


def _authorization(info: dict[str, Any], key: str, to: str, value: int, *, receive: bool = False) -> bytes:
    """Call data of an EIP-3009 ``transferWithAuthorization`` (``receiveWithAuthorization``
    when ``receive``) of ``value`` USDC atomic units from ``key``'s account to ``to``, signed
    now (valid for an hour, a fresh nonce)."""
    usdc, payer, nonce = info["contracts"]["usdc"], Account.from_key(key).address, os.urandom(32)
    valid_before = int(time.time()) + 3600
    fields: dict[str, Any] = {"chain_id": 84532, "usdc": usdc, "payer": payer, "value": value,
                              "valid_after": 0, "valid_before": valid_before, "nonce": nonce}  # fmt: skip
    typed = (
        eip712.receive_with_authorization(settlement=to, **fields)
        if receive
        else eip712.transfer_with_authorization(to=to, **fields)
    )
    signed = Account.sign_typed_data(key, full_message=typed)
    function = RECEIVE if receive else TRANSFER
    r, s = signed.r.to_bytes(32, "big"), signed.s.to_bytes(32, "big")
    return function.encode(payer, to, value, 0, valid_before, nonce, signed.v, r, s)


async def _independent(rpc_url: str, sender: str, calls: Sequence[Call]) -> list[bool]:
    """Whether each call succeeds at the latest block as ``sender`` within its gas limit and
    returns what its function returns: one ``eth_call`` each, straight to the node."""
    verdicts = []
    async with aiohttp.ClientSession() as session:
        for to, data, gas, function in calls:
            tx = {"from": sender, "to": to, "data": "0x" + data.hex(), "gas": hex(gas)}
            body = {"jsonrpc": "2.0", "id": 1, "method": "eth_call", "params": [tx, "latest"]}
            async with session.post(rpc_url, json=body) as response:
                answer = await response.json()
            try:
                function.decode(bytes.fromhex(answer["result"][2:]))
                verdicts.append("error" not in answer)
            except (KeyError, ValueError, DecodingError):
                verdicts.append(False)
    return verdicts


def _send(info: dict[str, Any], to: str, data: bytes) -> None:
    """Mine ``data`` to ``to`` from the executor (an unlocked anvil account)."""
    anvil = Anvil(info["rpcUrl"])
    tx = {"from": info["executor"]["address"], "to": to, "data": "0x" + data.hex()}
    tx_hash = anvil.rpc("eth_sendTransaction", tx)
    for _ in range(100):
        receipt = anvil.rpc("eth_getTransactionReceipt", tx_hash)
        if receipt is not None:
            assert receipt["status"] == "0x1", receipt
            return
        time.sleep(0.05)
    raise AssertionError(f"{tx_hash} not mined")


def _methods(proxy: RpcProxy) -> list[tuple[str, list[Any]]]:
    return [(m, json.loads(p)) for m, p in proxy.calls]


def _with_one_used(info: dict[str, Any]) -> tuple[str, str, list[str], list[str], bytes]:
    """(USDC, the executor, the payers' keys and addresses, an authorization of the first payer
    to the second already used on chain)."""
    usdc, executor = info["contracts"]["usdc"], info["executor"]["address"]
    keys = [p["privateKey"] for p in info["payers"]]
    addresses = [p["address"] for p in info["payers"]]
    used = _authorization(info, keys[0], addresses[1], 1)
    _send(info, usdc, used)
    return usdc, executor, keys, addresses, used


async def test_a_batch_is_executed_in_one_eth_call_with_the_verdicts_of_one_eth_call_each(
    tmp_path: Path, admin_database_url: str
) -> None:
    """Good transfers, an authorization already used, a payer without balance, and
    ``receiveWithAuthorization`` (only its payee may call it: good when it pays the executor,
    a revert when it pays another) give, in one ``eth_call`` that sends no ``from`` and places
    the prober's code at the executor's address, the verdicts of one ``eth_call`` each as the
    executor."""
    async with _executor(tmp_path, admin_database_url) as (info, proxy, chain):
        usdc, executor, keys, addresses, used = _with_one_used(info)
        broke = Account.create()
        calls: list[Call] = [
            (usdc, _authorization(info, keys[0], addresses[1], 10), GAS, TRANSFER),
            (usdc, used, GAS, TRANSFER),
            (usdc, _authorization(info, keys[1], addresses[2], 20), GAS, TRANSFER),
            (usdc, _authorization(info, "0x" + bytes(broke.key).hex(), addresses[0], 1), GAS, TRANSFER),
            (usdc, _authorization(info, keys[1], executor, 30, receive=True), GAS, RECEIVE),
            (usdc, _authorization(info, keys[1], addresses[0], 30, receive=True), GAS, RECEIVE),
            (usdc, _authorization(info, keys[2], addresses[0], 40), GAS, TRANSFER),
        ]
        proxy.calls.clear()
        got = await chain.calls_succeed(executor, calls)
        sent = _methods(proxy)
        independent = await _independent(info["rpcUrl"], executor, calls)
    assert got == independent == [True, False, True, False, True, False, True]
    assert [m for m, _ in sent] == ["eth_call"], sent
    tx, block, override = sent[0][1]
    assert tx["to"] == executor and "from" not in tx and block == "latest"
    assert override == {executor: {"code": runtime_code()}}


async def test_no_execution_sees_another_ones_state_changes(tmp_path: Path, admin_database_url: str) -> None:
    """Executions in one prober call are independent: the same authorization twice succeeds
    twice (the first's use of it is undone), and a transfer from an account without funds
    fails beside the transfer that funds it, though it succeeds once that one is mined."""
    async with _executor(tmp_path, admin_database_url) as (info, proxy, chain):
        usdc, executor = info["contracts"]["usdc"], info["executor"]["address"]
        payer = info["payers"][0]
        middle = Account.create()
        fund = _authorization(info, payer["privateKey"], middle.address, 5_000)
        onward = _authorization(info, "0x" + bytes(middle.key).hex(), payer["address"], 5_000)
        proxy.calls.clear()
        twice = await chain.calls_succeed(executor, [(usdc, fund, GAS, TRANSFER)] * 2)
        chained = await chain.calls_succeed(
            executor, [(usdc, fund, GAS, TRANSFER), (usdc, onward, GAS, TRANSFER)]
        )
        sent = [m for m, _ in _methods(proxy)]
        independent = await _independent(info["rpcUrl"], executor, [(usdc, onward, GAS, TRANSFER)])
        _send(info, usdc, fund)
        after = await chain.calls_succeed(executor, [(usdc, onward, GAS, TRANSFER)])
    assert twice == [True, True]
    assert chained == [True, False] and independent == [False]
    assert after == [True]
    assert sent == ["eth_call", "eth_call"]


async def test_each_execution_gets_exactly_its_gas_limit(tmp_path: Path, admin_database_url: str) -> None:
    """A call succeeds in the prober at the lowest gas limit at which its own ``eth_call``
    succeeds, and fails one gas below it; a batch whose calls all run out of gas is run in
    full in one prober call (its gas is enough for them all); calls whose gas passes one
    ``eth_call``'s bound go in more prober calls of the same round trip, with the same
    verdicts."""
    async with _executor(tmp_path, admin_database_url) as (info, proxy, chain):
        usdc, executor = info["contracts"]["usdc"], info["executor"]["address"]
        payer = info["payers"][0]
        data = _authorization(info, payer["privateKey"], info["payers"][1]["address"], 7)
        low, high = 21_000, GAS  # fails at low, succeeds at high
        assert await _independent(info["rpcUrl"], executor, [(usdc, data, high, TRANSFER)]) == [True]
        while high - low > 1:
            middle = (low + high) // 2
            ok = await _independent(info["rpcUrl"], executor, [(usdc, data, middle, TRANSFER)])
            low, high = (low, middle) if ok == [True] else (middle, high)
        edge = await chain.calls_succeed(
            executor, [(usdc, data, high, TRANSFER), (usdc, data, low, TRANSFER)]
        )
        proxy.calls.clear()
        starved = await chain.calls_succeed(executor, [(usdc, data, low, TRANSFER)] * 60)
        starved_sent = [m for m, _ in _methods(proxy)]
        big = PROBER_GAS_MAX * 2 // 5  # two fit in one prober call, not three
        proxy.calls.clear()
        large = await chain.calls_succeed(executor, [(usdc, data, big, TRANSFER)] * 3)
        sent = _methods(proxy)
    assert edge == [True, False], (low, high)
    assert starved == [False] * 60 and starved_sent == ["eth_call"]  # none left unrun, asked again
    assert large == [True] * 3
    assert [m for m, _ in sent] == ["eth_call", "eth_call"], sent
    assert all(len(params) == 3 and int(params[0]["gas"], 16) <= PROBER_GAS_MAX for _, params in sent)
    assert len({json.dumps(params[2]) for _, params in sent}) == 1  # the same override


async def test_a_node_that_refuses_state_overrides_gets_one_eth_call_each_from_then_on(
    tmp_path: Path, admin_database_url: str
) -> None:
    """A prober call answered with a revert is checked with one ``eth_call`` each that time
    only; a node that refuses the state override (an error that is no revert) is asked one
    ``eth_call`` each, with the same verdicts, that time and from then on, and a batch
    simulation asks it nothing (each job is simulated with its own ``eth_estimateGas``)."""
    async with _executor(tmp_path, admin_database_url) as (info, proxy, chain):
        usdc, executor, keys, addresses, used = _with_one_used(info)
        calls: list[Call] = [
            (usdc, _authorization(info, keys[0], addresses[1], 10), GAS, TRANSFER),
            (usdc, used, GAS, TRANSFER),
            (usdc, _authorization(info, keys[1], executor, 30, receive=True), GAS, RECEIVE),
        ]
        expected = await _independent(info["rpcUrl"], executor, calls)
        answer: dict[str, Any] = {"code": 3, "message": "execution reverted", "data": "0x"}
        proxy.refuse = lambda c: answer if c["method"] == "eth_call" and len(c["params"]) > 2 else None
        runs = []
        for refusal in (
            {"code": 3, "message": "execution reverted", "data": "0x"},
            {"code": -32602, "message": "too many arguments, want at most 2"},
            None,  # not asked again: remembered
        ):
            answer = refusal or answer
            proxy.calls.clear()
            runs.append((await chain.calls_succeed(executor, calls), _methods(proxy)))
        proxy.calls.clear()
        simulated = await chain.simulate_many(executor, [c[:2] + c[3:] for c in calls], 1_500_000, 1)
        simulation_calls = _methods(proxy)
    assert simulated == [None] * 3 and simulation_calls == []  # each job: its own eth_estimateGas
    assert expected == [True, False, True]
    for got, _sent in runs:
        assert got == expected
    overrides = [[len(params) == 3 for m, params in sent if m == "eth_call"] for _, sent in runs]
    assert overrides == [[True, False, False, False], [True, False, False, False], [False, False, False]]
    assert all(params[0]["from"] == executor for _, sent in runs for _, params in sent if len(params) == 2)


async def test_a_batch_simulation_gives_each_call_the_gas_eth_estimate_gas_gives_in_one_eth_call(
    tmp_path: Path, admin_database_url: str
) -> None:
    """The simulation of many jobs (``simulate_many``) executes them in one prober ``eth_call``
    at the block asked, each within the gas cap: a call that succeeds gets the gas limit its
    own ``eth_estimateGas`` answers (within 1 %; a transaction at it plus the plan's margin
    succeeds), one that reverts or needs more than the cap gets None (its own
    ``eth_estimateGas`` names why)."""
    async with _executor(tmp_path, admin_database_url) as (info, proxy, chain):
        usdc, executor, keys, addresses, used = _with_one_used(info)
        broke = Account.create()
        calls = [
            (usdc, _authorization(info, keys[0], addresses[1], 10), TRANSFER),
            (usdc, used, TRANSFER),
            (usdc, _authorization(info, keys[1], executor, 30, receive=True), RECEIVE),
            (usdc, _authorization(info, "0x" + bytes(broke.key).hex(), addresses[0], 1), TRANSFER),
            (usdc, _authorization(info, keys[2], addresses[0], 40), TRANSFER),
        ]
        head = int(Anvil(info["rpcUrl"]).rpc("eth_blockNumber"), 16)
        proxy.calls.clear()
        got = await chain.simulate_many(executor, calls, 1_500_000, head)
        sent = _methods(proxy)
        good = (calls[0], calls[2], calls[4])
        estimates = [await chain.estimate_gas(executor, to, data) for to, data, _f in good]
        proxy.calls.clear()
        over_cap = await chain.simulate_many(executor, [calls[0]], estimates[0] - 1, head)
        margin = [
            await _independent(info["rpcUrl"], executor, [(to, data, g * 12 // 10, f)])
            for (to, data, f), g in zip(good, (got[0], got[2], got[4]), strict=True)
        ]
    assert [g is None for g in got] == [False, True, False, True, False]
    for g, estimate in zip((got[0], got[2], got[4]), estimates, strict=True):
        assert g is not None and abs(g - estimate) <= estimate // 100, (g, estimate)
    assert margin == [[True]] * 3
    assert over_cap == [None]
    assert [m for m, _ in sent] == ["eth_call"], sent
    tx, block, override = sent[0][1]
    assert tx["to"] == executor and "from" not in tx and block == hex(head)
    assert override == {executor: {"code": runtime_code()}}
