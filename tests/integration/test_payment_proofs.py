"""A payment is what the chain proves (issue 35): the payer works against us. An EIP-3009
nonce belongs to the payer alone: cancelling it, or spending it on another authorization,
marks it used without paying us. Through HTTP on a private anvil and Postgres, against the
standard x402 resource (``actions/retire`` with ``PAYMENT-SIGNATURE``) and the standard
facilitator (``/facilitator/settle``):

- a cancelled nonce pays nothing: the resource refuses it (with or without funds) and records
  nothing; a cancel after the payment was accepted ends the payment ``failed``, never retired
  and never refunded, even when its retirement became impossible;
- a settle after the payer cancelled, or spent the nonce on a 1-unit transfer to itself, fails;
  a 1-block reorg that replaces the settled block with the payer's cancel turns the answer into
  a failure; after a deeper reorg no settle names a transaction the chain no longer holds;
- refused payments record nothing and open ones never starve an honest one;
- identical posts of one payload get one answer;
- settles that only cost us gas are refused;
- the relay's own ``actions/retire`` whose nonce the payer cancels after acceptance fails."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data

from relayer.admin import create_api_key
from tests.chain_helpers import eth_balance, transact_as, transact_as_deployer
from tests.conftest import Daemon
from tests.helpers import payer as payer_acts
from tests.helpers.facilitator import call, payment
from tests.helpers.x402 import (
    decode,
    nonce_of,
    post,
    required,
    resource,
    retire_body,
    sign_payload,
    usdc,
    wait_state,
)
from tests.private import Anvil, private_chain

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ChainAndDb = tuple[dict[str, Any], str]
NONCE_USED = "invalid_exact_evm_nonce_already_used"


def funded(info: dict[str, Any], usdc_atomic: int = 50_000_000) -> dict[str, str]:
    """A fresh payer holding ``usdc_atomic`` USDC (minted by the deployer) and no ETH."""
    account = Account.create()
    if usdc_atomic:
        transact_as_deployer(
            info, info["contracts"]["usdc"], "UsdcEip3009", "mint", account.address, usdc_atomic
        )
    return {"address": account.address, "privateKey": "0x" + bytes(account.key).hex()}


async def rows_of(d: Daemon, payer: str) -> int:
    return int(await d.runtime.db.fetchval("SELECT count(*) FROM x402_payments WHERE payer = $1", payer))


async def treasury_jobs(d: Daemon) -> int:
    """Relay jobs the treasury signed (its retirements and refunds)."""
    treasury = d.chain["treasury"]["address"]
    return int(await d.runtime.db.fetchval("SELECT count(*) FROM relay_jobs WHERE payer = $1", treasury))


# ------------------------------------------------------------------ the resource


async def test_a_cancelled_nonce_pays_nothing_and_retires_nothing(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    """Finding 1: quote, sign to the treasury, the payer's cancelAuthorization mined, then the
    post: a 402 naming the used nonce, nothing recorded, the treasury unchanged."""
    info, dsn = chain_and_db
    treasury = info["treasury"]["address"]
    async with resource(info, dsn) as d:
        payer = funded(info)
        body = retire_body(payer["address"])
        pr = await required(d, body)
        header = sign_payload(pr, payer["privateKey"])
        payer_acts.cancel(info, payer["privateKey"], nonce_of(header))
        before, jobs = await usdc(d, treasury), await treasury_jobs(d)
        status, answer, headers = await post(d, body, header)
        assert status == 402, answer
        assert decode(headers["PAYMENT-REQUIRED"])["error"] == NONCE_USED
        assert decode(headers["PAYMENT-RESPONSE"])["success"] is False
        assert await rows_of(d, payer["address"]) == 0
        await asyncio.sleep(1.5)  # a keeper step or more: still nothing
        assert await usdc(d, treasury) == before and await treasury_jobs(d) == jobs
        assert await usdc(d, payer["address"]) == 50_000_000


async def test_an_empty_payers_cancelled_nonce_records_nothing(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    """Finding 1, without funds: 402 and no payment row (the keeper has nothing to retire once
    validBefore passes); twenty such payers leave twenty 402s and no row (finding 4)."""
    info, dsn = chain_and_db
    async with resource(info, dsn) as d:
        for _ in range(20):
            payer = funded(info, 0)
            body = retire_body(payer["address"])
            pr = await required(d, body)
            header = sign_payload(pr, payer["privateKey"])
            payer_acts.cancel(info, payer["privateKey"], nonce_of(header))
            status, answer, headers = await post(d, body, header)
            assert status == 402, answer
            assert decode(headers["PAYMENT-REQUIRED"])["error"] in (NONCE_USED, "insufficient_funds")
            assert await rows_of(d, payer["address"]) == 0
        # and without a cancel: insufficient funds, nothing recorded
        payer = funded(info, 0)
        body = retire_body(payer["address"])
        pr = await required(d, body)
        status, answer, headers = await post(d, body, sign_payload(pr, payer["privateKey"]))
        assert status == 402 and decode(headers["PAYMENT-REQUIRED"])["error"] == "insufficient_funds"
        assert await rows_of(d, payer["address"]) == 0


async def test_a_cancel_after_acceptance_is_neither_retired_nor_refunded(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    """Finding 2: the payment accepted (its transfer not yet sent), then the payer cancels
    the nonce and the retirement becomes impossible (the listing withdrawn): the payment ends
    ``failed``; the treasury neither retires nor refunds what it never received."""
    info, dsn = chain_and_db
    treasury = info["treasury"]["address"]
    listing = next(li for li in info["listings"] if li.get("state", "active") == "active")
    payer = funded(info)
    body = retire_body(payer["address"], listingId=str(listing["listingId"]))
    del body["carbonClass"]
    async with resource(info, dsn, workers=False, settle_wait_s=1) as d:
        pr = await required(d, body)
        header = sign_payload(pr, payer["privateKey"])
        status, answer, _ = await post(d, body, header)
        assert status == 200, answer
        payment_id = answer["paymentId"]
    payer_acts.cancel(info, payer["privateKey"], nonce_of(header))
    receipt = transact_as(
        info,
        "seller",
        info["contracts"]["marketplace"],
        "Marketplace",
        "cancelListing",
        int(listing["listingId"]),
    )
    assert receipt["status"] == 1
    async with resource(info, dsn) as d:
        before = await usdc(d, treasury)
        row = await wait_state(d, payment_id, {"failed", "refunded", "retired"}, timeout_s=60)
        assert row["state"] == "failed", row
        assert row["retire_job_id"] is None and row["refund_job_id"] is None
        assert await usdc(d, treasury) == before
        assert await usdc(d, payer["address"]) == 50_000_000
        status, again, headers = await post(d, body, header)  # the payload again: the failure
        assert decode(headers["PAYMENT-RESPONSE"])["success"] is False, again


async def test_a_valid_before_beyond_the_quotes_timeout_is_refused(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    """The resource takes an authorization valid at most ``maxTimeoutSeconds`` (finding 4's
    payments with validBefore 10^12 never closed)."""
    info, dsn = chain_and_db
    async with resource(info, dsn, workers=False) as d:
        payer = funded(info)
        body = retire_body(payer["address"])
        pr = await required(d, body)
        header = sign_payload(pr, payer["privateKey"], valid_before=10**12)
        status, answer, headers = await post(d, body, header)
        assert status == 402, answer
        assert (
            decode(headers["PAYMENT-REQUIRED"])["error"]
            == "invalid_exact_evm_payload_authorization_valid_before"
        )
        assert await rows_of(d, payer["address"]) == 0


async def test_open_payments_never_starve_an_honest_slow_one(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    """Finding 4: 25 payments that never close (left open with validBefore 10^12, as payments
    accepted before this release could be) and an honest payment whose transfer was mined only
    after its request stopped waiting: the keeper still drives the honest one to retired."""
    info, dsn = chain_and_db
    anvil = Anvil(info["rpcUrl"])
    async with resource(info, dsn, settle_wait_s=1) as d:
        payer = funded(info)
        body = retire_body(payer["address"])
        pr = await required(d, body)
        header = sign_payload(pr, payer["privateKey"])
        template = await stuck_rows(d, info, 25)
        anvil.automine(False)
        try:
            status, answer, headers = await post(d, body, header)
            assert status == 200, answer
            assert decode(headers["PAYMENT-RESPONSE"])["errorReason"] == "settlement_pending"
        finally:
            anvil.automine(True)
        anvil.mine()
        row = await wait_state(d, answer["paymentId"], {"retired"}, timeout_s=45)
        assert row["state"] == "retired"
        assert template == 25


async def stuck_rows(d: Daemon, info: dict[str, Any], n: int) -> int:
    """``n`` open payments that can never close: accepted long ago, no transfer job, their
    authorizations valid until 10^12 and never sent (an unknown payer's)."""
    now = int(time.time())
    for _ in range(n):
        ghost = Account.create().address
        nonce = os.urandom(32)
        payload = {
            "x402Version": 2,
            "payload": {
                "authorization": {
                    "from": ghost,
                    "to": info["treasury"]["address"],
                    "value": "1000",
                    "validAfter": "0",
                    "validBefore": str(10**12),
                    "nonce": "0x" + nonce.hex(),
                },
                "signature": "0x" + "11" * 65,
            },
            "accepted": {
                "scheme": "exact",
                "network": "eip155:84532",
                "asset": info["contracts"]["usdc"],
                "amount": "1000",
                "payTo": info["treasury"]["address"],
                "maxTimeoutSeconds": 300,
                "extra": {"name": "USDC", "version": "2"},
            },
        }
        await d.runtime.db.execute(
            "INSERT INTO x402_payments (id, chain_id, quote_id, request_hash, request, payload, "
            "payload_hash, payer, auth_nonce, amount, state, created_at, updated_at, due_at) "
            "VALUES ($1, 84532, $2, $3, $4::jsonb, $5::jsonb, $6, $7, $8, 1000, 'accepted', $9, $9, $9)",
            uuid.uuid4(),
            uuid.uuid4().hex,
            os.urandom(32),
            '{"carbonClass": "NBO", "amount": "1", "inputToken": "USDC", "from": "' + ghost + '"}',
            json.dumps(payload),
            os.urandom(32),
            ghost,
            nonce,
            now - 3600,
        )
    return n


async def test_identical_posts_of_one_payload_get_one_answer(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    """Finding 5: 20 identical ``PAYMENT-SIGNATURE`` posts at once, 3 rounds: every answer is
    the payment's (200, one payment id), never ``quote_consumed``; each payer charged once."""
    info, dsn = chain_and_db
    async with resource(info, dsn) as d:
        for _ in range(3):
            payer = funded(info)
            body = retire_body(payer["address"])
            pr = await required(d, body)
            amount = int(pr["accepts"][0]["amount"])
            header = sign_payload(pr, payer["privateKey"])
            answers = await asyncio.gather(*(post(d, body, header) for _ in range(20)))
            statuses = [status for status, _, _ in answers]
            errors = [decode(h["PAYMENT-REQUIRED"]).get("error") for s, _, h in answers if s == 402]
            assert statuses == [200] * 20, (statuses, errors, [a for s, a, _ in answers if s != 200][:1])
            assert len({a["paymentId"] for _, a, _ in answers}) == 1
            assert await usdc(d, payer["address"]) == 50_000_000 - amount


# ------------------------------------------------------------------ the facilitator


@pytest.fixture(scope="module")
async def facilitator(chain_and_db: tuple[dict[str, Any], str]) -> AsyncIterator[tuple[Daemon, str]]:
    info, dsn = chain_and_db
    async with resource(info, dsn) as d:
        key = await create_api_key(d.runtime.settings, f"proofs-{uuid.uuid4().hex[:6]}", ["facilitator"])
        yield d, key


def merchant() -> str:
    return str(Account.create().address)


async def test_settle_after_the_payer_cancels_fails(facilitator: tuple[Daemon, str]) -> None:
    """Finding 3: verify says valid; the payer cancels the nonce; settle is a failure and the
    merchant received nothing."""
    d, key = facilitator
    payer, pay_to = funded(d.chain), merchant()
    body = payment(d, pay_to, 1_000_000, key=payer["privateKey"], payer=payer["address"])
    status, verdict = await call(d, "verify", body, key)
    assert verdict["isValid"] is True, verdict
    nonce = bytes.fromhex(body["paymentPayload"]["payload"]["authorization"]["nonce"][2:])
    payer_acts.cancel(d.chain, payer["privateKey"], nonce)
    status, settled = await call(d, "settle", body, key)
    assert status == 200 and settled["success"] is False, settled
    assert await usdc(d, pay_to) == 0


async def test_settle_after_a_same_nonce_self_transfer_fails(facilitator: tuple[Daemon, str]) -> None:
    """Finding 3: the payer spends the nonce on a 1-unit authorization to itself: settle is a
    failure (never the payer's own transaction as success)."""
    d, key = facilitator
    payer, pay_to = funded(d.chain), merchant()
    body = payment(d, pay_to, 1_000_000, key=payer["privateKey"], payer=payer["address"])
    status, verdict = await call(d, "verify", body, key)
    assert verdict["isValid"] is True, verdict
    nonce = bytes.fromhex(body["paymentPayload"]["payload"]["authorization"]["nonce"][2:])
    own = payer_acts.spend(d.chain, payer["privateKey"], nonce)
    status, settled = await call(d, "settle", body, key)
    assert status == 200 and settled["success"] is False, settled
    assert settled.get("transaction") != "0x" + bytes(own["transactionHash"]).hex()
    assert await usdc(d, pay_to) == 0


async def test_a_reorg_replacing_the_settled_block_with_a_cancel_fails_later_settles(
    facilitator: tuple[Daemon, str],
) -> None:
    """Finding 3: settled (success, depth 1); a 1-block reorg replaces that block with one
    holding the payer's cancel; our job is rewound and sent again and reverts: every later
    settle is a failure."""
    d, key = facilitator
    anvil = Anvil(d.chain["rpcUrl"])
    payer, pay_to = funded(d.chain), merchant()
    body = payment(d, pay_to, 1_000_000, key=payer["privateKey"], payer=payer["address"])
    status, first = await call(d, "settle", body, key)
    assert first["success"] is True, first
    nonce = bytes.fromhex(body["paymentPayload"]["payload"]["authorization"]["nonce"][2:])
    cancel = payer_acts.send(d.chain, payer_acts.cancel_call(d.chain, payer["privateKey"], nonce), raw=True)
    anvil.rpc("anvil_reorg", 1, [[cancel, 0]])
    deadline = time.monotonic() + 20
    while True:  # the follower rewinds the job and sends it again: it reverts on the cancel
        state = await d.runtime.db.fetchval(
            "SELECT state FROM relay_jobs WHERE tx_hash = $1", bytes.fromhex(first["transaction"][2:])
        )
        if state == "reverted" or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert await usdc(d, pay_to) == 0
    for _ in range(3):
        status, again = await call(d, "settle", body, key)
        assert status == 200 and again["success"] is False, again


async def test_settles_that_only_cost_us_gas_are_refused(facilitator: tuple[Daemon, str]) -> None:
    """Finding 6: requirements with amount 0, or payTo the executor, the treasury, USDC itself
    or the payer: refused, nothing recorded, no gas spent."""
    d, key = facilitator
    payer = funded(d.chain)
    executor = d.chain["executor"]["address"]
    gas_before = await eth_balance(d.runtime.node, executor)
    cases = [
        (merchant(), 0),
        (executor, 10_000),
        (d.chain["treasury"]["address"], 10_000),
        (d.chain["contracts"]["usdc"], 10_000),
        (payer["address"], 10_000),
    ]
    for pay_to, amount in cases:
        body = payment(d, pay_to, amount, key=payer["privateKey"], payer=payer["address"])
        for path, flag in (("verify", "isValid"), ("settle", "success")):
            status, answer = await call(d, path, body, key)
            assert status == 200 and answer[flag] is False, (pay_to, amount, answer)
    recorded = await d.runtime.db.fetchval(
        "SELECT count(*) FROM relay_jobs WHERE payer = $1", payer["address"]
    )
    assert recorded == 0
    assert await eth_balance(d.runtime.node, executor) == gas_before


async def test_after_a_deep_reorg_no_settle_names_a_lost_transaction(
    tmp_path: Path, admin_database_url: str
) -> None:
    """Finding 3: a reorg deeper than the window (the daemon halts by design) takes the settled
    transaction: a settle again is not a success naming that transaction."""
    async with (
        private_chain(tmp_path, admin_database_url) as (info, dsn),
        resource(info, dsn, facilitator_settle_wait_s=3) as d,  # the halted follower answers nothing final
    ):
        anvil = Anvil(info["rpcUrl"])
        key = await create_api_key(d.runtime.settings, "deep", ["facilitator"])
        payer, pay_to = funded(info), merchant()
        body = payment(d, pay_to, 1_000_000, key=payer["privateKey"], payer=payer["address"])
        status, first = await call(d, "settle", body, key)
        assert first["success"] is True, first
        anvil.mine()
        await asyncio.sleep(0.5)  # the follower sees the block over it
        anvil.rpc("anvil_reorg", 2, [])
        assert anvil.rpc("eth_getTransactionReceipt", first["transaction"]) is None
        for _ in range(3):
            status, again = await call(d, "settle", body, key)
            assert status == 200 and again["success"] is False, again


# ------------------------------------------------------------------ the relay's own actions/retire


async def test_a_relayed_retirement_whose_nonce_the_payer_cancels_fails(
    tmp_path_factory: pytest.TempPathFactory, admin_database_url: str
) -> None:
    """A payer who cancels the bound nonce after ``actions/retire`` accepted its request gets
    a failure, never ``settled``. Its own chain and database: the revert it costs us is its
    daemon's alone to account for."""
    async with private_chain(tmp_path_factory.mktemp("relayed"), admin_database_url) as (info, dsn):
        await _relayed_then_cancelled(info, dsn)


async def _relayed_then_cancelled(info: dict[str, Any], dsn: str) -> None:
    anvil = Anvil(info["rpcUrl"])
    async with resource(info, dsn, settle_wait_s=8) as d:
        payer = funded(info)
        body = retire_body(payer["address"])
        status, challenge = await d.post(body)
        assert status == 402, challenge
        typed = challenge["typedData"]
        signed = Account.sign_message(encode_typed_data(full_message=typed), payer["privateKey"])
        request = challenge["actionsRetireRequest"]
        request["authPayload"]["signature"] = "0x" + bytes(signed.signature).hex()
        nonce = bytes.fromhex(typed["message"]["nonce"][2:])
        anvil.automine(False)
        try:
            answer = asyncio.create_task(d.post(request))
            deadline = time.monotonic() + 10
            while not anvil.pool() and time.monotonic() < deadline:  # our transaction is sent
                await asyncio.sleep(0.05)
            # the payer's cancel, with a tip that puts it before ours in the next block
            call_data = payer_acts.cancel_call(info, payer["privateKey"], nonce)
            cancel = payer_acts.send(info, call_data, raw=True, tip_wei=100 * 10**9)
            anvil.rpc("eth_sendRawTransaction", cancel)
        finally:
            anvil.automine(True)
        anvil.mine()
        status, result = await answer
        assert status != 200 or result.get("status") != "settled", result
        assert status >= 400, (status, result)
        d.expected_reverts += 1
