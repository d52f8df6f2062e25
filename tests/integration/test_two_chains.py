"""Both Base networks from one endpoint (issue 39): one daemon relays on 84532 and, through
``RELAYER_RELAY_CHAINS``, on 8453, each request's ``chainId`` choosing the chain. Two real
anvils (the run's chain templates of each id: the same contracts at the same addresses, USDC
under its own EIP-712 domain name on each), one real Postgres, the daemon over HTTP."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from relayer.admin import create_api_key
from relayer.app import Runtime
from relayer.config import IndexChain
from relayer.domain.chains import usdc_domain_name
from relayer.ops import connected_findings, offline_problems
from relayer_dev import devdb
from relayer_dev.deploy import UPDATED_LISTING_ID
from relayer_dev.facilitator import create_facilitator_key
from relayer_dev.ports import free_port
from tests.chain_helpers import eth_balance, token_balance
from tests.conftest import Daemon, assert_solvent
from tests.helpers import payer as payer_acts
from tests.helpers import stacks
from tests.helpers.facilitator import call, fresh_address
from tests.helpers.facilitator import payment as facilitator_payment
from tests.helpers.relay import challenge, signed_request
from tests.helpers.sdk import FUNDED, PRICE, fresh_payer, pay, resource, settle_answer
from tests.helpers.x402 import SECRET, decode, nonce_of, post, required, retire_body, sign_payload
from tests.private import base_chains, daemon_settings, relay_chain, serving

pytestmark = pytest.mark.integration

FIRST, SECOND = 84532, 8453
NONCE_USED = "invalid_exact_evm_nonce_already_used"


class TwoChains:
    """The daemon on both chains: its ``/api``, each chain's devnet description, and each
    chain seen as the session daemon's tests see theirs (``daemons``: the runtime of that
    chain, its devnet description, the one base URL)."""

    def __init__(
        self, session: aiohttp.ClientSession, base: str, chains: dict[int, dict[str, Any]], rt: Runtime
    ) -> None:
        self.session, self.base, self.chains = session, base, chains
        self.chain = chains[FIRST]  # the helpers' devnet description: payers are alike on both
        self.daemons = {
            r.settings.chain_id: Daemon(base, f"{base}/api", r, chains[r.settings.chain_id], session)
            for r in (rt, *rt.others)
        }

    async def post(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        async with self.session.post(f"{self.base}/api", json=body) as r:
            return r.status, await r.json(content_type=None)

    async def get(self, path: str, **params: Any) -> tuple[int, dict[str, Any]]:
        async with self.session.get(f"{self.base}{path}", params=params) as r:
            return r.status, await r.json(content_type=None)


class _OnChain:
    """``challenge`` posts through this: the daemon, with ``chainId`` set on every body."""

    def __init__(self, daemon: TwoChains, chain_id: int) -> None:
        self.daemon, self.chain_id, self.chain = daemon, chain_id, daemon.chains[chain_id]

    async def post(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return await self.daemon.post({**body, "chainId": self.chain_id})


@pytest.fixture(scope="module")
def anvils(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, dict[str, Any]]]:
    with base_chains(tmp_path_factory.mktemp("base-chains")) as chains:
        yield chains


@pytest.fixture(scope="module")
async def two(anvils: dict[int, dict[str, Any]], admin_database_url: str) -> AsyncIterator[TwoChains]:
    dsn = stacks.scratch_database(admin_database_url, prefix="relayer_two_chains")
    first = anvils[FIRST]
    settings = daemon_settings(
        first,
        dsn,
        free_port(),
        relay_chains=[relay_chain(anvils[SECOND])],
        treasury_private_key=first["treasury"]["privateKey"],
        x402_quote_secret=SECRET,
    )
    try:
        async with serving(settings, first) as d:  # ends with the first chain's solvency ledger
            assert [o.settings.chain_id for o in d.runtime.others] == [SECOND]
            two = TwoChains(d.session, d.base_url, anvils, d.runtime)
            yield two
            await assert_solvent(two.daemons[SECOND], "the second chain")
    finally:
        devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])


async def _usdc(d: Daemon, owner: str) -> int:
    """``owner``'s USDC on ``d``'s chain, read through that chain's own node."""
    return await token_balance(d.runtime.node, "usdc", owner)


async def _retire(two: TwoChains, chain_id: int, payer: dict[str, str]) -> dict[str, Any]:
    on = _OnChain(two, chain_id)
    ch = await challenge(on, payer, carbonClass="NBO", amount="1", inputToken="USDC")
    # the payer signs under the chain's own USDC domain: the chain id and domain name
    domain = ch["typedData"]["domain"]
    assert domain["chainId"] == chain_id
    assert domain["name"] == ("USD Coin" if chain_id == 8453 else "USDC")
    status, result = await two.post(signed_request(ch, payer["privateKey"]))
    assert status == 200 and result["status"] == "settled", result
    return result


async def test_the_same_payer_retires_on_both_chains_through_one_daemon(two: TwoChains) -> None:
    payer = two.chains[FIRST]["payers"][0]
    assert payer["address"] == two.chains[SECOND]["payers"][0]["address"]
    before = {c: await _usdc(two.daemons[c], payer["address"]) for c in (FIRST, SECOND)}
    results = await asyncio.gather(*(_retire(two, c, payer) for c in (FIRST, SECOND)))
    after = {c: await _usdc(two.daemons[c], payer["address"]) for c in (FIRST, SECOND)}
    for chain_id, result in zip((FIRST, SECOND), results, strict=True):
        tx = result["transactionHash"]
        [entry] = result["retirements"]
        assert entry["retirementId"] == f"{chain_id}-{tx}-0"
        assert before[chain_id] > after[chain_id]  # each chain's USDC paid, on that chain
        # each certificate comes from its own chain's retirement index
        status, cert = await two.get("/api/certificate", chainId=str(chain_id), txHash=tx)
        assert status == 200, cert
        assert cert["retirements"][0]["retirementId"] == f"{chain_id}-{tx}-0"
        other = SECOND if chain_id == FIRST else FIRST
        status, cert = await two.get("/api/certificate", chainId=str(other), txHash=tx)
        assert status == 404, cert  # the transaction is not the other chain's
    for d in two.daemons.values():
        assert await eth_balance(d.runtime.node, payer["address"]) == 0  # gasless on both


async def test_a_chain_not_served_is_refused_naming_the_served_ones(two: TwoChains) -> None:
    status, body = await two.get("/api/quote", carbonClass="NBO", amount="1", chainId="137")
    assert (status, body["error"]) == (400, "unsupported_chain_id"), body
    assert body["supported"] == [SECOND, FIRST]
    assert "8453 and 84532" in body["message"], body
    # discover has no unsupported_chain_id: a schema_validation naming the served chains
    status, body = await two.get("/api/discover", chainId="1")
    assert (status, body["error"]) == (400, "schema_validation"), body
    assert body["supported"] == [SECOND, FIRST]


async def test_each_chain_answers_with_its_own_supply_and_a_request_without_chain_id_the_first(
    two: TwoChains,
) -> None:
    for chain_id in (FIRST, SECOND):
        status, body = await two.get("/api/quote", carbonClass="NBO", amount="1", chainId=str(chain_id))
        assert status == 200, body
        assert body["chainId"] == chain_id, body
    status, body = await two.get("/api/quote", carbonClass="NBO", amount="1")
    assert status == 200 and body["chainId"] == FIRST, body


async def test_the_facilitator_lists_both_networks_and_the_sdk_pays_on_each(two: TwoChains) -> None:
    status, supported = await two.get("/facilitator/supported")
    assert status == 200, supported
    assert [k["network"] for k in supported["kinds"]] == [f"eip155:{FIRST}", f"eip155:{SECOND}"]
    key = await create_facilitator_key(two.daemons[FIRST].runtime.settings, "two-chains")
    for chain_id, d in two.daemons.items():
        payer = await asyncio.to_thread(fresh_payer, d)
        async with resource(d, key) as paid:
            response = await asyncio.to_thread(pay, d, payer, paid.url, {"chain": chain_id})
            assert response.status_code == 200, (response.status_code, response.text)
            settled = settle_answer(response)
            assert settled.success is True and settled.network == f"eip155:{chain_id}", settled
        # paid on this chain: the merchant credited there, the payer charged once
        assert await _usdc(d, paid.merchant) == PRICE
        assert await _usdc(d, payer.address) == FUNDED - PRICE
        other = two.daemons[SECOND if chain_id == FIRST else FIRST]
        assert await _usdc(other, paid.merchant) == 0


async def test_a_payment_on_a_network_not_served_is_refused_naming_the_served_ones(two: TwoChains) -> None:
    key = await create_facilitator_key(two.daemons[FIRST].runtime.settings, "two-chains-refused")
    d = two.daemons[SECOND]
    body = facilitator_payment(d, fresh_address(), 1000)
    for part in (body["paymentRequirements"], body["paymentPayload"]["accepted"]):
        part["network"] = "eip155:137"
    status, answer = await call(d, "verify", body, key)
    assert status == 200 and answer["isValid"] is False, answer
    assert answer["invalidReason"] == "invalid_network"
    assert answer["invalidMessage"] == f"only networks eip155:{FIRST} and eip155:{SECOND} are served"


async def test_the_standard_resource_offers_the_requests_chain_and_retires_there(two: TwoChains) -> None:
    for chain_id, d in two.daemons.items():
        payer = d.chain["payers"][1]
        body = retire_body(payer["address"], chainId=chain_id)
        pr = await required(d, body)
        [offered] = pr["accepts"]
        assert offered["network"] == f"eip155:{chain_id}", offered
        assert offered["asset"] == d.chain["contracts"]["usdc"]
        assert offered["extra"]["name"] == usdc_domain_name(chain_id)
        treasury = d.chain["treasury"]["address"]
        before = await _usdc(d, treasury)
        status, data, headers = await post(d, body, sign_payload(pr, payer["privateKey"]))
        assert status == 200 and data["status"] == "settled", data
        assert data["retirements"][0]["retirementId"].startswith(f"{chain_id}-"), data
        settled = decode(headers["PAYMENT-RESPONSE"])
        assert settled["success"] is True and settled["network"] == f"eip155:{chain_id}", settled
        # the treasury was paid and retired on this chain: what it kept is at most the payment
        assert 0 <= await _usdc(d, treasury) - before <= int(offered["amount"])


async def test_the_manifest_and_openapi_list_both_chains(two: TwoChains) -> None:
    status, manifest = await two.get("/.well-known/x402.json")
    assert status == 200, manifest
    served = [(c["chainId"], c["network"], c["settlement"]) for c in manifest["chains"]]
    assert served == [(c, f"eip155:{c}", two.chains[c]["contracts"]["settlement"]) for c in (FIRST, SECOND)]
    status, openapi = await two.get("/api/openapi.json")
    assert status == 200
    text = str(openapi)
    assert "'enum': [84532, 8453]" in text, "the chainId a request may name: both chains"


async def test_marketplace_orders_retire_on_the_listings_chain(two: TwoChains) -> None:
    key = await create_api_key(two.daemons[FIRST].runtime.settings, "two-chains-orders")
    auth = {"Authorization": f"Bearer {key}"}
    for chain_id in (FIRST, SECOND):
        source = f"listing-{chain_id}-0x{UPDATED_LISTING_ID:064x}"
        body: dict[str, Any] = {"asset_price_source_id": source, "quantity_tonnes": "1"}
        deadline = time.monotonic() + 30
        while True:  # the listing is indexed a moment after start
            async with two.session.post(f"{two.base}/quotes", json=body, headers=auth) as r:
                status, quote = r.status, await r.json()
            if status != 404 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert status == 201, quote
        order_body = {"quote_uuid": quote["uuid"], "beneficiary_name": f"on {chain_id}"}
        async with two.session.post(f"{two.base}/orders", json=order_body, headers=auth) as r:
            status, order = r.status, await r.json()
        assert status == 201, order
        while order["status"] not in ("COMPLETED", "FAILED") and time.monotonic() < deadline + 30:
            await asyncio.sleep(0.2)
            async with two.session.get(f"{two.base}/orders/{order['id']}", headers=auth) as r:
                order = await r.json()
        assert order["status"] == "COMPLETED", order
        assert f"/retirements/{chain_id}-{order['transaction_hash']}-" in order["view_retirement_url"], order
    # both chains' listings are orderable (indexed by now)
    status, prices = await two.get("/prices", limit="100")
    assert status == 200, prices
    orderable = {(int(p["sourceId"].split("-")[1]), p["orderable"]) for p in prices}
    assert {(FIRST, True), (SECOND, True)} <= orderable, orderable
    # a listing of a chain no order retires on is refused naming the served chains
    body = {"asset_price_source_id": f"listing-137-0x{1:064x}", "quantity_tonnes": "1"}
    async with two.session.post(f"{two.base}/quotes", json=body, headers=auth) as r:
        status, refused = r.status, await r.json()
    assert (status, refused["code"]) == (400, "unsupported_chain"), refused
    assert refused["supported"] == [SECOND, FIRST]


async def test_config_check_validates_each_relayed_chain_and_names_it(two: TwoChains) -> None:
    settings = two.daemons[FIRST].runtime.settings
    assert offline_problems(settings, ()) == []
    found = await connected_findings(settings)
    assert (found.problems, found.unreachable) == ([], [])
    second = settings.relay_chains[0]
    # the second chain's entry pointed at the first chain's node: named, with the way out
    swapped = settings.model_copy(
        update={"relay_chains": [second.model_copy(update={"rpc_url": settings.rpc_url})]}
    )
    found = await connected_findings(swapped)
    [line] = found.unreachable
    assert line.startswith(f"RELAYER_RELAY_CHAINS (chain {SECOND})") and "serves chain 84532" in line, line
    # the first chain's deployment file given for the second: the contracts checked on chain 8453 hold
    # code (same addresses on the devnet), but the file is of chain 84532
    wrong_file = second.model_copy(update={"deployment_file": settings.deployment_file})
    problems = offline_problems(settings.model_copy(update={"relay_chains": [wrong_file]}), ())
    assert any(p.startswith(f"RELAYER_RELAY_CHAINS (chain {SECOND})") for p in problems), problems
    # a chain relayed and also indexed apart
    both = settings.model_copy(
        update={
            "index_chains": [
                IndexChain(chain_id=SECOND, rpc_url=second.rpc_url, deployment_file=second.deployment_file)
            ]
        }
    )
    problems = offline_problems(both, ())
    assert any("RELAYER_INDEX_CHAINS names chain 8453, which this daemon relays on" in p for p in problems), (
        problems
    )


async def test_a_facilitator_keys_gas_budget_is_per_chain(two: TwoChains) -> None:
    """A key's daily gas budget is kept per chain (migration 0027): its day spent on 84532 is
    refused there (429 gas_budget_exhausted, nothing recorded) and leaves 8453's untouched."""
    first = two.daemons[FIRST]
    budget = 10**18
    name = f"two-chains-budget-{uuid.uuid4().hex[:6]}"
    token = await create_api_key(first.runtime.settings, name, ["facilitator"], None, budget)
    key_id = int(await first.runtime.db.fetchval("SELECT id FROM api_keys WHERE name = $1", name))
    for d in two.daemons.values():
        status, answer = await call(d, "settle", facilitator_payment(d, fresh_address(), 1000), token)
        assert status == 200 and answer["success"] is True, answer
    rows = await first.runtime.db.fetch(
        "SELECT chain_id, settles FROM api_key_gas_days WHERE api_key_id = $1 ORDER BY chain_id", key_id
    )
    assert [(r["chain_id"], r["settles"]) for r in rows] == [(SECOND, 1), (FIRST, 1)]
    # 84532's day is spent: refused there, while 8453 still settles on the same key
    await first.runtime.db.execute(
        "UPDATE api_key_gas_days SET paid_wei = $2 WHERE api_key_id = $1 AND chain_id = $3",
        key_id,
        budget,
        FIRST,
    )
    status, answer = await call(first, "settle", facilitator_payment(first, fresh_address(), 1000), token)
    assert (status, answer["error"]) == (429, "gas_budget_exhausted"), answer
    d = two.daemons[SECOND]
    status, answer = await call(d, "settle", facilitator_payment(d, fresh_address(), 1000), token)
    assert status == 200 and answer["success"] is True, answer


async def _treasury_jobs(d: Daemon) -> int:
    """Relay jobs the treasury signed on ``d``'s chain (its retirements and refunds)."""
    treasury = d.chain["treasury"]["address"]
    return int(
        await d.runtime.db.fetchval(
            "SELECT count(*) FROM relay_jobs WHERE payer = $1 AND chain_id = $2",
            treasury,
            d.runtime.settings.chain_id,
        )
    )


async def test_on_the_second_chain_a_cancelled_nonce_pays_and_retires_nothing(two: TwoChains) -> None:
    """The payer works against us on 8453: quote, sign to the treasury, then its own
    cancelAuthorization mined on 8453 before the post: a 402 naming the used nonce, nothing
    recorded, the treasury's USDC and jobs unchanged on either chain."""
    d = two.daemons[SECOND]
    payer = d.chain["payers"][2]
    body = retire_body(payer["address"], chainId=SECOND)
    pr = await required(d, body)
    header = sign_payload(pr, payer["privateKey"])
    payer_acts.cancel(d.chain, payer["privateKey"], nonce_of(header))
    treasury = d.chain["treasury"]["address"]
    before = {c: (await _usdc(x, treasury), await _treasury_jobs(x)) for c, x in two.daemons.items()}
    status, answer, headers = await post(d, body, header)
    assert status == 402, answer
    assert decode(headers["PAYMENT-REQUIRED"])["error"] == NONCE_USED
    assert decode(headers["PAYMENT-RESPONSE"])["success"] is False
    await asyncio.sleep(1.5)  # a keeper step or more on each chain: still nothing
    after = {c: (await _usdc(x, treasury), await _treasury_jobs(x)) for c, x in two.daemons.items()}
    assert after == before


async def test_a_payment_signed_for_one_chain_is_refused_on_the_other(two: TwoChains) -> None:
    """A PAYMENT-SIGNATURE signed for 84532 (its network, its USDC domain) posted with
    ``chainId`` 8453: the 8453 resource refuses it before any money moves, and it stays good
    for nothing else there; the treasury gains nothing on either chain."""
    first, second = two.daemons[FIRST], two.daemons[SECOND]
    payer = first.chain["payers"][2]
    pr = await required(first, retire_body(payer["address"], chainId=FIRST))
    header = sign_payload(pr, payer["privateKey"])
    treasury = first.chain["treasury"]["address"]
    before = {c: await _usdc(x, treasury) for c, x in two.daemons.items()}
    status, answer, headers = await post(second, retire_body(payer["address"], chainId=SECOND), header)
    assert status == 402, answer
    assert decode(headers["PAYMENT-RESPONSE"])["success"] is False
    assert decode(headers["PAYMENT-REQUIRED"])["accepts"][0]["network"] == f"eip155:{SECOND}"
    await asyncio.sleep(1.5)
    assert {c: await _usdc(x, treasury) for c, x in two.daemons.items()} == before
    rows = await first.runtime.db.fetchval(
        "SELECT count(*) FROM x402_payments WHERE payer = $1", payer["address"]
    )
    assert rows == 0
