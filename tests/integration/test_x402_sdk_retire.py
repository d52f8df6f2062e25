"""The official x402 v2 SDKs, unmodified, pay the retirement endpoint itself (issue 19; design
docs/design/x402-v2.md (b), C4 and C8 1-3, 5, 6), on a private devnet (anvil deployed and
seeded as ``make devnet`` does, the daemon given the settings ``make devnet`` gives it) and
Postgres, over HTTP.

- The Python SDK's client (``x402Client`` + ``ExactEvmScheme(Account)``, spend controls
  allowing the devnet USDC with a cap above the retirement's price) posts an ``actions/retire``
  body, as our own clients send it, through the SDK's httpx wrapper and through its requests
  wrapper: 200, ``PAYMENT-RESPONSE`` decoded by the SDK to success with the payer's transfer,
  body ``settled``/``pending_index``, the retirement readable by ``certificate``, the payer
  charged exactly the 402's amount, once.
- The TypeScript SDK's client (``tests/x402_ts_client.mjs``) pays it: 200.
- Failures the SDK client meets: a payer without USDC gets the 402 with ``insufficient_funds``;
  a second payment for a quote already paid gets a 402 with ``quote_consumed`` and is not
  charged; the paid payload sent again answers the first payment, never a second charge.
- A crash between payment and retirement: the SDK client is answered 200 with
  ``settlement_pending`` by a daemon whose workers are off; the daemon started again retires it,
  once.
- The documented example (docs/x402.md) paying the retirement endpoint runs as written against a
  ``.devdata/devnet.json`` holding only what ``make devnet`` writes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import requests
from eth_account import Account
from x402 import x402Client, x402ClientSync
from x402.http import (
    decode_payment_required_header,
    decode_payment_response_header,
    encode_payment_signature_header,
)
from x402.http.clients import x402_requests, x402HttpxClient
from x402.mechanisms.evm.exact import ExactEvmScheme
from x402.schemas import PaymentCreatedContext, PaymentPayload, PaymentRequired, SettleResponse

from relayer_dev.settings import dev_settings
from tests.chain_helpers import token_balance
from tests.conftest import ROOT, Daemon, free_port
from tests.helpers.docs import x402_sdk_examples
from tests.private import daemon_settings, serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CAP = "50000000"  # 50 USDC: the most the clients pay per request (a retirement costs a few)
TS_CLIENT = ROOT / "tests" / "x402_ts_client.mjs"


@contextlib.asynccontextmanager
async def retirement_resource(
    info: dict[str, Any], dsn: str, *, workers: bool = True, **overrides: Any
) -> AsyncIterator[Daemon]:
    """A daemon offering ``actions/retire`` as a standard x402 resource, configured as
    ``make devnet`` configures it (:func:`relayer_dev.settings.dev_settings`: the devnet's
    treasury key and its derived quote secret)."""
    settings = dev_settings(info, daemon_settings(info, dsn, free_port(), **overrides))
    assert settings.treasury_private_key is not None and settings.x402_quote_secret is not None
    async with serving(settings, info, workers=workers) as d:
        yield d


@pytest.fixture
async def resource(chain_and_db: tuple[dict[str, Any], str]) -> AsyncIterator[Daemon]:
    info, dsn = chain_and_db
    async with retirement_resource(info, dsn) as d:
        yield d


def payer_of(info: dict[str, Any], n: int) -> Any:
    """Devnet payer ``n`` (10,000 USDC, no ETH) as an eth-account ``LocalAccount``."""
    payers: list[dict[str, str]] = info["payers"]
    return Account.from_key(payers[n % len(payers)]["privateKey"])


def retire_body(payer: str, beneficiary: str) -> dict[str, Any]:
    """An ``actions/retire`` body as our own clients send it: 1 t of class NBO paid in USDC,
    retired for a named beneficiary."""
    return {
        "action": "actions/retire",
        "from": payer,
        "carbonClass": "NBO",
        "amount": "1",
        "inputToken": "USDC",
        "details": {
            "beneficiaryIsPayer": False,
            "beneficiaryAddress": Account.create().address,
            "beneficiaryString": beneficiary,
            "retirementMessage": "paid with the official x402 SDK",
        },
    }


def spend_controls(d: Daemon) -> Any:
    network = f"eip155:{d.chain['chainId']}"
    return {
        "allowed_assets": [
            {"network": network, "asset": d.chain["contracts"]["usdc"], "max_amount_per_payment": CAP}
        ]
    }


def sync_client(d: Daemon, payer: Any, signed: list[PaymentPayload]) -> x402ClientSync:
    """The SDK's sync client; every payload it signs is appended to ``signed``."""
    client = x402ClientSync().register(f"eip155:{d.chain['chainId']}", ExactEvmScheme(signer=payer))
    client.set_spend_controls(spend_controls(d))
    client.on_after_payment_creation(lambda ctx: signed.append(keep(ctx)))
    return client


def keep(ctx: PaymentCreatedContext) -> PaymentPayload:
    assert isinstance(ctx.payment_payload, PaymentPayload)
    return ctx.payment_payload


def pay_with_requests(
    d: Daemon, payer: Any, body: dict[str, Any], signed: list[PaymentPayload]
) -> requests.Response:
    with x402_requests(sync_client(d, payer, signed)) as session:
        return session.post(d.api, json=body, timeout=120)


async def pay_with_httpx(d: Daemon, payer: Any, body: dict[str, Any], signed: list[PaymentPayload]) -> Any:
    client = x402Client().register(f"eip155:{d.chain['chainId']}", ExactEvmScheme(signer=payer))
    client.set_spend_controls(spend_controls(d))
    client.on_after_payment_creation(lambda ctx: signed.append(keep(ctx)))
    async with x402HttpxClient(client, timeout=120) as http:
        return await http.post(d.api, json=body)


async def usdc(d: Daemon, owner: str) -> int:
    return await token_balance(d.runtime.node, "usdc", owner)


async def certificate(d: Daemon, tx: str) -> dict[str, Any]:
    """The certificate of retirement ``tx`` once indexed (bounded: 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        status, cert = await d.get("/api/certificate", txHash=tx)
        if status == 200 or time.monotonic() > deadline:
            assert status == 200, cert
            return cert
        await asyncio.sleep(0.3)


async def assert_paid_and_retired(
    d: Daemon, payer: Any, before: int, signed: list[PaymentPayload], status: int, headers: Any, body: Any
) -> SettleResponse:
    """What a paid retirement answers and leaves: 200, a successful PAYMENT-RESPONSE naming the
    payer's transfer, a settled or indexing retirement readable by certificate, and the payer
    charged the signed (402's) amount exactly once."""
    assert status == 200, (status, body, dict(headers))
    assert len(signed) == 1, signed  # the SDK paid once
    amount = int(signed[0].accepted.amount)
    assert signed[0].accepted.pay_to == d.chain["treasury"]["address"]
    settled = decode_payment_response_header(headers["PAYMENT-RESPONSE"])
    assert settled.success is True, settled
    assert settled.payer == payer.address and settled.network == f"eip155:{d.chain['chainId']}"
    assert settled.transaction.startswith("0x") and len(settled.transaction) == 66
    assert settled.amount == str(amount)
    assert body["status"] in ("settled", "pending_index"), body
    assert body["payment"]["transaction"] == settled.transaction
    cert = await certificate(d, body["transactionHash"])
    assert cert, cert
    assert await usdc(d, payer.address) == before - amount  # charged exactly once
    nonce = bytes.fromhex(signed[0].payload["authorization"]["nonce"][2:])
    assert await d.runtime.db.fetchval("SELECT count(*) FROM x402_payments WHERE auth_nonce = $1", nonce) == 1
    return settled


async def test_python_sdk_httpx_client_pays_the_retirement(resource: Daemon) -> None:
    d, payer, signed = resource, payer_of(resource.chain, 0), []
    before = await usdc(d, payer.address)
    response = await pay_with_httpx(d, payer, retire_body(payer.address, "httpx buyer"), signed)
    await assert_paid_and_retired(
        d, payer, before, signed, response.status_code, response.headers, response.json()
    )


async def test_python_sdk_requests_client_pays_the_retirement(resource: Daemon) -> None:
    d, payer, signed = resource, payer_of(resource.chain, 1), []
    before = await usdc(d, payer.address)
    body = retire_body(payer.address, "requests buyer")
    response = await asyncio.to_thread(pay_with_requests, d, payer, body, signed)
    paid = response.json()
    await assert_paid_and_retired(d, payer, before, signed, response.status_code, response.headers, paid)
    # The identical PAYMENT-SIGNATURE again: the first payment's answer, no second charge.
    header = encode_payment_signature_header(signed[0])
    again = await asyncio.to_thread(
        requests.post, d.api, json=body, headers={"PAYMENT-SIGNATURE": header}, timeout=120
    )
    assert again.status_code == 200 and again.json()["paymentId"] == paid["paymentId"], again.text
    settled = decode_payment_response_header(again.headers["PAYMENT-RESPONSE"])
    assert settled.transaction == paid["payment"]["transaction"]
    assert await usdc(d, payer.address) == before - int(signed[0].accepted.amount)


async def ts_client(d: Daemon, payer: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Run ``tests/x402_ts_client.mjs`` (the TypeScript SDK's client) posting ``body`` to
    actions/retire: its printed ``{status, body, paymentResponse}``."""
    node = shutil.which("node")
    assert node is not None, "node is needed (make install brings the SDKs)"
    env = {
        "PATH": os.environ["PATH"],
        "X402_PRIVATE_KEY": "0x" + bytes(payer.key).hex(),
        "X402_NETWORK": f"eip155:{d.chain['chainId']}",
        "X402_ASSET": d.chain["contracts"]["usdc"],
        "X402_MAX_AMOUNT": CAP,
    }
    proc = await asyncio.create_subprocess_exec(
        node,
        str(TS_CLIENT),
        d.api,
        "POST",
        json.dumps(body),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=150)
    assert proc.returncode == 0, err.decode()
    answer: dict[str, Any] = json.loads(out)
    return answer


async def test_typescript_sdk_client_pays_the_retirement(resource: Daemon) -> None:
    d, payer = resource, payer_of(resource.chain, 2)
    before = await usdc(d, payer.address)
    answer = await ts_client(d, payer, retire_body(payer.address, "typescript buyer"))
    assert answer["status"] == 200, answer
    settled, paid = answer["paymentResponse"], json.loads(answer["body"])
    assert settled["success"] is True and settled["payer"] == payer.address, settled
    assert (
        paid["status"] in ("settled", "pending_index")
        and paid["payment"]["transaction"] == settled["transaction"]
    )
    assert await certificate(d, paid["transactionHash"])
    assert await usdc(d, payer.address) == before - int(settled["amount"])
    # A payer without USDC: the TS client is answered 402 with the reason, and does not throw.
    broke = Account.create()
    refused = await ts_client(d, broke, retire_body(broke.address, "typescript, no USDC"))
    assert refused["status"] == 402, refused
    assert refused["paymentResponse"]["errorReason"] == "insufficient_funds", refused


def required_of(d: Daemon, body: dict[str, Any]) -> PaymentRequired:
    """The 402's PAYMENT-REQUIRED for ``body``, decoded by the SDK."""
    unpaid = requests.post(d.api, json=body, timeout=60)
    assert unpaid.status_code == 402, unpaid.text
    return decode_payment_required_header(unpaid.headers["PAYMENT-REQUIRED"])


def refusal(response: requests.Response) -> str | None:
    assert response.status_code == 402, response.text
    return decode_payment_required_header(response.headers["PAYMENT-REQUIRED"]).error


async def test_a_payer_without_usdc_gets_402_insufficient_funds(resource: Daemon) -> None:
    d, broke, signed = resource, Account.create(), []
    body = retire_body(broke.address, "a payer with nothing")
    response = await asyncio.to_thread(pay_with_requests, d, broke, body, signed)
    assert len(signed) == 1  # the SDK signed and sent a payment; we refused it
    assert refusal(response) == "insufficient_funds", dict(response.headers)
    settled = decode_payment_response_header(response.headers["PAYMENT-RESPONSE"])
    assert (settled.success, settled.error_reason, settled.transaction) == (False, "insufficient_funds", "")
    assert (
        await d.runtime.db.fetchval("SELECT count(*) FROM x402_payments WHERE payer = $1", broke.address) == 0
    )


async def test_a_quote_already_paid_is_refused_and_charges_nothing(resource: Daemon) -> None:
    d, first, second = resource, payer_of(resource.chain, 3), payer_of(resource.chain, 4)
    body = retire_body(first.address, "one quote, one retirement")
    required = await asyncio.to_thread(required_of, d, body)
    payloads = []
    for payer in (first, second):  # two SDK clients sign the same 402
        client = x402ClientSync().register(f"eip155:{d.chain['chainId']}", ExactEvmScheme(signer=payer))
        client.set_spend_controls(spend_controls(d))
        payloads.append(client.create_payment_payload(required))
    before = await usdc(d, second.address)

    def send(payload: PaymentPayload) -> requests.Response:
        headers = {"PAYMENT-SIGNATURE": encode_payment_signature_header(payload)}
        return requests.post(d.api, json=body, headers=headers, timeout=120)

    paid = await asyncio.to_thread(send, payloads[0])
    assert paid.status_code == 200, paid.text
    again = await asyncio.to_thread(send, payloads[1])
    assert refusal(again) == "quote_consumed"
    fresh = decode_payment_required_header(again.headers["PAYMENT-REQUIRED"])
    assert fresh.accepts[0].extra["quoteRef"] != required.accepts[0].extra["quoteRef"]  # a new quote
    assert await usdc(d, second.address) == before


async def test_a_crash_between_payment_and_retirement_completes_once(
    chain_and_db: tuple[dict[str, Any], str],
) -> None:
    """The SDK client pays a daemon whose workers are off (its transfer is journaled, never
    sent) and gets 200 with ``settlement_pending``; started again, the daemon sends it and
    retires, once."""
    info, dsn = chain_and_db
    payer, signed = payer_of(info, 5), []
    body = retire_body(payer.address, "survives a crash")
    async with retirement_resource(info, dsn, workers=False, settle_wait_s=2) as stopped:
        before = await usdc(stopped, payer.address)
        response = await asyncio.to_thread(pay_with_requests, stopped, payer, body, signed)
        assert response.status_code == 200, response.text
        settled = decode_payment_response_header(response.headers["PAYMENT-RESPONSE"])
        assert (settled.success, settled.error_reason) == (False, "settlement_pending"), settled
        payment_id = response.json()["paymentId"]
    async with retirement_resource(info, dsn) as d:  # "restarted": its payment keeper drives it
        await completes_once(d, payer, before, body, signed, payment_id, settled.transaction)


async def completes_once(
    d: Daemon,
    payer: Any,
    before: int,
    body: dict[str, Any],
    signed: list[PaymentPayload],
    payment_id: str,
    tx: str,
) -> None:
    """The crashed payment ends retired, once; its payload sent again answers success."""
    deadline = time.monotonic() + 60
    while True:
        row = await d.runtime.db.fetchrow("SELECT * FROM x402_payments WHERE id = $1::uuid", payment_id)
        if row["state"] == "retired" or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert row["state"] == "retired" and row["refund_job_id"] is None, row
    assert await usdc(d, payer.address) == before - int(signed[0].accepted.amount)
    # The same payload once more: the finished payment's answer, success with the transfer.
    header = encode_payment_signature_header(signed[0])
    again = await asyncio.to_thread(
        requests.post, d.api, json=body, headers={"PAYMENT-SIGNATURE": header}, timeout=120
    )
    assert again.status_code == 200 and again.json()["paymentId"] == payment_id, again.text
    final = decode_payment_response_header(again.headers["PAYMENT-RESPONSE"])
    assert final.success is True and len(final.transaction) == 66 and tx in ("", final.transaction)
    assert await usdc(d, payer.address) == before - int(signed[0].accepted.amount)


async def test_readme_example_pays_the_retirement(resource: Daemon, tmp_path: Path) -> None:
    """The documented retirement example (docs/x402.md), as written, in a directory whose
    ``.devdata/devnet.json`` has only fields ``make devnet`` writes (pointing at this daemon):
    it prints 200, the retirement's status and hash, and a successful PAYMENT-RESPONSE."""
    d = resource
    *_, code = x402_sdk_examples()
    payer = payer_of(d.chain, 1)  # the example's payer
    written = {k: d.chain[k] for k in ("chainId", "payers", "carbonClasses", "contracts", "treasury")}
    devnet = {**written, "usdc": d.chain["contracts"]["usdc"], "x402BaseUrl": d.api}
    (tmp_path / ".devdata").mkdir()
    (tmp_path / ".devdata" / "devnet.json").write_text(json.dumps(devnet))
    before = await usdc(d, payer.address)
    env = {"PATH": os.environ["PATH"], "PYTHONWARNINGS": "ignore"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=150)
    assert proc.returncode == 0, err.decode()
    printed = out.decode().strip()
    print("\ndocumented retirement client:", printed)
    status, state, tx, settled = printed.split(" ", 3)
    assert status == "200" and state in ("settled", "pending_index"), printed
    assert settled.startswith("success=True"), printed
    assert await certificate(d, tx)
    paid = await d.runtime.db.fetchrow(
        "SELECT amount, state FROM x402_payments WHERE payer = $1 ORDER BY created_at DESC LIMIT 1",
        payer.address,
    )
    assert await usdc(d, payer.address) == before - int(paid["amount"])
