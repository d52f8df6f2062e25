"""``python -m relayer_dev demo``: the whole gasless flow as a real client does it, over HTTP only: discover,
quote, actions/retire without a signature (402 challenge), sign the EIP-712 typed data with
eth-account as the payer, post the request back, resolve the certificate. Starts the daemon
in-process when none answers at the configured address."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import click
from eth_account import Account
from eth_account.messages import encode_typed_data

from relayer.config import Settings
from relayer_dev import DevError


def _step(text: str) -> None:
    click.echo(click.style("==> ", fg="green") + text, err=True)


async def _alive(session: aiohttp.ClientSession, base: str) -> bool:
    try:
        async with session.get(f"{base}/healthz", timeout=aiohttp.ClientTimeout(total=1)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


@contextlib.asynccontextmanager
async def _daemon(settings: Settings, session: aiohttp.ClientSession) -> AsyncIterator[None]:
    if await _alive(session, settings.public_base_url):
        _step(f"using the daemon at {settings.public_base_url}")
        yield
        return
    from relayer.app import serve

    _step(f"starting the daemon in-process at {settings.public_base_url}")
    task = asyncio.create_task(serve(settings, workers=True))
    try:
        for _ in range(100):
            if task.done():
                task.result()
            if await _alive(session, settings.public_base_url):
                break
            await asyncio.sleep(0.1)
        else:
            raise DevError("the daemon did not come up within 10 s")
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    data: dict[str, Any] = await resp.json(content_type=None)
    return data


async def run_demo(
    settings: Settings, devnet: dict[str, Any], *, amount: str, carbon_class: str | None
) -> dict[str, Any]:
    """Run the flow; returns the final result line's object."""
    payer = devnet["payers"][0]
    api = settings.x402_base_url
    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=settings.settle_wait_s + 30)
    async with aiohttp.ClientSession(timeout=timeout) as session, _daemon(settings, session):
        async with session.get(f"{api}/discover") as r:
            discovered = await _json(r)
        classes = discovered["carbonClasses"]
        chosen = next((c for c in classes if c["carbonClassId"] == carbon_class), classes[0])
        _step(
            f"discover: {len(classes)} carbon classes, {len(discovered['marketplaceListings'])} listings; "
            f"using class {chosen['carbonClassId']} ({chosen['name']})"
        )
        params = {"carbonClass": chosen["carbonClassId"], "amount": amount, "inputToken": "USDC"}
        async with session.get(f"{api}/quote", params=params) as r:
            quote = await _json(r)
        _step(f"quote: {quote['humanSummary']}")
        request = {
            "action": "actions/retire",
            **params,
            "from": payer["address"],
            "details": {
                "beneficiaryIsPayer": True,
                "beneficiaryString": "Relayer demo",
                "retirementMessage": "Gasless retirement on a local Base chain",
            },
        }
        async with session.post(api, json=request) as r:
            challenge = await _json(r)
            _step(
                f"actions/retire without a signature: HTTP {r.status} {challenge.get('error')}; "
                f"authorize {challenge.get('authValueFormatted')} USDC "
                f"(gas allowance {challenge.get('gasAllowanceFormatted')} USDC)"
            )
        if r.status != 402:
            return {"status": "failed", "error": challenge}
        typed = challenge["typedData"]
        signed = Account.sign_message(encode_typed_data(full_message=typed), payer["privateKey"])
        body = challenge["actionsRetireRequest"]
        body["authPayload"]["signature"] = "0x" + bytes(signed.signature).hex()
        _step(f"signed EIP-712 {typed['primaryType']} as payer {payer['address']}; posting it back")
        async with session.post(api, json=body) as r:
            result = await _json(r)
        _step(
            f"actions/retire: HTTP {r.status} status={result.get('status') or result.get('error')} "
            f"tx={result.get('transactionHash')}"
        )
        urls: list[str] = []
        ids: list[str] = []
        if result.get("transactionHash"):
            async with session.get(f"{api}/certificate", params={"txHash": result["transactionHash"]}) as r:
                cert = await _json(r)
            for entry in cert.get("retirements", []):
                ids.append(entry["retirementId"])
                urls.append(entry["certificateUrl"])
                _step(
                    f"certificate: {entry['amountInTonnes']} t of {entry['creditId']} for "
                    f"{entry['beneficiaryName'] or entry['beneficiaryAddress']} -> {entry['certificateUrl']}"
                )
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": [payer["address"], "latest"]}
        async with session.post(devnet["rpcUrl"], json=rpc) as r:
            balance = int((await _json(r))["result"], 16)
        _step(f"payer ETH balance: {balance} wei; done in {time.perf_counter() - started:.1f} s")
        return {
            "status": result.get("status") or result.get("error"),
            "transactionHash": result.get("transactionHash"),
            "retirementIds": ids,
            "certificateUrls": urls,
            "payerEthBalanceWei": balance,
        }
