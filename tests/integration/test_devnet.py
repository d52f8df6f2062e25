"""The local devnet: anvil starts, the protocol deploys and is seeded as the relayer needs
(gasless funded payers, classes with liquidity, listings incl. a Puro one, a registered
executor), and ``up``/``down`` manage exactly their own anvil. Checked on-chain."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from web3 import Web3
from web3.contract import Contract

from relayer.config import Settings
from relayer_dev import devnet
from relayer_dev.deploy import deploy_and_seed, load_artifact
from relayer_dev.settings import dev_settings, env_lines, write_env_file

pytestmark = pytest.mark.integration

PROJECTS_FILE = devnet.DEFAULT_PROJECTS_FILE
CHAIN_ID = 84532
ANVIL_ACCOUNTS = {
    "deployer": 0,
    "executor": 1,
    "seller": 2,
    "feeRecipient": 3,
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def anvil(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not PROJECTS_FILE.is_file():
        pytest.skip(f"{PROJECTS_FILE} missing")
    port = _free_port()
    proc = devnet.start_anvil(tmp_path_factory.mktemp("anvil"), port, CHAIN_ID)
    try:
        yield devnet.rpc_url(port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def deployed(anvil: str) -> dict[str, Any]:
    description = deploy_and_seed(anvil, CHAIN_ID, PROJECTS_FILE)
    json.dumps(description)  # JSON-serialisable as written to devnet.json
    return description


@pytest.fixture(scope="module")
def w3(anvil: str) -> Web3:
    return Web3(Web3.HTTPProvider(anvil))


def _contract(w3: Web3, deployed: dict[str, Any], key: str, name: str) -> Contract:
    abi, _ = load_artifact(name)
    contract: Contract = w3.eth.contract(address=deployed["contracts"][key], abi=abi)
    return contract


def test_description_shape(deployed: dict[str, Any], w3: Web3) -> None:
    assert deployed["chainId"] == CHAIN_ID
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


def test_usdc_domain_name(deployed: dict[str, Any], w3: Web3) -> None:
    usdc = _contract(w3, deployed, "usdc", "UsdcEip3009")
    assert usdc.functions.name().call() == "USDC"
    assert usdc.functions.decimals().call() == 6


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
        assert all(units == 5_000_000 for units in available)
        for token_id in token_ids:
            assert credits.functions.balanceOf(classes.address, token_id).call() >= 5_000_000
    cdr = next(r for r in deployed["carbonClasses"] if r["symbol"] == "CDR")
    assert cdr["minRetirementUnits"] == 1000
    assert all(credits.functions.creditInfo(t).call()[2] == "PUR" for t in cdr["tokenIds"])


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


def test_listings_on_chain(deployed: dict[str, Any], w3: Web3) -> None:
    market = _contract(w3, deployed, "marketplace", "Marketplace")
    credits = _contract(w3, deployed, "carbonCredits", "CarbonCredits")
    count = market.functions.listingCount().call()
    assert count >= 5
    now = w3.eth.get_block("latest")["timestamp"]
    registries = []
    for listing_id in range(1, count + 1):
        seller, token, token_id, unit_price, total, left, min_fill, expiration, active = (
            market.functions.getListing(listing_id).call()
        )
        assert seller == deployed["seller"]["address"]
        assert token == credits.address
        assert active and left == total
        assert 200_000 <= left <= 2_000_000
        assert unit_price > 0 and 0 < min_fill <= left
        assert expiration > now + 29 * 24 * 3600
        assert credits.functions.balanceOf(market.address, token_id).call() >= left
        registries.append(credits.functions.creditInfo(token_id).call()[2])
    assert "PUR" in registries
    assert len({row["unitPrice"] for row in deployed["listings"]}) == len(deployed["listings"])


def test_pool_and_settlement(deployed: dict[str, Any], w3: Web3) -> None:
    pool = _contract(w3, deployed, "pool", "UsdcKvcmPool")
    settlement = _contract(w3, deployed, "settlement", "RetirementSettlement")
    assert pool.functions.getReserves().call() == [500_000 * 10**6, 1_000_000 * 10**18]
    assert settlement.functions.isExecutor(deployed["executor"]["address"]).call() is True
    assert settlement.functions.isExecutor(deployed["seller"]["address"]).call() is False
    assert settlement.functions.feeRecipient().call() == deployed["feeRecipient"]["address"]
    assert settlement.functions.fees().call() == [100, 10_000, 500, 50_000]


def test_up_is_idempotent_and_down_stops_only_its_anvil(
    tmp_path: Path, anvil: str, w3: Web3, deployed: dict[str, Any]
) -> None:
    port = _free_port()
    try:
        first = devnet.up(
            tmp_path, port=port, chain_id=CHAIN_ID, x402_base_url="http://x/api", projects_file=PROJECTS_FILE
        )
        pid = int((tmp_path / ".devdata" / "anvil.pid").read_text())
        written = json.loads((tmp_path / ".devdata" / "devnet.json").read_text())
        assert written == first
        assert first["x402BaseUrl"] == "http://x/api"
        assert first["rpcUrl"] == devnet.rpc_url(port)
        again = devnet.up(tmp_path, port=port, chain_id=CHAIN_ID, x402_base_url="http://other/api")
        assert again == first
        assert int((tmp_path / ".devdata" / "anvil.pid").read_text()) == pid
    finally:
        stopped = devnet.down(tmp_path)
    assert stopped is True
    assert devnet.probe_chain_id(devnet.rpc_url(port)) is None
    assert not (tmp_path / ".devdata" / "anvil.pid").exists()
    assert not (tmp_path / ".devdata" / "devnet.json").exists()
    assert devnet.down(tmp_path) is False
    assert w3.eth.chain_id == CHAIN_ID  # the module's own anvil is untouched


def test_dev_settings_fill_only_what_is_missing_and_the_env_file_starts_the_product(
    tmp_path: Path, deployed: dict[str, Any]
) -> None:
    info = {**deployed, "deploymentFile": str(tmp_path / "devnet.json")}
    given = "postgresql://relayer@127.0.0.1:1/given"
    settings = dev_settings(info, Settings(database_url=given, rpc_url="http://127.0.0.1:9/given"))
    assert settings.database_url is not None and settings.database_url.get_secret_value() == given
    assert settings.rpc_url == "http://127.0.0.1:9/given"  # the environment wins
    assert settings.deployment_file == tmp_path / "devnet.json"
    assert settings.executor_private_key is not None
    assert settings.executor_private_key.get_secret_value() == deployed["executor"]["privateKey"]

    env_file = write_env_file(settings, tmp_path / "relayer.env")
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    # Sourced as `make devnet` does, the lines give the product every setting it requires.
    probe = (
        "from relayer.config import load_settings; s = load_settings(); "
        "s.require('database_url', 'rpc_url', 'deployment_file', 'executor_private_key'); "
        "print(s.rpc_url, s.chain_id, s.deployment_file)"
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
    assert done.stdout.split() == ["http://127.0.0.1:9/given", str(CHAIN_ID), str(tmp_path / "devnet.json")]
    assert env_lines(settings) == env_file.read_text().splitlines()[1:]
