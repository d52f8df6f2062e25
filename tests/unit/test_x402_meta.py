"""The x402 endpoint's self-description (relayer/api/x402_meta.py), served in-process by a
tiny aiohttp app with the API's own envelope: the manifest against the error registry and
the request model, the errors document against the spec's table, the changelog against the
spec's Versioning section, security.txt against RFC 9116, the guides, and the OpenAPI 3.1
document. No chain and no database."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from relayer.api import kernel, x402_routes
from relayer.api.x402_manifest import security_txt
from relayer.api.x402_meta import add_meta_routes
from relayer.api.x402_openapi import _component
from relayer.api.x402_versions import GUIDE_IDS, LATEST_VERSION, RELEASES, X402Info
from relayer.config import Settings
from relayer.domain.errors import (
    ACTION_CODES,
    COMMON_CODES,
    REGISTRY,
    X402_FACILITATOR_VERSION,
    X402_REGISTRY,
    allowed_codes,
)
from relayer.domain.schemas import ACTION_FIELDS, ACTION_REQUIRED, ACTIONS, CHOOSES_CREDIT, ActionRequest
from relayer.domain.verify import AUTH_EXPIRY_MARGIN_S
from relayer.metrics import Metrics
from tests.helpers.spec import SPEC, SPEC_ERRORS

ROOT = Path(__file__).resolve().parents[2]
GUIDES_DIR = ROOT / "relayer" / "guides"

SETTLEMENT = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
TOKENS = [
    {
        "symbol": "USDC",
        "address": "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359",
        "decimals": 6,
        "scheme": "eip3009",
    },
    {
        "symbol": "kVCM",
        "address": "0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB",
        "decimals": 18,
        "scheme": "eip2612",
    },
]
PLACEHOLDER = re.compile(r"\{(x402_[a-z0-9_]+|origin|chain_id)\}")
HOSTS = {
    "latest": "http://x402.test/api",
    "current": "http://v1.x402.test/api",
    "v0": "http://v0.x402.test/api",
}


def info_for(host: str) -> X402Info:
    """What the lead's ``info_of`` gives: the host decides the major and the base URL."""
    major = 0 if host.startswith("v0.") else x402_routes.LATEST_MAJOR
    base = HOSTS["v0"] if major == 0 else HOSTS["current"] if host.startswith("v1.") else HOSTS["latest"]
    return X402Info(
        api_version=x402_routes.API_VERSION,
        major=major,
        base_url=base,
        versioned_hosts=dict(HOSTS),
        chain_id=84532,
        settlement=SETTLEMENT,
        input_tokens=TOKENS,
        security_contact="mailto:security@x402.test",
    )


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application(middlewares=[kernel.envelope])
    app[kernel.METRICS] = Metrics()
    add_meta_routes(app, lambda request: info_for(request.host))
    async with TestClient(TestServer(app)) as c:
        yield c


async def _get(
    client: TestClient[web.Request, web.Application], path: str, host: str = "x402.test", **params: str
) -> tuple[int, Any]:
    async with client.get(path, params=params, headers={"Host": host}) as r:
        text = await r.text()
        if r.content_type == "application/json":
            return r.status, json.loads(text)
        return r.status, text


# ---------------------------------------------------------------------------- manifest


async def test_manifest_publishes_versions_hosts_chain_and_tokens(client: TestClient[Any, Any]) -> None:
    status, body = await _get(client, "/.well-known/x402.json")
    assert status == 200
    assert body["apiVersion"] == body["latestApiVersion"] == x402_routes.API_VERSION == LATEST_VERSION
    assert body["major"] == x402_routes.LATEST_MAJOR == 1
    hosts = body["versionedHosts"]
    assert {k: hosts[k] for k in ("latest", "current", "v0")} == HOSTS
    note = hosts["note"].lower()
    assert "host" in note and "header" in note and "query" in note and "accept" in note
    assert body["x402FacilitatorVersion"] == X402_FACILITATOR_VERSION == 2
    assert body["settlement"] == SETTLEMENT
    assert body["chains"] == [
        {"chainId": 84532, "name": "Base Sepolia", "network": "eip155:84532", "settlement": SETTLEMENT}
    ]
    assert body["inputTokens"] == TOKENS
    assert body["errors"] == "/.well-known/x402-errors.json"


async def test_manifest_actions_take_their_codes_from_the_registry(client: TestClient[Any, Any]) -> None:
    _, body = await _get(client, "/.well-known/x402.json")
    actions = {a["action"]: a for a in body["actions"]}
    assert list(actions) == list(ACTIONS)
    fields = {f.alias or name for name, f in ActionRequest.model_fields.items()}
    for name, entry in actions.items():
        assert entry["errors"] == list(allowed_codes(name)), name
        assert entry["post"] == "/api"
        assert entry["get"] == (None if name == "actions/retire" else f"/api/{name}")
        assert entry["movesFunds"] is (name == "actions/retire")
        schema = entry["schema"]
        assert schema["properties"]["action"]["const"] == name
        assert schema["required"] == ["action"]
        assert schema["additionalProperties"] is False
        assert set(schema["properties"]) == fields
        assert all(d["additionalProperties"] is False for d in schema["$defs"].values())


async def test_manifest_declares_the_additive_extensions(client: TestClient[Any, Any]) -> None:
    _, body = await _get(client, "/.well-known/x402.json")
    by_name = {e["name"]: e for e in body["extensions"]}
    waiting = by_name["retire-202-while-on-its-way"]
    assert (waiting["action"], waiting["httpStatus"]) == ("actions/retire", 202)
    assert "submitted" in waiting["statuses"] and set(waiting["finalStatuses"]) == {
        "settled",
        "pending_index",
    }
    unavailable = by_name["retire-payment-unavailable"]
    assert (unavailable["error"], unavailable["httpStatus"]) == ("payment_unavailable", 503)
    assert "payment_unavailable" in allowed_codes("actions/retire")
    versions = {r.version for r in RELEASES}
    assert all(e["since"] in versions for e in body["extensions"])


async def test_the_v0_host_is_major_0_and_ignores_unknown_top_level_keys(
    client: TestClient[Any, Any],
) -> None:
    _, body = await _get(client, "/.well-known/x402.json", host="v0.x402.test")
    assert body["major"] == 0
    assert body["apiVersion"] == "0.9.0" and body["latestApiVersion"] == LATEST_VERSION
    assert body["baseUrl"] == HOSTS["v0"]
    for entry in body["actions"]:
        assert entry["schema"]["additionalProperties"] is True
        assert entry["schema"]["$defs"]["Details"]["additionalProperties"] is False
    for host in ("v1.x402.test", "x402.test"):  # the v1 host and the latest serve major 1: refused
        _, pinned = await _get(client, "/.well-known/x402.json", host=host)
        assert (pinned["major"], pinned["apiVersion"]) == (1, "1.3.0")
        assert all(entry["schema"]["additionalProperties"] is False for entry in pinned["actions"])
    assert pinned["baseUrl"] == HOSTS["latest"]


# ---------------------------------------------------------------------------- errors


async def test_errors_document_is_the_spec_table_in_its_order(client: TestClient[Any, Any]) -> None:
    status, body = await _get(client, "/.well-known/x402-errors.json")
    assert status == 200
    assert (body["apiVersion"], body["x402FacilitatorVersion"]) == (LATEST_VERSION, 2)
    codes = [e["code"] for e in body["errors"]]
    # the spec's table in its order, then the additive codes of releases 1.2.0 and 1.3.0
    # (the marketplace API's own codes share the registry but are not x402 codes)
    assert codes == list(X402_REGISTRY) == [*SPEC_ERRORS, "rate_limited", "method_not_allowed"]
    assert not set(codes) & {c for c, spec in REGISTRY.items() if spec.surface == "marketplace"}
    for entry in body["errors"]:
        spec = SPEC_ERRORS.get(entry["code"]) or REGISTRY[entry["code"]]
        assert (entry["httpStatus"], entry["group"], entry["retryable"]) == (
            spec.http_status,
            spec.group,
            spec.retryable,
        )
        assert entry["message"] == REGISTRY[entry["code"]].message
    assert body["commonCodes"] == list(COMMON_CODES)
    assert body["actions"] == {a: list(ACTION_CODES[a]) for a in ACTIONS}
    _, api = await _get(client, "/api/errors")
    assert api == body


# ---------------------------------------------------------------------------- changelog

_SPEC_BREAKING = re.search(r"Two breaking releases so far: (.+?)\.\n", SPEC.read_text(encoding="utf-8"))


def _spec_breaking_changes() -> list[str]:
    assert _SPEC_BREAKING is not None, "the spec's Versioning section no longer names its breaking changes"
    return [part.strip() for part in re.split(r",\s*(?:and\s+)?", _SPEC_BREAKING.group(1))]


def _semver(version: str) -> tuple[int, int, int, int, str]:
    """SemVer precedence: a pre-release (``1.0.0-rc.1``) before its release."""
    core, _, pre = version.partition("-")
    major, minor, patch = (int(p) for p in core.split("."))
    return major, minor, patch, 0 if pre else 1, pre


async def test_changelog_is_newest_first_and_consistent_with_api_version(
    client: TestClient[Any, Any],
) -> None:
    status, body = await _get(client, "/.well-known/x402-changelog.json")
    assert status == 200
    releases = body["releases"]
    assert releases[0]["version"] == body["apiVersion"] == x402_routes.API_VERSION
    versions = [_semver(r["version"]) for r in releases]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    dates = [date.fromisoformat(r["date"]) for r in releases]
    assert dates == sorted(dates, reverse=True)
    _, manifest = await _get(client, "/.well-known/x402.json")
    assert body["versionedHosts"] == manifest["versionedHosts"]
    assert {v[0] for v in versions} == {0, 1}
    for r in releases:
        assert isinstance(r["breaking"], bool) and r["summary"] and r["changes"]
        # a release is breaking exactly when it leads to a new major: 1.0.0 and its pre-release
        assert r["breaking"] == (_semver(r["version"])[:3] == (1, 0, 0)), r["version"]


async def test_changelog_has_exactly_the_spec_breaking_changes_with_migration(
    client: TestClient[Any, Any],
) -> None:
    """Spec: "Two breaking releases so far: a newly required attribution field, and rejecting
    unknown top-level keys"; each breaking release has its own ``migration``."""
    _, body = await _get(client, "/.well-known/x402-changelog.json")
    breaking = [r for r in body["releases"] if r["breaking"]][::-1]  # oldest first, as the spec
    assert [r["version"] for r in breaking] == ["1.0.0-rc.1", "1.0.0"]
    assert all(isinstance(r["migration"], str) and len(r["migration"]) > 40 for r in breaking)
    assert all("migration" not in r for r in body["releases"] if not r["breaking"])
    wanted = _spec_breaking_changes()
    assert len(wanted) == 2
    for phrase, release in zip(wanted, breaking, strict=True):
        said = [c for c in release["changes"] if c.startswith("Breaking:")]
        assert len(said) == 1 and phrase.lower() in said[0].lower(), (phrase, release["changes"])
    attribution, strict = (r["migration"] for r in breaking)
    assert "details.beneficiaryAddress" in attribution and "beneficiaryIsPayer" in attribution
    assert "top-level key" not in attribution and "v0 host" in attribution
    assert "top-level key" in strict and "beneficiary" not in strict and "v0 host" in strict


async def test_changelog_minor_and_previous_major(client: TestClient[Any, Any]) -> None:
    _, body = await _get(client, "/.well-known/x402-changelog.json")
    by_version = {r["version"]: r for r in body["releases"]}
    additive = " ".join(by_version["1.1.0"]["changes"])
    assert "202" in additive and "submitted" in additive
    assert "payment_unavailable" in additive and "/api/openapi.json" in additive
    (old,) = [r for r in body["releases"] if r["version"].startswith("0.")]
    text = " ".join(old["changes"]).lower()
    assert "unknown top-level keys are ignored" in text and "no attribution field is required" in text
    _, v0 = await _get(client, "/.well-known/x402-changelog.json", host="v0.x402.test")
    assert v0["apiVersion"] == old["version"] and v0["releases"] == body["releases"]
    _, v1 = await _get(client, "/.well-known/x402-changelog.json", host="v1.x402.test")
    assert v1["apiVersion"] == "1.3.0" and v1["releases"] == body["releases"]


# ---------------------------------------------------------------------------- security.txt


async def test_security_txt_has_the_rfc_9116_fields(client: TestClient[Any, Any]) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    async with client.get("/.well-known/security.txt", headers={"Host": "x402.test"}) as r:
        assert r.status == 200 and r.content_type == "text/plain"
        text = await r.text()
    fields: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        fields.setdefault(name, []).append(value)
    assert fields["Contact"] == ["mailto:security@x402.test"]
    (expires,) = fields["Expires"]  # RFC 9116: exactly once
    when = datetime.strptime(expires, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert before + timedelta(days=365) <= when <= datetime.now(UTC) + timedelta(days=365)
    assert fields["Preferred-Languages"] == ["en"]
    assert fields["Canonical"] == ["http://x402.test/.well-known/security.txt"]
    assert fields["Policy"] == ["http://x402.test/api/docs"]


def test_security_txt_expires_a_year_after_now() -> None:
    now = datetime(2026, 11, 24, 4, 35, 14, 123456, tzinfo=UTC)
    text = security_txt(info_for("v1.x402.test"), now)
    assert "Expires: 2027-11-24T04:35:14Z\n" in text
    assert "Canonical: http://v1.x402.test/.well-known/security.txt\n" in text


# ---------------------------------------------------------------------------- guides


def test_the_packaged_guides_are_the_listed_ones() -> None:
    assert {p.stem for p in GUIDES_DIR.glob("*.md")} == set(GUIDE_IDS)
    assert set(GUIDE_IDS) == {"quick-start", "relay-flow", "errors", "fees", "versioning", "standard-x402"}


async def test_docs_index_and_each_document(client: TestClient[Any, Any]) -> None:
    status, index = await _get(client, "/api/docs")
    assert status == 200
    assert [d["id"] for d in index["documents"]] == list(GUIDE_IDS)
    for entry in index["documents"]:
        assert entry["title"] and entry["summary"] and not PLACEHOLDER.search(entry["summary"])
        assert entry["url"] == f"{HOSTS['latest']}/docs?id={entry['id']}"
        status, doc = await _get(client, "/api/docs", id=entry["id"])
        assert status == 200
        assert (doc["id"], doc["title"], doc["format"]) == (entry["id"], entry["title"], "markdown")
        assert doc["body"].startswith(f"# {doc['title']}\n")
        assert not PLACEHOLDER.search(doc["body"]), entry["id"]


BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


async def test_docs_are_html_for_a_browser_and_json_for_a_machine(client: TestClient[Any, Any]) -> None:
    for accept in (None, "*/*", "application/json"):
        headers = {"Host": "x402.test"} | ({} if accept is None else {"Accept": accept})
        async with client.get("/api/docs", params={"id": "fees"}, headers=headers) as r:
            assert (r.status, r.content_type, r.headers["Vary"]) == (200, "application/json", "Accept")
            assert (await r.json())["format"] == "markdown"
    headers = {"Host": "x402.test", "Accept": BROWSER_ACCEPT}
    async with client.get("/api/docs", headers=headers) as r:
        assert (r.status, r.content_type, r.headers["Vary"]) == (200, "text/html", "Accept")
        assert "default-src 'none'" in r.headers["Content-Security-Policy"]
        index = await r.text()
    assert "<h1>Guides</h1>" in index
    for gid in GUIDE_IDS:
        assert f'<a href="?id={gid}">' in index
    for gid in GUIDE_IDS:
        async with client.get("/api/docs", params={"id": gid}, headers=headers) as r:
            assert (r.status, r.content_type) == (200, "text/html")
            page = await r.text()
        assert re.search(r"<h1>[^<]+</h1>", page), gid
        assert "<h2>" in page or gid == "versioning", gid  # sections became headings
        assert "<pre><code" in page or "<code>" in page, gid
        assert "# " not in page.split("<main>", 1)[1].split("<pre>", 1)[0], gid  # no raw Markdown heading
        assert not PLACEHOLDER.search(page), gid
        assert "<script" not in page


async def test_unknown_guide_is_the_envelope_even_for_a_browser(client: TestClient[Any, Any]) -> None:
    headers = {"Host": "x402.test", "Accept": BROWSER_ACCEPT}
    async with client.get("/api/docs", params={"id": "teleport"}, headers=headers) as r:
        assert (r.status, r.content_type) == (404, "application/json")


async def test_guides_speak_of_the_host_they_are_served_by(client: TestClient[Any, Any]) -> None:
    _, doc = await _get(client, "/api/docs", host="v0.x402.test", id="versioning")
    assert "This document was served by `http://v0.x402.test/api`" in doc["body"]
    for url in HOSTS.values():
        assert url in doc["body"]


async def test_unknown_document_lists_the_available_ones(client: TestClient[Any, Any]) -> None:
    for wanted in ("teleport", ""):
        status, body = await _get(client, "/api/docs", id=wanted)
        assert (status, body["error"], body["x402FacilitatorVersion"]) == (404, "document_not_found", 2)
        assert body["available"] == list(GUIDE_IDS)


async def test_docs_and_api_routes_refuse_unknown_and_repeated_query_keys(
    client: TestClient[Any, Any],
) -> None:
    for path in ("/api/docs", "/api/errors", "/api/openapi.json"):
        status, body = await _get(client, path, colour="green")
        assert (status, body["error"]) == (400, "schema_validation"), path
        assert body["issues"] == [{"path": [], "keys": ["colour"], "message": "unrecognized keys"}]
    async with client.get("/api/docs?id=fees&id=errors", headers={"Host": "x402.test"}) as r:
        body = await r.json()
    assert (r.status, body["error"], body["issues"][0]["keys"]) == (400, "schema_validation", ["id"])


def _guide(name: str) -> str:
    return (GUIDES_DIR / f"{name}.md").read_text(encoding="utf-8")


def test_the_errors_guide_names_every_code_an_action_can_answer() -> None:
    text = _guide("errors")
    for code in {c for a in ACTIONS for c in allowed_codes(a)}:
        assert f"`{code}`" in text, code


def test_the_guides_quote_the_operator_defaults_they_describe() -> None:
    """The figures the guides give are the settings' defaults (a changed default must
    change the guide)."""
    defaults = {name: f.default for name, f in Settings.model_fields.items()}
    fees, relay = _guide("fees"), _guide("relay-flow")
    assert defaults["class_slippage_bps"] == 400 and "plus 4 %" in fees and "\u00d7 1.04" in fees
    assert defaults["gas_budget_class"] == 450_000 and "450,000 gas for a class" in fees
    assert defaults["gas_budget_listing"] == 350_000 and "350,000 for a listing" in fees
    assert defaults["gas_allowance_margin_bps"] == 5_000 and "margin (by default 50 %)" in fees
    assert defaults["base_fee_multiplier"] == 2 and "twice the next block's base fee" in fees
    assert defaults["class_auth_lifetime_s"] == 3600 and "one hour for a class" in relay
    assert defaults["listing_auth_lifetime_s"] == 300 and "five minutes for a listing" in relay
    assert defaults["settle_wait_s"] == 45 and "up to 45 seconds" in relay
    assert AUTH_EXPIRY_MARGIN_S == 30 and "within 30 seconds" in relay


# ---------------------------------------------------------------------------- OpenAPI


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _error_codes(responses: dict[str, Any]) -> dict[str, set[str]]:
    out = {}
    for status, response in responses.items():
        if status.startswith(("4", "5")):
            schema = response["content"]["application/json"]["schema"]
            assert schema["allOf"][0] == {"$ref": "#/components/schemas/Error"}
            out[status] = set(schema["allOf"][1]["properties"]["error"]["enum"])
    return out


async def test_openapi_covers_every_action_from_the_model(client: TestClient[Any, Any]) -> None:
    status, doc = await _get(client, "/api/openapi.json")
    assert status == 200
    assert doc["openapi"] == "3.1.0" and doc["info"]["version"] == LATEST_VERSION
    assert doc["servers"] == [{"url": "http://x402.test"}]
    for ref in set(_refs(doc)):
        _resolve(doc, ref)  # every reference resolves
    schemas = doc["components"]["schemas"]
    assert schemas["Details"]["additionalProperties"] is False
    assert schemas["AuthPayload"]["additionalProperties"] is False
    assert schemas["Error"]["required"] == ["error", "message", "x402FacilitatorVersion"]
    fields = {f.alias or name for name, f in ActionRequest.model_fields.items()}
    for action in ACTIONS:  # each action's own fields, from the model, unknown keys refused
        request = schemas[_component(action)]
        assert request["additionalProperties"] is False
        assert set(request["properties"]) == set(ACTION_FIELDS[action]) <= fields
        assert request["required"][: len(ACTION_REQUIRED[action])] == list(ACTION_REQUIRED[action])

    post = doc["paths"]["/api"]["post"]
    one_of = post["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    consts = {_resolve(doc, s["$ref"])["properties"]["action"]["const"] for s in one_of}
    assert consts == set(ACTIONS)
    every = {c for a in ACTIONS for c in allowed_codes(a)}
    assert set().union(*_error_codes(post["responses"]).values()) == every

    for action in ACTIONS:
        operations = doc["paths"][f"/api/{action}"]
        assert ("get" in operations) is (action != "actions/retire"), action
        for operation in operations.values():
            by_status = _error_codes(operation["responses"])
            assert set().union(*by_status.values()) == set(allowed_codes(action)), action
            for status_text, codes in by_status.items():
                assert {REGISTRY[c].http_status for c in codes} == {int(status_text)}
        if "get" in operations:
            names = {p["name"] for p in operations["get"]["parameters"]}
            by_post = {"authPayload", "details"} | (
                {"listingId", "credit"} if action in CHOOSES_CREDIT else set()
            )
            assert {n for n in names if "." not in n} == set(ACTION_FIELDS[action]) - by_post
            if "details" in ACTION_FIELDS[action]:
                assert {n.split(".", 1)[1] for n in names if n.startswith("details.")} == set(
                    schemas["Details"]["properties"]
                )
    retire = doc["paths"]["/api/actions/retire"]["post"]["responses"]
    assert set(retire["200"]["content"]["application/json"]["schema"]["properties"]["status"]["enum"]) == {
        "settled",
        "pending_index",
    }
    assert (
        "submitted" in retire["202"]["content"]["application/json"]["schema"]["properties"]["status"]["enum"]
    )


async def test_openapi_lists_the_meta_routes(client: TestClient[Any, Any]) -> None:
    _, doc = await _get(client, "/api/openapi.json")
    for path in (
        "/.well-known/x402.json",
        "/.well-known/x402-changelog.json",
        "/.well-known/x402-errors.json",
        "/.well-known/security.txt",
        "/api/errors",
        "/api/docs",
        "/api/openapi.json",
    ):
        assert "get" in doc["paths"][path], path
    docs = doc["paths"]["/api/docs"]["get"]
    assert docs["parameters"][0]["schema"]["enum"] == list(GUIDE_IDS)
    assert "document_not_found" in _error_codes(docs["responses"])["404"]
    _, v0 = await _get(client, "/api/openapi.json", host="v0.x402.test")
    assert v0["components"]["schemas"]["QuoteRequest"]["additionalProperties"] is True
    assert v0["info"]["version"].startswith("0.")
