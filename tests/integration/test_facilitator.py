"""The standard x402 v2 facilitator under ``/facilitator`` through HTTP, on real anvil and
Postgres: supported lists the chain; verify answers isValid with the payer, or false with the
spec's reason (wrong signer, expired, wrong recipient, value mismatch, insufficient balance);
verify and settle need an API key of scope facilitator; settle pays payTo exactly once (a
repeated settle answers the same transaction from the same job); a settle the node holds
unmined answers ``settlement_pending`` with the hash, and the same settle after mining answers success.
Verify simulates the transfer (a nonce used elsewhere is refused) and counts the payer's
transfers in flight; a front-runner's transaction is success only once at the confirmation
depth; a settle cancelled unsigned is a new attempt when settled again."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import requests
from eth_account import Account
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from web3 import Web3

from relayer.admin import create_api_key
from relayer.service.outcome import blocks_deep
from tests.chain_helpers import token_balance, transact_as_deployer
from tests.conftest import Daemon
from tests.helpers.facilitator import (
    PAYER_INDEX,
    call,
    fresh_address,
    held_unmined,
    mutate,
    network,
    payment,
    submit_directly,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def api_key(daemon: Daemon) -> AsyncIterator[str]:
    """A facilitator key whose limit the generated-bodies test (300 requests at once) stays under."""
    name = f"facilitator-{uuid.uuid4().hex[:6]}"
    yield await create_api_key(daemon.runtime.settings, name, ["facilitator"], rate_limit="1000/second")


async def test_supported_lists_the_chain_and_the_executors(daemon: Daemon) -> None:
    status, body = await daemon.get("/facilitator/supported")
    assert status == 200, body
    assert body["kinds"] == [{"x402Version": 2, "scheme": "exact", "network": network(daemon)}]
    assert body["extensions"] == ["payment-identifier"]
    assert body["signers"] == {"eip155:*": [daemon.chain["executor"]["address"]]}


async def test_verify_and_settle_need_an_api_key(daemon: Daemon, api_key: str) -> None:
    body = payment(daemon, fresh_address(), 1_000)
    for path in ("verify", "settle"):
        for key in (None, "mk_000000000000_nope"):
            status, answer = await call(daemon, path, body, key)
            assert status == 401, answer
            assert answer == {"error": "unauthorized", "message": answer["message"]}
    status, answer = await call(daemon, "verify", body, api_key)
    assert status == 200 and answer["isValid"] is True, answer


async def test_verify_of_a_good_payload_is_valid_with_its_payer(daemon: Daemon, api_key: str) -> None:
    status, answer = await call(daemon, "verify", payment(daemon, fresh_address(), 12_345), api_key)
    assert status == 200
    assert answer == {"isValid": True, "payer": daemon.chain["payers"][PAYER_INDEX]["address"]}


async def test_invalid_payments_answer_200_with_the_reason(
    daemon: Daemon, api_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    pay_to = fresh_address()
    held = await token_balance(daemon.runtime.node, "usdc", daemon.chain["payers"][PAYER_INDEX]["address"])
    stranger = Account.create()
    cases = {
        "invalid_exact_evm_payload_signature": payment(daemon, pay_to, 1_000, key=stranger.key.hex()),
        "invalid_exact_evm_payload_authorization_valid_before": payment(
            daemon, pay_to, 1_000, valid_before=int(time.time()) + 2
        ),
        "invalid_exact_evm_payload_recipient_mismatch": payment(daemon, pay_to, 1_000, to=fresh_address()),
        "invalid_exact_evm_payload_authorization_value_mismatch": payment(daemon, pay_to, 1_000, value=999),
        "insufficient_funds": payment(daemon, pay_to, held + 1),
    }
    bad_network = payment(daemon, pay_to, 1_000)
    bad_network["paymentRequirements"]["network"] = "eip155:1"
    cases["invalid_network"] = bad_network
    bad_version = payment(daemon, pay_to, 1_000)
    bad_version["paymentPayload"]["x402Version"] = 1
    cases["invalid_x402_version"] = bad_version
    bad_shape = payment(daemon, pay_to, 1_000)
    bad_shape["paymentPayload"]["payload"]["signature"] = "0x12"
    cases["invalid_payload"] = bad_shape
    with caplog.at_level(logging.INFO, "relayer.api.facilitator"):
        for reason, body in cases.items():
            status, answer = await call(daemon, "verify", body, api_key)
            assert status == 200, answer
            assert (answer["isValid"], answer["invalidReason"]) == (False, reason), answer
            assert answer["payer"] == daemon.chain["payers"][PAYER_INDEX]["address"]
        for reason in ("invalid_exact_evm_payload_signature", "insufficient_funds"):
            status, answer = await call(daemon, "settle", cases[reason], api_key)
            assert status == 200, answer
            assert (answer["success"], answer["errorReason"], answer["transaction"]) == (False, reason, "")
            assert answer["network"] == network(daemon)
    refused = [
        (r.levelname, r.code, r.status)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "relayer.api.facilitator" and r.getMessage() == "refused"
    ]
    reasons = [*cases, "invalid_exact_evm_payload_signature", "insufficient_funds"]
    assert refused == [("INFO", reason, 200) for reason in reasons]  # one line each
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == 0


async def test_settle_pays_once_and_a_repeat_answers_the_same_transaction(
    daemon: Daemon, api_key: str
) -> None:
    pay_to, value = fresh_address(), 43_210
    body = payment(daemon, pay_to, value)
    status, first = await call(daemon, "settle", body, api_key)
    assert status == 200, first
    assert first["success"] is True, first
    assert first["network"] == network(daemon) and first["amount"] == str(value)
    assert first["payer"] == daemon.chain["payers"][PAYER_INDEX]["address"]
    assert first["transaction"].startswith("0x") and len(first["transaction"]) == 66
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == value
    status, again = await call(daemon, "settle", body, api_key)
    assert status == 200 and again == first
    jobs = await daemon.runtime.db.fetch(
        "SELECT id, api_key_id FROM relay_jobs WHERE tx_hash = $1", bytes.fromhex(first["transaction"][2:])
    )
    assert len(jobs) == 1 and jobs[0]["api_key_id"] is not None
    count = await daemon.runtime.db.fetchval(
        "SELECT count(*) FROM relay_transactions WHERE job_id = $1", jobs[0]["id"]
    )
    assert count == 1
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == value
    # Once settled, the authorization's nonce is spent: verify says so.
    status, verdict = await call(daemon, "verify", body, api_key)
    assert (status, verdict["isValid"], verdict["invalidReason"]) == (
        200,
        False,
        "invalid_exact_evm_nonce_already_used",
    ), verdict
    # Another authorization with the same nonce (to someone else) is refused, never paid.
    nonce = body["paymentPayload"]["payload"]["authorization"]["nonce"]
    other_to = fresh_address()
    status, other = await call(daemon, "settle", payment(daemon, other_to, value, nonce=nonce), api_key)
    assert status == 200 and other["success"] is False, other
    assert (other["errorReason"], other["transaction"]) == ("invalid_exact_evm_nonce_already_used", "")
    assert await token_balance(daemon.runtime.node, "usdc", other_to) == 0


async def test_a_settle_the_node_holds_is_pending_then_final(daemon: Daemon, api_key: str) -> None:
    pay_to, value = fresh_address(), 7_777
    body = payment(daemon, pay_to, value)
    with held_unmined(daemon, 3.0) as w3:
        status, pending = await call(daemon, "settle", body, api_key)
        assert status == 200, pending
        assert (pending["success"], pending["errorReason"]) == (False, "settlement_pending"), pending
        assert pending["transaction"].startswith("0x") and len(pending["transaction"]) == 66
        assert await token_balance(daemon.runtime.node, "usdc", pay_to) == 0
        w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    await asyncio.sleep(0.1)
    status, final = await call(daemon, "settle", body, api_key)
    assert status == 200, final
    assert final["success"] is True and final["transaction"] == pending["transaction"], final
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == value


async def test_generated_bad_bodies_answer_no_5xx_and_record_nothing(daemon: Daemon, api_key: str) -> None:
    """Mutations of a valid body signed by a payer holding nothing: every answer is 200 with
    isValid/success false (or 400 for a body that is not one JSON object), never 5xx, and
    nothing is recorded for the payer."""
    broke = Account.create()
    base = payment(daemon, fresh_address(), 5_000, key=broke.key.hex(), payer=broke.address)
    url, headers = f"{daemon.base_url}/facilitator", {"Authorization": f"Bearer {api_key}"}
    seen: list[int] = []

    def run() -> None:
        with requests.Session() as session:

            @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
            @given(st.data(), st.sampled_from(["verify", "settle"]))
            def check(data: st.DataObject, path: str) -> None:
                body = mutate(base, data.draw)
                r = session.post(f"{url}/{path}", json=body, headers=headers, timeout=30)
                seen.append(r.status_code)
                assert r.status_code in (200, 400), (r.status_code, r.text, body)
                answer = r.json()
                if r.status_code == 200:
                    flag = "isValid" if path == "verify" else "success"
                    assert answer[flag] is False, (answer, body)
                else:
                    assert set(answer) == {"error", "message"}, answer

            check()
            for raw in (b"", b"[]", b"{", b"\xff\xfe", b"null"):
                r = session.post(
                    f"{url}/settle", data=raw, headers={**headers, "Content-Type": "application/json"}
                )
                assert r.status_code == 400 and r.json()["error"] == "invalid_json", r.text

    await asyncio.to_thread(run)
    assert len(seen) >= 300 and all(s < 500 for s in seen)
    recorded = await daemon.runtime.db.fetchval(
        "SELECT count(*) FROM relay_jobs WHERE payer = $1", broke.address
    )
    assert recorded == 0


async def test_a_settled_payment_answers_its_transaction_after_its_window_closed(
    daemon: Daemon, api_key: str
) -> None:
    pay_to, value = fresh_address(), 3_333
    margin = daemon.runtime.facilitator.expiry_margin_s
    body = payment(daemon, pay_to, value, valid_before=int(time.time()) + margin + 4)
    status, first = await call(daemon, "settle", body, api_key)
    assert status == 200 and first["success"] is True, first
    await asyncio.sleep(5)  # validBefore is now within the margin: a new payment would be refused
    status, verdict = await call(daemon, "verify", body, api_key)
    assert verdict["invalidReason"] == "invalid_exact_evm_payload_authorization_valid_before", verdict
    status, again = await call(daemon, "settle", body, api_key)
    assert status == 200 and again == first
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == value


async def test_a_settle_not_signed_within_the_wait_fails_and_is_never_charged(
    daemon: Daemon, api_key: str
) -> None:
    """With no wait at all the job is often not yet signed: it is cancelled (rejected, so
    the broadcaster can never send it) and the answer is a failure, and nothing is paid until
    someone settles the payload again: a new attempt (also under the same payment
    identifier: a cancelled job does not pin it), answered truthfully; when the broadcaster
    signed it first, the answer is pending with the hash and a repeated settle is success
    with that transaction."""
    facilitator = daemon.runtime.facilitator
    wait, answers = facilitator.settle_wait_s, []
    facilitator.settle_wait_s = 0.0
    try:
        bodies = [(to, payment(daemon, to, 1_111)) for to in (fresh_address() for _ in range(4))]
        for _, body in bodies:
            info = {"required": False, "id": f"pay_{uuid.uuid4().hex}"}
            body["paymentPayload"]["extensions"] = {"payment-identifier": {"info": info}}
        for to, body in bodies:
            status, answer = await call(daemon, "settle", body, api_key)
            assert status == 200, answer
            answers.append((to, body, answer))
    finally:
        facilitator.settle_wait_s = wait
    await asyncio.sleep(2)
    for to, body, answer in answers:
        if answer["errorReason"] == "settlement_pending":
            assert len(answer["transaction"]) == 66
            status, final = await call(daemon, "settle", body, api_key)
            assert final["success"] is True and final["transaction"] == answer["transaction"], final
            assert await token_balance(daemon.runtime.node, "usdc", to) == 1_111
        else:
            assert (answer["success"], answer["errorReason"], answer["transaction"]) == (
                False,
                "unexpected_settle_error",
                "",
            ), answer
            assert await token_balance(daemon.runtime.node, "usdc", to) == 0  # cancelled: never sent
            # Settling it again is a new attempt, answered truthfully: paid once, now.
            status, again = await call(daemon, "settle", body, api_key)
            assert again["success"] is True, again
            assert await token_balance(daemon.runtime.node, "usdc", to) == 1_111
            status, repeat = await call(daemon, "settle", body, api_key)  # and it stays paid once
            assert repeat == again
            assert await token_balance(daemon.runtime.node, "usdc", to) == 1_111
    print("no-wait settles:", [a["errorReason"] if not a["success"] else "success" for _, _, a in answers])
    # Every job of the key has ended: the cancelled ones gave their gas reservations back and the
    # mined ones moved theirs into the gas paid (design C3).
    reserved = await daemon.runtime.db.fetchval(
        "SELECT coalesce(sum(d.reserved_wei), 0) FROM api_key_gas_days d "
        "JOIN api_keys k ON k.id = d.api_key_id WHERE k.key_hash = $1",
        hashlib.sha256(api_key.encode()).digest(),
    )
    assert reserved == 0


async def test_verify_simulates_the_transfer_so_a_nonce_used_elsewhere_is_refused(
    daemon: Daemon, api_key: str
) -> None:
    """The authorization submitted to USDC by someone else: verify's simulation reverts on
    the used nonce (the payer's balance would still cover another)."""
    body = payment(daemon, fresh_address(), 2_222)
    status, verdict = await call(daemon, "verify", body, api_key)
    assert (status, verdict["isValid"]) == (200, True), verdict
    submit_directly(daemon, body)
    status, verdict = await call(daemon, "verify", body, api_key)
    assert (status, verdict["isValid"], verdict["invalidReason"]) == (
        200,
        False,
        "invalid_exact_evm_nonce_already_used",
    ), verdict


async def test_verify_counts_the_payers_transfers_in_flight(daemon: Daemon, api_key: str) -> None:
    """A payer holding 10 000 with a transfer of 6 000 signed and sent but not mined: a second
    payment of 6 000 is covered by the balance alone, not by what is left once the first
    lands, so verify answers insufficient_funds; 4 000 still verifies."""
    payer = Account.create()
    transact_as_deployer(
        daemon.chain, daemon.chain["contracts"]["usdc"], "UsdcEip3009", "mint", payer.address, 10_000
    )
    signer = {"key": payer.key.hex(), "payer": payer.address}
    first = payment(daemon, fresh_address(), 6_000, **signer)
    with held_unmined(daemon, 3.0) as w3:
        status, pending = await call(daemon, "settle", first, api_key)
        assert (status, pending["errorReason"]) == (200, "settlement_pending"), pending
        status, verdict = await call(
            daemon, "verify", payment(daemon, fresh_address(), 6_000, **signer), api_key
        )
        assert (verdict["isValid"], verdict.get("invalidReason")) == (False, "insufficient_funds"), verdict
        assert verdict["payer"] == payer.address
        status, verdict = await call(
            daemon, "verify", payment(daemon, fresh_address(), 4_000, **signer), api_key
        )
        assert verdict == {"isValid": True, "payer": payer.address}, verdict
        # The payment in flight itself is not counted against itself.
        status, verdict = await call(daemon, "verify", first, api_key)
        assert verdict == {"isValid": True, "payer": payer.address}, verdict
        w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    status, final = await call(daemon, "settle", first, api_key)
    assert final["success"] is True and final["transaction"] == pending["transaction"], final


async def test_a_front_runners_transaction_is_success_only_at_confirmation_depth(
    daemon: Daemon, api_key: str
) -> None:
    """The payer's authorization sent to USDC by someone else before our settle: our
    simulation reverts and the answer names the front-runner's transaction, as
    ``settlement_pending`` until it is buried under the chain's confirmation depth (3 here),
    then success; nothing of ours is sent and the recipient is paid once."""
    outcomes = daemon.runtime.services.relay.outcomes
    facilitator = daemon.runtime.facilitator
    pay_to, value = fresh_address(), 5_432
    body = payment(daemon, pay_to, value)
    w3 = Web3(Web3.HTTPProvider(daemon.chain["rpcUrl"]))
    confirmed, wait = outcomes.confirmed, facilitator.settle_wait_s
    outcomes.confirmed, facilitator.settle_wait_s = blocks_deep(3), 1.0
    try:
        other = "0x" + submit_directly(daemon, body).hex()
        status, pending = await call(daemon, "settle", body, api_key)
        assert status == 200, pending
        assert (pending["success"], pending["errorReason"], pending["transaction"]) == (
            False,
            "settlement_pending",
            other,
        ), pending
        w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
        w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
        status, final = await call(daemon, "settle", body, api_key)
    finally:
        outcomes.confirmed, facilitator.settle_wait_s = confirmed, wait
    assert status == 200 and (final["success"], final["transaction"]) == (True, other), final
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == value
    sent = await daemon.runtime.db.fetchval(
        "SELECT count(*) FROM relay_transactions t JOIN relay_jobs j ON j.id = t.job_id "
        "WHERE j.kind = 'transfer' AND j.summary->>'nonce' = $1",
        body["paymentPayload"]["payload"]["authorization"]["nonce"],
    )
    assert sent == 0


async def test_a_front_runners_confirmed_transaction_is_success_at_once(daemon: Daemon, api_key: str) -> None:
    """At the daemon's depth (1: anvil mines a block per transaction) the front-runner's
    mined transaction is confirmed: success with its hash."""
    pay_to, value = fresh_address(), 4_321
    body = payment(daemon, pay_to, value)
    other = "0x" + submit_directly(daemon, body).hex()
    status, answer = await call(daemon, "settle", body, api_key)
    assert status == 200 and (answer["success"], answer["transaction"]) == (True, other), answer
    assert answer["amount"] == str(value)
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == value
