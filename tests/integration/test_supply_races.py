"""Supply in flight is reserved (issue 18): jobs in flight count against a listing's
``leftToSell`` and a carbon class's liquidity before a job is signed, as payer balances do.
Many payers racing for the same small supply end with as many settled as the supply holds,
the rest refused before anything was signed, and no transaction reverted at the executor's
cost. On a private chain and database, through HTTP, with the daemon's workers."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest
from eth_account import Account
from web3 import Web3

from relayer.admin import create_api_key
from relayer.chain.abi import abi
from relayer.domain.amounts import UNITS_PER_TONNE, USDC_DECIMALS
from relayer.domain.states import JobState
from relayer.store.relay_jobs import Job
from relayer_dev.deploy import TREASURY_KEY
from tests.chain_helpers import transact_as, transact_as_deployer
from tests.conftest import Daemon, free_port
from tests.helpers.relay import challenge, signed_request
from tests.private import daemon_settings, private_chain, private_daemon, serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FAR: Final = 2**40  # an expiration no test reaches
RACERS: Final = 20
ORDERS: Final = 12


def _read(chain: dict[str, Any], key: str, contract: str, function: str, *args: Any) -> Any:
    w3 = Web3(Web3.HTTPProvider(chain["rpcUrl"]))
    handle = w3.eth.contract(address=chain["contracts"][key], abi=abi(contract))
    return getattr(handle.functions, function)(*args).call()


def _as_deployer(chain: dict[str, Any], key: str, contract: str, function: str, *args: Any) -> None:
    transact_as_deployer(chain, chain["contracts"][key], contract, function, *args)


def _list(chain: dict[str, Any], tonnes: int) -> int:
    """Mint ``tonnes`` of a class credit to the seller and list them (10 USDC a tonne, 1 t
    minimum fill); the listing id."""
    token_id = next(c for c in chain["carbonClasses"] if c["symbol"] == "RE")["tokenIds"][0]
    units = tonnes * UNITS_PER_TONNE
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
        10 * 10**USDC_DECIMALS,
        UNITS_PER_TONNE,
        FAR,
    )
    assert receipt["status"] == 1
    return int(_read(chain, "marketplace", "Marketplace", "listingCount"))


def _small_class(chain: dict[str, Any], symbol: str, tonnes: int) -> None:
    """A carbon class ``symbol`` holding one credit with ``tonnes`` of liquidity."""
    nbo = next(c for c in chain["carbonClasses"] if c["symbol"] == "NBO")
    token_id, price = nbo["tokenIds"][0], int(nbo["priceKvcmPerTonne"])
    _as_deployer(chain, "carbonClasses", "CarbonClasses", "createClass", symbol, f"Race {symbol}", price, 1)
    class_id = int(_read(chain, "carbonClasses", "CarbonClasses", "classCount"))
    _as_deployer(chain, "carbonClasses", "CarbonClasses", "registerCredit", class_id, token_id)
    units = tonnes * UNITS_PER_TONNE
    deployer = chain["deployer"]["address"]
    _as_deployer(chain, "carbonCredits", "CarbonCredits", "mint", deployer, token_id, units)
    _as_deployer(chain, "carbonClasses", "CarbonClasses", "deposit", class_id, token_id, units)


def _funded_payers(chain: dict[str, Any], n: int) -> list[dict[str, str]]:
    """``n`` fresh gasless payers holding 100 USDC each."""
    payers = []
    for _ in range(n):
        account = Account.create()
        _as_deployer(chain, "usdc", "UsdcEip3009", "mint", account.address, 100 * 10**USDC_DECIMALS)
        payers.append({"address": account.address, "privateKey": account.key.hex()})
    return payers


async def _reverts(d: Daemon) -> tuple[int, int]:
    """Relay transactions mined reverted and the wei the executor paid for them."""
    row = await d.runtime.db.fetchrow(
        "SELECT count(*) AS n, coalesce(sum(paid_wei), 0) AS wei FROM relay_transactions "
        "WHERE succeeded = false"
    )
    assert row is not None
    return int(row["n"]), int(row["wei"])


def _since(before: tuple[int, int], now: tuple[int, int]) -> tuple[int, int]:
    return now[0] - before[0], now[1] - before[1]


async def _race(d: Daemon, payers: list[dict[str, str]], **fields: Any) -> Counter[str]:
    """Each payer signs the same retirement ``fields``; all post at once; the outcomes."""
    bodies = []
    for payer in payers:
        ch = await challenge(d, payer, inputToken="USDC", **fields)
        bodies.append(signed_request(ch, payer["privateKey"]))
    answers = await asyncio.gather(*(d.post(b) for b in bodies))
    return Counter(body.get("status") or body.get("error") for _, body in answers)


@pytest.fixture(scope="module")
async def racing(tmp_path_factory: pytest.TempPathFactory, admin_database_url: str) -> AsyncIterator[Daemon]:
    state: Path = tmp_path_factory.mktemp("races")
    async with private_daemon(state, admin_database_url, treasury_private_key=TREASURY_KEY) as (d, _):
        yield d


async def test_twenty_payers_racing_for_a_two_tonne_listing_two_settle_none_revert(racing: Daemon) -> None:
    d = racing
    listing = _list(d.chain, 2)
    payers = _funded_payers(d.chain, RACERS)
    before = await _reverts(d)
    outcomes = await _race(d, payers, listingId=listing, amount="1")
    reverted, wei = _since(before, await _reverts(d))
    print(f"\nlisting race: {dict(outcomes)}; reverted {reverted}, executor paid {wei} wei for reverts")
    assert outcomes == Counter({"settled": 2, "insufficient_listing_supply": RACERS - 2}), outcomes
    assert (reverted, wei) == (0, 0)
    assert int(_read(d.chain, "marketplace", "Marketplace", "getListing", listing)[5]) == 0


async def test_payers_racing_for_a_small_class_none_revert(racing: Daemon) -> None:
    d = racing
    _small_class(d.chain, "RACE", 2)
    payers = _funded_payers(d.chain, 8)
    before = await _reverts(d)
    outcomes = await _race(d, payers, carbonClass="RACE", amount="1")
    reverted, wei = _since(before, await _reverts(d))
    print(f"\nclass race: {dict(outcomes)}; reverted {reverted}, executor paid {wei} wei for reverts")
    assert outcomes == Counter({"settled": 2, "insufficient_liquidity": 6}), outcomes
    assert (reverted, wei) == (0, 0)


async def test_concurrent_orders_against_a_listing_with_little_left_none_revert(racing: Daemon) -> None:
    d = racing
    listing = _list(d.chain, 2)
    key = await create_api_key(d.runtime.settings, f"races-{uuid.uuid4().hex[:6]}")
    headers = {"Authorization": f"Bearer {key}"}
    source = f"listing-{d.chain['chainId']}-0x{listing:064x}"
    market = d.base_url

    async def post(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        async with d.session.post(f"{market}{path}", json=body, headers=headers) as r:
            return r.status, await r.json(content_type=None)

    async def quote() -> dict[str, Any]:
        deadline = time.monotonic() + 30  # the indexer shows the new listing
        while True:
            status, body = await post("/quotes", {"asset_price_source_id": source, "quantity_tonnes": "1"})
            if status != 404 or time.monotonic() > deadline:
                assert status == 201, body
                return body
            await asyncio.sleep(0.2)

    quotes = [await quote() for _ in range(ORDERS)]
    before = await _reverts(d)
    placed = await asyncio.gather(
        *(post("/orders", {"quote_uuid": q["uuid"], "beneficiary_name": "Racer"}) for q in quotes)
    )
    ids = [body["id"] for _, body in placed if "id" in body]
    refused = Counter(body.get("code") for _, body in placed if "id" not in body)
    finals: Counter[str] = Counter()
    deadline = time.monotonic() + 90
    for order_id in ids:
        while True:
            async with d.session.get(f"{market}/orders/{order_id}", headers=headers) as r:
                order = await r.json()
            if order["status"] in ("COMPLETED", "FAILED") or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        finals[order["status"] if order["status"] != "FAILED" else order["error"]["code"]] += 1
    reverted, wei = _since(before, await _reverts(d))
    print(f"\norder race: {dict(finals)} refused {dict(refused)}; reverted {reverted}, paid {wei} wei")
    assert (finals, refused) == (Counter({"COMPLETED": 2, "insufficient_listing_supply": ORDERS - 2}), {})
    assert (reverted, wei) == (0, 0)


def _fill_directly(chain: dict[str, Any], listing: int, tonnes: int) -> None:
    """The deployer fills ``tonnes`` of ``listing`` on the marketplace itself (not relayed)."""
    deployer, market = chain["deployer"]["address"], chain["contracts"]["marketplace"]
    _as_deployer(chain, "usdc", "UsdcEip3009", "mint", deployer, 1_000 * 10**USDC_DECIMALS)
    _as_deployer(chain, "usdc", "UsdcEip3009", "approve", market, 1_000 * 10**USDC_DECIMALS)
    _as_deployer(
        chain, "marketplace", "Marketplace", "fill", listing, tonnes * UNITS_PER_TONNE, 10**9, deployer
    )


async def test_a_signing_batch_counts_its_earlier_jobs_against_supply_taken_meanwhile(
    tmp_path: Path, admin_database_url: str
) -> None:
    """Two 1 t fills of a 2 t listing are accepted; then 1 t is sold elsewhere before they are
    signed: the batch signs the older only (the newer waits behind it); when the rest is sold
    too, both are refused with the listing's code before anything is signed."""
    async with private_chain(tmp_path, admin_database_url) as (info, dsn):
        settings = daemon_settings(info, dsn, free_port(), settle_wait_s=0.5)
        async with serving(settings, info, workers=False) as d:  # nothing signs but the test
            listing = _list(d.chain, 2)
            ids = []
            for payer in _funded_payers(d.chain, 2):
                ch = await challenge(d, payer, inputToken="USDC", listingId=listing, amount="1")
                body = signed_request(ch, payer["privateKey"])
                status, answer = await d.post(body)
                assert status < 300, answer
                salt = bytes.fromhex(body["salt"][2:])
                found = await d.runtime.db.fetchval("SELECT id FROM relay_jobs WHERE salt = $1", salt)
                ids.append(int(found))
            relay = d.runtime.services.relay
            simulator, jobs = relay.simulator, relay.jobs

            async def batch() -> list[Job]:
                found = [await jobs.get(i) for i in ids]
                return [j for j in found if j is not None]

            assert [j.state for j in await batch()] == [JobState.SIMULATED] * 2
            _fill_directly(d.chain, listing, 1)
            assert await simulator.recheck(await batch(), simulator.executor_address) == ids[:1]
            assert [j.state for j in await batch()] == [JobState.SIMULATED] * 2  # the newer waits

            _fill_directly(d.chain, listing, 1)
            assert await simulator.recheck(await batch(), simulator.executor_address) == []
            refused = await batch()
            assert [j.state for j in refused] == [JobState.REJECTED] * 2
            assert [j.error and j.error["code"] for j in refused] == ["insufficient_listing_supply"] * 2
            assert all(j.tx_hash is None for j in refused)
