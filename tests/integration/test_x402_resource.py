"""actions/retire as a standard x402 v2 resource (issue 19 part 4, design C4-C6), on a private
anvil and Postgres: the 402's PAYMENT-REQUIRED header; a payload signed here exactly as the
standard exact EVM client signs it (EIP-712 TransferWithAuthorization, 32 random bytes of
nonce, to = payTo, value = amount, validAfter 0, validBefore now + maxTimeoutSeconds) and sent
base64 in PAYMENT-SIGNATURE with the same body; paid once, retired from the treasury, replays
answered from the payment; refusals charge nothing; a crash between payment and retirement
completes once; a retirement that cannot execute is refunded once; a front-run still retires."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import time
from typing import Any

import pytest
from eth_account import Account

from relayer.domain.schemas import parse_request
from relayer.domain.verify import request_hash
from relayer.domain.x402_wire import Requirements
from relayer.ops import ledger_summary
from relayer.service.payments.quotes import quote_ref
from tests.chain_helpers import transact_as
from tests.conftest import Daemon
from tests.helpers.x402 import (
    SECRET,
    decode,
    payer_of,
    payments_of,
    post,
    required,
    resource,
    retire_body,
    sign_payload,
    submit_payload,
    usdc,
    wait_state,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def ledger_entry(d: Daemon, payment_id: str) -> dict[str, Any]:
    """Payment ``payment_id``'s row of ``relayer ledger``'s ``x402Payments``, which agrees."""
    payments = (await ledger_summary(d.runtime.settings))["x402Payments"]
    assert payments["disagreeing"] == [], payments
    return next(r for r in payments["rows"] if r["id"] == payment_id)


async def test_402_carries_payment_required(chain_and_db: tuple[dict[str, Any], str]) -> None:
    info, dsn = chain_and_db
    async with resource(info, dsn, workers=False) as d:
        payer = payer_of(info, 0)
        status, body, headers = await post(d, retire_body(payer["address"]))
        assert status == 402 and "typedData" in body and "actionsRetireRequest" in body  # today's body
        pr = decode(headers["PAYMENT-REQUIRED"])
        assert pr["x402Version"] == 2 and pr["resource"]["url"] == f"{d.base_url}/api/actions/retire"
        [accept] = pr["accepts"]
        assert accept["scheme"] == "exact" and accept["network"] == "eip155:84532"
        assert accept["asset"] == info["contracts"]["usdc"] and accept["payTo"] == info["treasury"]["address"]
        assert int(accept["amount"]) > int(body["authValue"]) > 0  # the retirement plus the transfer's gas
        assert accept["maxTimeoutSeconds"] > 30
        assert accept["extra"]["name"] == "USDC" and accept["extra"]["version"] == "2"
        assert accept["extra"]["quoteRef"].startswith("q1.")
        again = await required(d, retire_body(payer["address"]))
        assert again["accepts"][0]["extra"]["quoteRef"] != accept["extra"]["quoteRef"]  # one per 402
        assert await d.runtime.db.fetchval("SELECT count(*) FROM x402_payments") == 0  # a 402 writes nothing


async def test_paid_retires_once_and_a_replay_gets_the_same_answer(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    info, dsn = chain_and_db
    payer, treasury = payer_of(info, 1), info["treasury"]["address"]
    async with resource(info, dsn) as d:
        body = retire_body(payer["address"])
        pr = await required(d, body)
        amount = int(pr["accepts"][0]["amount"])
        before_payer, before_treasury = await usdc(d, payer["address"]), await usdc(d, treasury)
        header = sign_payload(pr, payer["privateKey"])
        status, paid, headers = await post(d, body, header)
        assert status == 200, paid
        settle = decode(headers["PAYMENT-RESPONSE"])
        assert settle["success"] is True and settle["payer"] == payer["address"], settle
        assert settle["amount"] == str(amount) and settle["network"] == "eip155:84532"
        assert settle["transaction"].startswith("0x") and len(settle["transaction"]) == 66
        assert paid["status"] in ("settled", "pending_index"), paid
        assert paid["payment"]["transaction"] == settle["transaction"]
        assert await usdc(d, payer["address"]) == before_payer - amount  # charged exactly once
        treasury_delta = await usdc(d, treasury) - before_treasury
        assert 0 < treasury_delta < amount  # paid the amount, spent the retirement (gas priced in)
        tx = paid["transactionHash"]
        deadline = time.monotonic() + 30
        while True:  # readable by certificate once indexed
            status, cert = await d.get("/api/certificate", txHash=tx)
            if status == 200 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        assert status == 200, cert
        row = await wait_state(d, paid["paymentId"], {"retired"})
        assert row["retire_job_id"] is not None and row["refund_job_id"] is None
        # `relayer ledger`, per payment (issue 35): received the amount, paid out what left the treasury
        entry = await ledger_entry(d, paid["paymentId"])
        assert entry["receivedUsdc"] == str(amount) and entry["paymentTx"] == settle["transaction"], entry
        assert entry["refundedUsdc"] == "0" and entry["agrees"] is True, entry
        assert int(entry["paidOutUsdc"]) == amount - treasury_delta, (entry, treasury_delta)

        status, replay, replay_headers = await post(d, body, header)  # the identical payload again
        assert status == 200 and replay["paymentId"] == paid["paymentId"], replay
        assert decode(replay_headers["PAYMENT-RESPONSE"])["transaction"] == settle["transaction"]
        assert await usdc(d, payer["address"]) == before_payer - amount  # never a second charge
        nonce = bytes.fromhex(decode(header)["payload"]["authorization"]["nonce"][2:])
        assert (
            await d.runtime.db.fetchval("SELECT count(*) FROM x402_payments WHERE auth_nonce = $1", nonce)
            == 1
        )
        transfers = await d.runtime.db.fetchval(
            "SELECT count(*) FROM relay_jobs WHERE kind = 'transfer' AND summary->>'nonce' = $1",
            "0x" + nonce.hex(),
        )
        assert transfers == 1


async def test_refusals_charge_nothing(chain_and_db: tuple[dict[str, Any], str]) -> None:
    info, dsn = chain_and_db
    payer = payer_of(info, 2)
    async with resource(info, dsn, workers=False) as d:
        body = retire_body(payer["address"])
        pr = await required(d, body)
        accept = pr["accepts"][0]
        amount = int(accept["amount"])
        before, recorded = await usdc(d, payer["address"]), len(await payments_of(d, payer["address"]))
        other = Account.create().address
        expired = copy.deepcopy(accept)
        now = int(time.time())
        core = Requirements(
            "exact", accept["network"], accept["asset"], amount, accept["payTo"], accept["maxTimeoutSeconds"]
        )
        req = parse_request({k: v for k, v in body.items() if k != "action"})
        expired["extra"]["quoteRef"] = quote_ref(
            SECRET.encode(), 84532, request_hash(req), core, now - 1, os.urandom(16)
        )
        tampered = copy.deepcopy(body)
        tampered["details"]["beneficiaryString"] = "someone else"
        cases = [
            (
                body,
                sign_payload(pr, payer["privateKey"], value=amount - 1),
                "invalid_exact_evm_payload_authorization_value_mismatch",
            ),
            (
                body,
                sign_payload(pr, payer["privateKey"], to=other),
                "invalid_exact_evm_payload_recipient_mismatch",
            ),
            (
                body,
                sign_payload(pr, payer["privateKey"], to=other, payTo=other),
                "invalid_payment_requirements",
            ),
            (
                body,
                sign_payload(pr, payer["privateKey"], amount=str(amount - 1), value=amount - 1),
                "invalid_payment_requirements",
            ),
            (
                body,
                sign_payload(pr, payer["privateKey"], extra=expired["extra"]),
                "invalid_payment_requirements",
            ),
            (tampered, sign_payload(pr, payer["privateKey"]), "invalid_payment_requirements"),
            (body, base64.b64encode(b"not json").decode(), "invalid_payload"),
        ]
        for sent, header, reason in cases:
            status, refused, headers = await post(d, sent, header)
            assert status == 402 and refused["error"] == "payment_required", refused
            fresh = decode(headers["PAYMENT-REQUIRED"])
            assert fresh["error"] == reason, (reason, fresh.get("error"))
            assert fresh["accepts"][0]["extra"]["quoteRef"] != accept["extra"]["quoteRef"]
        assert await usdc(d, payer["address"]) == before
        assert len(await payments_of(d, payer["address"])) == recorded


async def test_a_quote_pays_once(chain_and_db: tuple[dict[str, Any], str]) -> None:
    info, dsn = chain_and_db
    first, second = payer_of(info, 3), payer_of(info, 4)
    async with resource(info, dsn) as d:
        body = retire_body(first["address"])
        pr = await required(d, body)
        status, paid, _ = await post(d, body, sign_payload(pr, first["privateKey"]))
        assert status == 200, paid
        before, recorded = await usdc(d, second["address"]), len(await payments_of(d, second["address"]))
        status, _refused, headers = await post(d, body, sign_payload(pr, second["privateKey"]))
        why = decode(headers["PAYMENT-RESPONSE"])
        assert status == 402 and decode(headers["PAYMENT-REQUIRED"])["error"] == "quote_consumed", why
        assert await usdc(d, second["address"]) == before
        assert len(await payments_of(d, second["address"])) == recorded


async def test_a_crash_between_payment_and_retirement_completes_once(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    info, dsn = chain_and_db
    payer = payer_of(info, 5)
    body = retire_body(payer["address"])
    before = None
    async with resource(info, dsn, workers=False, settle_wait_s=2) as d:  # nothing is ever sent
        pr = await required(d, body)
        amount = int(pr["accepts"][0]["amount"])
        before = await usdc(d, payer["address"])
        status, answer, headers = await post(d, body, sign_payload(pr, payer["privateKey"]))
        assert status == 200, answer
        settle = decode(headers["PAYMENT-RESPONSE"])
        assert settle["success"] is False and settle["errorReason"] == "settlement_pending", settle
        payment_id = answer["paymentId"]
    async with resource(info, dsn) as d:  # "restarted": the keeper drives it
        row = await wait_state(d, payment_id, {"retired"})
        assert await usdc(d, payer["address"]) == before - amount
        jobs = await d.runtime.db.fetchval(
            "SELECT count(*) FROM relay_jobs WHERE id = $1 OR id = $2",
            row["transfer_job_id"],
            row["retire_job_id"],
        )
        assert jobs == 2 and row["refund_job_id"] is None


async def test_a_retirement_that_cannot_execute_is_refunded_once(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    info, dsn = chain_and_db
    payer = payer_of(info, 6)
    listing = next(li for li in info["listings"] if li.get("state", "active") == "active")
    body = retire_body(payer["address"], listingId=str(listing["listingId"]))
    del body["carbonClass"]
    async with resource(info, dsn, workers=False, settle_wait_s=2) as d:
        pr = await required(d, body)
        before = await usdc(d, payer["address"])
        status, answer, _ = await post(d, body, sign_payload(pr, payer["privateKey"]))
        assert status == 200, answer
        payment_id = answer["paymentId"]
    # The seller withdraws the listing after the payment was taken, before its retirement.
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
        row = await wait_state(d, payment_id, {"refunded"}, timeout_s=90)
        assert row["retire_job_id"] is None and row["refund_job_id"] is not None
        assert await usdc(d, payer["address"]) == before  # paid, then refunded in full
        refunds = (await ledger_summary(d.runtime.settings))["x402Refunds"]  # `relayer ledger`
        assert refunds["refunds"] == "1" and int(refunds["paidWei"]) > 0, refunds
        assert refunds["refundedUsdc"] == str(row["amount"])
        entry = await ledger_entry(d, payment_id)  # per payment: all it received went back
        assert entry["receivedUsdc"] == entry["refundedUsdc"] == entry["paidOutUsdc"] == str(row["amount"])
        assert entry["retiredUsdc"] == "0" and entry["agrees"] is True, entry
        await asyncio.sleep(2)  # the keeper steps again: nothing more happens
        again = await d.runtime.db.fetchrow("SELECT * FROM x402_payments WHERE id = $1::uuid", payment_id)
        assert again["state"] == "refunded" and again["refund_job_id"] == row["refund_job_id"]


async def test_a_front_run_payment_still_retires(chain_and_db: tuple[dict[str, Any], str]) -> None:
    info, dsn = chain_and_db
    payer, treasury = payer_of(info, 7), info["treasury"]["address"]
    async with resource(info, dsn) as d:
        body = retire_body(payer["address"])
        pr = await required(d, body)
        amount = int(pr["accepts"][0]["amount"])
        before = await usdc(d, payer["address"])
        header = sign_payload(pr, payer["privateKey"])
        receipt = submit_payload(info, header)
        assert receipt["status"] == 1
        assert await usdc(d, payer["address"]) == before - amount  # the funds are in the treasury
        status, paid, headers = await post(d, body, header)
        assert status == 200, paid
        settle = decode(headers["PAYMENT-RESPONSE"])
        assert (
            settle["success"] is True
            and settle["transaction"] == "0x" + bytes(receipt["transactionHash"]).hex()
        )
        row = await wait_state(d, paid["paymentId"], {"retired"})
        assert row["refund_job_id"] is None
        assert await usdc(d, payer["address"]) == before - amount
        assert treasury


async def test_discovery_lists_the_retirement_resource(chain_and_db: tuple[dict[str, Any], str]) -> None:
    info, dsn = chain_and_db
    async with resource(info, dsn, workers=False) as d:
        async with d.session.get(f"{d.base_url}/facilitator/discovery/resources", params={"limit": "5"}) as r:
            assert r.status == 200
            listed = await r.json()
        assert listed["x402Version"] == 2 and listed["pagination"] == {"limit": 5, "offset": 0, "total": 1}
        [item] = listed["items"]
        assert item["resource"] == f"{d.base_url}/api/actions/retire" and item["type"] == "http"
        [accept] = item["accepts"]
        assert accept["payTo"] == info["treasury"]["address"] and "quoteRef" not in accept["extra"]
        bazaar = item["extensions"]["bazaar"]
        assert bazaar["info"]["input"]["method"] == "POST" and bazaar["info"]["output"]["type"] == "json"
        assert "properties" in bazaar["schema"]["input"]


def _mutated(data: Any, good: str) -> tuple[str, str]:
    """A PAYMENT-SIGNATURE header drawn by hypothesis: random text, base64 of random bytes or
    of random JSON, or the good payload with one field replaced, dropped or retyped."""
    from hypothesis import strategies as st

    kind = data.draw(st.sampled_from(["text", "bytes", "json", "field"]), label="kind")
    if kind == "text":
        return kind, data.draw(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=300))
    if kind == "bytes":
        return kind, base64.b64encode(data.draw(st.binary(max_size=600))).decode()
    if kind == "json":
        value = data.draw(
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                max_leaves=12,
            )
        )
        return kind, base64.b64encode(json.dumps(value).encode()).decode()
    payload = json.loads(base64.b64decode(good))
    where = data.draw(
        st.sampled_from(["top", "payload", "authorization", "accepted", "extra"]), label="where"
    )
    target = {
        "top": payload,
        "payload": payload["payload"],
        "authorization": payload["payload"]["authorization"],
        "accepted": payload["accepted"],
        "extra": payload["accepted"]["extra"],
    }[where]
    key = data.draw(st.sampled_from([*sorted(target), "unknown"]), label="key")
    action = data.draw(st.sampled_from(["drop", "replace"]), label="action")
    if action == "drop":
        target.pop(key, None)
    else:
        target[key] = data.draw(
            st.none()
            | st.integers(-(2**300), 2**300)
            | st.text(max_size=80)
            | st.lists(st.integers(), max_size=3),
            label="value",
        )
    return f"{where}.{key}.{action}", base64.b64encode(json.dumps(payload).encode()).decode()


async def test_generated_payment_signatures_never_answer_5xx(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    """Random PAYMENT-SIGNATURE headers on actions/retire (random text, base64 of random bytes
    or JSON, a good payload of a payer holding no USDC with one field dropped or replaced):
    never a 5xx, a refusal is 402 with a fresh PAYMENT-REQUIRED, and nothing is charged or
    recorded for the payer."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    info, dsn = chain_and_db
    broke = Account.create()
    body = retire_body(broke.address)
    seen: dict[int, int] = {}
    async with resource(info, dsn, workers=False) as d:
        good = sign_payload(await required(d, body), broke.key.hex())
        loop = asyncio.get_running_loop()

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(st.data())
        def check(data: Any) -> None:
            kind, header = _mutated(data, good)
            status, answer, headers = asyncio.run_coroutine_threadsafe(post(d, body, header), loop).result(60)
            seen[status] = seen.get(status, 0) + 1
            assert status < 500, (status, answer, kind)
            assert status in (400, 402), (status, answer, kind)
            if status == 402:
                assert "PAYMENT-REQUIRED" in headers, (answer, kind)

        await asyncio.to_thread(check)
        print(f"\nPAYMENT-SIGNATURE bad input: statuses {dict(sorted(seen.items()))}")
        assert sum(seen.values()) >= 300
        assert await payments_of(d, broke.address) == []
        assert await usdc(d, broke.address) == 0
