"""The x402 endpoint's self-description against the running daemon (real anvil, real
Postgres): the manifest names the settlement contract, tokens and request fields the daemon
really uses, the errors document gives the statuses the daemon really answers, the daemon
serves the meta routes with the host choosing the major, and the built wheel carries the
guides."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web

from relayer.api import kernel, x402_routes
from relayer.api.x402_meta import add_meta_routes
from relayer.api.x402_versions import GUIDE_IDS, LATEST_VERSION, X402Info
from tests.conftest import Daemon, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TREE = ("pyproject.toml", "README.md", "relayer", "contracts_abi", "migrations", "data")


def _info(daemon: Daemon) -> X402Info:
    """This daemon's x402 description, from its runtime (what ``info_of`` gives)."""
    supply = daemon.runtime.services.supply
    return X402Info(
        api_version=x402_routes.API_VERSION,
        major=x402_routes.LATEST_MAJOR,
        base_url=daemon.api,
        versioned_hosts={"latest": daemon.api, "current": daemon.api, "v0": daemon.api},
        chain_id=supply.chain_id,
        settlement=supply.contracts.settlement,
        input_tokens=[
            {"symbol": t.symbol, "address": t.address, "decimals": t.decimals, "scheme": t.scheme}
            for t in supply.tokens.values()
        ],
        security_contact="mailto:security@example.invalid",
    )


@pytest.fixture(scope="module")
async def meta(daemon: Daemon) -> AsyncIterator[str]:
    """The meta routes over this daemon's runtime, on their own loopback port."""
    app = web.Application(middlewares=[kernel.envelope])
    app[kernel.METRICS] = daemon.runtime.metrics
    info = _info(daemon)
    add_meta_routes(app, lambda _request: info)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def _fetch(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url) as r:
        assert r.status == 200, url
        body: dict[str, Any] = await r.json()
    return body


async def test_manifest_names_what_the_daemon_uses(daemon: Daemon, meta: str) -> None:
    manifest = await _fetch(daemon.session, f"{meta}/.well-known/x402.json")
    status, discovered = await daemon.get("/api/discover")
    assert status == 200
    assert manifest["chains"][0]["chainId"] == discovered["chainId"]
    assert [{k: t[k] for k in ("symbol", "address", "decimals")} for t in manifest["inputTokens"]] == (
        discovered["supportedInputTokens"]
    )
    payer = daemon.chain["payers"][0]["address"]
    schemes = {t["symbol"]: t["scheme"] for t in manifest["inputTokens"]}
    for token in ("USDC", "kVCM"):
        status, challenge = await daemon.post(
            {
                "action": "actions/retire",
                "carbonClass": "RE",
                "amount": "0.5",
                "inputToken": token,
                "from": payer,
                "details": {"beneficiaryIsPayer": True, "retirementMessage": "manifest check"},
            }
        )
        assert (status, challenge["error"]) == (402, "payment_required"), challenge
        assert challenge["scheme"] == schemes[token]
        request = challenge["actionsRetireRequest"]
        assert challenge["to"] == request["authPayload"]["to"] == manifest["settlement"]
        # every field of the daemon's own ready request is declared by the live schema
        schema = next(a for a in manifest["actions"] if a["action"] == "actions/retire")["schema"]
        assert set(request) <= set(schema["properties"])
        assert set(request["details"]) <= set(schema["$defs"]["Details"]["properties"])
        assert set(request["authPayload"]) <= set(schema["$defs"]["AuthPayload"]["properties"])
        assert set(schema["$defs"]["AuthPayload"]["required"]) <= set(request["authPayload"])


async def test_manifest_and_docs_lead_to_the_standard_x402_routes(daemon: Daemon, meta: str) -> None:
    """The manifest's ``standardX402`` names the facilitator's routes and the standard
    resource's headers, each link answering on this daemon; ``/api/docs`` lists its guide."""
    manifest = await _fetch(daemon.session, f"{meta}/.well-known/x402.json")
    standard = manifest["standardX402"]
    assert (standard["x402Version"], standard["scheme"]) == (2, "exact")
    assert standard["network"] == f"eip155:{manifest['chains'][0]['chainId']}"
    assert standard["resource"]["url"] == f"{manifest['baseUrl']}/actions/retire"
    facilitator = standard["facilitator"]
    assert facilitator["url"] == f"{daemon.base_url}/facilitator"
    for name in ("supported", "discovery"):  # public
        async with daemon.session.get(facilitator[name]) as resp:
            assert resp.status == 200, (name, await resp.text())
    supported = await _fetch(daemon.session, facilitator["supported"])
    assert supported["kinds"][0]["network"] == standard["network"]
    for name in ("verify", "settle"):  # behind a key
        async with daemon.session.post(facilitator[name], json={}) as resp:
            assert resp.status == 401, name
    status, index = await daemon.get("/api/docs")
    assert status == 200 and "standard-x402" in [d["id"] for d in index["documents"]]
    assert standard["guide"].endswith("/docs?id=standard-x402")


async def test_errors_document_gives_the_statuses_the_daemon_answers(daemon: Daemon, meta: str) -> None:
    document = await _fetch(daemon.session, f"{meta}/.well-known/x402-errors.json")
    statuses = {e["code"]: e["httpStatus"] for e in document["errors"]}
    payer = daemon.chain["payers"][0]["address"]
    answered = [
        await daemon.post({"action": "teleport"}),
        await daemon.post({"action": "quote", "carbonClass": "NBO", "amount": "1", "colour": "green"}),
        await daemon.get("/.well-known/nowhere"),  # an x402 path (elsewhere the marketplace answers)
        await daemon.get("/api/quote", listingId="999", amount="1"),
        await daemon.get("/api/quote", carbonClass="NBO", amount="0.0001"),
        await daemon.get("/api/quote", listingId="1", amount="1", inputToken="kVCM"),
        await daemon.get("/api/quote", carbonClass="NBO", amount="1", chainId="1"),
        await daemon.get("/api/certificate", txHash="0x" + "ab" * 32),
        await daemon.post({"action": "prepare-auth", "carbonClass": "NBO", "amount": "1", "from": payer}),
        await daemon.post(
            {
                "action": "actions/retire",
                "carbonClass": "NBO",
                "amount": "1",
                "from": payer,
                "details": {"beneficiaryIsPayer": True},
            }
        ),
    ]
    codes = set()
    for status, body in answered:
        codes.add(body["error"])
        assert status == statuses[body["error"]], body
        assert body["x402FacilitatorVersion"] == document["x402FacilitatorVersion"]
    assert len(codes) == len(answered)


async def test_the_daemon_serves_the_meta_routes_by_host(daemon: Daemon) -> None:
    async with daemon.session.get(f"{daemon.base_url}/.well-known/x402.json") as r:
        assert r.status == 200
        latest = await r.json()
    assert latest["apiVersion"] == LATEST_VERSION and latest["major"] == 1
    assert latest["settlement"] == daemon.runtime.services.supply.contracts.settlement
    hosts = daemon.runtime.settings.x402_hosts()
    v0_host = urlsplit(hosts["v0"]).netloc
    async with daemon.session.get(f"{daemon.base_url}/.well-known/x402.json", headers={"Host": v0_host}) as r:
        old = await r.json()
    assert (r.status, old["major"]) == (200, 0)
    v1_host = urlsplit(hosts["v1"]).netloc
    async with daemon.session.get(f"{daemon.base_url}/.well-known/x402.json", headers={"Host": v1_host}) as r:
        pinned = await r.json()
    assert (r.status, pinned["major"], pinned["apiVersion"]) == (200, 1, "1.3.0")  # the v1 host stays on 1.x
    for path in ("/.well-known/x402-changelog.json", "/.well-known/x402-errors.json", "/api/errors"):
        status, _ = await daemon.get(path)
        assert status == 200, path
    status, index = await daemon.get("/api/docs")
    assert [d["id"] for d in index["documents"]] == list(GUIDE_IDS)
    status, body = await daemon.get("/api/docs", id="teleport")
    assert (status, body["error"], body["available"]) == (404, "document_not_found", list(GUIDE_IDS))
    status, doc = await daemon.get("/api/openapi.json")
    assert (status, doc["openapi"]) == (200, "3.1.0")
    async with daemon.session.get(f"{daemon.base_url}/.well-known/security.txt") as r:
        assert r.status == 200 and "Expires: " in await r.text()


def test_the_wheel_carries_the_guides(tmp_path: Path) -> None:
    """The built wheel holds every guide, and an installed copy reads them with no source
    tree (``python -S``: no site-packages, no editable install; package_data needs none)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in TREE:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("relayer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    assert {f"relayer/guides/{g}.md" for g in GUIDE_IDS} <= names
    probe = (
        "import json, relayer; from relayer import package_data; "
        f"print(json.dumps([relayer.__file__, *(package_data.guide(g) for g in {list(GUIDE_IDS)!r})]))"
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        cwd=outside,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    where, *texts = json.loads(done.stdout)
    assert Path(where).is_relative_to(tmp_path / "site")
    for guide_id, text in zip(GUIDE_IDS, texts, strict=True):
        assert text == (ROOT / "relayer" / "guides" / f"{guide_id}.md").read_text(encoding="utf-8")
