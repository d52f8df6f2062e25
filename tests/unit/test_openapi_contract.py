"""What the OpenAPI documents promise about the HTTP front (issue 21), in process: both
documents are valid OpenAPI 3.1; a wrong method on a known path is 405 with ``Allow`` in the
path's own envelope; every 429 says ``Retry-After``; a refusal names the field and the rule,
never the validator's internals; bounds are JSON Schema keywords."""

from __future__ import annotations

import dataclasses
import json
from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import validate

from relayer.api.errors import error_response
from relayer.api.http import build_app
from relayer.api.kernel import RateLimit
from relayer.api.marketplace import guarded
from relayer.api.marketplace import openapi_document as marketplace_document
from relayer.api.x402_openapi import openapi_document as x402_document
from relayer.api.x402_versions import X402Info
from relayer.domain.errors import Rejection
from relayer.domain.marketplace import CarbonProjectsQuery, OrderRequest, QuoteRequest, validated
from relayer.domain.projects import CATEGORIES
from relayer.domain.schemas import parse_request
from relayer.metrics import Metrics

INFO = X402Info(
    api_version="1.2.0",
    major=1,
    base_url="http://127.0.0.1:8402/api",
    versioned_hosts={"latest": "http://127.0.0.1:8402/api"},
    chain_id=84532,
    settlement="0x" + "1" * 40,
    input_tokens=[{"symbol": "USDC", "address": "0x" + "2" * 40, "decimals": 6, "scheme": "eip3009"}],
    security_contact="mailto:security@example.org",
)


def _keys(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in _keys(v)}
    return set()


@pytest.mark.parametrize("major", [1, 0])
def test_the_x402_document_is_valid_with_typed_answers_and_per_action_requests(major: int) -> None:
    doc = x402_document(dataclasses.replace(INFO, major=major))
    validate(doc)
    assert not {"ge", "le", "gt", "lt"} & _keys(doc)  # pydantic's names are not JSON Schema
    schemas = doc["components"]["schemas"]
    quote = schemas["QuoteRequest"]
    assert quote["required"] == ["amount"] and quote["additionalProperties"] is (major == 0)
    assert "authPayload" not in quote["properties"] and "txHash" not in quote["properties"]
    assert schemas["CertificateRequest"]["required"] == ["txHash"]
    assert quote["properties"]["chainId"]["enum"] == [84532]
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            ok = [s for s in operation["responses"] if s.startswith("2")]
            assert ok, (path, method)
            for status in ok:
                for media in operation["responses"][status]["content"].values():
                    assert media["schema"] not in ({}, {"type": "object"}), (path, status)
            assert "429" in operation["responses"], (path, method)
            assert "Retry-After" in operation["responses"]["429"]["headers"]


def test_the_marketplace_document_is_valid_and_says_what_is_served() -> None:
    doc = marketplace_document("http://127.0.0.1:8402")
    validate(doc)
    paths = doc["paths"]
    provenance = paths["/retirements/{id}/provenance"]["get"]["responses"]["200"]["content"]
    assert provenance["application/json"]["schema"]["type"] == "array"
    certificate = paths["/retirements/{id}/certificate"]["get"]["responses"]["200"]["content"]
    assert set(certificate) == {"application/pdf", "text/html"}
    category = next(p for p in paths["/carbonProjects"]["get"]["parameters"] if p["name"] == "category")
    assert category["schema"]["enum"] == list(CATEGORIES)
    assert not {"ge", "le", "gt", "lt"} & _keys(doc)
    for path, item in paths.items():
        for operation in item.values():
            assert "Retry-After" in operation["responses"]["429"]["headers"], path
            for status, answer in operation["responses"].items():
                if status.startswith("2"):
                    for media in answer["content"].values():
                        assert media["schema"] != {"type": "object"}, path


# ---------------------------------------------------------------------------- 405, 429


async def _client(rate_limit: RateLimit | None = None) -> TestClient[web.Request, web.Application]:
    async def ready() -> bool:
        return True

    @guarded
    async def retirement(_request: web.Request) -> web.Response:
        return web.json_response({"id": "x"})

    def mount(app: web.Application) -> None:
        app.router.add_get("/retirements/{id}", retirement)

    app = build_app(mock.Mock(), Metrics(), ready, 1024, mount=mount, rate_limit=rate_limit)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.mark.parametrize(
    ("method", "path", "allow", "surface"),
    [
        ("PUT", "/retirements/84532-0x00-0", "GET, HEAD", "marketplace"),
        ("DELETE", "/api/discover", "GET, HEAD, POST", "x402"),
        ("GET", "/api/actions/retire", "POST", "x402"),
        ("TRACE", "/healthz", "GET, HEAD", "x402"),
    ],
)
async def test_a_wrong_method_is_405_with_allow_in_the_paths_envelope(
    method: str, path: str, allow: str, surface: str
) -> None:
    client = await _client()
    try:
        async with client.request(method, path) as r:
            body = await r.json()
            assert (r.status, r.headers["Allow"]) == (405, allow)
        if surface == "marketplace":
            assert (body["statusCode"], body["code"]) == (405, "method_not_allowed")
            assert body["error"] == "Method Not Allowed"
        else:
            assert (body["error"], body["x402FacilitatorVersion"]) == ("method_not_allowed", 2)
        assert body["allow"] == allow.split(", ")
        async with client.get("/nowhere/at/all") as r:
            assert r.status == 404 and "Allow" not in r.headers
    finally:
        await client.close()


async def test_every_429_says_retry_after_on_both_surfaces() -> None:
    client = await _client(RateLimit("1/minute"))
    try:
        async with client.get("/retirements/1-0x00-0") as r:
            assert r.status == 200
        for path, code_of in (("/retirements/1-0x00-0", "code"), ("/api/discover", "error")):
            async with client.get(path) as r:
                body = await r.json()
                assert r.status == 429 and int(r.headers["Retry-After"]) >= 1, path
                assert body[code_of] == "rate_limited" and body["retryAfterSeconds"] >= 1
    finally:
        await client.close()
    for surface in ("x402", "marketplace", "facilitator"):
        answer = error_response(Rejection("gas_budget_exhausted", retryAfterSeconds=7), surface)
        assert (answer.status, answer.headers["Retry-After"]) == (429, "7")


# ---------------------------------------------------------------------------- messages


def _refusal(model: Any, data: dict[str, Any]) -> Rejection:
    with pytest.raises(Rejection) as caught:
        validated(model, data)
    return caught.value


@pytest.mark.parametrize("quantity", [True, None, [1], {"t": 1}])
def test_a_marketplace_refusal_names_the_field_and_the_rule(quantity: Any) -> None:
    error = _refusal(QuoteRequest, {"asset_price_source_id": "listing-1", "quantity_tonnes": quantity})
    rule = "must be a decimal string (or a JSON number) of tonnes above 0 with at most 3 decimals"
    assert error.message == f"quantity_tonnes: {rule}"
    assert error.context["fields"] == [{"field": "quantity_tonnes", "problem": rule}]


def test_no_refusal_leaks_pydantic_internals() -> None:
    internals = ("constrained-str", "function-after", "Value error,", "is-instance", "decimal")
    order = _refusal(
        OrderRequest, {"quote_uuid": "x", "beneficiary_name": "", "beneficiary_address": "0x" + "0" * 40}
    )
    query = _refusal(CarbonProjectsQuery, {"limit": "0", "sdg": "99", "colour": "red"})
    for error in (order, query):
        assert not any(word in error.message for word in internals), error.message
    assert "beneficiary_address: the zero address is not allowed" in order.message
    assert "quote_uuid: String should match pattern" in order.message
    assert "limit: Input should be greater than or equal to 1" in query.message
    assert "colour: unrecognized key" in query.message
    with pytest.raises(Rejection) as caught:
        parse_request({"listingId": True, "index": False, "details": {"beneficiaryAddress": "0x" + "0" * 40}})
    issues = {tuple(i["path"]): i["message"] for i in caught.value.context["issues"]}
    assert issues == {
        ("listingId",): "a boolean is not a number",
        ("index",): "a boolean is not a number",
        ("details", "beneficiaryAddress"): "the zero address is not allowed",
    }
    assert json.dumps(caught.value.context).count("Value error") == 0
