"""Deploys the reference protocol (``contracts_abi/``) on a local chain and seeds it.

Owns the devnet description (the dict written to ``.devdata/devnet.json``): anvil's
well-known dev accounts for deployer, executor, seller and fee recipient, deterministic
payer keys funded with USDC and kVCM but no ETH, a treasury funded with USDC but no ETH,
carbon classes and marketplace listings built from real projects of
``carbon-projects.json`` (one listing repriced, one cancelled), and a few retirements the
deployer settled itself so the catalogue is not empty. The same on every dev chain (Base
Sepolia 84532, the Polygon stand-in 137). Dev chains only: every key used here is public.

Units: USDC amounts are atomic (6 decimals), kVCM amounts atomic (18 decimals), credit
amounts are credit units (1 unit = 1 kg CO2e, 1000 units = 1 tonne), prices are atomic
units of the paying token per tonne.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import requests
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from hexbytes import HexBytes
from web3 import Web3
from web3.contract import Contract
from web3.logs import DISCARD
from web3.types import Nonce, RPCEndpoint, TxParams, TxReceipt, Wei

from relayer.chain.abi import artifact
from relayer.domain.amounts import KVCM_DECIMALS, UNITS_PER_TONNE, USDC_DECIMALS
from relayer.domain.chains import usdc_domain_name
from relayer.domain.retirement import SOURCE_CARBON_CLASS, SOURCE_LISTING, Retirement, RetirementDetails
from relayer_dev import DevError

log = logging.getLogger(__name__)


# anvil's default accounts 0-3 (mnemonic "test test ... junk"): public dev keys.
DEPLOYER_KEY: Final = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
EXECUTOR_KEY: Final = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d"
SELLER_KEY: Final = "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a"
FEE_RECIPIENT_KEY: Final = "0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6"
# anvil's accounts 4 and 5: more executor keys, registered with the settlement but not used by
# default (RELAYER_EXECUTOR_PRIVATE_KEYS adds them).
SPARE_EXECUTOR_KEYS: Final = (
    "0x47e179ec197488593b187f80a00eb0da91f1b9d0b13f8733639f19c30a34926a",
    "0x8b3a350cf5c34c9194ca85829a2df0ec3153be0318b5e2d3348e872092edffba",
)

# keccak256("relayer-devnet treasury"): the operator's treasury, which pays marketplace orders
# in USDC through the gasless relay (EIP-3009 authorizations signed with this key). Not an
# anvil account: it holds USDC and never ETH.
TREASURY_KEY: Final = "0xb7b9929dba077a60b607ccb4c7f2c949a91089e7508013eacbb7f94745d9bac2"
TREASURY_USDC: Final = 10_000 * 10**USDC_DECIMALS

PAYER_COUNT: Final = 3
PAYER_USDC: Final = 10_000 * 10**USDC_DECIMALS
PAYER_KVCM: Final = 100_000 * 10**KVCM_DECIMALS
POOL_USDC: Final = 500_000 * 10**USDC_DECIMALS
POOL_KVCM: Final = 1_000_000 * 10**KVCM_DECIMALS
CLASS_DEPOSIT_UNITS: Final = 5_000 * UNITS_PER_TONNE
LISTING_LIFETIME_S: Final = 30 * 24 * 3600

# Latest vintage a seeded credit may carry. Some registries (ICR) list ex-ante vintages far
# into the future (to 2071); the data snapshot is from April 2026, so later vintages cannot
# have been issued. Projects with no vintage up to this year are skipped.
MAX_VINTAGE: Final = 2025

PRIORITY_FEE_WEI: Final = 1_000_000
GAS_MARGIN_BPS: Final = 2_000
RECEIPT_TIMEOUT_S: Final = 60.0

# Registries whose credits retire in whole tonnes only and need consumption metadata.
WHOLE_TONNE_REGISTRIES: Final = frozenset({"PUR"})

SETTLEMENT_FEES: Final = {
    "classFeeBps": 100,
    "classFeeFloorUsdc": 10_000,
    "listingFeeBps": 500,
    "listingFeeFloorUsdc": 50_000,
}

_FEES_ABI_ORDER: Final = ("classFeeBps", "classFeeFloorUsdc", "listingFeeBps", "listingFeeFloorUsdc")
_SECP256K1_N: Final = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


@dataclass(frozen=True)
class ClassSpec:
    """A carbon class to create and the rule that picks its credits.

    Attributes:
        symbol: class symbol, e.g. ``"NBO"``.
        name: human-readable class name.
        price_kvcm_per_tonne: kVCM atomic units (18 decimals) per tonne.
        min_retirement_units: smallest redeemable amount, credit units (kg).
        categories: marketplace categories whose projects qualify.
        registries: registry codes that qualify (empty: any except whole-tonne ones).
        count: how many credits the class gets.
    """

    symbol: str
    name: str
    price_kvcm_per_tonne: int
    min_retirement_units: int
    categories: frozenset[str]
    registries: frozenset[str] = frozenset()
    count: int = 3


CLASS_SPECS: Final[tuple[ClassSpec, ...]] = (
    ClassSpec(
        "NBO",
        "Nature-based offsets",
        24 * 10**KVCM_DECIMALS,
        1,
        frozenset({"Forestry", "Blue Carbon", "Other Nature Based"}),
    ),
    ClassSpec("RE", "Renewable energy", 4 * 10**KVCM_DECIMALS, 1, frozenset({"Renewable Energy"})),
    ClassSpec(
        "IND",
        "Industrial and efficiency",
        8 * 10**KVCM_DECIMALS,
        1,
        frozenset({"Industrial Processing", "Energy Efficiency", "Other"}),
    ),
    ClassSpec(
        "CDR",
        "Durable carbon removal (Puro.earth)",
        300 * 10**KVCM_DECIMALS,
        UNITS_PER_TONNE,
        frozenset({"Other"}),
        registries=frozenset({"PUR"}),
        count=1,
    ),
)


@dataclass(frozen=True)
class ListingUpdate:
    """New terms a seller gives a listing with ``updateListing``.

    Attributes:
        unit_price: USDC atomic units (6 decimals) per tonne.
        min_fill: smallest fill, credit units (kg).
        lifetime_s: the new expiration, seconds after the latest block.
    """

    unit_price: int
    min_fill: int
    lifetime_s: int


@dataclass(frozen=True)
class ListingSpec:
    """A seller listing, placed on the ``index``-th credit of class ``symbol``.

    Attributes:
        symbol: class whose credit list the credit is taken from.
        index: position in that class's credits.
        unit_price: USDC atomic units (6 decimals) per tonne, as created.
        tonnes: amount listed, whole tonnes.
        min_fill: smallest fill, credit units (kg), as created.
        update: terms given with ``updateListing`` once created (state ``"updated"``).
        cancelled: cancelled with ``cancelListing`` once created (state ``"cancelled"``).
    """

    symbol: str
    index: int
    unit_price: int
    tonnes: int
    min_fill: int = UNITS_PER_TONNE
    update: ListingUpdate | None = None
    cancelled: bool = False

    @property
    def state(self) -> str:
        """``"active"``, ``"updated"`` or ``"cancelled"``: what the description records."""
        return "cancelled" if self.cancelled else "updated" if self.update else "active"


LISTING_SPECS: Final[tuple[ListingSpec, ...]] = (
    ListingSpec("NBO", 0, 12_500_000, 1_000),
    ListingSpec("IND", 0, 18_000_000, 500, min_fill=100),
    ListingSpec("RE", 0, 7_250_000, 2_000),
    ListingSpec("CDR", 0, 150_000_000, 200),
    ListingSpec("NBO", 1, 30_000_000, 800),
)
"""Live listings 1-5, untouched after creation (tests rely on their ids, amounts and prices)."""

CHANGED_LISTING_SPECS: Final[tuple[ListingSpec, ...]] = (
    # 6: repriced from 9.50 to 8.75 USDC a tonne, then partly filled by a seeded retirement.
    ListingSpec(
        "RE",
        1,
        9_500_000,
        300,
        min_fill=100,
        update=ListingUpdate(8_750_000, 50, 2 * LISTING_LIFETIME_S),
    ),
    # 7: cancelled (inactive, nothing left to sell).
    ListingSpec("IND", 1, 21_000_000, 150, cancelled=True),
)
"""Listings 6 and 7, placed after :data:`LISTING_SPECS`, whose life goes on after creation."""

ALL_LISTING_SPECS: Final = LISTING_SPECS + CHANGED_LISTING_SPECS
UPDATED_LISTING_ID: Final = len(LISTING_SPECS) + 1
CANCELLED_LISTING_ID: Final = len(LISTING_SPECS) + 2


@dataclass(frozen=True)
class RetirementSpec:
    """A retirement the deployer settles while seeding, paying its own gas: the settlement's
    direct ``[approve, retire]`` path (no gas allowance).

    Attributes:
        carbon_class: symbol of the class redeemed from, or ``""`` for a listing fill.
        listing_id: the listing filled (``0`` for a class retirement).
        credit_index: for a class retirement, position of the credit in the class's credits.
        units: credit units retired (1000 a tonne).
        input_token: ``"USDC"`` or ``"kVCM"`` (listings: USDC only).
        beneficiary: beneficiary name (its address is derived from it).
        retiring_entity: the retiring entity's name.
        message: the retirement message.
        location: beneficiary location ("" when not given).
        country: ISO 3166-1 alpha-2 consumption country ("" when not given).
        period: consumption period start and end, ISO dates (empty when not given).
    """

    carbon_class: str
    listing_id: int
    credit_index: int
    units: int
    input_token: str
    beneficiary: str
    retiring_entity: str
    message: str
    location: str = ""
    country: str = ""
    period: tuple[str, str] = ("", "")


SEED_RETIREMENTS: Final[tuple[RetirementSpec, ...]] = (
    RetirementSpec(
        "NBO",
        0,
        0,
        2 * UNITS_PER_TONNE,
        "USDC",
        "Northwind Freight GmbH",
        "Northwind Freight GmbH",
        "Offsetting the 2024 Scope 1 emissions of our Hamburg depot's delivery fleet.",
        location="Hamburg, Germany",
        country="DE",
        period=("2024-01-01", "2024-12-31"),
    ),
    RetirementSpec(
        "RE",
        0,
        0,
        5_500,
        "kVCM",
        "Aurora Coffee Roasters",
        "Aurora Coffee Roasters Ltd",
        "Roasting on renewable power: Q1 2025 electricity use, retired on behalf of our customers.",
        location="Bristol, United Kingdom",
        country="GB",
        period=("2025-01-01", "2025-03-31"),
    ),
    RetirementSpec(
        "",
        UPDATED_LISTING_ID,
        0,
        25 * UNITS_PER_TONNE,
        "USDC",
        "Maple & Fern Design Studio",
        "Maple & Fern Design Studio Inc.",
        "25 tonnes for our team's 2025 conference travel.",
        location="Toronto, Canada",
    ),
)
"""Two class retirements (NBO in USDC, RE in kVCM) and a partial fill of the repriced listing."""

SEEDER_USDC: Final = 10_000 * 10**USDC_DECIMALS
SEEDER_KVCM: Final = 10_000 * 10**KVCM_DECIMALS
SEED_SLIPPAGE_BPS: Final = 400
"""Headroom on a class retirement's quoted input (the pool moves); the rest is refunded."""


@dataclass(frozen=True)
class CreditPick:
    """A credit chosen from the projects file.

    Attributes:
        project_id: project key, e.g. ``"VCS-10"`` (the on-chain ``projectId``).
        vintage: latest listed vintage year not after :data:`MAX_VINTAGE`.
        registry: registry code, e.g. ``"VCS"``.
        name: project name.
        category: marketplace category.
        country: project country ("" when the source did not say).
    """

    project_id: str
    vintage: int
    registry: str
    name: str
    category: str
    country: str


class DeployError(DevError):
    """A deployment or seeding step failed (reverted, timed out, or bad input data)."""


def payer_key(index: int) -> str:
    """Deterministic devnet payer key: ``keccak256(f"relayer-devnet payer {index}")``.

    Args:
        index: payer number, from 0.

    Returns:
        The private key as 0x-prefixed hex.

    Raises:
        DeployError: the hash is not a valid secp256k1 scalar (practically never).
    """
    raw = bytes(Web3.keccak(text=f"relayer-devnet payer {index}"))
    if not 0 < int.from_bytes(raw, "big") < _SECP256K1_N:
        raise DeployError(f"payer seed {index} is not a valid secp256k1 key")
    return "0x" + raw.hex()


def pick_credits(projects: Sequence[dict[str, Any]]) -> dict[str, list[CreditPick]]:
    """Choose credits per class from real projects, deterministically.

    Walks the projects in file order; a project qualifies for a class when its category and
    registry match the class spec and it lists a vintage up to :data:`MAX_VINTAGE`. Within a class a
    registry not used yet is preferred, so each class mixes registries where the data allows.
    Each project is used once; its latest vintage up to :data:`MAX_VINTAGE` is the credit's
    vintage.

    Args:
        projects: records of ``carbon-projects.json`` (``key``, ``registry``, ``name``,
            ``category``, ``vintages`` of four-digit strings, ...).

    Returns:
        Class symbol -> chosen credits, in the order of :data:`CLASS_SPECS`.

    Raises:
        DeployError: a class could not be filled.
    """
    used: set[str] = set()
    picks: dict[str, list[CreditPick]] = {}
    for spec in CLASS_SPECS:
        candidates = [p for p in projects if _qualifies(p, spec) and p["key"] not in used]
        chosen: list[dict[str, Any]] = []
        registries: set[str] = set()
        for prefer_new in (True, False):
            for p in candidates:
                if len(chosen) == spec.count:
                    break
                if p in chosen or (prefer_new and p["registry"] in registries):
                    continue
                chosen.append(p)
                registries.add(p["registry"])
        if len(chosen) < spec.count:
            raise DeployError(f"only {len(chosen)} projects qualify for class {spec.symbol}")
        used.update(p["key"] for p in chosen)
        picks[spec.symbol] = [
            CreditPick(
                project_id=p["key"],
                vintage=_latest_vintage(p),
                registry=p["registry"],
                name=p["name"],
                category=p["category"],
                country=p.get("country") or "",
            )
            for p in chosen
        ]
    return picks


def _latest_vintage(project: dict[str, Any]) -> int:
    """Latest vintage year of ``project`` not after :data:`MAX_VINTAGE`; 0 when none."""
    years = [int(v) for v in project.get("vintages") or () if str(v).isdigit()]
    return max((y for y in years if y <= MAX_VINTAGE), default=0)


def _qualifies(project: dict[str, Any], spec: ClassSpec) -> bool:
    if project.get("category") not in spec.categories or not _latest_vintage(project):
        return False
    if spec.registries:
        return project.get("registry") in spec.registries
    return project.get("registry") not in WHOLE_TONNE_REGISTRIES


def load_artifact(name: str) -> tuple[list[dict[str, Any]], str]:
    """ABI and creation bytecode of a compiled contract in ``contracts_abi/``.

    Args:
        name: contract name, e.g. ``"UsdcEip3009"``.

    Returns:
        ``(abi, bytecode)`` with the bytecode as 0x hex.
    """
    data = artifact(name)
    return cast(list[dict[str, Any]], data["abi"]), cast(str, data["bytecode"])


@dataclass
class _Sender:
    """Signs transactions locally with per-account nonces; sends a phase of independent
    transactions, then waits for all their receipts (each must have status 1)."""

    w3: Web3
    chain_id: int
    nonces: dict[str, int] = field(default_factory=dict)
    pending: list[tuple[str, HexBytes]] = field(default_factory=list)
    max_fee: int = 0
    sent: int = 0

    def refresh_fees(self) -> None:
        base_fee = int(self.w3.eth.get_block("latest").get("baseFeePerGas", 0))
        self.max_fee = 2 * base_fee + PRIORITY_FEE_WEI

    def send(self, what: str, account: LocalAccount, call: Any) -> None:
        """Sign and broadcast ``call`` (a contract function or constructor) from ``account``."""
        if not self.max_fee:
            self.refresh_fees()
        addr = account.address
        if addr not in self.nonces:
            self.nonces[addr] = self.w3.eth.get_transaction_count(addr, "pending")
        params: TxParams = {
            "from": addr,
            "nonce": Nonce(self.nonces[addr]),
            "chainId": self.chain_id,
            "maxFeePerGas": Wei(self.max_fee),
            "maxPriorityFeePerGas": Wei(PRIORITY_FEE_WEI),
        }
        try:
            gas = int(call.estimate_gas(params))
        except Exception as exc:
            raise DeployError(f"{what}: gas estimation failed: {exc}") from exc
        params["gas"] = gas + gas * GAS_MARGIN_BPS // 10_000
        tx = call.build_transaction(params)
        signed = account.sign_transaction(cast(dict[str, Any], tx))
        tx_hash = self.w3.eth.send_raw_transaction(signed.raw_transaction)
        self.nonces[addr] += 1
        self.sent += 1
        self.pending.append((what, tx_hash))

    def flush(self) -> list[TxReceipt]:
        """Wait for every pending transaction; raise if one reverted or timed out."""
        receipts: list[TxReceipt] = []
        for what, tx_hash in self.pending:
            try:
                receipt = self.w3.eth.wait_for_transaction_receipt(
                    tx_hash, timeout=RECEIPT_TIMEOUT_S, poll_latency=0.05
                )
            except Exception as exc:
                raise DeployError(f"{what}: no receipt for {tx_hash.to_0x_hex()}: {exc}") from exc
            if receipt["status"] != 1:
                raise DeployError(f"{what}: transaction {tx_hash.to_0x_hex()} reverted")
            receipts.append(receipt)
        self.pending.clear()
        self.refresh_fees()
        return receipts


def _web3(rpc_url: str, session: requests.Session) -> Web3:
    """A web3 for seeding a local node through ``session`` (one per chain and thread), which
    is told to ignore the environment's proxy settings (a loopback node; looking them up for
    every request cost a tenth of the seeding), and that asks the chain id once (web3 asks
    it again for every transaction it validates)."""
    session.trust_env = False
    provider = Web3.HTTPProvider(
        rpc_url,
        request_kwargs={"timeout": 30},
        session=session,
        cache_allowed_requests=True,
        cacheable_requests={RPCEndpoint("eth_chainId")},
    )
    return Web3(provider)


def _account_info(account: LocalAccount) -> dict[str, str]:
    return {"address": account.address, "privateKey": "0x" + bytes(account.key).hex()}


def deploy_and_seed(rpc_url: str, chain_id: int, projects_file: Path) -> dict[str, Any]:
    """Deploy the reference protocol on a dev chain and seed it with supply and payers.

    Deploys USDC (EIP-3009; domain name ``"USD Coin"`` on 8453, else ``"USDC"``), kVCM,
    CarbonCredits, CarbonClasses, UsdcKvcmPool, Marketplace and RetirementSettlement with
    anvil's account 0; registers one registry per registry code used (PUR: whole tonnes
    and consumption metadata) and one credit per chosen project (see :func:`pick_credits`);
    creates the classes of :data:`CLASS_SPECS` and deposits 5,000 t (5,000,000 units) of
    each credit; adds 500,000 USDC / 1,000,000 kVCM of pool liquidity; places the seller's
    listings of :data:`LISTING_SPECS` (ids 1-5, expiring 30 days after the latest block) and
    of :data:`CHANGED_LISTING_SPECS` (id 6 then repriced with ``updateListing``, id 7 then
    cancelled); sets settlement fees (class 100 bps, floor 0.01 USDC; listing 500 bps,
    floor 0.05 USDC) and registers the executor; funds :data:`PAYER_COUNT` payers with
    10,000 USDC and 100,000 kVCM each and no ETH, and the treasury (:data:`TREASURY_KEY`)
    with 10,000 USDC and no ETH; finally the deployer settles the retirements of
    :data:`SEED_RETIREMENTS` itself (direct ``[approve, retire]``, one transaction each):
    two class retirements and a partial fill of listing 6 at its new price.

    Args:
        rpc_url: HTTP JSON-RPC endpoint of an anvil node whose default accounts hold ETH.
        chain_id: the node's chain id (84532 Base Sepolia, 8453 Base or 137 Polygon,
            simulated).
        projects_file: path of ``carbon-projects.json``.

    Returns:
        The devnet description (JSON-serialisable): ``chainId``, ``genesisHash`` (0x hex:
        the chain's identity across resets), ``rpcUrl``, ``deployBlock``, ``contracts``
        (name -> checksummed address), ``deployer``, ``executor``, ``seller``,
        ``feeRecipient``, ``treasury`` and ``payers`` (``address``, ``privateKey``), ``fees``
        (the settlement's fee schedule), ``credits`` (``tokenId``, ``projectId``,
        ``vintage``, ``registry``, ``name``, ``category``, ``country``, ``carbonClass``),
        ``carbonClasses`` (``classId``, ``symbol``, ``name``, ``priceKvcmPerTonne``,
        ``minRetirementUnits``, ``tokenIds``), ``listings`` (``listingId``, ``tokenId``,
        ``seller``, ``unitPrice``, ``amount`` (as listed), ``minFill``, ``expiration`` as
        they are on chain now, ``leftToSell``, ``state``: ``"active"``, ``"updated"`` or
        ``"cancelled"``; an updated one also ``createdUnitPrice``, ``createdMinFill``,
        ``createdExpiration``) and ``seededRetirements`` (see :func:`_seed_retirements`).
        Token amounts too large for a JSON number are decimal strings of atomic units.

    Raises:
        DeployError: the node reports another chain id, a transaction reverted or timed
            out, or the projects file cannot fill the classes.
    """
    with requests.Session() as session:
        return _deploy_and_seed(_web3(rpc_url, session), rpc_url, chain_id, projects_file)


def _deploy_and_seed(w3: Web3, rpc_url: str, chain_id: int, projects_file: Path) -> dict[str, Any]:
    """:func:`deploy_and_seed` through ``w3`` (connected to ``rpc_url``)."""
    started = time.monotonic()
    node_chain_id = w3.eth.chain_id
    if node_chain_id != chain_id:
        raise DeployError(f"node at {rpc_url} has chain id {node_chain_id}, expected {chain_id}")
    accounts = _Accounts.of_anvil()
    picks = pick_credits(json.loads(projects_file.read_text()))
    tx = _Sender(w3, chain_id)
    protocol = _deploy_protocol(tx, accounts)
    log.info("deployed %d contracts from block %d", len(protocol.addresses()), protocol.deploy_block)
    _configure(tx, protocol, accounts, picks)
    token_ids, credit_rows = _register_credits(tx, protocol, accounts.deployer, picks)
    listing_tokens = _stock(tx, protocol, accounts, token_ids)
    listing_rows = _deposit_and_list(tx, protocol, accounts, token_ids, listing_tokens)
    fee_sources = _fee_sources(tx, accounts)
    _change_listings(tx, protocol, accounts, listing_rows)
    seeded = _seed_retirements(tx, protocol, accounts, token_ids, listing_rows)
    for gasless in (*accounts.payers, accounts.treasury):
        if w3.eth.get_balance(gasless.address) != 0:
            raise DeployError(f"{gasless.address} holds ETH; payers and the treasury must be gasless")
    class_rows = _class_rows(token_ids)
    log.info(
        "seeded %d credits, %d classes, %d listings, %d payers, %d retirements on chain %d "
        "in %d transactions (%.1f s)",
        len(credit_rows),
        len(class_rows),
        len(listing_rows),
        len(accounts.payers),
        len(seeded),
        chain_id,
        tx.sent,
        time.monotonic() - started,
    )
    return {
        "chainId": chain_id,
        "genesisHash": "0x" + bytes(w3.eth.get_block(0)["hash"]).hex(),
        "rpcUrl": rpc_url,
        "deployBlock": protocol.deploy_block,
        "contracts": {**protocol.addresses(), **fee_sources},
        "deployer": _account_info(accounts.deployer),
        "executor": _account_info(accounts.executor),
        "spareExecutors": [_account_info(a) for a in accounts.spare_executors],
        "seller": _account_info(accounts.seller),
        "feeRecipient": _account_info(accounts.fee_recipient),
        "treasury": _account_info(accounts.treasury),
        "payers": [_account_info(p) for p in accounts.payers],
        "fees": dict(SETTLEMENT_FEES),
        "credits": credit_rows,
        "carbonClasses": class_rows,
        "listings": listing_rows,
        "seededRetirements": seeded,
    }


GAS_PRICE_ORACLE: Final = "0x420000000000000000000000000000000000000F"
"""The OP-stack GasPriceOracle predeploy address (Base's L1 data fee and operator fee)."""

DEVNET_L1_FEES: Final = {
    # OP Mainnet's published Ecotone blob scalars (shared/REFERENCE.md), a 1 gwei L1 base fee
    # and a 1 wei blob base fee; tests move them on the oracle.
    "l1BaseFee": 10**9,
    "blobBaseFee": 1,
    "baseFeeScalar": 1368,
    "blobBaseFeeScalar": 810949,
}
DEVNET_OPERATOR_FEE: Final = {"operatorFeeScalar": 0, "operatorFeeConstant": 0}
DEVNET_ETH_USD: Final = 3000 * 10**8
"""The devnet feed's ETH/USD answer (8 decimals): 3,000 USD."""


def _fee_sources(tx: _Sender, accounts: _Accounts) -> dict[str, str]:
    """What a Base transaction costs beyond L2 gas, and what ETH is worth, on the devnet: the
    GasPriceOracle stand-in placed at the predeploy address (deployed, then its runtime code
    copied there with ``anvil_setCode``; parameters set through its setters) and a
    Chainlink-style ETH/USD feed. Returns the description's ``gasPriceOracle`` and
    ``ethUsdFeed`` contract entries."""
    w3 = tx.w3
    abi, bytecode = load_artifact("GasPriceOracleDev")
    tx.send(
        "deploy GasPriceOracleDev",
        accounts.deployer,
        w3.eth.contract(abi=abi, bytecode=bytecode).constructor(),
    )
    feed_abi, feed_code = load_artifact("EthUsdFeedDev")
    feed_deploy = w3.eth.contract(abi=feed_abi, bytecode=feed_code).constructor(DEVNET_ETH_USD)
    tx.send("deploy EthUsdFeedDev", accounts.deployer, feed_deploy)
    template, feed_receipt = tx.flush()
    template_address, feed = template["contractAddress"], feed_receipt["contractAddress"]
    if template_address is None or feed is None:
        raise DeployError("deploy of the fee sources: a receipt has no contract address")
    runtime = w3.eth.get_code(template_address)
    w3.provider.make_request(RPCEndpoint("anvil_setCode"), [GAS_PRICE_ORACLE, "0x" + bytes(runtime).hex()])
    oracle = w3.eth.contract(address=Web3.to_checksum_address(GAS_PRICE_ORACLE), abi=abi)
    tx.send("set L1 fees", accounts.deployer, oracle.functions.setL1Fees(*DEVNET_L1_FEES.values()))
    tx.send(
        "set operator fee", accounts.deployer, oracle.functions.setOperatorFee(*DEVNET_OPERATOR_FEE.values())
    )
    tx.flush()
    return {"gasPriceOracle": oracle.address, "ethUsdFeed": str(feed)}


def _class_rows(token_ids: dict[str, list[int]]) -> list[dict[str, Any]]:
    """The description's carbon classes (class ids are sequential from 1)."""
    return [
        {
            "classId": class_id,
            "symbol": spec.symbol,
            "name": spec.name,
            "priceKvcmPerTonne": str(spec.price_kvcm_per_tonne),
            "minRetirementUnits": spec.min_retirement_units,
            "tokenIds": token_ids[spec.symbol],
        }
        for class_id, spec in enumerate(CLASS_SPECS, start=1)
    ]


@dataclass(frozen=True)
class _Accounts:
    """The devnet's roles: anvil's accounts 0-5, the deterministic payers and the treasury."""

    deployer: LocalAccount
    executor: LocalAccount
    seller: LocalAccount
    fee_recipient: LocalAccount
    payers: tuple[LocalAccount, ...]
    spare_executors: tuple[LocalAccount, ...]
    treasury: LocalAccount

    @classmethod
    def of_anvil(cls) -> _Accounts:
        return cls(
            Account.from_key(DEPLOYER_KEY),
            Account.from_key(EXECUTOR_KEY),
            Account.from_key(SELLER_KEY),
            Account.from_key(FEE_RECIPIENT_KEY),
            tuple(Account.from_key(payer_key(i)) for i in range(PAYER_COUNT)),
            tuple(Account.from_key(k) for k in SPARE_EXECUTOR_KEYS),
            Account.from_key(TREASURY_KEY),
        )


@dataclass(frozen=True)
class _Protocol:
    """The deployed contracts, bound to their ABIs, and the block of the first deployment."""

    usdc: Contract
    kvcm: Contract
    credits: Contract
    classes: Contract
    pool: Contract
    market: Contract
    settlement: Contract
    deploy_block: int

    def addresses(self) -> dict[str, ChecksumAddress]:
        """Deployment key -> checksummed address (the ``contracts`` of the description)."""
        return {
            "usdc": self.usdc.address,
            "kvcm": self.kvcm.address,
            "carbonCredits": self.credits.address,
            "carbonClasses": self.classes.address,
            "pool": self.pool.address,
            "marketplace": self.market.address,
            "settlement": self.settlement.address,
        }


def _deploy_protocol(tx: _Sender, accounts: _Accounts) -> _Protocol:
    """Deploy the seven contracts in three phases (each needs the addresses of the last)."""
    w3 = tx.w3

    def deploy(name: str, *args: Any) -> Callable[[TxReceipt], Contract]:
        abi, bytecode = load_artifact(name)
        constructor = w3.eth.contract(abi=abi, bytecode=bytecode).constructor(*args)
        tx.send(f"deploy {name}", accounts.deployer, constructor)

        def bind(receipt: TxReceipt) -> Contract:
            address = receipt["contractAddress"]
            if address is None:
                raise DeployError(f"deploy {name}: receipt has no contract address")
            return w3.eth.contract(address=address, abi=abi)

        return bind

    usdc_domain = usdc_domain_name(tx.chain_id)
    binders = [deploy("UsdcEip3009", usdc_domain), deploy("KlimaVcm"), deploy("CarbonCredits")]
    receipts = tx.flush()
    usdc, kvcm, credits = (bind(r) for bind, r in zip(binders, receipts, strict=True))
    binders = [
        deploy("CarbonClasses", kvcm.address, credits.address, accounts.fee_recipient.address),
        deploy("UsdcKvcmPool", usdc.address, kvcm.address),
        deploy("Marketplace", usdc.address),
    ]
    classes, pool, market = (bind(r) for bind, r in zip(binders, tx.flush(), strict=True))
    bind_settlement = deploy(
        "RetirementSettlement",
        usdc.address,
        kvcm.address,
        credits.address,
        classes.address,
        market.address,
        pool.address,
        accounts.fee_recipient.address,
        # web3 8 mangles a dict for a struct argument: pass the tuple in ABI order.
        tuple(SETTLEMENT_FEES[k] for k in _FEES_ABI_ORDER),
    )
    (settlement_receipt,) = tx.flush()
    settlement = bind_settlement(settlement_receipt)
    return _Protocol(usdc, kvcm, credits, classes, pool, market, settlement, int(receipts[0]["blockNumber"]))


def _configure(tx: _Sender, p: _Protocol, accounts: _Accounts, picks: dict[str, list[CreditPick]]) -> None:
    """Registries, classes, the executor, funded payers and approvals (independent transactions)."""
    deployer = accounts.deployer
    for code in sorted({c.registry for spec in CLASS_SPECS for c in picks[spec.symbol]}):
        whole = code in WHOLE_TONNE_REGISTRIES
        tx.send(f"addRegistry {code}", deployer, p.credits.functions.addRegistry(code, whole, whole))
    for spec in CLASS_SPECS:
        tx.send(
            f"createClass {spec.symbol}",
            deployer,
            p.classes.functions.createClass(
                spec.symbol, spec.name, spec.price_kvcm_per_tonne, spec.min_retirement_units
            ),
        )
    tx.send("setExecutor", deployer, p.settlement.functions.setExecutor(accounts.executor.address, True))
    for spare in accounts.spare_executors:
        tx.send("setExecutor (spare)", deployer, p.settlement.functions.setExecutor(spare.address, True))
    for payer in accounts.payers:
        tx.send("mint USDC to payer", deployer, p.usdc.functions.mint(payer.address, PAYER_USDC))
        tx.send("mint kVCM to payer", deployer, p.kvcm.functions.mint(payer.address, PAYER_KVCM))
    tx.send("mint pool USDC", deployer, p.usdc.functions.mint(deployer.address, POOL_USDC))
    tx.send("mint pool kVCM", deployer, p.kvcm.functions.mint(deployer.address, POOL_KVCM))
    tx.send("approve pool USDC", deployer, p.usdc.functions.approve(p.pool.address, POOL_USDC))
    tx.send("approve pool kVCM", deployer, p.kvcm.functions.approve(p.pool.address, POOL_KVCM))
    tx.send("approve classes", deployer, p.credits.functions.setApprovalForAll(p.classes.address, True))
    tx.send(
        "approve marketplace", accounts.seller, p.credits.functions.setApprovalForAll(p.market.address, True)
    )
    tx.flush()


def _register_credits(
    tx: _Sender, p: _Protocol, deployer: LocalAccount, picks: dict[str, list[CreditPick]]
) -> tuple[dict[str, list[int]], list[dict[str, Any]]]:
    """One ERC-1155 credit per picked project; token ids are sequential from 1 in class
    order. Returns (class symbol -> token ids, the description's credit rows)."""
    all_picks = [c for spec in CLASS_SPECS for c in picks[spec.symbol]]
    for pick in all_picks:
        tx.send(
            f"registerCredit {pick.project_id}",
            deployer,
            p.credits.functions.registerCredit(pick.project_id, pick.vintage, pick.registry),
        )
    tx.flush()
    token_ids: dict[str, list[int]] = {}
    credit_rows: list[dict[str, Any]] = []
    for spec in CLASS_SPECS:
        token_ids[spec.symbol] = []
        for pick in picks[spec.symbol]:
            token_id = len(credit_rows) + 1
            token_ids[spec.symbol].append(token_id)
            credit_rows.append(
                {
                    "tokenId": token_id,
                    "projectId": pick.project_id,
                    "vintage": pick.vintage,
                    "registry": pick.registry,
                    "name": pick.name,
                    "category": pick.category,
                    "country": pick.country,
                    "carbonClass": spec.symbol,
                }
            )
    if int(p.credits.functions.creditCount().call()) != len(credit_rows):
        raise DeployError("credit count on chain does not match the registered credits")
    return token_ids, credit_rows


def _stock(tx: _Sender, p: _Protocol, accounts: _Accounts, token_ids: dict[str, list[int]]) -> list[int]:
    """Register credits with their classes, mint class deposits and the seller's inventory,
    and add pool liquidity. Returns the token id of each listing of :data:`ALL_LISTING_SPECS`."""
    deployer = accounts.deployer
    for class_id, spec in enumerate(CLASS_SPECS, start=1):
        for token_id in token_ids[spec.symbol]:
            tx.send(
                f"class {spec.symbol} registerCredit {token_id}",
                deployer,
                p.classes.functions.registerCredit(class_id, token_id),
            )
            tx.send(
                f"mint credit {token_id}",
                deployer,
                p.credits.functions.mint(deployer.address, token_id, CLASS_DEPOSIT_UNITS),
            )
    listing_tokens = [token_ids[ls.symbol][ls.index] for ls in ALL_LISTING_SPECS]
    for ls, token_id in zip(ALL_LISTING_SPECS, listing_tokens, strict=True):
        tx.send(
            f"mint credit {token_id} to seller",
            deployer,
            p.credits.functions.mint(accounts.seller.address, token_id, ls.tonnes * UNITS_PER_TONNE),
        )
    tx.send("addLiquidity", deployer, p.pool.functions.addLiquidity(POOL_USDC, POOL_KVCM))
    tx.flush()
    return listing_tokens


def _deposit_and_list(
    tx: _Sender,
    p: _Protocol,
    accounts: _Accounts,
    token_ids: dict[str, list[int]],
    listing_tokens: list[int],
) -> list[dict[str, Any]]:
    """Deposit each class's credits and place the seller's listings of
    :data:`ALL_LISTING_SPECS` in order (ids from 1, expiring :data:`LISTING_LIFETIME_S` after
    the latest block). Returns the description's listing rows, as created."""
    expiration = int(tx.w3.eth.get_block("latest")["timestamp"]) + LISTING_LIFETIME_S
    for class_id, spec in enumerate(CLASS_SPECS, start=1):
        for token_id in token_ids[spec.symbol]:
            tx.send(
                f"deposit {token_id} into {spec.symbol}",
                accounts.deployer,
                p.classes.functions.deposit(class_id, token_id, CLASS_DEPOSIT_UNITS),
            )
    listing_rows: list[dict[str, Any]] = []
    for listing_id, (ls, token_id) in enumerate(zip(ALL_LISTING_SPECS, listing_tokens, strict=True), start=1):
        amount = ls.tonnes * UNITS_PER_TONNE
        tx.send(
            f"createListing {listing_id}",
            accounts.seller,
            p.market.functions.createListing(
                p.credits.address, token_id, amount, ls.unit_price, ls.min_fill, expiration
            ),
        )
        listing_rows.append(
            {
                "listingId": listing_id,
                "tokenId": token_id,
                "seller": accounts.seller.address,
                "unitPrice": str(ls.unit_price),
                "amount": amount,
                "minFill": ls.min_fill,
                "expiration": expiration,
                "leftToSell": amount,
                "state": "active",
            }
        )
    tx.flush()
    if int(p.market.functions.listingCount().call()) != len(listing_rows):
        raise DeployError("listing count on chain does not match the created listings")
    return listing_rows


def _change_listings(
    tx: _Sender, p: _Protocol, accounts: _Accounts, listing_rows: list[dict[str, Any]]
) -> None:
    """Reprice and cancel the listings of :data:`CHANGED_LISTING_SPECS` (updating
    ``listing_rows`` in place), and fund the treasury (10,000 USDC) and the deployer, who
    settles the seeded retirements (the pool's deposit took all it held)."""
    latest = int(tx.w3.eth.get_block("latest")["timestamp"])
    for row, ls in zip(listing_rows, ALL_LISTING_SPECS, strict=True):
        if ls.update is not None:
            expiration = latest + ls.update.lifetime_s
            tx.send(
                f"updateListing {row['listingId']}",
                accounts.seller,
                p.market.functions.updateListing(
                    row["listingId"], ls.update.unit_price, ls.update.min_fill, expiration
                ),
            )
            row.update(
                createdUnitPrice=row["unitPrice"],
                createdMinFill=row["minFill"],
                createdExpiration=row["expiration"],
                unitPrice=str(ls.update.unit_price),
                minFill=ls.update.min_fill,
                expiration=expiration,
            )
        if ls.cancelled:
            tx.send(
                f"cancelListing {row['listingId']}",
                accounts.seller,
                p.market.functions.cancelListing(row["listingId"]),
            )
            row["leftToSell"] = 0
        row["state"] = ls.state
    deployer = accounts.deployer
    tx.send("mint treasury USDC", deployer, p.usdc.functions.mint(accounts.treasury.address, TREASURY_USDC))
    tx.send("mint seeder USDC", deployer, p.usdc.functions.mint(deployer.address, SEEDER_USDC))
    tx.send("mint seeder kVCM", deployer, p.kvcm.functions.mint(deployer.address, SEEDER_KVCM))
    tx.flush()


def beneficiary_address(name: str) -> ChecksumAddress:
    """A seeded retirement's beneficiary address: the low 20 bytes of
    ``keccak256(f"relayer-devnet beneficiary {name}")`` (deterministic, nobody's key)."""
    return Web3.to_checksum_address(bytes(Web3.keccak(text=f"relayer-devnet beneficiary {name}"))[-20:])


def _seed_retirements(
    tx: _Sender,
    p: _Protocol,
    accounts: _Accounts,
    token_ids: dict[str, list[int]],
    listing_rows: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Settle :data:`SEED_RETIREMENTS` as the deployer, the way prepare/retire's batch does:
    ``approve(settlement, maxInput)`` of each input token (the sum of its retirements'
    inputs: the quoted cost + fee, with :data:`SEED_SLIPPAGE_BPS` headroom for a class),
    then one ``retire(r, maxInput)`` transaction per retirement (the unused input is
    refunded). A listing fill lowers its row's ``leftToSell``.

    Returns:
        The description's ``seededRetirements``, in order: ``id`` (the unified
        ``{chainId}-{transactionHash}-{retirementIndex}``), ``transactionHash``,
        ``retirementIndex``, ``blockNumber``, ``source`` (``"carbonClass"`` or
        ``"listing"``), ``sourceId`` (class or listing id), ``carbonClass`` (symbol, ``""``
        for a listing), ``tokenId``, ``amountUnits`` (credit units), ``inputToken``
        (``"USDC"`` or ``"kVCM"``), ``value``, ``retirementCost``, ``fee``, ``refunded``
        (decimal strings, atomic units of the input token), ``payer`` (the deployer),
        ``beneficiary`` (address), ``beneficiaryName``, ``retiringEntity``, ``message``,
        ``beneficiaryLocation``, ``consumptionCountryCode``, ``consumptionPeriodStart``,
        ``consumptionPeriodEnd``.
    """
    deployer = accounts.deployer
    tokens = {"USDC": p.usdc, "kVCM": p.kvcm}
    class_ids = {spec.symbol: class_id for class_id, spec in enumerate(CLASS_SPECS, start=1)}
    listings = {row["listingId"]: row for row in listing_rows}
    planned: list[tuple[RetirementSpec, Retirement, int]] = []
    approvals = dict.fromkeys(tokens, 0)
    for spec in SEED_RETIREMENTS:
        if spec.carbon_class:
            source, source_id = SOURCE_CARBON_CLASS, class_ids[spec.carbon_class]
            token_id = token_ids[spec.carbon_class][spec.credit_index]
        else:
            source, source_id = SOURCE_LISTING, spec.listing_id
            token_id = listings[spec.listing_id]["tokenId"]
        retirement = _seed_retirement(spec, source, source_id, token_id, p, tokens, deployer.address)
        cost, fee = (int(v) for v in p.settlement.functions.quote(retirement.as_tuple()).call())
        max_input = cost + fee
        if source == SOURCE_CARBON_CLASS:
            max_input += max_input * SEED_SLIPPAGE_BPS // 10_000
        approvals[spec.input_token] += max_input
        planned.append((spec, retirement, max_input))
    for symbol, amount in approvals.items():
        if amount:
            tx.send(
                f"approve settlement {symbol}",
                deployer,
                tokens[symbol].functions.approve(p.settlement.address, amount),
            )
    tx.flush()
    for spec, retirement, max_input in planned:
        tx.send(
            f"retire for {spec.beneficiary}",
            deployer,
            p.settlement.functions.retire(retirement.as_tuple(), max_input),
        )
    rows: list[dict[str, Any]] = []
    settled = p.settlement.events.RetirementSettled()
    for (spec, retirement, _), receipt in zip(planned, tx.flush(), strict=True):
        events = settled.process_receipt(receipt, errors=DISCARD)
        if len(events) != 1:
            raise DeployError(f"retire for {spec.beneficiary}: {len(events)} RetirementSettled events, not 1")
        args = events[0]["args"]
        tx_hash = "0x" + bytes(receipt["transactionHash"]).hex()
        index = int(args["retirementIndex"])
        rows.append(
            _seeded_row(tx.chain_id, tx_hash, index, receipt, args, spec, retirement, deployer.address)
        )
        if retirement.source == SOURCE_LISTING:
            listings[retirement.source_id]["leftToSell"] -= retirement.amount
    return rows


def _seed_retirement(
    spec: RetirementSpec,
    source: int,
    source_id: int,
    token_id: int,
    p: _Protocol,
    tokens: dict[str, Any],
    retiring: str,
) -> Retirement:
    """The retirement of one :data:`SEED_RETIREMENTS` entry, retired by ``retiring``."""
    return Retirement(
        source=source,
        source_id=source_id,
        credit_token=p.credits.address,
        token_id=token_id,
        amount=spec.units,
        input_token=tokens[spec.input_token].address,
        gas_allowance=0,
        details=RetirementDetails(
            retiring_address=retiring,
            beneficiary_address=beneficiary_address(spec.beneficiary),
            beneficiary_string=spec.beneficiary,
            retiring_entity_string=spec.retiring_entity,
            retirement_message=spec.message,
            beneficiary_location=spec.location,
            consumption_country_code=spec.country,
            consumption_period_start=spec.period[0],
            consumption_period_end=spec.period[1],
        ),
    )


def _seeded_row(
    chain_id: int,
    tx_hash: str,
    index: int,
    receipt: Any,
    args: Any,
    spec: RetirementSpec,
    retirement: Retirement,
    payer: str,
) -> dict[str, Any]:
    """One ``seededRetirements`` entry (see :func:`_seed_retirements`)."""
    details = retirement.details
    return {
        "id": f"{chain_id}-{tx_hash}-{index}",
        "transactionHash": tx_hash,
        "retirementIndex": index,
        "blockNumber": int(receipt["blockNumber"]),
        "source": "carbonClass" if retirement.source == SOURCE_CARBON_CLASS else "listing",
        "sourceId": retirement.source_id,
        "carbonClass": spec.carbon_class,
        "tokenId": retirement.token_id,
        "amountUnits": retirement.amount,
        "inputToken": spec.input_token,
        "value": str(args["value"]),
        "retirementCost": str(args["retirementCost"]),
        "fee": str(args["fee"]),
        "refunded": str(args["refunded"]),
        "payer": payer,
        "beneficiary": details.beneficiary_address,
        "beneficiaryName": details.beneficiary_string,
        "retiringEntity": details.retiring_entity_string,
        "message": details.retirement_message,
        "beneficiaryLocation": details.beneficiary_location,
        "consumptionCountryCode": details.consumption_country_code,
        "consumptionPeriodStart": details.consumption_period_start,
        "consumptionPeriodEnd": details.consumption_period_end,
    }
