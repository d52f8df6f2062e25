"""The local devnet: three anvils (Base Sepolia 84532, Base 8453 and the Polygon stand-in 137) start, the
protocol deploys and is seeded on each as the relayer and the marketplace need (gasless funded
payers, a USDC-only treasury, classes with liquidity, listings incl. a Puro one, one repriced
and one cancelled, a few retirements already settled, a registered executor), and
``up``/``down`` manage exactly their own anvils. Checked on-chain."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from web3 import Web3
from web3.contract import Contract
from web3.logs import DISCARD

from relayer.config import Settings
from relayer.service.market.keys import ApiKeys
from relayer.store.orders import Orders
from relayer.store.pool import Database
from relayer_dev import devnet
from relayer_dev.deploy import (
    CANCELLED_LISTING_ID,
    LISTING_SPECS,
    TREASURY_KEY,
    UPDATED_LISTING_ID,
    beneficiary_address,
    deploy_and_seed,
    load_artifact,
)
from relayer_dev.facilitator import record_facilitator_key
from relayer_dev.ports import free_port
from relayer_dev.settings import dev_settings, env_lines, index_chains, relay_chains, write_env_file

pytestmark = pytest.mark.integration

PROJECTS_FILE = devnet.DEFAULT_PROJECTS_FILE
CHAIN_ID = 84532
_NAME_ABI = [
    {
        "name": "name",
        "type": "function",
        "stateMutability": "view",
        "inputs": [],
        "outputs": [{"type": "string"}],
    }
]
POLYGON = devnet.POLYGON_CHAIN_ID
BOTH = pytest.mark.parametrize("chain_id", [CHAIN_ID, POLYGON], ids=["base-sepolia", "polygon"])
ANVIL_ACCOUNTS = {
    "deployer": 0,
    "executor": 1,
    "seller": 2,
    "feeRecipient": 3,
}
TREASURY_USDC = 10_000 * 10**6


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, tuple[Web3, dict[str, Any]]]]:
    """Both chains of a devnet, each on its own anvil, deployed and seeded as ``devnet up``
    does: chain id -> (web3, description)."""
    if not PROJECTS_FILE.is_file():
        pytest.skip(f"{PROJECTS_FILE} missing")
    state = tmp_path_factory.mktemp("anvils")
    procs: dict[int, subprocess.Popen[bytes]] = {}
    urls = {chain_id: devnet.rpc_url(free_port()) for chain_id in (CHAIN_ID, POLYGON)}
    try:
        for chain_id, url in urls.items():
            port = int(url.rsplit(":", 1)[1])
            procs[chain_id] = devnet.start_anvil(state, port, chain_id, log_name=f"anvil-{chain_id}.log")
        described = {c: deploy_and_seed(url, c, PROJECTS_FILE) for c, url in urls.items()}
        for description in described.values():
            json.dumps(description)  # JSON-serialisable as written to devnet.json
        yield {c: (Web3(Web3.HTTPProvider(urls[c])), described[c]) for c in procs}
    finally:
        for proc in procs.values():
            _stop(proc)


@pytest.fixture
def chain_id() -> int:
    return CHAIN_ID


@pytest.fixture
def w3(deployments: dict[int, tuple[Web3, dict[str, Any]]], chain_id: int) -> Web3:
    return deployments[chain_id][0]


@pytest.fixture
def deployed(deployments: dict[int, tuple[Web3, dict[str, Any]]], chain_id: int) -> dict[str, Any]:
    return deployments[chain_id][1]


def _contract(w3: Web3, deployed: dict[str, Any], key: str, name: str) -> Contract:
    abi, _ = load_artifact(name)
    contract: Contract = w3.eth.contract(address=deployed["contracts"][key], abi=abi)
    return contract


@BOTH
def test_description_shape(deployed: dict[str, Any], w3: Web3, chain_id: int) -> None:
    assert deployed["chainId"] == chain_id == w3.eth.chain_id
    assert set(deployed["contracts"]) == {
        "usdc",
        "kvcm",
        "carbonCredits",
        "carbonClasses",
        "pool",
        "marketplace",
        "settlement",
        "gasPriceOracle",
        "ethUsdFeed",
    }
    assert deployed["contracts"]["gasPriceOracle"] == "0x420000000000000000000000000000000000000F"
    for address in deployed["contracts"].values():
        assert Web3.is_checksum_address(address)
        assert len(w3.eth.get_code(address)) > 0
    usdc, first = deployed["contracts"]["usdc"], deployed["deployBlock"]
    assert w3.eth.get_code(usdc, block_identifier=first - 1) == b""  # first deployment's block
    assert len(w3.eth.get_code(usdc, block_identifier=first)) > 0
    accounts = w3.eth.accounts
    for role, index in ANVIL_ACCOUNTS.items():
        assert deployed[role]["address"] == accounts[index]
        assert deployed[role]["privateKey"].startswith("0x")


def test_both_chains_are_seeded_alike(deployments: dict[int, tuple[Web3, dict[str, Any]]]) -> None:
    """The same protocol, accounts, supply and seeding on both chains (only the chain, its
    genesis and the transactions differ)."""
    base, polygon = deployments[CHAIN_ID][1], deployments[POLYGON][1]
    # No chain id is hashed into a block header: two anvils started in the same second have the
    # same genesis hash, so a chain is known by its chain id and genesis hash together.
    assert base["genesisHash"].startswith("0x") and polygon["genesisHash"].startswith("0x")
    for key in ("contracts", "treasury", "payers", "credits", "carbonClasses", "fees"):
        assert base[key] == polygon[key], key

    def terms(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:  # expirations follow each chain's clock
        return [{k: v for k, v in row.items() if "xpiration" not in k} for row in rows]

    assert terms(base["listings"]) == terms(polygon["listings"])
    assert [r["id"].split("-")[0] for r in polygon["seededRetirements"]] == ["137"] * 3
    strip = ("id", "transactionHash", "blockNumber")
    assert [{k: v for k, v in r.items() if k not in strip} for r in base["seededRetirements"]] == [
        {k: v for k, v in r.items() if k not in strip} for r in polygon["seededRetirements"]
    ]


@BOTH
def test_usdc_domain_name(deployed: dict[str, Any], w3: Web3) -> None:
    usdc = _contract(w3, deployed, "usdc", "UsdcEip3009")
    assert usdc.functions.name().call() == "USDC"
    assert usdc.functions.decimals().call() == 6


@BOTH
def test_payers_funded_without_eth(deployed: dict[str, Any], w3: Web3) -> None:
    usdc = _contract(w3, deployed, "usdc", "UsdcEip3009")
    kvcm = _contract(w3, deployed, "kvcm", "KlimaVcm")
    assert len(deployed["payers"]) >= 3
    assert len({p["address"] for p in deployed["payers"]}) == len(deployed["payers"])
    for payer in deployed["payers"]:
        address = payer["address"]
        assert w3.eth.get_balance(address) == 0
        assert w3.eth.get_transaction_count(address) == 0
        assert usdc.functions.balanceOf(address).call() >= 10_000 * 10**6
        assert kvcm.functions.balanceOf(address).call() >= 100_000 * 10**18


@BOTH
def test_treasury_holds_usdc_and_no_eth(deployed: dict[str, Any], w3: Web3) -> None:
    treasury = deployed["treasury"]
    assert treasury["privateKey"] == TREASURY_KEY == "0x" + Web3.keccak(text="relayer-devnet treasury").hex()
    assert treasury["address"] == Account.from_key(TREASURY_KEY).address
    others = {p["address"] for p in deployed["payers"]} | {
        deployed[role]["address"] for role in ANVIL_ACCOUNTS
    }
    assert treasury["address"] not in others | set(w3.eth.accounts)  # not one of the roles
    usdc = _contract(w3, deployed, "usdc", "UsdcEip3009")
    kvcm = _contract(w3, deployed, "kvcm", "KlimaVcm")
    assert usdc.functions.balanceOf(treasury["address"]).call() == TREASURY_USDC
    assert kvcm.functions.balanceOf(treasury["address"]).call() == 0
    assert w3.eth.get_balance(treasury["address"]) == 0
    assert w3.eth.get_transaction_count(treasury["address"]) == 0


def _seeded_class_units(deployed: dict[str, Any], token_id: int) -> int:
    return sum(
        r["amountUnits"]
        for r in deployed["seededRetirements"]
        if r["source"] == "carbonClass" and r["tokenId"] == token_id
    )


@BOTH
def test_classes_have_liquidity(deployed: dict[str, Any], w3: Web3) -> None:
    classes = _contract(w3, deployed, "carbonClasses", "CarbonClasses")
    credits = _contract(w3, deployed, "carbonCredits", "CarbonCredits")
    count = classes.functions.classCount().call()
    assert count >= 3
    assert count == len(deployed["carbonClasses"])
    for row in deployed["carbonClasses"]:
        symbol, name, price, min_units = classes.functions.classInfo(row["classId"]).call()
        assert (symbol, name, str(price), min_units) == (
            row["symbol"],
            row["name"],
            row["priceKvcmPerTonne"],
            row["minRetirementUnits"],
        )
        token_ids, available = classes.functions.classCredits(row["classId"]).call()
        assert list(token_ids) == row["tokenIds"]
        for token_id, units in zip(token_ids, available, strict=True):
            # 5,000 t deposited a credit, less what the seeded retirements took
            assert units == 5_000_000 - _seeded_class_units(deployed, token_id)
            assert units >= 4_990_000
            assert credits.functions.balanceOf(classes.address, token_id).call() >= units
    cdr = next(r for r in deployed["carbonClasses"] if r["symbol"] == "CDR")
    assert cdr["minRetirementUnits"] == 1000
    assert all(credits.functions.creditInfo(t).call()[2] == "PUR" for t in cdr["tokenIds"])


@BOTH
def test_credits_registered_from_projects(deployed: dict[str, Any], w3: Web3) -> None:
    credits = _contract(w3, deployed, "carbonCredits", "CarbonCredits")
    projects = {p["key"]: p for p in json.loads(PROJECTS_FILE.read_text())}
    assert credits.functions.creditCount().call() == len(deployed["credits"]) >= 8
    for row in deployed["credits"]:
        project_id, vintage, registry, whole, metadata = credits.functions.creditInfo(row["tokenId"]).call()
        assert (project_id, vintage, registry) == (row["projectId"], row["vintage"], row["registry"])
        assert str(vintage) in projects[project_id]["vintages"]
        assert projects[project_id]["registry"] == registry
        assert whole == metadata == (registry == "PUR")


@BOTH
def test_listings_on_chain(deployed: dict[str, Any], w3: Web3) -> None:
    market = _contract(w3, deployed, "marketplace", "Marketplace")
    credits = _contract(w3, deployed, "carbonCredits", "CarbonCredits")
    count = market.functions.listingCount().call()
    rows = {row["listingId"]: row for row in deployed["listings"]}
    assert count == len(rows) == len(LISTING_SPECS) + 2
    assert sorted(rows) == list(range(1, count + 1))
    states = {listing_id: row["state"] for listing_id, row in rows.items()}
    assert states == {
        **dict.fromkeys(range(1, len(LISTING_SPECS) + 1), "active"),
        UPDATED_LISTING_ID: "updated",
        CANCELLED_LISTING_ID: "cancelled",
    }
    now = w3.eth.get_block("latest")["timestamp"]
    registries = []
    for listing_id, row in rows.items():
        seller, token, token_id, unit_price, total, left, min_fill, expiration, active = (
            market.functions.getListing(listing_id).call()
        )
        assert seller == row["seller"] == deployed["seller"]["address"]
        assert token == credits.address
        assert (token_id, str(unit_price), total, left, min_fill, expiration) == (
            row["tokenId"],
            row["unitPrice"],
            row["amount"],
            row["leftToSell"],
            row["minFill"],
            row["expiration"],
        )
        assert active is (row["state"] != "cancelled")
        assert credits.functions.balanceOf(market.address, token_id).call() >= left
        if row["state"] == "active":
            assert left == total
            assert 200_000 <= left <= 2_000_000
            assert unit_price > 0 and 0 < min_fill <= left
            assert expiration > now + 29 * 24 * 3600
            registries.append(credits.functions.creditInfo(token_id).call()[2])
    assert "PUR" in registries
    assert len({row["unitPrice"] for row in deployed["listings"]}) == len(deployed["listings"])

    # The repriced listing: ListingUpdated carries its new terms, and a seeded retirement took
    # part of it at the new price.
    updated = rows[UPDATED_LISTING_ID]
    assert int(updated["unitPrice"]) < int(updated["createdUnitPrice"])
    assert updated["expiration"] > updated["createdExpiration"] > now
    fills = [r for r in deployed["seededRetirements"] if r["source"] == "listing"]
    assert [r["sourceId"] for r in fills] == [UPDATED_LISTING_ID]
    assert 0 < updated["leftToSell"] == updated["amount"] - fills[0]["amountUnits"] < updated["amount"]
    assert int(fills[0]["retirementCost"]) == -(-int(updated["unitPrice"]) * fills[0]["amountUnits"] // 1000)
    (event,) = market.events.ListingUpdated().get_logs(from_block=deployed["deployBlock"])
    assert dict(event["args"]) == {
        "listingId": UPDATED_LISTING_ID,
        "unitPrice": int(updated["unitPrice"]),
        "minFill": updated["minFill"],
        "expiration": updated["expiration"],
    }
    # The cancelled listing: inactive, nothing left, its credits back with the seller.
    (cancelled,) = market.events.ListingCancelled().get_logs(from_block=deployed["deployBlock"])
    assert cancelled["args"]["listingId"] == CANCELLED_LISTING_ID
    assert rows[CANCELLED_LISTING_ID]["leftToSell"] == 0
    seller_holds = credits.functions.balanceOf(
        deployed["seller"]["address"], rows[CANCELLED_LISTING_ID]["tokenId"]
    )
    assert seller_holds.call() == rows[CANCELLED_LISTING_ID]["amount"]


@BOTH
def test_seeded_retirements_are_settled_on_chain(deployed: dict[str, Any], w3: Web3, chain_id: int) -> None:
    settlement = _contract(w3, deployed, "settlement", "RetirementSettlement")
    seeded = deployed["seededRetirements"]
    assert sum(r["source"] == "carbonClass" for r in seeded) >= 2
    assert sum(r["source"] == "listing" for r in seeded) >= 1
    assert {r["inputToken"] for r in seeded} == {"USDC", "kVCM"}
    tokens = {"USDC": deployed["contracts"]["usdc"], "kVCM": deployed["contracts"]["kvcm"]}
    classes = {c["symbol"]: c for c in deployed["carbonClasses"]}
    for row in seeded:
        assert row["id"] == f"{chain_id}-{row['transactionHash']}-{row['retirementIndex']}"
        tx = w3.eth.get_transaction(row["transactionHash"])
        assert tx["from"] == row["payer"] == deployed["deployer"]["address"]  # it paid its own gas
        assert tx["to"] == settlement.address
        receipt = w3.eth.get_transaction_receipt(row["transactionHash"])
        assert receipt["status"] == 1 and receipt["blockNumber"] == row["blockNumber"]
        (event,) = settlement.events.RetirementSettled().process_receipt(receipt, errors=DISCARD)
        args = event["args"]
        assert (args["payer"], args["beneficiary"], args["retirementIndex"]) == (
            row["payer"],
            row["beneficiary"],
            row["retirementIndex"],
        )
        assert row["beneficiary"] == beneficiary_address(row["beneficiaryName"])
        assert [str(args[k]) for k in ("value", "fee", "retirementCost", "refunded")] == [
            row["value"],
            row["fee"],
            row["retirementCost"],
            row["refunded"],
        ]
        assert int(row["value"]) == int(row["retirementCost"]) + int(row["fee"]) + int(row["refunded"])
        assert args["authorizationNonce"] == b"\0" * 32  # the direct path binds no authorization
        retirement = args["retirement"]
        assert {k: retirement[k] for k in list(retirement) if k != "details"} == {
            "source": 0 if row["source"] == "carbonClass" else 1,
            "sourceId": row["sourceId"],
            "creditToken": deployed["contracts"]["carbonCredits"],
            "tokenId": row["tokenId"],
            "amount": row["amountUnits"],
            "inputToken": tokens[row["inputToken"]],
            "gasAllowance": 0,
        }
        assert dict(retirement["details"]) == {
            "retiringAddress": row["payer"],
            "beneficiaryAddress": row["beneficiary"],
            "beneficiaryString": row["beneficiaryName"],
            "retiringEntityString": row["retiringEntity"],
            "retirementMessage": row["message"],
            "beneficiaryLocation": row["beneficiaryLocation"],
            "consumptionCountryCode": row["consumptionCountryCode"],
            "consumptionPeriodStart": row["consumptionPeriodStart"],
            "consumptionPeriodEnd": row["consumptionPeriodEnd"],
        }
        assert row["beneficiaryName"] and row["message"] and row["retiringEntity"]
        if row["source"] == "carbonClass":
            assert row["sourceId"] == classes[row["carbonClass"]]["classId"]
            assert row["tokenId"] in classes[row["carbonClass"]]["tokenIds"]
    # Nothing else settled: the catalogue starts with exactly these.
    logged = settlement.events.RetirementSettled().get_logs(from_block=deployed["deployBlock"])
    assert sorted("0x" + bytes(e["transactionHash"]).hex() for e in logged) == sorted(
        r["transactionHash"] for r in seeded
    )


@BOTH
def test_pool_and_settlement(deployed: dict[str, Any], w3: Web3) -> None:
    pool = _contract(w3, deployed, "pool", "UsdcKvcmPool")
    settlement = _contract(w3, deployed, "settlement", "RetirementSettlement")
    # 500,000 USDC / 1,000,000 kVCM, moved only by the seeded class retirements paid in USDC
    swapped = [
        r for r in deployed["seededRetirements"] if r["source"] == "carbonClass" and r["inputToken"] == "USDC"
    ]
    prices = {c["symbol"]: int(c["priceKvcmPerTonne"]) for c in deployed["carbonClasses"]}
    assert pool.functions.getReserves().call() == [
        500_000 * 10**6 + sum(int(r["retirementCost"]) for r in swapped),
        1_000_000 * 10**18 - sum(-(-prices[r["carbonClass"]] * r["amountUnits"] // 1000) for r in swapped),
    ]
    assert settlement.functions.isExecutor(deployed["executor"]["address"]).call() is True
    assert settlement.functions.isExecutor(deployed["seller"]["address"]).call() is False
    assert settlement.functions.feeRecipient().call() == deployed["feeRecipient"]["address"]
    assert settlement.functions.fees().call() == [100, 10_000, 500, 50_000]


def _pid(root: Path, name: str) -> int:
    return int((root / ".devdata" / name).read_text())


def test_up_is_idempotent_and_down_stops_every_anvil(tmp_path: Path) -> None:
    guard = devnet.start_anvil(tmp_path / "guard", free_port(), CHAIN_ID)  # another anvil: left alone
    port, index_port, other_port = free_port(), free_port(), free_port()
    devdata = tmp_path / ".devdata"
    try:
        started = time.monotonic()
        first = devnet.up(
            tmp_path,
            port=port,
            chain_id=CHAIN_ID,
            x402_base_url="http://x:8402/api",
            projects_file=PROJECTS_FILE,
            index_port=index_port,
            other_base_port=other_port,
        )
        print(f"\ndevnet up (three chains, deployed and seeded): {time.monotonic() - started:.2f} s")
        pids = _pid(tmp_path, "anvil.pid"), _pid(tmp_path, "anvil-137.pid"), _pid(tmp_path, "anvil-8453.pid")
        assert len(set(pids)) == 3
        written = json.loads((devdata / "devnet.json").read_text())
        assert written == first
        assert first["chainId"] == CHAIN_ID
        assert first["x402BaseUrl"] == "http://x:8402/api"
        assert first["marketplaceBaseUrl"] == "http://x:8402"
        assert first["facilitatorUrl"] == "http://x:8402/facilitator"
        assert first["usdc"] == first["contracts"]["usdc"]
        assert first["rpcUrl"] == devnet.rpc_url(port)
        assert first["chains"] == [
            {
                "chainId": CHAIN_ID,
                "name": "base-sepolia",
                "rpcUrl": devnet.rpc_url(port),
                "deploymentFile": str((devdata / "devnet.json").resolve()),
            },
            {
                "chainId": 8453,
                "name": "base",
                "rpcUrl": devnet.rpc_url(other_port),
                "deploymentFile": str((devdata / "devnet-8453.json").resolve()),
            },
            {
                "chainId": 137,
                "name": "polygon",
                "rpcUrl": devnet.rpc_url(index_port),
                "deploymentFile": str((devdata / "devnet-137.json").resolve()),
            },
        ]
        # Both Base networks carry the protocol, each with its own USDC domain name (the
        # EIP-712 name payers sign under: "USD Coin" on Base, "USDC" on Base Sepolia).
        base = json.loads((devdata / "devnet-8453.json").read_text())
        assert base["chainId"] == 8453 == devnet.probe_chain_id(devnet.rpc_url(other_port))
        assert base["contracts"] == first["contracts"] and len(base["payers"]) == len(first["payers"])
        for url, name in ((devnet.rpc_url(port), "USDC"), (devnet.rpc_url(other_port), "USD Coin")):
            token = Web3(Web3.HTTPProvider(url)).eth.contract(
                address=first["contracts"]["usdc"], abi=_NAME_ABI
            )
            assert token.functions.name().call() == name, url
        # the daemon relays on both Base networks and indexes the Polygon stand-in
        assert [c.chain_id for c in relay_chains(first)] == [8453]
        assert [c.chain_id for c in index_chains(first)] == [137]
        polygon = json.loads((devdata / "devnet-137.json").read_text())
        assert polygon["chainId"] == 137 == devnet.probe_chain_id(devnet.rpc_url(index_port))
        assert polygon["rpcUrl"] == devnet.rpc_url(index_port)
        assert set(polygon) == set(first) - {
            "x402BaseUrl",
            "marketplaceBaseUrl",
            "facilitatorUrl",
            "usdc",
            "chains",
        }
        assert polygon["contracts"] == first["contracts"] and polygon["deployBlock"] > 0
        assert len(polygon["seededRetirements"]) == len(first["seededRetirements"]) >= 3
        assert (devdata / "anvil-137.log").stat().st_size > 0

        again = devnet.up(
            tmp_path,
            port=port,
            chain_id=CHAIN_ID,
            x402_base_url="http://other/api",
            index_port=index_port,
            other_base_port=other_port,
        )
        assert again == first
        assert (
            _pid(tmp_path, "anvil.pid"),
            _pid(tmp_path, "anvil-137.pid"),
            _pid(tmp_path, "anvil-8453.pid"),
        ) == pids

        # Polygon's anvil dies: the next `up` replaces that chain alone.
        os.kill(pids[1], signal.SIGTERM)
        deadline = time.monotonic() + 5
        while devnet.probe_chain_id(devnet.rpc_url(index_port)) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        revived = devnet.up(
            tmp_path,
            port=port,
            chain_id=CHAIN_ID,
            x402_base_url="http://x:8402/api",
            index_port=index_port,
            other_base_port=other_port,
        )
        assert revived == first
        assert _pid(tmp_path, "anvil.pid") == pids[0] and _pid(tmp_path, "anvil-8453.pid") == pids[2]
        assert _pid(tmp_path, "anvil-137.pid") != pids[1]
        replaced = json.loads((devdata / "devnet-137.json").read_text())
        assert replaced["genesisHash"] != polygon["genesisHash"]
        assert devnet.probe_chain_id(devnet.rpc_url(index_port)) == 137
    finally:
        stopped = devnet.down(tmp_path)
        try:
            assert stopped is True
            for url in (devnet.rpc_url(port), devnet.rpc_url(index_port), devnet.rpc_url(other_port)):
                assert devnet.probe_chain_id(url) is None
            for name in (
                "anvil.pid",
                "anvil-137.pid",
                "anvil-8453.pid",
                "devnet.json",
                "devnet-137.json",
                "devnet-8453.json",
            ):
                assert not (devdata / name).exists(), name
            assert devnet.down(tmp_path) is False
            assert guard.poll() is None  # the other anvil is untouched
        finally:
            _stop(guard)


def test_up_refuses_a_devnet_of_this_root_on_another_port(tmp_path: Path) -> None:
    port, index_port, other_port = free_port(), free_port(), free_port()
    try:
        devnet.up(
            tmp_path,
            port=port,
            chain_id=CHAIN_ID,
            x402_base_url="http://x/api",
            index_port=index_port,
            other_base_port=other_port,
        )
        with pytest.raises(devnet.DevnetError, match="already running"):
            devnet.up(
                tmp_path,
                port=port,
                chain_id=CHAIN_ID,
                x402_base_url="http://x/api",
                index_port=free_port(),
                other_base_port=other_port,
            )
    finally:
        assert devnet.down(tmp_path) is True


def test_dev_settings_fill_only_what_is_missing_and_the_env_file_starts_the_product(
    tmp_path: Path, deployed: dict[str, Any]
) -> None:
    index_file = str(tmp_path / "devnet-137.json")
    base_file = str(tmp_path / "devnet-8453.json")
    info = {
        **deployed,
        "deploymentFile": str(tmp_path / "devnet.json"),
        "chains": [
            {
                "chainId": CHAIN_ID,
                "name": "base-sepolia",
                "rpcUrl": deployed["rpcUrl"],
                "deploymentFile": "x",
            },
            {"chainId": 8453, "name": "base", "rpcUrl": "http://127.0.0.1:8547", "deploymentFile": base_file},
            {
                "chainId": 137,
                "name": "polygon",
                "rpcUrl": "http://127.0.0.1:8546",
                "deploymentFile": index_file,
            },
        ],
    }
    given = "postgresql://relayer@127.0.0.1:1/given"
    settings = dev_settings(info, Settings(database_url=given, rpc_url="http://127.0.0.1:9/given"))
    assert settings.database_url is not None and settings.database_url.get_secret_value() == given
    assert settings.rpc_url == "http://127.0.0.1:9/given"  # the environment wins
    assert settings.deployment_file == tmp_path / "devnet.json"
    assert settings.executor_private_key is not None
    assert settings.executor_private_key.get_secret_value() == deployed["executor"]["privateKey"]
    assert settings.treasury_private_key is not None
    assert settings.treasury_private_key.get_secret_value() == deployed["treasury"]["privateKey"]
    # The other local chains only, never the daemon's own; depth 1 (anvil mines a block a transaction).
    expected = [
        {"chainId": 137, "rpcUrl": "http://127.0.0.1:8546", "deploymentFile": index_file, "confirmations": 1}
    ]
    assert [
        c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in settings.index_chains
    ] == expected
    # The other Base network is relayed on, not indexed apart.
    relayed = [
        {"chainId": 8453, "rpcUrl": "http://127.0.0.1:8547", "deploymentFile": base_file, "confirmations": 1}
    ]
    assert [
        c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in settings.relay_chains
    ] == relayed
    assert settings.served_chain_ids() == [CHAIN_ID, 8453]
    lines = env_lines(settings)
    assert f"RELAYER_TREASURY_PRIVATE_KEY={deployed['treasury']['privateKey']}" in lines
    assert f"RELAYER_INDEX_CHAINS={shlex.quote(json.dumps(expected, separators=(',', ':')))}" in lines
    assert f"RELAYER_RELAY_CHAINS={shlex.quote(json.dumps(relayed, separators=(',', ':')))}" in lines
    assert dev_settings(info, Settings(database_url=given, relay_chains=[])).relay_chains == []
    # the environment wins here too: RELAYER_INDEX_CHAINS='[]' indexes nothing
    assert dev_settings(info, Settings(database_url=given, index_chains=[])).index_chains == []
    without_chains = {k: v for k, v in info.items() if k != "chains"}  # a description of an older `up`
    assert dev_settings(without_chains, Settings(database_url=given)).index_chains == []

    env_file = write_env_file(settings, tmp_path / "relayer.env")
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    # Sourced as `make devnet` does, the lines give the product every setting it requires.
    probe = (
        "from relayer.config import load_settings; s = load_settings(); "
        "s.require('database_url', 'rpc_url', 'deployment_file', 'executor_private_key', "
        "'treasury_private_key'); "
        "print(s.rpc_url, s.chain_id, s.deployment_file, *(c.deployment_file for c in s.index_chains), "
        "*(c.deployment_file for c in s.relay_chains))"
    )
    done = subprocess.run(
        ["bash", "-c", f'set -a; . "$1"; set +a; exec "{sys.executable}" -c "$2"', "-", str(env_file), probe],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "http://127.0.0.1:9/given",
        str(CHAIN_ID),
        str(tmp_path / "devnet.json"),
        index_file,
        base_file,
    ]
    assert env_lines(settings) == env_file.read_text().splitlines()[1:]


async def _key_id(database_url: str, token: str) -> int:
    db = await Database.connect(database_url, 1, 1)
    try:
        return (await ApiKeys(Orders(db)).authenticate(f"Bearer {token}", "facilitator")).id
    finally:
        await db.close()


def test_up_records_the_facilitator_and_a_dev_api_key_for_it(tmp_path: Path, database_url: str) -> None:
    """`devnet up` (as ``python -m relayer_dev devnet up`` runs it) leaves in devnet.json all a
    standard x402 resource server needs: the facilitator's URL, a bearer key the daemon's
    database knows, and the USDC address; an older description gains them, a reused one keeps
    its key."""
    port, index_port, other_port = free_port(), free_port(), free_port()
    devdata = tmp_path / ".devdata"
    try:
        info = devnet.up(
            tmp_path,
            port=port,
            chain_id=CHAIN_ID,
            x402_base_url="http://127.0.0.1:8402/api",
            index_port=index_port,
            other_base_port=other_port,
        )
        assert info["facilitatorUrl"] == "http://127.0.0.1:8402/facilitator"
        assert info["usdc"] == info["contracts"]["usdc"]
        settings = Settings(database_url=database_url)
        recorded = record_facilitator_key(devdata / "devnet.json", settings)
        token = recorded["facilitatorApiKey"]
        assert token.startswith("mk_")
        written = json.loads((devdata / "devnet.json").read_text())
        assert written == recorded == {**info, "facilitatorApiKey": token}
        assert stat.S_IMODE((devdata / "devnet.json").stat().st_mode) == 0o600  # it holds a secret
        key_id = asyncio.run(_key_id(database_url, token))
        # Reused: the same key, not a new one each `up`.
        assert record_facilitator_key(devdata / "devnet.json", settings)["facilitatorApiKey"] == token
        again = devnet.up(
            tmp_path,
            port=port,
            chain_id=CHAIN_ID,
            x402_base_url="http://other/api",
            index_port=index_port,
            other_base_port=other_port,
        )
        assert again["facilitatorApiKey"] == token
        # A description written before these keys existed gains them, and then a key.
        older = {k: v for k, v in written.items() if k not in ("facilitatorUrl", "usdc", "facilitatorApiKey")}
        (devdata / "devnet.json").write_text(json.dumps(older))
        upgraded = devnet.up(
            tmp_path,
            port=port,
            chain_id=CHAIN_ID,
            x402_base_url="http://127.0.0.1:8402/api",
            index_port=index_port,
            other_base_port=other_port,
        )
        assert (upgraded["facilitatorUrl"], upgraded["usdc"]) == (info["facilitatorUrl"], info["usdc"])
        fresh = record_facilitator_key(devdata / "devnet.json", settings)["facilitatorApiKey"]
        assert fresh != token and asyncio.run(_key_id(database_url, fresh)) != key_id
    finally:
        assert devnet.down(tmp_path) is True
