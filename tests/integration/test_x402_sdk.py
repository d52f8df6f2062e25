"""The official x402 v2 SDKs, unmodified, against our facilitator (design: docs/design/x402-v2.md,
(b) and C8), on real anvil and Postgres through HTTP.

A resource server made with the Python SDK's own Flask middleware (``x402ResourceServerSync``
+ ``HTTPFacilitatorClientSync`` with a bearer auth provider, scheme ``exact`` on the devnet
chain, price an AssetAmount in the devnet USDC, payTo a fresh merchant) runs in a thread on a
free port. It is paid by the Python SDK's client (``x402ClientSync`` + ``ExactEvmScheme``,
spend controls allowing the devnet USDC, through ``x402_requests``) and by the TypeScript SDK's
(``tests/x402_ts_client.mjs``): 200, the merchant credited on chain, the payer charged once.
Failures through the same server and our facilitator: wrong signer, a window too short for
our margin, no balance, a replayed payload (settling twice answers the same transaction, one
transfer on chain), a missing or unknown API key (our verify answers 401, the SDK's resource
server turns it into a 402). And ``settlement_pending``: with mining paused our settle answers
pending with the hash; what the SDK's one immediate retry then does is asserted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from eth_account import Account
from x402 import x402ClientSync
from x402.http import (
    FacilitatorConfig,
    HTTPFacilitatorClientSync,
    decode_payment_required_header,
    encode_payment_signature_header,
)
from x402.http.utils import decode_payment_signature_header
from x402.mechanisms.evm.exact import ExactEvmScheme
from x402.schemas import PaymentPayload, PaymentRequirements

from relayer_dev.facilitator import create_facilitator_key
from tests.chain_helpers import token_balance
from tests.conftest import ROOT, Daemon, free_port
from tests.helpers.docs import x402_sdk_examples
from tests.helpers.sdk import (
    FUNDED,
    PRICE,
    Bearer,
    Resource,
    fresh_payer,
    pay,
    resource,
    settle_answer,
)
from tests.private import Anvil

pytestmark = pytest.mark.integration

TS_CLIENT = ROOT / "tests" / "x402_ts_client.mjs"


async def new_key(daemon: Daemon) -> str:
    """A facilitator API key in the session daemon's database (the dev tooling's one helper)."""
    return await create_facilitator_key(daemon.runtime.settings, f"sdk-test-{uuid.uuid4().hex[:6]}")


@pytest.fixture(scope="module")
async def api_key(daemon: Daemon) -> AsyncIterator[str]:
    yield await new_key(daemon)


def refusal(response: requests.Response) -> str | None:
    """The ``error`` of the 402's PAYMENT-REQUIRED (the reason the server gives)."""
    return decode_payment_required_header(response.headers["PAYMENT-REQUIRED"]).error


async def usdc(d: Daemon, owner: str) -> int:
    return await token_balance(d.runtime.node, "usdc", owner)


async def transfers_of(d: Daemon, tx_hash: str) -> tuple[int, int]:
    """(jobs, transactions) our journal holds for ``tx_hash``'s job."""
    jobs = await d.runtime.db.fetch(
        "SELECT id FROM relay_jobs WHERE tx_hash = $1", bytes.fromhex(tx_hash[2:])
    )
    if not jobs:
        return 0, 0
    sent = await d.runtime.db.fetchval(
        "SELECT count(*) FROM relay_transactions WHERE job_id = $1", jobs[0]["id"]
    )
    return len(jobs), int(sent)


async def test_python_sdk_client_pays_the_sdk_resource_server_through_us(
    daemon: Daemon, api_key: str
) -> None:
    payer = await asyncio.to_thread(fresh_payer, daemon)
    async with resource(daemon, api_key) as paid:
        response = await asyncio.to_thread(pay, daemon, payer, paid.url, {"hello": "x402"})
        assert response.status_code == 200, (response.status_code, response.text, dict(response.headers))
        assert response.json() == {"served": True, "echo": {"hello": "x402"}}
        settled = settle_answer(response)
        assert settled.success is True, settled
        assert settled.network == f"eip155:{daemon.chain['chainId']}"
        assert settled.payer == payer.address and len(settled.transaction) == 66
        assert len(paid.seen) == 1  # the handler ran once, for the paid request
    assert await usdc(daemon, paid.merchant) == PRICE
    assert await usdc(daemon, payer.address) == FUNDED - PRICE  # charged once
    assert await transfers_of(daemon, settled.transaction) == (1, 1)


async def test_typescript_sdk_client_pays_the_same_resource(daemon: Daemon, api_key: str) -> None:
    node = shutil.which("node")
    assert node is not None, "node is needed (make install brings the SDKs)"
    payer = await asyncio.to_thread(fresh_payer, daemon)
    env = {
        "PATH": os.environ["PATH"],
        "X402_PRIVATE_KEY": "0x" + bytes(payer.key).hex(),
        "X402_NETWORK": f"eip155:{daemon.chain['chainId']}",
        "X402_ASSET": daemon.chain["contracts"]["usdc"],
        "X402_MAX_AMOUNT": "1000000",
    }
    async with resource(daemon, api_key) as paid:
        proc = await asyncio.create_subprocess_exec(
            node,
            str(TS_CLIENT),
            paid.url,
            "POST",
            json.dumps({"from": "typescript"}),
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=100)
    assert proc.returncode == 0, err.decode()
    print("\nTypeScript client:", out.decode().strip())
    answer = json.loads(out)
    assert answer["status"] == 200, answer
    assert json.loads(answer["body"]) == {"served": True, "echo": {"from": "typescript"}}
    settled = answer["paymentResponse"]
    assert settled["success"] is True and settled["payer"] == payer.address, settled
    assert await usdc(daemon, paid.merchant) == PRICE
    assert await usdc(daemon, payer.address) == FUNDED - PRICE
    assert await transfers_of(daemon, settled["transaction"]) == (1, 1)
    # The payload the TS SDK signed: the EIP-3009 window it chose.
    signed = decode_payment_signature_header(paid.seen[0])
    assert signed.payload["authorization"]["validAfter"] == "0"


def payload_for(d: Daemon, paid: Resource, signer: Any) -> tuple[PaymentPayload, Any]:
    """Ask ``paid`` without paying and sign its 402 with the SDK client of ``signer``: the
    payload and the requirements it answers."""
    unpaid = requests.post(paid.url, json={}, timeout=30)
    assert unpaid.status_code == 402, unpaid.text
    required = decode_payment_required_header(unpaid.headers["PAYMENT-REQUIRED"])
    client = x402ClientSync().register(f"eip155:{d.chain['chainId']}", ExactEvmScheme(signer=signer))
    client.set_spend_controls(False)
    return client.create_payment_payload(required), required.accepts[0]


def send_paid(paid: Resource, payload: PaymentPayload) -> requests.Response:
    headers = {"PAYMENT-SIGNATURE": encode_payment_signature_header(payload)}
    return requests.post(paid.url, json={}, headers=headers, timeout=120)


async def test_failures_through_the_sdk_resource_server(daemon: Daemon, api_key: str) -> None:
    payer = await asyncio.to_thread(fresh_payer, daemon)
    stranger, broke = fresh_payer(daemon, 0), fresh_payer(daemon, 0)
    async with resource(daemon, api_key) as paid:
        # Wrong signer: a payload signed by one account claiming to be from another.
        forged, _ = await asyncio.to_thread(payload_for, daemon, paid, stranger)
        forged.payload["authorization"]["from"] = payer.address
        response = await asyncio.to_thread(send_paid, paid, forged)
        assert response.status_code == 402 and refusal(response) == "invalid_exact_evm_payload_signature"
        # No balance: the SDK client pays from an empty account.
        response = await asyncio.to_thread(pay, daemon, broke, paid.url, {})
        assert response.status_code == 402 and refusal(response) == "insufficient_funds", response.headers
        assert paid.seen == []  # the handler never ran
    # A window shorter than our expiry margin (the route's maxTimeoutSeconds) is refused at verify.
    async with resource(daemon, api_key, max_timeout_s=5) as short:
        response = await asyncio.to_thread(pay, daemon, payer, short.url, {})
        assert response.status_code == 402, response.text
        assert refusal(response) == "invalid_exact_evm_payload_authorization_valid_before"
    assert await usdc(daemon, paid.merchant) == await usdc(daemon, short.merchant) == 0
    assert await usdc(daemon, payer.address) == FUNDED


async def test_a_replayed_payload_pays_once(daemon: Daemon, api_key: str) -> None:
    payer = await asyncio.to_thread(fresh_payer, daemon)
    async with resource(daemon, api_key) as paid:
        payload, accepted = await asyncio.to_thread(payload_for, daemon, paid, payer)
        first = await asyncio.to_thread(send_paid, paid, payload)
        assert first.status_code == 200, first.text
        tx = settle_answer(first).transaction
        # The same PAYMENT-SIGNATURE again at the resource: verify says the nonce is spent.
        again = await asyncio.to_thread(send_paid, paid, payload)
        assert again.status_code == 402 and refusal(again) == "invalid_exact_evm_nonce_already_used"
        assert len(paid.seen) == 1
    # Settled twice more straight through the SDK's facilitator client: the same transaction.
    config = FacilitatorConfig(url=f"{daemon.base_url}/facilitator", auth_provider=Bearer(api_key))
    requirements = PaymentRequirements.model_validate(accepted.model_dump())
    with HTTPFacilitatorClientSync(config) as client:
        for _ in range(2):
            answer = await asyncio.to_thread(client.settle, payload, requirements)
            assert (answer.success, answer.transaction) == (True, tx), answer
    assert await usdc(daemon, paid.merchant) == PRICE
    assert await usdc(daemon, payer.address) == FUNDED - PRICE
    assert await transfers_of(daemon, tx) == (1, 1)


async def test_without_a_valid_api_key_the_resource_server_answers_402(daemon: Daemon) -> None:
    payer = await asyncio.to_thread(fresh_payer, daemon)
    for key in (None, "mk_000000000000_not-a-key"):
        async with resource(daemon, key) as paid:  # /supported is public: the server starts
            response = await asyncio.to_thread(pay, daemon, payer, paid.url, {})
            assert response.status_code == 402, response.text
            error = refusal(response)
            assert error is not None and "Facilitator verify failed (401)" in error, error
            assert paid.seen == []
        assert await usdc(daemon, paid.merchant) == 0
    # What the SDK's client got from us: 401 on verify.
    body = {"x402Version": 2, "paymentPayload": {}, "paymentRequirements": {}}
    async with daemon.session.post(f"{daemon.base_url}/facilitator/verify", json=body) as r:
        assert r.status == 401 and (await r.json())["error"] == "unauthorized"
    assert await usdc(daemon, payer.address) == FUNDED


@contextlib.contextmanager
def mining_paused(d: Daemon, settle_wait_s: float) -> Iterator[Anvil]:
    """Automine off and our settle's wait shortened; both restored (one block mined) after."""
    anvil, facilitator = Anvil(d.chain["rpcUrl"]), d.runtime.facilitator
    wait = facilitator.settle_wait_s
    facilitator.settle_wait_s = settle_wait_s
    anvil.automine(False)
    try:
        yield anvil
    finally:
        anvil.automine(True)
        anvil.mine()
        facilitator.settle_wait_s = wait


def mine_when(anvil: Anvil, seconds: float, stop: threading.Event) -> None:
    """Mine one block ``seconds`` after a transaction reaches anvil's pool (bounded: 30 s)."""
    deadline = time.monotonic() + 30
    while not anvil.pool() and time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.05)
    if not stop.wait(seconds):
        anvil.mine()


async def test_settlement_pending_and_the_sdks_one_retry(daemon: Daemon, api_key: str) -> None:
    """With mining paused past both waits, our settle answers pending (hash known) twice, the
    SDK's resource server gives up after its one immediate retry and answers the buyer 402
    with PAYMENT-RESPONSE ``settlement_pending`` and the hash; once mining resumes that very
    transaction pays the merchant (the buyer was charged and got a 402: upstream's known
    gap). With mining back during the retry's wait, the retry answers success: 200."""
    wait = 2.0
    stuck = await asyncio.to_thread(fresh_payer, daemon)
    quick = await asyncio.to_thread(fresh_payer, daemon)
    async with resource(daemon, api_key) as paid:
        with mining_paused(daemon, wait) as anvil:
            started = time.monotonic()
            response = await asyncio.to_thread(pay, daemon, stuck, paid.url, {})
            took = time.monotonic() - started
            assert response.status_code == 402, response.text
            answer = settle_answer(response)
            assert (answer.success, answer.error_reason) == (False, "settlement_pending"), answer
            assert len(answer.transaction) == 66 and anvil.pool() == {answer.transaction}
            assert took >= 2 * wait  # two settles, each waited the whole wait
            assert await usdc(daemon, paid.merchant) == 0
        assert len(paid.seen) == 1
    await asyncio.sleep(0.5)
    assert await usdc(daemon, paid.merchant) == PRICE  # the pending transaction paid after all
    assert await usdc(daemon, stuck.address) == FUNDED - PRICE
    assert await transfers_of(daemon, answer.transaction) == (1, 1)

    async with resource(daemon, api_key) as paid:
        with mining_paused(daemon, wait) as anvil:
            stop = threading.Event()
            miner = threading.Thread(target=mine_when, args=(anvil, wait + 0.5, stop))
            miner.start()
            try:
                response = await asyncio.to_thread(pay, daemon, quick, paid.url, {})
            finally:
                stop.set()
                miner.join(timeout=35)
        assert response.status_code == 200, response.text
        settled = settle_answer(response)
        assert settled.success is True, settled
    assert await usdc(daemon, paid.merchant) == PRICE
    assert await usdc(daemon, quick.address) == FUNDED - PRICE
    assert await transfers_of(daemon, settled.transaction) == (1, 1)


async def wait_for_port(port: int, server: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server.returncode is None:
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the documented server did not listen on {port}")


async def test_readme_examples_run(daemon: Daemon, api_key: str, tmp_path: Path) -> None:
    """The documented resource server and client (docs/x402.md), as written, against a devnet.json naming the
    test daemon (its facilitator URL and a key) and a fresh payer: the client prints 200 and
    a successful PAYMENT-RESPONSE, and the seller is paid 0.01 USDC."""
    server_code, client_code, _ = x402_sdk_examples()
    port = free_port()
    payer = await asyncio.to_thread(fresh_payer, daemon)
    seller = Account.create().address
    (tmp_path / ".devdata").mkdir()
    (tmp_path / ".devdata" / "devnet.json").write_text(
        json.dumps(
            {
                "chainId": daemon.chain["chainId"],
                "usdc": daemon.chain["contracts"]["usdc"],
                "facilitatorUrl": f"{daemon.base_url}/facilitator",
                "facilitatorApiKey": api_key,
                "payers": [{"address": payer.address, "privateKey": "0x" + bytes(payer.key).hex()}],
                "seller": {"address": seller},
            }
        )
    )
    env = {"PATH": os.environ["PATH"], "PYTHONWARNINGS": "ignore"}

    async def python(code: str, **kw: Any) -> asyncio.subprocess.Process:
        code = code.replace("4021", str(port))
        return await asyncio.create_subprocess_exec(sys.executable, "-c", code, cwd=tmp_path, env=env, **kw)

    server = await python(server_code, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        await wait_for_port(port, server)
        client = await python(client_code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(client.communicate(), timeout=100)
    finally:
        server.terminate()
        _, server_err = await asyncio.wait_for(server.communicate(), timeout=10)
    assert client.returncode == 0, (err.decode(), server_err.decode()[-2000:])
    print("\ndocumented client:", out.decode().strip())
    assert out.decode().startswith("200 {'weather': 'sunny'} success=True"), out
    assert await usdc(daemon, seller) == 10_000
    assert await usdc(daemon, payer.address) == FUNDED - 10_000
