"""``python -m relayer_dev demo``: the whole gasless flow as a real client does it, over HTTP only: discover,
quote, actions/retire without a signature (402 challenge), sign the EIP-712 typed data with
eth-account as the payer, post the request back, resolve the certificate. Starts the daemon
in-process when none answers at the configured address (and stops it at the end: the
certificates are then saved as PDF files, since their URLs would answer no more); refuses
an address another service holds."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final, NoReturn

import aiohttp
import click
from eth_account import Account
from eth_account.messages import encode_typed_data

from relayer.config import Settings
from relayer.domain.errors import RelayerError
from relayer_dev import DevError
from relayer_dev.settings import shown


def step(text: str) -> None:
    click.echo(click.style("==> ", fg="green") + text, err=True)


RELAYER_NAME: Final = "x402 carbon retirement endpoint"
"""What our daemon's x402 index (``GET /api``) answers as its ``name``."""


def _elsewhere(settings: Settings) -> str:
    """How to run the demo beside whatever holds the daemon's port: on one free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return (
        f"stop it, or run the demo on a free port: RELAYER_HTTP_PORT={port} "
        f"RELAYER_PUBLIC_BASE_URL=http://127.0.0.1:{port} make demo"
    )


async def identify(
    session: aiohttp.ClientSession, settings: Settings, devnet: dict[str, Any] | None = None
) -> bool:
    """Whether this devnet's relayer answers at ``settings.public_base_url`` (False: nothing
    listens there, so the demo may start its own).

    Raises:
        DevError: something else answers there (a foreign service, an HTTP server that is not
            a relayer, or a relayer of another chain or settlement than ``devnet``'s); the
            message is one line naming it and the way out.
    """
    url = settings.x402_base_url
    try:
        async with session.get(
            url, headers={"Accept": "application/json"}, timeout=aiohttp.ClientTimeout(total=3)
        ) as r:
            index = await r.json(content_type=None) if r.status == 200 else None
            status = r.status
    except aiohttp.ClientConnectorError:
        return False
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise DevError(
            f"{url}: something listens there but does not answer as a relayer "
            f"({type(exc).__name__}); {_elsewhere(settings)}"
        ) from None
    if not isinstance(index, dict) or index.get("name") != RELAYER_NAME:
        raise DevError(
            f"{url}: another service answers there (HTTP {status}, not this relayer); {_elsewhere(settings)}"
        )
    if devnet is not None and (index.get("chainId"), index.get("settlement")) != (
        devnet["chainId"],
        devnet["contracts"]["settlement"],
    ):
        raise DevError(
            f"{url}: a relayer of another devnet answers there (chain {index.get('chainId')}, "
            f"settlement {index.get('settlement')}); {_elsewhere(settings)}"
        )
    return True


async def refuse_foreign(settings: Settings) -> None:
    """Fail early, before any devnet is started, when something other than a relayer holds
    the daemon's address (see :func:`identify`)."""
    async with aiohttp.ClientSession() as session:
        await identify(session, settings)


@contextlib.asynccontextmanager
async def _daemon(
    settings: Settings, session: aiohttp.ClientSession, devnet: dict[str, Any]
) -> AsyncIterator[bool]:
    """This devnet's daemon for the duration: the one that answers (yields True: it keeps
    running after the demo) or one started in-process (yields False: stopped at the end)."""
    if await identify(session, settings, devnet):
        step(f"using the daemon at {settings.public_base_url} (left running as it was)")
        yield True
        return
    from relayer.app import serve

    step(f"starting the daemon in-process at {settings.public_base_url}")
    task = asyncio.create_task(serve(settings, workers=True))
    try:
        for _ in range(100):
            if task.done():
                _raise_start_failure(task, settings)
            with contextlib.suppress(DevError):
                if await identify(session, settings, devnet):
                    break
            await asyncio.sleep(0.1)
        else:
            raise DevError("the daemon did not come up within 10 s")
        yield False
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _raise_start_failure(task: asyncio.Task[None], settings: Settings) -> NoReturn:
    """The in-process daemon ended before it answered: its error (one line: a port it cannot
    listen on is a ``ConfigError``), with the way out."""
    try:
        task.result()
    except RelayerError as exc:
        raise DevError(f"{exc.message}; {_elsewhere(settings)}") from None
    raise DevError("the daemon stopped before it answered")


async def _save_certificate(session: aiohttp.ClientSession, url: str, path: Path) -> Path:
    """The PDF certificate at ``url``, written to ``path``."""
    async with session.get(url, headers={"Accept": "application/pdf"}) as r:
        body = await r.read()
        if r.status != 200 or not body.startswith(b"%PDF"):
            raise DevError(f"{url} answered HTTP {r.status} {r.content_type}, not a PDF certificate")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    return path


async def _json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    data: dict[str, Any] = await resp.json(content_type=None)
    return data


async def run_demo(
    settings: Settings,
    devnet: dict[str, Any],
    *,
    amount: str,
    carbon_class: str | None,
    certificates_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the flow on each chain the daemon relays on (``settings.served_chain_ids()``: on
    the devnet both Base networks, the first first); returns the final result line's object:
    ``status`` (``settled`` when every chain's retirement settled, else the first other
    answer), ``transactionHash`` (the first chain's), ``chains`` (per chain: ``chainId``,
    ``status``, ``transactionHash``, ``payerEthBalanceWei``), ``retirementIds``,
    ``certificateFiles`` (the PDFs saved under ``certificates_dir``, default
    ``.devdata/certificates`` beside the deployment file), ``certificateUrls`` only when the
    daemon used keeps running (one the demo did not start), ``daemonLeftRunning`` and
    ``payerEthBalanceWei`` (the most on any chain)."""
    if certificates_dir is None:
        certificates_dir = Path(devnet["deploymentFile"]).parent / "certificates"
    rpc_urls = {c["chainId"]: c["rpcUrl"] for c in devnet.get("chains", ())} | {
        devnet["chainId"]: devnet["rpcUrl"]
    }
    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=settings.settle_wait_s + 30)
    runs: list[dict[str, Any]] = []
    certificates: list[tuple[str, str, Path]] = []
    async with aiohttp.ClientSession(timeout=timeout) as session, _daemon(settings, session, devnet) as kept:
        for chain_id in settings.served_chain_ids():
            demo = _ChainDemo(
                session, settings.x402_base_url, chain_id, rpc_urls[chain_id], devnet["payers"][0]
            )
            run, found = await demo.retire(amount, carbon_class, certificates_dir, kept)
            runs.append(run)
            certificates += found
    balance = max(run["payerEthBalanceWei"] for run in runs)
    step(f"payer ETH balance: {balance} wei on every chain; done in {time.perf_counter() - started:.1f} s")
    status = next((run["status"] for run in runs if run["status"] != "settled"), "settled")
    return {
        "status": status,
        "transactionHash": runs[0]["transactionHash"],
        "chains": runs,
        "retirementIds": [rid for rid, _, _ in certificates],
        "certificateFiles": [str(path) for _, _, path in certificates],
        **({"certificateUrls": [url for _, url, _ in certificates]} if kept else {}),
        "daemonLeftRunning": kept,
        "payerEthBalanceWei": balance,
    }


class _ChainDemo:
    """The demo's flow on one chain: every request names ``chain_id``."""

    def __init__(
        self, session: aiohttp.ClientSession, api: str, chain_id: int, rpc_url: str, payer: dict[str, str]
    ) -> None:
        self.session, self.api, self.chain_id, self.rpc_url, self.payer = (
            session,
            api,
            chain_id,
            rpc_url,
            payer,
        )

    async def retire(
        self, amount: str, carbon_class: str | None, certificates_dir: Path, kept: bool
    ) -> tuple[dict[str, Any], list[tuple[str, str, Path]]]:
        """Discover, quote, sign and post one retirement on this chain, save its
        certificates: the chain's entry of the result (see :func:`run_demo`) and the
        certificates found."""
        session, api, payer, chain = self.session, self.api, self.payer, {"chainId": str(self.chain_id)}
        async with session.get(f"{api}/discover", params=chain) as r:
            discovered = await _json(r)
        classes = discovered["carbonClasses"]
        chosen = next((c for c in classes if c["carbonClassId"] == carbon_class), classes[0])
        step(
            f"chain {self.chain_id}: discover: {len(classes)} carbon classes, "
            f"{len(discovered['marketplaceListings'])} listings; using class {chosen['carbonClassId']} "
            f"({chosen['name']})"
        )
        params = {"carbonClass": chosen["carbonClassId"], "amount": amount, "inputToken": "USDC", **chain}
        async with session.get(f"{api}/quote", params=params) as r:
            quote = await _json(r)
        step(f"quote: {quote['humanSummary']}")
        result = await self._signed(params)
        certificates: list[tuple[str, str, Path]] = []
        if result.get("transactionHash"):
            certificates = await _certificates(
                session, api, self.chain_id, result["transactionHash"], certificates_dir, kept
            )
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": [payer["address"], "latest"]}
        async with session.post(self.rpc_url, json=rpc) as r:
            balance = int((await _json(r))["result"], 16)
        run = {
            "chainId": self.chain_id,
            "status": result.get("status") or result.get("error"),
            "transactionHash": result.get("transactionHash"),
            "payerEthBalanceWei": balance,
        }
        return run, certificates

    async def _signed(self, params: dict[str, str]) -> dict[str, Any]:
        """actions/retire unsigned (the 402 challenge), then signed by the payer: the answer."""
        session, api, payer = self.session, self.api, self.payer
        request = {
            "action": "actions/retire",
            **params,
            "chainId": self.chain_id,
            "from": payer["address"],
            "details": {
                "beneficiaryIsPayer": True,
                "beneficiaryString": "Relayer demo",
                "retirementMessage": "Gasless retirement on a local Base chain",
            },
        }
        async with session.post(api, json=request) as r:
            challenge = await _json(r)
            step(
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
        step(
            f"signed EIP-712 {typed['primaryType']} (domain {typed['domain']['name']!r}, chain "
            f"{typed['domain']['chainId']}) as payer {payer['address']}; posting it back"
        )
        async with session.post(api, json=body) as r:
            result = await _json(r)
        step(
            f"actions/retire: HTTP {r.status} status={result.get('status') or result.get('error')} "
            f"tx={result.get('transactionHash')}"
        )
        return result


async def _certificates(
    session: aiohttp.ClientSession, api: str, chain_id: int, tx_hash: str, directory: Path, kept: bool
) -> list[tuple[str, str, Path]]:
    """``(retirementId, certificateUrl, saved PDF)`` of each retirement of ``tx_hash`` on
    ``chain_id``; the step line names the URL only when the daemon keeps running, else the file."""
    async with session.get(f"{api}/certificate", params={"txHash": tx_hash, "chainId": str(chain_id)}) as r:
        cert = await _json(r)
    found = []
    for entry in cert.get("retirements", []):
        rid, url = entry["retirementId"], entry["certificateUrl"]
        path = await _save_certificate(session, url, directory / f"{rid}.pdf")
        found.append((rid, url, path))
        step(
            f"certificate: {entry['amountInTonnes']} t of {entry['creditId']} for "
            f"{entry['beneficiaryName'] or entry['beneficiaryAddress']} -> {url if kept else shown(path)}"
        )
    return found
