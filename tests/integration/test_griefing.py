"""A hostile payer cannot make the executor pay (issue 7): concurrent authorizations beyond the
payer's balance, funds moved away after acceptance, and throwaway keys with no funds are all
refused before anything is signed, and cost no executor gas. Counts printed (-s)."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from relayer.domain.eip712 import RECEIVE_WITH_AUTHORIZATION_FIELDS
from relayer.domain.states import JobState
from relayer.workers.gauges import GAUGE_INTERVAL_S
from tests.chain_helpers import transact_as_deployer
from tests.conftest import Daemon, free_port
from tests.helpers.relay import challenge, signed_request
from tests.private import daemon_settings, private_chain, serving
from tests.processes import RpcProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _as_deployer(chain: dict[str, Any], contract: str, name: str, *args: Any) -> None:
    key = {"UsdcEip3009": "usdc", "KlimaVcm": "kvcm"}[contract]
    transact_as_deployer(chain, chain["contracts"][key], contract, name, *args)


def _move_away(chain: dict[str, Any], payer: dict[str, str], value: int) -> None:
    """The payer empties its balance with a gasless EIP-3009 transfer that someone else
    (here the deployer) submits: what a griefer would do after its request was accepted."""
    nonce = os.urandom(32)
    typed = {
        "domain": {
            "name": "USDC",
            "version": "2",
            "chainId": chain["chainId"],
            "verifyingContract": chain["contracts"]["usdc"],
        },
        # EIP-3009's TransferWithAuthorization has the fields of ReceiveWithAuthorization
        "types": {"TransferWithAuthorization": RECEIVE_WITH_AUTHORIZATION_FIELDS},
        "primaryType": "TransferWithAuthorization",
        "message": {
            "from": payer["address"],
            "to": chain["deployer"]["address"],
            "value": value,
            "validAfter": 0,
            "validBefore": 2**48,
            "nonce": nonce,
        },
    }
    sig = Account.sign_typed_data(payer["privateKey"], full_message=typed)
    _as_deployer(
        chain,
        "UsdcEip3009",
        "transferWithAuthorization",
        payer["address"],
        chain["deployer"]["address"],
        value,
        0,
        2**48,
        nonce,
        sig.v,
        sig.r.to_bytes(32, "big"),
        sig.s.to_bytes(32, "big"),
    )


async def _seen_funded(d: Daemon, payer: dict[str, str], amount: int) -> None:
    """Wait (bounded) until the daemon reads ``amount`` in the payer's balance: its reads are
    cached per head, and the funding block may be newer than the head it last saw."""
    usdc = d.chain["contracts"]["usdc"]
    for _ in range(100):
        if (await d.runtime.reads.balance(usdc, payer["address"])).amount >= amount:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the daemon never saw the payer funded")


def _fresh_payer() -> dict[str, str]:
    account = Account.create()
    return {"address": account.address, "privateKey": "0x" + bytes(account.key).hex()}


async def _signed_by(d: Daemon, payer: dict[str, str], count: int) -> list[dict[str, Any]]:
    """``count`` distinct signed retirements (0.01 t of class RE in USDC) by ``payer``."""
    bodies = []
    for _ in range(count):
        ch = await challenge(d, payer, carbonClass="RE", amount="0.01", inputToken="USDC")
        bodies.append(signed_request(ch, payer["privateKey"]))
    return bodies


async def _jobs_of(d: Daemon, payer: str) -> list[Any]:
    return await d.runtime.db.fetch("SELECT state FROM relay_jobs WHERE payer = $1", payer)


async def _reverted_on_chain(d: Daemon, payer: str) -> int:
    """Executor transactions of ``payer``'s jobs that were mined and reverted."""
    value = await d.runtime.db.fetchval(
        "SELECT count(*) FROM relay_jobs WHERE payer = $1 AND state = 'reverted'", payer
    )
    return int(value)


def _refused_for_balance(status: int, body: dict[str, Any]) -> bool:
    return (
        status == 422
        and body.get("error") == "contract_revert"
        and body["decoded"]["errorName"] == "ERC20InsufficientBalance"
    )


async def test_a_payer_who_can_afford_one_of_ten_concurrent_authorizations_gets_one(daemon: Daemon) -> None:
    payer = _fresh_payer()
    bodies = await _signed_by(daemon, payer, 10)
    value = int(bodies[0]["authPayload"]["value"])
    assert all(int(b["authPayload"]["value"]) == value for b in bodies)
    # Funded just now: the daemon's cached head may predate it; it reads again before refusing.
    _as_deployer(daemon.chain, "UsdcEip3009", "mint", payer["address"], value + value // 2)  # 1.5 of them
    executor = daemon.chain["executor"]["address"]
    nonce_before = await daemon.runtime.executor.pending_nonce(executor)

    answers = await asyncio.gather(*(daemon.post(b) for b in bodies))

    settled = [r for s, r in answers if (s, r.get("status")) == (200, "settled")]
    refused = [(s, r) for s, r in answers if _refused_for_balance(s, r)]
    assert (len(settled), len(refused)) == (1, 9), answers
    assert all(r["decoded"]["args"]["needed"] == str(value) for _, r in refused)
    # Nothing of the nine was recorded, simulated or signed; the executor sent one transaction.
    assert [r["state"] for r in await _jobs_of(daemon, payer["address"])] == [JobState.INDEXED.value]
    assert await daemon.runtime.executor.pending_nonce(executor) == nonce_before + 1
    assert await _reverted_on_chain(daemon, payer["address"]) == 0
    print("\n1 of 10 affordable: settled 1, refused 9 before signing (contract_revert), executor reverts 0")


async def test_throwaway_keys_with_no_funds_cost_no_row_and_no_executor_gas(daemon: Daemon) -> None:
    payers = [_fresh_payer() for _ in range(300)]
    bodies = [(await _signed_by(daemon, p, 1))[0] for p in payers]
    executor = daemon.chain["executor"]["address"]
    nonce_before = await daemon.runtime.executor.pending_nonce(executor)
    rows_before = await daemon.runtime.db.fetchval("SELECT count(*) FROM relay_jobs")

    answers = []
    for start in range(0, len(bodies), 50):
        answers += await asyncio.gather(*(daemon.post(b) for b in bodies[start : start + 50]))

    assert all(_refused_for_balance(s, r) for s, r in answers), [a for a in answers if a[0] != 422][:3]
    assert all(r["decoded"]["args"]["balance"] == "0" for _, r in answers)
    assert await daemon.runtime.db.fetchval("SELECT count(*) FROM relay_jobs") == rows_before
    assert await daemon.runtime.executor.pending_nonce(executor) == nonce_before
    print(f"\n{len(payers)} throwaway keys: refused {len(answers)} (contract_revert), rows 0, executor gas 0")


async def test_funds_moved_away_after_acceptance_are_refused_before_signing(daemon: Daemon) -> None:
    """The re-simulation of the signing batch: a job simulated while the payer could pay, whose
    payer then emptied its balance, is refused before it is signed."""
    payer = _fresh_payer()
    [body] = await _signed_by(daemon, payer, 1)
    value = int(body["authPayload"]["value"])
    _as_deployer(daemon.chain, "UsdcEip3009", "mint", payer["address"], value)
    await _seen_funded(daemon, payer, value)
    executor = daemon.chain["executor"]["address"]
    nonce_before = await daemon.runtime.executor.pending_nonce(executor)
    rt = daemon.runtime
    # Between simulation and signing: the batch is re-simulated after the funds are gone.
    real_next = rt.lane.next_simulated

    async def funds_gone_before_signing(limit: int) -> list[Any]:
        batch = await real_next(limit)
        if any(j.payer == payer["address"] for j in batch):
            _move_away(daemon.chain, payer, value)
        return batch

    rt.lane.next_simulated = funds_gone_before_signing  # type: ignore[method-assign]
    try:
        status, answer = await daemon.post(body)
    finally:
        rt.lane.next_simulated = real_next  # type: ignore[method-assign]
    assert _refused_for_balance(status, answer), answer
    assert [r["state"] for r in await _jobs_of(daemon, payer["address"])] == [JobState.REJECTED.value]
    assert await daemon.runtime.executor.pending_nonce(executor) == nonce_before
    print("\nfunds moved away after acceptance: refused before signing, executor gas 0")


async def test_a_payer_whose_balance_falls_after_acceptance_gets_only_what_still_fits(daemon: Daemon) -> None:
    """Three jobs accepted while the payer could pay all three; before they are signed it
    moves two thirds away: each alone would still simulate, but together they do not fit,
    so two are refused before signing and the executor pays for no revert."""
    payer = _fresh_payer()
    bodies = await _signed_by(daemon, payer, 3)
    value = int(bodies[0]["authPayload"]["value"])
    _as_deployer(daemon.chain, "UsdcEip3009", "mint", payer["address"], 3 * value)
    await _seen_funded(daemon, payer, 3 * value)
    rt = daemon.runtime
    real_next = rt.lane.next_simulated
    moved = False

    async def funds_fall_before_signing(limit: int) -> list[Any]:
        nonlocal moved
        batch = await real_next(limit)
        if not moved and any(j.payer == payer["address"] for j in batch):
            moved = True
            _move_away(daemon.chain, payer, 2 * value)
        return batch

    rt.lane.next_simulated = funds_fall_before_signing  # type: ignore[method-assign]
    try:
        answers = await asyncio.gather(*(daemon.post(b) for b in bodies))
    finally:
        rt.lane.next_simulated = real_next  # type: ignore[method-assign]
    settled = [r for s, r in answers if (s, r.get("status")) == (200, "settled")]
    refused = [r for s, r in answers if _refused_for_balance(s, r)]
    assert (len(settled), len(refused)) == (1, 2), answers
    assert await _reverted_on_chain(daemon, payer["address"]) == 0
    print("\nbalance fell after acceptance: settled 1, refused 2 before signing, executor reverts 0")


async def test_a_refused_throwaway_payer_costs_at_most_one_rpc_call(
    tmp_path: Path, admin_database_url: str
) -> None:
    """Issue 18: each refusal re-read the balance past the per-block cache (``eth_blockNumber``
    and a second ``eth_call``): about 3 calls per throwaway post. Counted through a JSON-RPC
    proxy, with every shared cached read kept for the count (no block is mined meanwhile); the
    only other caller, the gauges, reads the head (the process's shared head read) every
    GAUGE_INTERVAL_S."""
    posts = 20
    async with (
        private_chain(tmp_path, admin_database_url) as (info, dsn),
        RpcProxy(info["rpcUrl"]) as proxy,
        serving(daemon_settings(info, dsn, free_port(), rpc_url=proxy.url), info, workers=False) as d,
    ):
        d.runtime.node.read_ttl_s = 3600.0  # the shared per-head reads stay cached for the count
        payers = [_fresh_payer() for _ in range(posts + 1)]
        bodies = [(await _signed_by(d, p, 1))[0] for p in payers]
        status, refused = await d.post(bodies[0])  # the first post loads the shared reads
        assert _refused_for_balance(status, refused), refused
        proxy.calls.clear()
        started = time.monotonic()
        for body in bodies[1:]:
            status, refused = await d.post(body)
            assert _refused_for_balance(status, refused), refused
        elapsed = time.monotonic() - started
        calls = list(proxy.calls)
    by_method = Counter(m for m, _ in calls)
    gauge_ticks = 1 + int(elapsed / GAUGE_INTERVAL_S)
    head_reads = sum(
        m == "eth_blockNumber" or (m, p[:9]) == ("eth_getBlockByNumber", '["latest"') for m, p in calls
    )
    own = len(calls) - min(head_reads, gauge_ticks)
    naming_the_payer = [
        sum(p["address"][2:].lower() in params.lower() for _, params in calls) for p in payers[1:]
    ]
    print(f"\n{posts} refused throwaway posts: {len(calls)} RPC calls {dict(by_method)} in {elapsed:.1f} s; "
          f"{own / posts:.2f} per post, at most {max(naming_the_payer)} naming its payer")  # fmt: skip
    assert max(naming_the_payer) <= 1, naming_the_payer
    assert own <= posts, by_method


def _tip_blocks(chain: dict[str, Any], blocks: int, tip_wei: int) -> None:
    """``blocks`` blocks, each holding one transaction (the deployer's 0-value send to itself)
    that tips ``tip_wei`` per gas: what anyone can pay to move the market's median tip."""
    from web3 import Web3

    w3 = Web3(Web3.HTTPProvider(chain["rpcUrl"]))
    sender = Account.from_key(chain["deployer"]["privateKey"])
    for _ in range(blocks):
        base_fee = int(w3.eth.get_block("latest")["baseFeePerGas"])  # type: ignore[arg-type]
        tx = {
            "type": 2,
            "chainId": int(chain["chainId"]),
            "to": sender.address,
            "value": 0,
            "gas": 21_000,
            "nonce": w3.eth.get_transaction_count(sender.address, "pending"),
            "maxFeePerGas": 4 * base_fee + tip_wei,
            "maxPriorityFeePerGas": tip_wei,
        }
        w3.eth.wait_for_transaction_receipt(
            w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction)
        )


async def test_a_few_blocks_of_large_tips_do_not_raise_what_payers_authorize(
    tmp_path: Path, admin_database_url: str
) -> None:
    """Issue 35, finding 7: 1 gwei tips in a few blocks (anvil's default tip, which test set-up
    pays) raised a 0.1 t quote's gas allowance tenfold. Now the tip is the median over 20
    blocks, capped at the base fee and the operator's ceiling: five such blocks leave the
    allowance as it was, twenty (the whole window) raise it at most to the base-fee cap; the
    executor's transaction tips no more than the quote priced, and its allowance covers it
    (the solvency ledger at the daemon's end)."""
    async with (
        private_chain(tmp_path, admin_database_url) as (info, dsn),
        serving(daemon_settings(info, dsn, free_port()), info) as d,
    ):
        payer = info["payers"][0]
        quiet = await challenge(d, payer, carbonClass="RE", amount="0.1", inputToken="USDC")
        await asyncio.to_thread(_tip_blocks, info, 5, 10**9)
        few = await challenge(d, payer, carbonClass="RE", amount="0.1", inputToken="USDC")
        await asyncio.to_thread(_tip_blocks, info, 20, 10**9)
        many = await challenge(d, payer, carbonClass="RE", amount="0.1", inputToken="USDC")
        base_fee = (await d.runtime.executor.fee_market()).next_base_fee
        price = await d.runtime.services.prepare.gas.price()
        print(
            f"\ngas allowance of 0.1 t: quiet {quiet['gasAllowance']}, after 5 blocks of 1 gwei tips "
            f"{few['gasAllowance']}, after 20 {many['gasAllowance']} (USDC atomic); tip priced "
            f"{price.max_priority_fee_per_gas} wei at a base fee of {base_fee} wei"
        )
        assert int(few["gasAllowance"]) <= int(quiet["gasAllowance"]) * 11 // 10
        assert price.max_priority_fee_per_gas <= max(d.runtime.settings.priority_fee_wei, base_fee)
        assert int(many["gasAllowance"]) <= int(quiet["gasAllowance"]) * 3
        status, result = await d.post(signed_request(many, payer["privateKey"]))
        assert status == 200 and result["status"] == "settled", result
        sent = await d.runtime.node.w3.eth.get_transaction(result["transactionHash"])
        assert int(sent["maxPriorityFeePerGas"]) <= price.max_priority_fee_per_gas, sent
