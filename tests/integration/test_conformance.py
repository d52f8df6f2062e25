"""Conformance with the spec's error table (x402-retirement-endpoint.md, Errors): every code
of the registry is provoked over HTTP against a daemon on a local chain, and each answers
its HTTP status, the envelope ``{error, message, x402FacilitatorVersion: 2}`` and the
context fields the spec names; every code an action answered is one that action may return
(the per-action lists, :func:`relayer.domain.errors.allowed_codes`).

The suite runs on a chain of its own (a private anvil, database and daemon, and daemons
without workers on the same chain and database where a setting or an outage is needed), so
the state it creates (a listing that expires, one cancelled under a relay, two classes
holding one credit, a credit only a listing sells) and the revert it provokes touch no
other test.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from eth_account import Account
from web3 import Web3

from relayer.app import open_runtime, web_runner
from relayer.chain.abi import abi
from relayer.config import Settings
from relayer.domain.errors import REGISTRY, X402_FACILITATOR_VERSION, X402_REGISTRY, allowed_codes
from relayer.domain.schemas import ACTIONS
from tests.chain_helpers import transact_as, transact_as_deployer
from tests.conftest import Daemon, free_port
from tests.helpers.relay import sign, signed_request
from tests.private import Anvil, daemon_settings, private_daemon
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Answer = tuple[int, dict[str, Any]]

CONTEXT: Final[dict[str, tuple[str, ...]]] = {
    "unknown_action": ("supported",),
    "document_not_found": ("available",),
    "schema_validation": ("issues",),
    "rate_limited": ("retryAfterSeconds",),
    "method_not_allowed": ("allow",),
    "vintage_not_found": ("availableVintages",),
    "amount_below_increment": ("minimum",),
    "insufficient_listing_supply": ("leftToSell",),
    "insufficient_authorized_value": ("requiredMinimum",),
    "params_mismatch": ("expectedNonce", "receivedNonce", "submitted"),
    "contract_revert": ("selector", "decoded.errorName", "contract", "function", "args"),
    "transaction_reverted": ("transactionHash",),
    "credit_ambiguous": ("carbonClasses", "candidates"),
    "credit_not_found": ("listingId",),
    "listing_not_found": ("listingId",),
    "registry_details_required": ("fields",),
}
"""The context fields the spec's Errors table names for a code (dotted: nested)."""

ANSWERED: Final[list[tuple[str, str]]] = []
"""(action, code) of every error an action answered while the suite ran."""

UNITS_PER_TONNE: Final = 1000
FAR: Final = 2**40  # an expiration no test reaches


# ------------------------------------------------------------------ the suite's own chain state


@dataclass(frozen=True)
class Stage:
    """What the suite puts on its chain before provoking anything.

    Attributes:
        listing: 5 t of a class credit at 10 USDC a tonne, smallest fill 2 t.
        expiring: 1 t listed until ``expires_at`` (unix s, a few seconds after set-up).
        doomed: 2 t, cancelled by the seller while a relayed fill of it is pending.
        listed_only: a listing of ``listed_only_credit``, a credit no class registers.
        twin_credit: a credit held by its seeded class and by the class ``TWIN``.
        empty_class: the symbol of a class with no credits.
    """

    listing: int
    expiring: int
    expires_at: int
    doomed: int
    listed_only: int
    listed_only_credit: str
    twin_credit: str
    empty_class: str


def _w3(chain: dict[str, Any]) -> Web3:
    return Web3(Web3.HTTPProvider(chain["rpcUrl"]))


def _read(chain: dict[str, Any], key: str, contract: str, function: str, *args: Any) -> Any:
    handle = _w3(chain).eth.contract(address=chain["contracts"][key], abi=abi(contract))
    return getattr(handle.functions, function)(*args).call()


def _as_deployer(chain: dict[str, Any], key: str, contract: str, function: str, *args: Any) -> None:
    transact_as_deployer(chain, chain["contracts"][key], contract, function, *args)


def _list(chain: dict[str, Any], token_id: int, units: int, min_fill: int, expiration: int) -> int:
    """Mint ``units`` of ``token_id`` to the seller and list them at 10 USDC a tonne; the id."""
    _as_deployer(chain, "carbonCredits", "CarbonCredits", "mint", chain["seller"]["address"], token_id, units)
    receipt = transact_as(
        chain,
        "seller",
        chain["contracts"]["marketplace"],
        "Marketplace",
        "createListing",
        chain["contracts"]["carbonCredits"],
        token_id,
        units,
        10_000_000,
        min_fill,
        expiration,
    )
    assert receipt["status"] == 1
    return int(_read(chain, "marketplace", "Marketplace", "listingCount"))


def _credit_id(credit: dict[str, Any]) -> str:
    return f"{credit['projectId']}-{credit['vintage']}"


def stage(chain: dict[str, Any]) -> Stage:
    """Create the suite's chain state as the deployer (protocol owner) and the seller."""
    credits = {c["tokenId"]: c for c in chain["credits"]}
    nbo = next(c for c in chain["carbonClasses"] if c["symbol"] == "NBO")
    re_class = next(c for c in chain["carbonClasses"] if c["symbol"] == "RE")
    listed = re_class["tokenIds"][0]
    latest = int(_w3(chain).eth.get_block("latest")["timestamp"])
    expires_at = max(latest, int(time.time())) + 3
    expiring = _list(chain, listed, UNITS_PER_TONNE, UNITS_PER_TONNE, expires_at)
    listing = _list(chain, listed, 5 * UNITS_PER_TONNE, 2 * UNITS_PER_TONNE, FAR)
    doomed = _list(chain, listed, 2 * UNITS_PER_TONNE, UNITS_PER_TONNE, FAR)
    # A credit of a seeded project with a vintage no class holds, sold by a listing only.
    known = credits[nbo["tokenIds"][0]]
    vintage = min(int(c["vintage"]) for c in chain["credits"]) - 5
    project, registry = known["projectId"], known["registry"]
    _as_deployer(chain, "carbonCredits", "CarbonCredits", "registerCredit", project, vintage, registry)
    only = int(_read(chain, "carbonCredits", "CarbonCredits", "creditCount"))
    listed_only = _list(chain, only, 3 * UNITS_PER_TONNE, UNITS_PER_TONNE, FAR)
    # A second class holding (with liquidity) a credit its seeded class holds too.
    twin = nbo["tokenIds"][-1]
    price = int(nbo["priceKvcmPerTonne"])
    _as_deployer(chain, "carbonClasses", "CarbonClasses", "createClass", "TWIN", "Conformance twin", price, 1)
    twin_class = int(_read(chain, "carbonClasses", "CarbonClasses", "classCount"))
    _as_deployer(chain, "carbonClasses", "CarbonClasses", "registerCredit", twin_class, twin)
    deployer = chain["deployer"]["address"]
    _as_deployer(chain, "carbonCredits", "CarbonCredits", "mint", deployer, twin, UNITS_PER_TONNE)
    _as_deployer(chain, "carbonClasses", "CarbonClasses", "deposit", twin_class, twin, UNITS_PER_TONNE)
    _as_deployer(chain, "carbonClasses", "CarbonClasses", "createClass", "VOID", "Conformance void", price, 1)
    return Stage(
        listing=listing,
        expiring=expiring,
        expires_at=expires_at,
        doomed=doomed,
        listed_only=listed_only,
        listed_only_credit=f"{project}-{vintage}",
        twin_credit=_credit_id(credits[twin]),
        empty_class="VOID",
    )


# ------------------------------------------------------------------ the daemons


@dataclass
class Conformance:
    """The suite's daemon (API and workers) on its own chain and database, the chain's
    anvil, and the state staged on it. Requests made through :meth:`get` and :meth:`post`
    record the (action, code) of every error answered."""

    daemon: Daemon
    anvil: Anvil
    stage: Stage

    @property
    def chain(self) -> dict[str, Any]:
        return self.daemon.chain

    def payer(self, index: int = 0) -> dict[str, str]:
        return dict(self.chain["payers"][index])

    async def get(self, action: str, d: Daemon | None = None, **params: Any) -> Answer:
        """GET /api/<action> with query ``params`` (on ``d``, default the suite's daemon)."""
        status, body = await (d or self.daemon).get(f"/api/{action}", **params)
        _record(action, status, body)
        return status, body

    async def post(self, body: dict[str, Any], d: Daemon | None = None) -> Answer:
        """POST /api with ``body`` (its ``action`` selects the operation)."""
        status, answer = await (d or self.daemon).post(body)
        _record(body.get("action"), status, answer)
        return status, answer

    async def challenge(
        self, payer: dict[str, str], d: Daemon | None = None, **fields: Any
    ) -> dict[str, Any]:
        """actions/retire without authPayload: the 402 body (typedData, actionsRetireRequest)."""
        status, body = await self.post(
            {
                "action": "actions/retire",
                "from": payer["address"],
                "inputToken": "USDC",
                "details": {"beneficiaryIsPayer": True},
                **fields,
            },
            d,
        )
        assert (status, body["error"]) == (402, "payment_required"), body
        return body

    async def signed(self, payer: dict[str, str], d: Daemon | None = None, **fields: Any) -> dict[str, Any]:
        """A ready actions/retire request signed by ``payer`` (class NBO, 0.5 t by default)."""
        ch = await self.challenge(payer, d, **{"carbonClass": "NBO", "amount": "0.5", **fields})
        return signed_request(ch, payer["privateKey"])


def _record(action: Any, status: int, body: dict[str, Any]) -> None:
    if status >= 400 and action in ACTIONS:
        ANSWERED.append((str(action), str(body.get("error"))))
        if "cause" in body and "upstream" not in body:  # a code the API kept out of the action's list
            ANSWERED.append((str(action), str(body["cause"])))


@pytest.fixture(scope="module")
async def conf(
    tmp_path_factory: pytest.TempPathFactory, admin_database_url: str
) -> AsyncIterator[Conformance]:
    state = tmp_path_factory.mktemp("conformance")
    async with private_daemon(state, admin_database_url) as (d, anvil):
        yield Conformance(d, anvil, stage(d.chain))


@contextlib.asynccontextmanager
async def api_only(conf: Conformance, **overrides: Any) -> AsyncIterator[Daemon]:
    """Another daemon, HTTP API only (no workers), on the suite's chain and database with
    settings ``overrides``."""
    port = free_port()
    settings: Settings = daemon_settings(conf.chain, conf.daemon.runtime.dsn, port, **overrides)
    async with open_runtime(settings, workers=False) as rt:
        runner = web_runner(rt)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                base = settings.public_base_url
                yield Daemon(base, f"{base}/api", rt, conf.chain, session)
        finally:
            await runner.cleanup()


# ------------------------------------------------------------------ provokers: request group


async def invalid_json(conf: Conformance) -> Answer:
    d = conf.daemon
    async with d.session.post(d.api, data=b"{not json", headers={"content-type": "application/json"}) as r:
        return r.status, await r.json(content_type=None)


async def unknown_action(conf: Conformance) -> Answer:
    status, body = await conf.post({"action": "teleport"})
    assert set(ACTIONS) <= set(body["supported"]), body
    return status, body


async def not_found(conf: Conformance) -> Answer:
    return await conf.daemon.get("/.well-known/nowhere")  # an x402 path; elsewhere the marketplace answers


async def document_not_found(conf: Conformance) -> Answer:
    status, body = await conf.daemon.get("/api/docs", id="nope")
    assert isinstance(body.get("available"), list) and body["available"], body
    return status, body


async def schema_validation(conf: Conformance) -> Answer:
    status, body = await conf.post(
        {
            "action": "quote",
            "carbonClass": "NBO",
            "amount": "1",
            "colour": "green",
            "details": {"beneficiaryIsPayer": True, "shoeSize": 44},
        }
    )
    issues = {tuple(i["path"]): i["keys"] for i in body["issues"]}
    assert issues == {(): ["colour"], ("details",): ["shoeSize"]}, body
    return status, body


async def internal_error(conf: Conformance) -> Answer:
    """An unexpected exception in a service (the only way to a 500)."""
    certificates = conf.daemon.runtime.services.certificates
    real = certificates.certificate

    async def crash(*_args: Any) -> dict[str, Any]:
        raise RuntimeError("provoked by the conformance suite")

    certificates.certificate = crash  # type: ignore[method-assign]
    try:
        status, body = await conf.get("certificate", txHash="0x" + "cd" * 32)
    finally:
        certificates.certificate = real  # type: ignore[method-assign]
    assert "provoked" not in body["message"], body  # no internals leak
    return status, body


async def marketplace_requires_usdc(conf: Conformance) -> Answer:
    return await conf.get("quote", listingId=str(conf.stage.listing), amount="2", inputToken="kVCM")


# ------------------------------------------------------------------ provokers: resolution group


async def unsupported_chain_id(conf: Conformance) -> Answer:
    return await conf.get("quote", carbonClass="NBO", amount="1", chainId="1")


async def unsupported_input_token(conf: Conformance) -> Answer:
    return await conf.get("quote", carbonClass="NBO", amount="1", inputToken="DAI")


async def invalid_input_token(conf: Conformance) -> Answer:
    """A relayed retirement paid with a token that has neither gasless scheme."""
    ch = await conf.challenge(conf.payer(), carbonClass="NBO", amount="0.5")
    body = signed_request(ch, conf.payer()["privateKey"])
    body["inputToken"] = "DAI"
    return await conf.post(body)


async def no_candidates(conf: Conformance) -> Answer:
    """A class that holds no credit."""
    return await conf.get("quote", carbonClass=conf.stage.empty_class, amount="1")


async def credit_not_found(conf: Conformance) -> Answer:
    """A credit no class registers, which a listing sells: the listing is named instead."""
    status, body = await conf.get("quote", credit=conf.stage.listed_only_credit, amount="1")
    assert body["listingId"] == str(conf.stage.listed_only), body
    return status, body


async def credit_ambiguous(conf: Conformance) -> Answer:
    """A credit two classes hold: each is a candidate."""
    payer = conf.payer()["address"]
    status, body = await conf.get(
        "prepare/retire", credit=conf.stage.twin_credit, amount="0.5", **{"from": payer}
    )
    assert sorted(body["carbonClasses"]) == ["NBO", "TWIN"], body
    assert {(c["carbonClass"], c["credit"]) for c in body["candidates"]} == {
        ("NBO", conf.stage.twin_credit),
        ("TWIN", conf.stage.twin_credit),
    }, body
    return status, body


async def vintage_not_found(conf: Conformance) -> Answer:
    status, body = await conf.get("quote", carbonClass="NBO", amount="1", vintage="1999")
    nbo = next(c for c in conf.chain["carbonClasses"] if c["symbol"] == "NBO")
    credits = {c["tokenId"]: c for c in conf.chain["credits"]}
    assert body["availableVintages"] == sorted({str(credits[t]["vintage"]) for t in nbo["tokenIds"]}), body
    return status, body


async def listing_not_found(conf: Conformance) -> Answer:
    """A listing id as the marketplace API writes it (bytes32 hex) that no listing has."""
    status, body = await conf.get("quote", listingId=f"0x{999_999:064x}", amount="1")
    assert body["listingId"] == "999999", body
    return status, body


async def listing_expired(conf: Conformance) -> Answer:
    while time.time() <= conf.stage.expires_at:  # a few seconds after set-up at most
        await asyncio.sleep(0.2)
    payer = conf.payer()["address"]
    return await conf.get("prepare/retire", listingId=str(conf.stage.expiring), amount="1", **{"from": payer})


# ------------------------------------------------------------------ provokers: amount group


async def insufficient_liquidity(conf: Conformance) -> Answer:
    return await conf.get("quote", carbonClass="RE", amount="100000")


async def amount_not_whole_tonnes(conf: Conformance) -> Answer:
    return await conf.get("quote", carbonClass="CDR", amount="1.5")


async def amount_below_increment(conf: Conformance) -> Answer:
    status, body = await conf.get("quote", carbonClass="NBO", amount="0.0001")
    assert body["minimum"] == "0.001", body
    return status, body


async def registry_details_required(conf: Conformance) -> Answer:
    status, body = await conf.get(
        "prepare-auth",
        carbonClass="CDR",
        amount="1",
        **{"from": conf.payer()["address"], "details.beneficiaryIsPayer": "true"},
    )
    assert "details.consumptionCountryCode" in body["fields"], body
    return status, body


async def below_min_fill(conf: Conformance) -> Answer:
    return await conf.post(
        {
            "action": "prepare-auth",
            "listingId": str(conf.stage.listing),
            "amount": "1",
            "from": conf.payer()["address"],
            "details": {"beneficiaryIsPayer": True},
        }
    )


async def insufficient_listing_supply(conf: Conformance) -> Answer:
    status, body = await conf.get("quote", listingId=str(conf.stage.listing), amount="6")
    assert body["leftToSell"] == "5", body
    return status, body


# ------------------------------------------------------------------ provokers: authorization group


async def payment_required(conf: Conformance) -> Answer:
    status, body = await conf.post(
        {
            "action": "actions/retire",
            "carbonClass": "NBO",
            "amount": "1",
            "from": conf.payer()["address"],
            "details": {"beneficiaryIsPayer": True},
        }
    )
    assert {"typedData", "actionsRetireRequest"} <= set(body), body
    return status, body


async def attribution_required(conf: Conformance) -> Answer:
    return await conf.post(
        {"action": "prepare-auth", "carbonClass": "NBO", "amount": "1", "from": conf.payer()["address"]}
    )


async def invalid_auth_payload(conf: Conformance) -> Answer:
    body = await conf.signed(conf.payer())
    body["authPayload"]["to"] = body["from"]
    return await conf.post(body)


async def insufficient_authorized_value(conf: Conformance) -> Answer:
    payer = conf.payer()
    ch = await conf.challenge(payer, carbonClass="NBO", amount="1")
    required = int(ch["quote"]["quote"]["total"]) + int(ch["gasAllowance"])
    ch["typedData"]["message"]["value"] = str(required - 1)
    ch["actionsRetireRequest"]["authPayload"]["value"] = str(required - 1)
    status, body = await conf.post(signed_request(ch, payer["privateKey"]))
    assert body["requiredMinimum"] == str(required), body
    return status, body


async def params_mismatch(conf: Conformance) -> Answer:
    body = await conf.signed(conf.payer())
    signed_nonce = body["authPayload"]["nonce"]
    body["amount"] = "0.6"
    status, answer = await conf.post(body)
    assert answer["receivedNonce"] == signed_nonce != answer["expectedNonce"], answer
    assert answer["submitted"]["amount"] == "0.6", answer
    return status, answer


# ------------------------------------------------------------------ provokers: settlement group


async def contract_revert(conf: Conformance) -> Answer:
    """An authorization valid only from an hour on: its simulation reverts in the token."""
    payer = conf.payer(1)
    ch = await conf.challenge(payer, carbonClass="NBO", amount="0.5")
    later = int(time.time()) + 3600
    typed = copy.deepcopy(ch["typedData"])
    typed["message"]["validAfter"] = later
    body = copy.deepcopy(ch["actionsRetireRequest"])
    body["authPayload"]["validAfter"] = str(later)
    body["authPayload"]["signature"] = sign(typed, payer["privateKey"])
    status, answer = await conf.post(body)
    assert (answer["decoded"]["errorName"], answer["contract"]) == ("AuthorizationNotYetValid", "UsdcEip3009")
    assert answer["function"] == "retireWithAuthorization" and answer["args"]["validAfter"] == str(later)
    assert answer["selector"].startswith("0x") and len(answer["selector"]) == 10, answer
    return status, answer


def _send_as(chain: dict[str, Any], role: str, key: str, contract: str, function: str, *args: Any) -> None:
    """Send ``contract.function(*args)`` from the devnet account ``role`` without waiting
    (the test mines it)."""
    w3 = _w3(chain)
    sender = Account.from_key(chain[role]["privateKey"])
    handle = w3.eth.contract(address=chain["contracts"][key], abi=abi(contract))
    base_fee = int(w3.eth.get_block("latest")["baseFeePerGas"])
    tx = getattr(handle.functions, function)(*args).build_transaction(
        {
            "from": sender.address,
            "nonce": w3.eth.get_transaction_count(sender.address, "pending"),
            "chainId": chain["chainId"],
            "gas": 200_000,
            "maxPriorityFeePerGas": 0,
            "maxFeePerGas": 4 * base_fee + 1,
        }
    )
    w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction)


async def _pending_relay(conf: Conformance, salt: str) -> tuple[str, bytes]:
    """The hash and raw bytes of the relay transaction of the job with ``salt``, once it
    waits in the node's pool (bounded: 20 s)."""
    query = (
        "SELECT t.tx_hash, t.raw_tx FROM relay_transactions t JOIN relay_jobs j ON j.id = t.job_id "
        "WHERE j.salt = $1"
    )
    for _ in range(400):
        row = await conf.daemon.runtime.db.fetchrow(query, bytes.fromhex(salt[2:]))
        if row is not None and "0x" + bytes(row["tx_hash"]).hex() in conf.anvil.pool():
            return "0x" + bytes(row["tx_hash"]).hex(), bytes(row["raw_tx"])
        await asyncio.sleep(0.05)
    raise AssertionError("the relay transaction never reached the pool")


async def transaction_reverted(conf: Conformance) -> Answer:
    """A relayed fill signed and sent while the listing was live, mined after the seller
    cancelled it: the transaction reverts on-chain (the authorization stays unused)."""
    anvil = conf.anvil
    body = await conf.signed(conf.payer(2), listingId=str(conf.stage.doomed), amount="1", carbonClass=None)
    anvil.automine(False)
    try:
        relay = asyncio.create_task(conf.post(body))
        tx_hash, raw = await _pending_relay(conf, body["salt"])
        # The seller's cancellation goes first, in a block of its own; then the relay.
        anvil.rpc("anvil_dropTransaction", tx_hash)
        _send_as(conf.chain, "seller", "marketplace", "Marketplace", "cancelListing", conf.stage.doomed)
        anvil.mine()
        anvil.rpc("eth_sendRawTransaction", "0x" + raw.hex())
        anvil.mine()
    finally:
        anvil.automine(True)
    receipt = anvil.rpc("eth_getTransactionReceipt", tx_hash)
    assert receipt is not None and int(receipt["status"], 16) == 0, receipt
    conf.daemon.expected_reverts += 1  # the executor paid for it: in the solvency ledger
    status, answer = await relay
    assert answer["transactionHash"] == tx_hash, answer
    return status, answer


async def retirement_not_found(conf: Conformance) -> Answer:
    return await conf.get("certificate", txHash="0x" + "ab" * 32)


# ------------------------------------------------------------------ provokers: upstream group


async def gas_estimate_unavailable(conf: Conformance) -> Answer:
    """The chain node stops answering (a TCP forwarder between a daemon and it is cut)."""
    node = urlsplit(conf.chain["rpcUrl"])
    proxy = TcpProxy(node.hostname or "127.0.0.1", node.port or 8545)
    await proxy.start()
    try:
        async with api_only(conf, rpc_url=f"http://127.0.0.1:{proxy.port}") as d:
            status, _ = await conf.get("quote", d, carbonClass="NBO", amount="1")
            assert status == 200
            await proxy.cut()
            await asyncio.sleep(1.1)  # past the per-head read cache's time limit
            status, body = await conf.get(
                "prepare-auth",
                d,
                carbonClass="NBO",
                amount="1",
                **{"from": conf.payer()["address"], "details.beneficiaryIsPayer": "true"},
            )
            await proxy.start()  # let the runtime close its connections normally
    finally:
        await proxy.cut()
    assert body["upstream"] == "chain node", body
    return status, body


async def gas_limit_exceeds_cap(conf: Conformance) -> Answer:
    """A daemon whose executor gas ceiling is below any retirement's gas."""
    async with api_only(conf, gas_cap=21_000) as d:
        body = await conf.signed(conf.payer(), d)
        return await conf.post(body, d)


async def payment_unavailable(conf: Conformance) -> Answer:
    """A daemon whose every executor key is below its balance floor."""
    async with api_only(conf, min_executor_balance_wei=10**40) as d:
        body = await conf.signed(conf.payer(), d)
        return await conf.post(body, d)


async def rate_limited(conf: Conformance) -> Answer:
    """A daemon whose per-client limit is two requests a minute (release 1.2.0)."""
    async with api_only(conf, rate_limit="2/minute") as d:
        for _ in range(2):
            status, _ = await conf.get("discover", d)
            assert status == 200
        return await conf.get("discover", d)


async def method_not_allowed(conf: Conformance) -> Answer:
    """GET of the POST-only actions/retire (release 1.3.0): 405 with ``allow``."""
    async with conf.daemon.session.get(f"{conf.daemon.base_url}/api/actions/retire") as r:
        assert r.headers.get("Allow") == "POST", dict(r.headers)
        return r.status, await r.json(content_type=None)


PROVOKERS: Final[dict[str, Callable[[Conformance], Awaitable[Answer]]]] = {
    "invalid_json": invalid_json,
    "unknown_action": unknown_action,
    "not_found": not_found,
    "document_not_found": document_not_found,
    "schema_validation": schema_validation,
    "internal_error": internal_error,
    "marketplace_requires_usdc": marketplace_requires_usdc,
    "unsupported_chain_id": unsupported_chain_id,
    "unsupported_input_token": unsupported_input_token,
    "invalid_input_token": invalid_input_token,
    "no_candidates": no_candidates,
    "credit_not_found": credit_not_found,
    "credit_ambiguous": credit_ambiguous,
    "vintage_not_found": vintage_not_found,
    "listing_not_found": listing_not_found,
    "listing_expired": listing_expired,
    "insufficient_liquidity": insufficient_liquidity,
    "amount_not_whole_tonnes": amount_not_whole_tonnes,
    "amount_below_increment": amount_below_increment,
    "registry_details_required": registry_details_required,
    "below_min_fill": below_min_fill,
    "insufficient_listing_supply": insufficient_listing_supply,
    "payment_required": payment_required,
    "attribution_required": attribution_required,
    "invalid_auth_payload": invalid_auth_payload,
    "insufficient_authorized_value": insufficient_authorized_value,
    "params_mismatch": params_mismatch,
    "contract_revert": contract_revert,
    "transaction_reverted": transaction_reverted,
    "retirement_not_found": retirement_not_found,
    "gas_estimate_unavailable": gas_estimate_unavailable,
    "gas_limit_exceeds_cap": gas_limit_exceeds_cap,
    "payment_unavailable": payment_unavailable,
    "rate_limited": rate_limited,
    "method_not_allowed": method_not_allowed,
}
"""Spec code -> how it is provoked over HTTP: an async function answering (status, body)."""


def _field(body: dict[str, Any], path: str) -> Any:
    value: Any = body
    for part in path.split("."):
        assert isinstance(value, dict) and part in value, f"no {path!r} in {body}"
        value = value[part]
    return value


@pytest.mark.parametrize("code", list(PROVOKERS))
async def test_each_code_answers_as_the_spec_says(conf: Conformance, code: str) -> None:
    status, body = await PROVOKERS[code](conf)
    assert (status, body.get("error")) == (REGISTRY[code].http_status, code), body
    assert isinstance(body["message"], str) and body["message"], body
    version = body["x402FacilitatorVersion"]
    assert version == X402_FACILITATOR_VERSION and type(version) is int, body
    for path in CONTEXT.get(code, ()):
        assert _field(body, path) is not None, (path, body)
    if code == "schema_validation":
        assert all(isinstance(i["path"], list) and isinstance(i["keys"], list) for i in body["issues"])


def test_the_table_covers_every_registered_code() -> None:
    assert set(PROVOKERS) == set(X402_REGISTRY)  # the marketplace API's own codes are not x402's
    assert set(CONTEXT) <= set(X402_REGISTRY)


# ------------------------------------------------------------------ the fixes the table needs


async def test_a_listing_id_in_bytes32_form_names_the_same_listing(conf: Conformance) -> None:
    """The marketplace API writes listing ids as bytes32 hex; the x402 endpoint takes them."""
    listing = conf.stage.listing
    status, by_hex = await conf.get("quote", listingId=f"0x{listing:064x}", amount="2")
    assert status == 200, by_hex
    status, by_number = await conf.get("quote", listingId=str(listing), amount="2")
    assert (status, by_hex) == (200, by_number)


async def test_a_credit_alone_resolves_through_the_one_class_holding_it(conf: Conformance) -> None:
    credits = {c["tokenId"]: c for c in conf.chain["credits"]}
    re_class = next(c for c in conf.chain["carbonClasses"] if c["symbol"] == "RE")
    credit = _credit_id(credits[re_class["tokenIds"][1]])
    status, body = await conf.get("quote", credit=credit, amount="1")
    assert (status, body["carbonClass"], body["resolvedCredit"]["tokenId"]) == (
        200,
        "RE",
        str(re_class["tokenIds"][1]),
    ), body
    # Naming the class settles an ambiguity; an unknown credit without a listing is not found.
    status, body = await conf.get("quote", credit=conf.stage.twin_credit, carbonClass="TWIN", amount="0.5")
    assert (status, body["carbonClass"]) == (200, "TWIN"), body
    status, body = await conf.get("quote", credit="VCS-0-1999", amount="1")
    assert (status, body["error"]) == (404, "credit_not_found") and "listingId" not in body, body


async def test_discover_names_each_listing_by_its_own_id(conf: Conformance) -> None:
    """Listing ids in discover are the marketplace's (the pages of getListings were numbered
    wrongly past the first listing)."""
    status, body = await conf.get("discover", source="marketplace")
    assert status == 200, body
    listed = {li["listingId"]: li for li in body["marketplaceListings"]}
    assert (listed[str(conf.stage.listing)]["leftToSell"], listed[str(conf.stage.listing)]["minFill"]) == (
        "5",
        "2",
    )
    assert listed[str(conf.stage.listed_only)]["credit"] == conf.stage.listed_only_credit
    seeded = {str(li["listingId"]): li for li in conf.chain["listings"] if li["state"] != "cancelled"}
    for listing_id, li in seeded.items():
        assert listed[listing_id]["tokenId"] == str(li["tokenId"]), (listing_id, listed[listing_id])


async def test_another_chain_id_where_the_action_has_no_chain_code_is_schema_validation(
    conf: Conformance,
) -> None:
    """discover and certificate may not answer unsupported_chain_id (spec: codes per action)."""
    for action, params in (("discover", {}), ("certificate", {"txHash": "0x" + "ab" * 32})):
        status, body = await conf.get(action, chainId="1", **params)
        assert (status, body["error"], body["issues"][0]["path"]) == (400, "schema_validation", ["chainId"])


# ------------------------------------------------------------------ last: what each action answered


async def test_a_listing_refusal_answers_one_status_on_both_surfaces(conf: Conformance) -> None:
    """The same code has one status on the x402 endpoint and on the marketplace API (issue
    17: listing_expired and insufficient_listing_supply were 409, below_min_fill 400 there):
    the registry's, in each surface's own body."""
    from relayer.admin import create_api_key

    key = await create_api_key(conf.daemon.runtime.settings, "conformance")
    session, base = conf.daemon.session, conf.daemon.base_url

    async def marketplace(listing: int, tonnes: str) -> Answer:
        body = {"asset_price_source_id": f"listing-{conf.chain['chainId']}-0x{listing:064x}",
                "quantity_tonnes": tonnes}  # fmt: skip
        async with session.post(f"{base}/quotes", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            return r.status, await r.json()

    deadline = time.monotonic() + 30
    while (await marketplace(conf.stage.listing, "6"))[1].get("code") == "listing_not_found":
        assert time.monotonic() < deadline, "the marketplace never indexed the staged listing"
        await asyncio.sleep(0.2)
    while time.time() <= conf.stage.expires_at:  # a few seconds after set-up at most
        await asyncio.sleep(0.2)
    cases = [
        (conf.stage.listing, "1", "below_min_fill"),
        (conf.stage.listing, "6", "insufficient_listing_supply"),
        (conf.stage.expiring, "1", "listing_expired"),
    ]
    for listing, tonnes, code in cases:
        status, body = await conf.get("quote", listingId=str(listing), amount=tonnes)
        assert (status, body["error"]) == (REGISTRY[code].http_status, code), body
        assert body["x402FacilitatorVersion"] == X402_FACILITATOR_VERSION
        status, refused = await marketplace(listing, tonnes)
        assert (status, refused["statusCode"], refused["code"]) == (REGISTRY[code].http_status,) * 2 + (code,)
        assert refused["error"] == "Unprocessable Entity" and refused["message"], refused
        assert REGISTRY[code].http_status == 422


def test_each_action_answered_only_codes_it_may_return() -> None:
    if not ANSWERED:
        pytest.skip("runs after the table test, with the (action, code) pairs it recorded")
    assert {a for a, _ in ANSWERED} >= {"quote", "prepare/retire", "prepare-auth", "actions/retire"}
    outside = sorted({(a, c) for a, c in ANSWERED if c not in allowed_codes(a)})
    assert outside == [], outside
    by_action = {a: sorted({c for b, c in ANSWERED if b == a}) for a in ACTIONS}
    print("\ncodes answered per action:", json.dumps(by_action, indent=1))
