"""The HTTP surface: strict parsing, the error envelope, routes, metrics (daemon over HTTP)."""

from __future__ import annotations

import pytest

from tests.conftest import Daemon

pytestmark = pytest.mark.integration


async def test_invalid_json_and_non_object(daemon: Daemon) -> None:
    for payload in (b"{not json", b"[1, 2]", b"action=discover"):
        async with daemon.session.post(
            daemon.api, data=payload, headers={"content-type": "application/json"}
        ) as r:
            body = await r.json()
        assert (r.status, body["error"], body["x402FacilitatorVersion"]) == (400, "invalid_json", 2)


async def test_unknown_action_lists_supported(daemon: Daemon) -> None:
    status, body = await daemon.post({"action": "teleport"})
    assert (status, body["error"]) == (400, "unknown_action")
    assert "actions/retire" in body["supported"]
    status, body = await daemon.post({})
    assert (status, body["error"]) == (400, "unknown_action")


async def test_unknown_keys_are_schema_validation_with_paths(daemon: Daemon) -> None:
    status, body = await daemon.post(
        {
            "action": "quote",
            "carbonClass": "NBO",
            "amount": "1",
            "colour": "green",
            "details": {"beneficiaryIsPayer": True, "shoeSize": 44},
        }
    )
    assert (status, body["error"]) == (400, "schema_validation")
    issues = {tuple(i["path"]): i["keys"] for i in body["issues"]}
    assert issues[()] == ["colour"]
    assert issues[("details",)] == ["shoeSize"]


async def test_unknown_route_is_not_found_in_its_surfaces_envelope(daemon: Daemon) -> None:
    """Under the x402 endpoint's paths the x402 envelope (an unknown action under /api is
    unknown_action); elsewhere (an unknown /projects: issue 37) the marketplace's
    ``{statusCode, error, message, code}``."""
    status, body = await daemon.get("/.well-known/nowhere")
    assert (status, body["error"], body["x402FacilitatorVersion"]) == (404, "not_found", 2)
    for path in ("/projects", "/nowhere"):
        status, body = await daemon.get(path)
        assert status == 404 and "x402FacilitatorVersion" not in body, body
        assert (body["statusCode"], body["error"], body["code"]) == (404, "Not Found", "not_found"), body


async def test_quote_rules(daemon: Daemon) -> None:
    status, body = await daemon.get("/api/quote", carbonClass="NBO", listingId="1", amount="1")
    assert (status, body["error"]) == (400, "schema_validation")
    status, body = await daemon.get("/api/quote", carbonClass="NBO", amount="0.0001")
    assert (status, body["error"], body["minimum"]) == (422, "amount_below_increment", "0.001")
    status, body = await daemon.get("/api/quote", listingId="1", amount="1", inputToken="kVCM")
    assert (status, body["error"]) == (400, "marketplace_requires_usdc")
    status, body = await daemon.get("/api/quote", listingId="999", amount="1")
    assert (status, body["error"]) == (404, "listing_not_found")
    status, body = await daemon.get("/api/quote", carbonClass="NBO", amount="1", chainId="1")
    assert (status, body["error"]) == (400, "unsupported_chain_id")
    status, body = await daemon.get("/api/quote", carbonClass="NBO", amount="1", inputToken="DAI")
    assert (status, body["error"]) == (400, "unsupported_input_token")
    puro = next(c for c in daemon.chain["credits"] if c["registry"] == "PUR")
    listing = next(li for li in daemon.chain["listings"] if li["tokenId"] == puro["tokenId"])
    status, body = await daemon.get("/api/quote", listingId=str(listing["listingId"]), amount="1.5")
    assert (status, body["error"]) == (422, "amount_not_whole_tonnes")
    status, body = await daemon.get("/api/quote", carbonClass="NBO", amount="1")
    assert status == 200
    assert int(body["quote"]["total"]) == int(body["quote"]["retirementCost"]) + int(body["quote"]["fee"])
    assert int(body["suggestedMaxInput"]) == -(-int(body["quote"]["total"]) * 10_400 // 10_000)


async def test_puro_relay_needs_registry_details(daemon: Daemon) -> None:
    puro = next(c for c in daemon.chain["credits"] if c["registry"] == "PUR")
    listing = next(li for li in daemon.chain["listings"] if li["tokenId"] == puro["tokenId"])
    status, body = await daemon.post(
        {
            "action": "prepare-auth",
            "listingId": str(listing["listingId"]),
            "amount": "1",
            "from": daemon.chain["payers"][0]["address"],
            "details": {"beneficiaryIsPayer": True},
        }
    )
    assert (status, body["error"]) == (400, "registry_details_required")
    assert "details.consumptionCountryCode" in body["fields"]


async def test_relay_without_beneficiary_is_attribution_required(daemon: Daemon) -> None:
    status, body = await daemon.post(
        {
            "action": "prepare-auth",
            "carbonClass": "NBO",
            "amount": "1",
            "from": daemon.chain["payers"][0]["address"],
        }
    )
    assert (status, body["error"]) == (400, "attribution_required")


async def test_certificate_for_unknown_hash(daemon: Daemon) -> None:
    status, body = await daemon.get("/api/certificate", txHash="0x" + "ab" * 32)
    assert (status, body["error"]) == (404, "retirement_not_found")


async def test_discover_lists_classes_and_listings(daemon: Daemon) -> None:
    status, body = await daemon.get("/api/discover")
    assert status == 200
    assert len(body["carbonClasses"]) >= 3 and len(body["marketplaceListings"]) >= 5
    assert {"PUR", "VCS"} <= {li["registry"] for li in body["marketplaceListings"]}


async def test_prepare_retire_gives_approve_then_retire(daemon: Daemon) -> None:
    status, body = await daemon.get(
        "/api/prepare/retire", carbonClass="RE", amount="1", **{"from": daemon.chain["payers"][0]["address"]}
    )
    assert status == 200, body
    assert [t["step"] for t in body["transactions"]] == ["approve", "prepareRetire"]
    assert body["approvalInstructions"]["spender"] == body["to"]


async def test_discover_filters(daemon: Daemon) -> None:
    status, body = await daemon.get("/api/discover", maxUsdcPricePerTonne="10", source="marketplace")
    assert status == 200 and body["carbonClasses"] == []
    prices = [int(li["priceUsdcPerTonne"]) for li in body["marketplaceListings"]]
    assert prices and all(p <= 10_000_000 for p in prices)
    status, body = await daemon.get("/api/discover", category="Renewable Energy")
    projects = {c["projectId"] for cls in body["carbonClasses"] for c in cls["creditsDetailed"]}
    projects |= {li["projectId"] for li in body["marketplaceListings"]}
    by_key = {c["projectId"]: c["category"] for c in daemon.chain["credits"]}
    assert projects and {by_key[p] for p in projects} == {"Renewable Energy"}
    status, body = await daemon.get("/api/discover", source="everywhere")
    assert (status, body["error"]) == (400, "schema_validation")
    assert body["issues"][0]["path"] == ["source"]


async def test_get_and_post_give_the_same_prepare_auth(daemon: Daemon) -> None:
    payer = daemon.chain["payers"][0]["address"]
    params = {"carbonClass": "RE", "amount": "0.5", "inputToken": "USDC", "from": payer}
    status, got = await daemon.get("/api/prepare-auth", **params, **{"details.beneficiaryIsPayer": "true"})
    assert status == 200, got
    status, posted = await daemon.post(
        {"action": "prepare-auth", **params, "details": {"beneficiaryIsPayer": True}}
    )
    assert status == 200, posted
    for body in (got, posted):  # fresh per call: the salt, and the nonce and lifetime that follow from it
        body["actionsRetireRequest"].pop("salt")
        body.pop("validBefore")
        body["actionsRetireRequest"]["authPayload"].pop("nonce")
        body["actionsRetireRequest"]["authPayload"].pop("validBefore")
        body.pop("onChainDetails")
        body.pop("typedData")
    assert got == posted


async def test_actions_retire_is_post_only_and_values_are_uint256(daemon: Daemon) -> None:
    async with daemon.session.get(f"{daemon.api}/actions/retire", params={"amount": "1"}) as r:
        status, body, allow = r.status, await r.json(), r.headers.get("Allow")
    assert (status, body["error"], allow) == (405, "method_not_allowed", "POST")
    status, body = await daemon.post(
        {
            "action": "actions/retire",
            "carbonClass": "NBO",
            "amount": "1",
            "gasAllowance": str(2**256),
            "from": daemon.chain["payers"][0]["address"],
        }
    )
    assert (status, body["error"]) == (400, "schema_validation")
    assert body["issues"][0]["path"] == ["gasAllowance"]
