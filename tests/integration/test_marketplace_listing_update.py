"""Marketplace.updateListing: the seller reprices an active listing (ListingUpdated), under
createListing's rules against what is left to sell; anyone else, an inactive or unknown
listing, and bad terms revert. On the session chain only what changes nothing for the other
tests is sent (the seller re-states listing 6's own terms; refusals are eth_calls); the
full life of a listing (repriced, filled at the new price, repriced under what is left,
cancelled) runs on a private chain. Also: the ``polygon_chain`` fixture (chain 137)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractCustomError, ContractLogicError
from web3.logs import DISCARD

from relayer.chain.abi import abi
from relayer.config import IndexChain
from relayer_dev.deploy import CANCELLED_LISTING_ID, UPDATED_LISTING_ID
from tests.chain_helpers import index_chain_setting, transact_as
from tests.helpers import stacks

pytestmark = pytest.mark.integration

UPDATED_EVENT = "ListingUpdated(uint256,uint256,uint256,uint64)"


def _market(chain: dict[str, Any]) -> tuple[Web3, Contract]:
    w3 = Web3(Web3.HTTPProvider(chain["rpcUrl"]))
    return w3, w3.eth.contract(address=chain["contracts"]["marketplace"], abi=abi("Marketplace"))


def _error(name: str, *types: str) -> str:
    """The 4-byte selector of custom error ``name(types)``, as 0x hex."""
    return "0x" + Web3.keccak(text=f"{name}({','.join(types)})")[:4].hex()


def _refusal(market: Contract, sender: str, *args: Any) -> str:
    """The revert data of ``updateListing(*args)`` called by ``sender`` (an eth_call: nothing
    is sent)."""
    with pytest.raises((ContractCustomError, ContractLogicError)) as exc:
        market.functions.updateListing(*args).call({"from": sender})
    data = exc.value.data
    return data if isinstance(data, str) else str(data)


def test_update_listing_emits_listing_updated(chain: dict[str, Any]) -> None:
    _, market = _market(chain)
    listing_id = UPDATED_LISTING_ID
    before = market.functions.getListing(listing_id).call()
    unit_price, min_fill, expiration = before[3], before[6], before[7]
    receipt = transact_as(
        chain,
        "seller",
        market.address,
        "Marketplace",
        "updateListing",
        listing_id,
        unit_price,
        min_fill,
        expiration,
    )
    assert receipt["status"] == 1
    (event,) = market.events.ListingUpdated().process_receipt(receipt)
    assert event["args"] == {
        "listingId": listing_id,
        "unitPrice": unit_price,
        "minFill": min_fill,
        "expiration": expiration,
    }
    log = receipt["logs"][0]
    assert log["topics"][0] == Web3.keccak(text=UPDATED_EVENT)
    assert int.from_bytes(log["topics"][1], "big") == listing_id  # indexed
    assert market.functions.getListing(listing_id).call() == before  # the same terms re-stated


def test_update_listing_refusals(chain: dict[str, Any]) -> None:
    w3, market = _market(chain)
    seller, deployer = chain["seller"]["address"], chain["deployer"]["address"]
    listing_id = UPDATED_LISTING_ID
    _, _, _, price, _, left, min_fill, expiration, active = market.functions.getListing(listing_id).call()
    assert active and left > 0
    now = int(w3.eth.get_block("latest")["timestamp"])
    invalid = _error("InvalidListing")
    # What the seller may send passes (an eth_call, so the shared chain is not changed).
    market.functions.updateListing(listing_id, price + 1, left, now + 3600).call({"from": seller})
    assert _refusal(market, deployer, listing_id, price, min_fill, expiration).startswith(
        _error("NotSeller", "address")
    )
    assert _refusal(market, seller, CANCELLED_LISTING_ID, price, min_fill, expiration).startswith(
        _error("ListingNotActive", "uint256")
    )
    assert _refusal(market, seller, 999, price, min_fill, expiration).startswith(
        _error("ListingNotFound", "uint256")
    )
    assert _refusal(market, seller, listing_id, 0, min_fill, expiration) == invalid  # no price
    assert _refusal(market, seller, listing_id, price, left + 1, expiration) == invalid  # min fill > left
    assert _refusal(market, seller, listing_id, price, min_fill, now) == invalid  # expired
    assert _refusal(market, seller, listing_id, price, min_fill, 1) == invalid


@pytest.fixture(scope="module")
def own_chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A private chain this module may change at will."""
    proc, info = stacks.start_chain(tmp_path_factory.mktemp("anvil"))
    try:
        yield info
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_listing_repriced_fills_at_its_new_price_and_stays_within_what_is_left(
    own_chain: dict[str, Any],
) -> None:
    chain = own_chain
    w3, market = _market(chain)
    usdc = w3.eth.contract(address=chain["contracts"]["usdc"], abi=abi("UsdcEip3009"))
    listing_id = 1
    _, _, token_id, price, total, left, _, expiration, _ = market.functions.getListing(listing_id).call()
    new_price, new_expiration = price * 2, expiration + 86_400

    def seller_sends(function: str, *args: Any) -> Any:
        receipt = transact_as(chain, "seller", market.address, "Marketplace", function, *args)
        assert receipt["status"] == 1
        return receipt

    receipt = seller_sends("updateListing", listing_id, new_price, 500, new_expiration)
    (event,) = market.events.ListingUpdated().process_receipt(receipt)
    assert event["args"] == {
        "listingId": listing_id,
        "unitPrice": new_price,
        "minFill": 500,
        "expiration": new_expiration,
    }
    after = market.functions.getListing(listing_id).call()
    assert (after[3], after[5], after[6], after[7], after[8]) == (new_price, left, 500, new_expiration, True)
    assert market.functions.fillCost(listing_id, 1000).call() == new_price

    # A fill pays the new price; minFill is then checked against what is left.
    amount = total - 300
    cost = market.functions.fillCost(listing_id, amount).call()
    deployer = chain["deployer"]["address"]
    for function, args in (("mint", (deployer, cost)), ("approve", (market.address, cost))):
        assert transact_as(chain, "deployer", usdc.address, "UsdcEip3009", function, *args)["status"] == 1
    receipt = transact_as(
        chain, "deployer", market.address, "Marketplace", "fill", listing_id, amount, cost, deployer
    )
    assert receipt["status"] == 1
    (filled,) = market.events.ListingFilled().process_receipt(receipt, errors=DISCARD)
    assert (filled["args"]["amount"], filled["args"]["cost"]) == (amount, -(-new_price * amount // 1000))
    seller = chain["seller"]["address"]
    assert _refusal(market, seller, listing_id, new_price, 301, new_expiration) == _error("InvalidListing")
    seller_sends("updateListing", listing_id, new_price, 300, new_expiration)  # minFill == leftToSell

    # Cancelled, it can no longer be updated.
    seller_sends("cancelListing", listing_id)
    assert _refusal(market, seller, listing_id, new_price, 0, new_expiration).startswith(
        _error("ListingNotActive", "uint256")
    )
    assert token_id > 0


def test_polygon_chain_fixture_is_a_seeded_chain_137(polygon_chain: dict[str, Any]) -> None:
    w3 = Web3(Web3.HTTPProvider(polygon_chain["rpcUrl"]))
    assert w3.eth.chain_id == polygon_chain["chainId"] == 137
    written = json.loads(Path(polygon_chain["deploymentFile"]).read_text())
    assert written["contracts"] == polygon_chain["contracts"]
    assert written["deployBlock"] == polygon_chain["deployBlock"] > 0
    setting = IndexChain.model_validate(index_chain_setting(polygon_chain))
    assert (setting.chain_id, setting.rpc_url, setting.depth()) == (137, polygon_chain["rpcUrl"], 1)
    assert setting.deployment_file == Path(polygon_chain["deploymentFile"])
    _, market = _market(polygon_chain)
    updated = next(r for r in polygon_chain["listings"] if r["state"] == "updated")
    assert str(market.functions.getListing(updated["listingId"]).call()[3]) == updated["unitPrice"]
    assert len(polygon_chain["seededRetirements"]) >= 3
