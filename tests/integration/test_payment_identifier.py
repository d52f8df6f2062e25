"""The x402 ``payment-identifier`` extension on ``/facilitator/settle`` through HTTP, on real
anvil and Postgres (spec: x402-foundation/x402 specs/extensions/payment_identifier.md,
Idempotency Behavior; design: docs/design/x402-v2.md C2 settle step 2): the same id with the
same payload answers from the same job (one transfer on chain, the same transaction, pending
becoming final), whatever order the JSON keys come in; the same id with another payload is
409 ``payment_identifier_conflict`` and pays nothing, also when both race; an id is scoped
by API key; an invalid id is ``invalid_payload``; ``/supported`` advertises the extension."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from relayer.admin import create_api_key
from tests.chain_helpers import token_balance
from tests.conftest import Daemon
from tests.helpers.facilitator import call, fresh_address, held_unmined, payment

pytestmark = pytest.mark.integration

DECLARED: dict[str, Any] = {
    "info": {"required": False},
    "schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"},
}


@pytest.fixture(scope="module")
async def api_key(daemon: Daemon) -> AsyncIterator[str]:
    yield await create_api_key(
        daemon.runtime.settings,
        f"payment-id-{uuid.uuid4().hex[:6]}",
        ["facilitator"],
        rate_limit="1000/second",
    )


def with_id(body: dict[str, Any], pid: Any, **info: Any) -> dict[str, Any]:
    """``body`` whose payload carries the server's declaration with the client's ``id``
    appended (as ``append_payment_identifier_to_extensions`` does)."""
    extension = {**DECLARED, "info": {**DECLARED["info"], "id": pid, **info}}
    body["paymentPayload"]["extensions"] = {"payment-identifier": extension}
    return body


def new_id() -> str:
    return f"pay_{uuid.uuid4().hex}"


def reordered(value: Any) -> Any:
    """``value`` with every object's keys in reverse order (another SDK's serialisation)."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


async def transactions_of_payment(d: Daemon, tx: str) -> int:
    return int(
        await d.runtime.db.fetchval(
            "SELECT count(*) FROM relay_transactions t JOIN relay_jobs j ON j.id = t.job_id "
            "WHERE j.tx_hash = $1",
            bytes.fromhex(tx[2:]),
        )
    )


async def test_supported_advertises_the_extension(daemon: Daemon) -> None:
    status, body = await daemon.get("/facilitator/supported")
    assert status == 200 and "payment-identifier" in body["extensions"], body


async def test_same_id_same_payload_settles_once_with_the_same_transaction(
    daemon: Daemon, api_key: str
) -> None:
    pay_to, value, pid = fresh_address(), 2_468, new_id()
    body = with_id(payment(daemon, pay_to, value), pid)
    status, first = await call(daemon, "settle", body, api_key)
    assert status == 200 and first["success"] is True, first
    status, again = await call(daemon, "settle", reordered(body), api_key)  # same payload, keys reordered
    assert status == 200 and again == first
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == value  # one transfer
    assert await transactions_of_payment(daemon, first["transaction"]) == 1
    row = await daemon.runtime.db.fetchrow(
        "SELECT p.scope, j.tx_hash FROM x402_payment_ids p JOIN relay_jobs j ON j.id = p.job_id "
        "WHERE p.id = $1",
        pid,
    )
    assert row is not None and row["scope"].startswith("facilitator:")
    assert "0x" + bytes(row["tx_hash"]).hex() == first["transaction"]


async def test_same_id_other_payload_is_a_conflict_and_pays_nothing(daemon: Daemon, api_key: str) -> None:
    pid = new_id()
    first_to, other_to = fresh_address(), fresh_address()
    status, first = await call(daemon, "settle", with_id(payment(daemon, first_to, 1_357), pid), api_key)
    assert status == 200 and first["success"] is True, first
    other = with_id(payment(daemon, other_to, 1_357), pid)
    for path in ("settle", "settle"):
        status, answer = await call(daemon, path, other, api_key)
        assert status == 409, answer
        assert answer == {"error": "payment_identifier_conflict", "message": answer["message"]}
    assert await token_balance(daemon.runtime.node, "usdc", other_to) == 0
    nonce = other["paymentPayload"]["payload"]["authorization"]["nonce"]
    jobs = await daemon.runtime.db.fetchval(
        "SELECT count(*) FROM relay_jobs WHERE kind = 'transfer' AND summary->>'nonce' = $1", nonce
    )
    assert jobs == 0
    # The identifier is the client's key per API key: under another key it is a new one.
    other_key = await create_api_key(
        daemon.runtime.settings,
        f"payment-id-{uuid.uuid4().hex[:6]}",
        ["facilitator"],
        rate_limit="1000/second",
    )
    status, answer = await call(daemon, "settle", other, other_key)
    assert status == 200 and answer["success"] is True, answer
    assert await token_balance(daemon.runtime.node, "usdc", other_to) == 1_357


async def test_two_payloads_racing_for_one_id_settle_one_and_refuse_the_other(
    daemon: Daemon, api_key: str
) -> None:
    pid = new_id()
    targets = [fresh_address() for _ in range(2)]
    bodies = [with_id(payment(daemon, to, 1_001), pid) for to in targets]
    answers = await asyncio.gather(*(call(daemon, "settle", b, api_key) for b in bodies))
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200, 409], answers
    won = next(i for i, (status, _) in enumerate(answers) if status == 200)
    assert answers[won][1]["success"] is True, answers
    balances = [await token_balance(daemon.runtime.node, "usdc", to) for to in targets]
    assert balances[won] == 1_001 and balances[1 - won] == 0


async def test_an_invalid_id_is_an_invalid_payload(daemon: Daemon, api_key: str) -> None:
    pay_to = fresh_address()
    bad: list[dict[str, Any]] = [
        with_id(payment(daemon, pay_to, 1_000), "short"),  # under 16 characters
        with_id(payment(daemon, pay_to, 1_000), "pay_" + "x" * 125),  # over 128
        with_id(payment(daemon, pay_to, 1_000), "pay_has spaces_0123456789"),
        with_id(payment(daemon, pay_to, 1_000), 1234567890123456789),
        with_id(payment(daemon, pay_to, 1_000), new_id(), required="yes"),
    ]
    not_an_object = payment(daemon, pay_to, 1_000)
    not_an_object["paymentPayload"]["extensions"] = {"payment-identifier": {"info": "pay_0123456789abcdef"}}
    bad.append(not_an_object)
    for body in bad:
        status, answer = await call(daemon, "settle", body, api_key)
        assert status == 200, answer
        assert (answer["success"], answer["errorReason"], answer["transaction"]) == (
            False,
            "invalid_payload",
            "",
        ), answer
        status, verdict = await call(daemon, "verify", body, api_key)
        assert (status, verdict["isValid"], verdict["invalidReason"]) == (200, False, "invalid_payload")
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == 0
    # The declaration echoed without an id is no identifier: settled as usual.
    plain = payment(daemon, pay_to, 1_000)
    plain["paymentPayload"]["extensions"] = {"payment-identifier": DECLARED}
    status, answer = await call(daemon, "settle", plain, api_key)
    assert status == 200 and answer["success"] is True, answer


async def test_a_pending_answer_becomes_final_through_the_identifier(daemon: Daemon, api_key: str) -> None:
    pay_to, value, pid = fresh_address(), 8_642, new_id()
    body = with_id(payment(daemon, pay_to, value), pid)
    with held_unmined(daemon, 3.0) as w3:
        status, pending = await call(daemon, "settle", body, api_key)
        assert (status, pending["errorReason"]) == (200, "settlement_pending"), pending
        assert len(pending["transaction"]) == 66
        w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    status, final = await call(daemon, "settle", body, api_key)
    assert status == 200 and final["success"] is True, final
    assert final["transaction"] == pending["transaction"]
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == value
    assert await transactions_of_payment(daemon, final["transaction"]) == 1
