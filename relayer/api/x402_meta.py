"""The x402 endpoint's description of itself (spec: Endpoints, "Other routes"; Errors;
Versioning): the discovery manifest, the changelog, the errors document, ``security.txt``
(RFC 9116), the guide documents and the OpenAPI 3.1 document.

Policy: nothing here is written twice. Request schemas are generated from the pydantic
models that validate requests (:class:`~relayer.domain.schemas.ActionRequest`), error lists
and statuses come from the one registry (:mod:`relayer.domain.errors`), the retire statuses
from :mod:`relayer.service.outcome`; only the release history and the guides are prose.
Refusals are :class:`~relayer.domain.errors.Rejection`s, answered by the API's envelope.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar, get_args

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from relayer import package_data
from relayer.api import pages
from relayer.domain import chains, views
from relayer.domain.errors import (
    ACTION_CODES,
    COMMON_CODES,
    REGISTRY,
    X402_FACILITATOR_VERSION,
    X402_REGISTRY,
    Rejection,
    allowed_codes,
)
from relayer.domain.models import StrictModel
from relayer.domain.schemas import (
    ACTION_FIELDS,
    ACTION_REQUIRED,
    ACTIONS,
    CHOOSES_CREDIT,
    NAMES_BENEFICIARY,
    ActionRequest,
    validation_issues,
)
from relayer.service.outcome import RetireOutcome, Status

JSON: Final = "application/json"

MANIFEST_PATH: Final = "/.well-known/x402.json"
CHANGELOG_PATH: Final = "/.well-known/x402-changelog.json"
ERRORS_PATH: Final = "/.well-known/x402-errors.json"
SECURITY_TXT_PATH: Final = "/.well-known/security.txt"
API_ERRORS_PATH: Final = "/api/errors"
DOCS_PATH: Final = "/api/docs"
OPENAPI_PATH: Final = "/api/openapi.json"

POST_ONLY: Final = frozenset({"actions/retire"})
"""Actions with no GET route: they move funds, and a signature never goes in a URL."""
MOVES_FUNDS: Final = frozenset({"actions/retire"})
"""Actions that move the payer's funds (spec: Endpoints, "Moves funds")."""
PURPOSES: Final[Mapping[str, str]] = {
    "discover": "Lists carbonClasses[] and marketplaceListings[] with prices, credits and input tokens.",
    "quote": "Live price for a tonnage (retirement cost plus protocol fee), by carbonClass or listingId.",
    "prepare/retire": "The unsigned [approve, retire] batch for a caller that pays its own gas.",
    "prepare-auth": "EIP-712 typedData and a ready actionsRetireRequest for the gasless relay.",
    "actions/retire": "The executor submits the retirement; needs a signed authPayload.",
    "certificate": "Certificate URL(s) of the retirements of a txHash.",
}

GUIDE_IDS: Final = ("quick-start", "relay-flow", "errors", "fees", "versioning", "standard-x402")
"""The packaged guide documents (``relayer/guides/<id>.md``), in index order."""

PINNING_NOTE: Final = (
    "Pin a major by its host only; there is no version header, query parameter or Accept "
    "negotiation. `latest` serves the newest release and moves to a new major on a breaking "
    "release; `current` serves major 1 and every later 1.x minor and patch, and never moves to 2; "
    "`v0` serves the previous major, 0 (before either breaking release), kept reachable for "
    "migration only and not extended."
)

# The 200 and 202 statuses of actions/retire, from the outcome type itself.
FINAL_STATUSES: Final = tuple(s for s in get_args(Status) if RetireOutcome(s, {}).final)
WAITING_STATUSES: Final = tuple(s for s in get_args(Status) if not RetireOutcome(s, {}).final)


@dataclass(frozen=True, slots=True)
class X402Info:
    """What this host is, per request (the ``Host`` decides the major).

    Attributes:
        api_version: semantic version of the latest release, e.g. ``"1.1.0"``.
        major: the major this request is served as (1, or 0 on the v0 host).
        base_url: this host's x402 base URL, e.g. ``"http://127.0.0.1:8402/api"``.
        versioned_hosts: ``{"latest", "current" (the major-1 host), "v0"}`` base URLs.
        chain_id: the chain served (8453 or 84532).
        settlement: the checksummed settlement contract address.
        input_tokens: ``[{"symbol", "address", "decimals", "scheme"}]``, scheme
            ``"eip3009"`` or ``"eip2612"``.
        security_contact: the RFC 9116 ``Contact`` URI, e.g. ``"mailto:security@example.org"``.
    """

    api_version: str
    major: int
    base_url: str
    versioned_hosts: dict[str, str]
    chain_id: int
    settlement: str
    input_tokens: list[dict[str, Any]]
    security_contact: str


# ---------------------------------------------------------------------------- releases


@dataclass(frozen=True, slots=True)
class Release:
    """One release of the API (dates ISO 8601). A breaking release says in ``migration``
    what a caller changes; ``changes`` lists what it brought, one sentence each."""

    version: str
    date: str
    breaking: bool
    summary: str
    changes: tuple[str, ...]
    migration: str | None = None

    def body(self) -> views.ReleaseNote:
        out: views.ReleaseNote = {
            "version": self.version,
            "date": self.date,
            "breaking": self.breaking,
            "summary": self.summary,
            "changes": list(self.changes),
        }
        if self.migration is not None:
            out["migration"] = self.migration
        return out


RELEASES: Final[tuple[Release, ...]] = (
    Release(
        "1.3.0",
        "2026-11-26",
        False,
        "Additive: 405 method_not_allowed on a known path asked with another method, and an "
        "OpenAPI document with per-action request schemas and typed answers.",
        (
            "A known path asked with a method it does not serve answers 405 "
            "`method_not_allowed` (not retryable) with `allow` and the `Allow` header; it "
            "answered 404 `not_found` before. GET /api/actions/retire answers 405 (Allow: POST).",
            "GET /api/openapi.json declares each action's own request schema (the fields it "
            "reads, those it needs), a typed schema for every 2xx answer, and every status "
            "an operation can answer (429 with Retry-After, 405 with Allow, 503).",
            "A 400's `issues[].message` names the field and the rule it broke.",
        ),
    ),
    Release(
        "1.2.0",
        "2026-11-24",
        False,
        "Additive: a per-client rate limit, answered 429 rate_limited on any route.",
        (
            "Any route may answer 429 `rate_limited` (retryable: wait `retryAfterSeconds`, also "
            "sent as the Retry-After header) when a client sends more than the operator's limit.",
            "A request that runs past the operator's request timeout answers the retryable "
            "`internal_error` with `cause` `timeout`.",
        ),
    ),
    Release(
        "1.1.0",
        "2026-11-24",
        False,
        "Additive: a 202 answer of actions/retire while its relay is on its way, "
        "payment_unavailable on actions/retire, and the OpenAPI document.",
        (
            "actions/retire may answer HTTP 202 with status `submitted` (broadcast, "
            "`transactionHash` given) or `accepted` (not yet broadcast, `transactionHash` null) "
            "when the relay is still on its way after the wait; post the identical request "
            "again to get its outcome (the same transaction, never a second one).",
            "actions/retire may answer 503 `payment_unavailable` (retryable) when every "
            "executor key is below its ETH floor: nothing was recorded or signed.",
            "GET /api/openapi.json: an OpenAPI 3.1 document of the whole endpoint, generated "
            "from the models that validate requests.",
        ),
    ),
    Release(
        "1.0.0",
        "2026-11-22",
        True,
        "Major 1: the second breaking release, rejecting unknown top-level keys. With "
        "1.0.0-rc.1 before it, the two breaking releases bundled into one major bump.",
        (
            "Breaking: rejecting unknown top-level keys. A request with a top-level key the "
            "endpoint does not know answers 400 `schema_validation`, naming the keys in "
            "`issues[].keys`; major 0 ignored them.",
        ),
        migration=(
            "Remove every top-level key the manifest's request schemas do not list (a 400 "
            "`schema_validation` names them in `issues[].keys`; keys inside `details` and "
            "`authPayload` were always checked). Until then the v0 host keeps serving major 0."
        ),
    ),
    Release(
        "1.0.0-rc.1",
        "2026-11-22",
        True,
        "The first breaking release, a newly required attribution field: a pre-release of "
        "major 1, which 1.0.0 completed.",
        (
            "Breaking: a newly required attribution field. A relayed retirement (prepare-auth "
            "and actions/retire) must name its beneficiary: `details.beneficiaryAddress`, or "
            "`details.beneficiaryIsPayer: true` (rule 6); without one it answers 400 "
            "`attribution_required`. Major 0 retired for the payer.",
        ),
        migration=(
            "Send `details.beneficiaryAddress` (the beneficiary's address) or "
            "`details.beneficiaryIsPayer: true` with every prepare-auth and actions/retire "
            "request (prepare-auth's `actionsRetireRequest` then carries it: post it back "
            "unchanged). Until then the v0 host keeps serving major 0."
        ),
    ),
    Release(
        "0.9.0",
        "2026-11-22",  # no earlier date of its own here: the day this service began (with 1.0.0)
        False,
        "Major 0 (the public endpoint's rules before either breaking release), served on the "
        "v0 host for migration only.",
        (
            "discover, quote, prepare/retire, prepare-auth, actions/retire and certificate, "
            "by GET or by POST to /api with `action`.",
            "Unknown top-level keys are ignored.",
            "No attribution field is required: a relayed retirement that names no beneficiary "
            "retires for the payer.",
        ),
    ),
)
"""The releases, newest first."""

LATEST_VERSION: Final = RELEASES[0].version
STRICT_KEYS_MAJOR: Final = 1
"""The first major that refuses unknown top-level request keys (release 1.0.0)."""


def ignores_unknown_keys(major: int) -> bool:
    """Whether ``major`` ignores unknown top-level request keys (major 0) rather than
    refusing them (major 1 on)."""
    return major < STRICT_KEYS_MAJOR


def _semver(version: str) -> tuple[int, int, int, int, str]:
    """A sort key of a semantic version: a pre-release (``1.0.0-rc.1``) before its release
    (SemVer 2.0.0 section 11; our pre-release identifiers compare as one string)."""
    core, _, pre = version.partition("-")
    major, minor, patch = (int(part) for part in core.split("."))
    return (major, minor, patch, 0 if pre else 1, pre)


def releases_up_to(api_version: str) -> list[Release]:
    """The releases up to and including ``api_version``, newest first."""
    latest = _semver(api_version)
    return [r for r in RELEASES if _semver(r.version) <= latest]


def newest_of_major(major: int, latest: str = LATEST_VERSION) -> str:
    """The version a host of ``major`` serves: the newest release of that major up to
    ``latest`` (``latest`` itself when the major has none)."""
    return next((r.version for r in releases_up_to(latest) if _semver(r.version)[0] == major), latest)


def served_version(info: X402Info) -> str:
    """The version this host serves: the newest release of its major (up to the latest)."""
    return newest_of_major(info.major, info.api_version)


def versioned_hosts(info: X402Info) -> views.VersionedHosts:
    """``versionedHosts``: ``latest``, ``current``, ``v0`` and the pinning ``note``."""
    hosts = info.versioned_hosts
    return {
        "latest": hosts.get("latest", info.base_url),
        "current": hosts.get("current", info.base_url),
        "v0": hosts.get("v0", info.base_url),
        "note": PINNING_NOTE,
    }


# ---------------------------------------------------------------------------- schemas

_REQUEST_SCHEMA: Final = ActionRequest.model_json_schema()


def action_schema(action: str, major: int) -> dict[str, Any]:
    """The JSON Schema (2020-12) of a POST body of ``action``, from :class:`ActionRequest`:
    ``action`` its constant, unknown keys refused (major 1) or ignored at the top level
    (major 0)."""
    schema = copy.deepcopy(_REQUEST_SCHEMA)
    schema["properties"]["action"] = {"const": action, "type": "string"}
    schema["required"] = ["action"]
    schema["title"] = f"{action} request"
    if ignores_unknown_keys(major):
        schema["additionalProperties"] = True
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _origin(info: X402Info) -> str:
    """The host's root URL (well-known documents live there), from its x402 base URL."""
    return info.base_url.removesuffix("/").removesuffix("/api")


# ---------------------------------------------------------------------------- documents


def manifest_document(info: X402Info) -> views.Manifest:
    """``/.well-known/x402.json`` (spec: Endpoints; Versioning): versions and hosts, chain,
    settlement, input tokens, and per action its routes, live schema and error codes."""
    return {
        "name": "x402 carbon retirement endpoint",
        "apiVersion": served_version(info),
        "latestApiVersion": info.api_version,
        "major": info.major,
        "versionedHosts": versioned_hosts(info),
        "x402FacilitatorVersion": X402_FACILITATOR_VERSION,
        "baseUrl": info.base_url,
        "settlement": info.settlement,
        "chains": [
            {
                "chainId": info.chain_id,
                "name": chains.display_name(info.chain_id),
                "network": chains.caip2(info.chain_id),
            }
        ],
        "inputTokens": info.input_tokens,
        "actions": [
            {
                "action": action,
                "purpose": PURPOSES[action],
                "get": None if action in POST_ONLY else f"/api/{action}",
                "post": "/api",
                "movesFunds": action in MOVES_FUNDS,
                "schema": action_schema(action, info.major),
                "errors": list(allowed_codes(action)),
            }
            for action in ACTIONS
        ],
        "extensions": extensions(),
        "standardX402": standard_x402(info),
        "errors": ERRORS_PATH,
        "changelog": CHANGELOG_PATH,
        "openapi": OPENAPI_PATH,
        "docs": DOCS_PATH,
        "securityTxt": SECURITY_TXT_PATH,
    }


def standard_x402(info: X402Info) -> views.StandardX402:
    """Where this host speaks the standard x402 v2 protocol (design: docs/design/x402-v2.md):
    the retirement endpoint as a standard resource (its headers) and the facilitator's
    routes (public or behind a bearer API key of scope ``facilitator``)."""
    origin = _origin(info)
    return {
        "x402Version": 2,
        "scheme": "exact",
        "network": chains.caip2(info.chain_id),
        "resource": {
            "url": f"{info.base_url}/actions/retire",
            "method": "POST",
            "paymentRequiredHeader": "PAYMENT-REQUIRED",
            "paymentHeader": "PAYMENT-SIGNATURE",
            "paymentResponseHeader": "PAYMENT-RESPONSE",
            "asset": "USDC",
        },
        "facilitator": {
            "url": f"{origin}/facilitator",
            "supported": f"{origin}/facilitator/supported",
            "verify": f"{origin}/facilitator/verify",
            "settle": f"{origin}/facilitator/settle",
            "discovery": f"{origin}/facilitator/discovery/resources",
            "authentication": "Authorization: Bearer <API key of scope facilitator> on verify and settle",
        },
        "guide": f"{info.base_url}/docs?id=standard-x402",
    }


def extensions() -> list[views.Extension]:
    """The additive extensions beyond the spec's text (both in 1.1.0)."""
    unavailable = REGISTRY["payment_unavailable"]
    return [
        {
            "name": "retire-202-while-on-its-way",
            "since": "1.1.0",
            "action": "actions/retire",
            "httpStatus": 202,
            "statuses": list(WAITING_STATUSES),
            "finalStatuses": list(FINAL_STATUSES),
            "description": (
                "When the relay is still on its way after the wait, actions/retire answers 202 "
                '{"status": "submitted", "transactionHash", "jobId", "chainId"} (or status '
                '"accepted" with a null transactionHash before it is broadcast). Post the '
                "identical request again to get its outcome: settled or pending_index, with the "
                "same transaction."
            ),
        },
        {
            "name": "retire-payment-unavailable",
            "since": "1.1.0",
            "action": "actions/retire",
            "error": unavailable.code,
            "httpStatus": unavailable.http_status,
            "retryable": unavailable.retryable,
            "description": (
                "actions/retire answers payment_unavailable when every executor key is below its "
                "ETH floor: no new work is taken (nothing is recorded or signed) until the operator "
                "tops one up. The identical request of a relay already taken is still answered."
            ),
        },
    ]


def changelog_document(info: X402Info) -> views.Changelog:
    """``/.well-known/x402-changelog.json`` (spec: Versioning): every release up to the
    latest, newest first; each breaking one with its ``migration``."""
    return {
        "apiVersion": served_version(info),
        "latestApiVersion": info.api_version,
        "versionedHosts": versioned_hosts(info),
        "releases": [r.body() for r in releases_up_to(info.api_version)],
    }


def errors_document(info: X402Info) -> views.ErrorsDocument:
    """``/.well-known/x402-errors.json`` and ``GET /api/errors`` (spec: Errors): every
    registered code in the spec's order, the common codes and each action's own codes."""
    return {
        "apiVersion": served_version(info),
        "x402FacilitatorVersion": X402_FACILITATOR_VERSION,
        "errors": [
            {
                "code": spec.code,
                "httpStatus": spec.http_status,
                "group": spec.group,
                "retryable": spec.retryable,
                "message": spec.message,
            }
            for spec in X402_REGISTRY.values()
        ],
        "commonCodes": list(COMMON_CODES),
        "actions": {action: list(ACTION_CODES[action]) for action in ACTIONS},
        "note": "Every action may answer its own codes and the commonCodes. Match on `error`, "
        "never on `message`; `retryable` says whether the identical request can succeed later.",
    }


def security_txt(info: X402Info, now: datetime) -> str:
    """RFC 9116 ``security.txt``: ``Expires`` one year (365 days) after ``now`` (UTC)."""
    expires = (now.astimezone(UTC) + timedelta(days=365)).replace(microsecond=0)
    return (
        f"Contact: {info.security_contact}\n"
        f"Expires: {expires.strftime('%Y-%m-%dT%H:%M:%SZ')}\n"
        "Preferred-Languages: en\n"
        f"Canonical: {_origin(info)}{SECURITY_TXT_PATH}\n"
        f"Policy: {info.base_url}/docs\n"
    )


# ---------------------------------------------------------------------------- guides


@dataclass(frozen=True, slots=True)
class Guide:
    """A guide document: its first line is ``# title``, its first paragraph the summary."""

    id: str
    title: str
    summary: str
    markdown: str = field(repr=False)

    @classmethod
    def parse(cls, guide_id: str, markdown: str) -> Guide:
        """Raises ValueError when the document does not open with ``# title`` and a paragraph."""
        lines = markdown.splitlines()
        if not lines or not lines[0].startswith("# "):
            raise ValueError(f"guide {guide_id} does not open with '# title'")
        paragraphs = "\n".join(lines[1:]).strip().split("\n\n")
        summary = " ".join(paragraphs[0].split())
        if not summary or summary.startswith("#"):
            raise ValueError(f"guide {guide_id} has no summary paragraph")
        return cls(guide_id, lines[0][2:].strip(), summary, markdown)


def load_guides() -> dict[str, Guide]:
    """Every packaged guide of :data:`GUIDE_IDS`, by id.

    Raises:
        FileNotFoundError: a guide is not packaged.
        ValueError: a guide has no title or summary.
    """
    return {gid: Guide.parse(gid, package_data.guide(gid)) for gid in GUIDE_IDS}


_PLACEHOLDER: Final = re.compile(
    r"\{(x402_base_url|x402_latest_base_url|x402_v1_base_url|x402_v0_base_url|"
    r"origin|chain_id)\}"
)


def render(markdown: str, info: X402Info) -> str:
    """A guide with this host's URLs and chain filled in (``{x402_base_url}``,
    ``{x402_latest_base_url}``, ``{x402_v1_base_url}``, ``{x402_v0_base_url}``,
    ``{origin}``, ``{chain_id}``)."""
    values = {
        "x402_base_url": info.base_url,
        "x402_latest_base_url": info.versioned_hosts.get("latest", info.base_url),
        "x402_v1_base_url": info.versioned_hosts.get("current", info.base_url),
        "x402_v0_base_url": info.versioned_hosts.get("v0", info.base_url),
        "origin": _origin(info),
        "chain_id": str(info.chain_id),
    }
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], markdown)


def docs_index(info: X402Info, guides: Mapping[str, Guide]) -> views.GuideIndex:
    """``GET /api/docs``: ``{documents: [{id, title, summary, url}]}``."""
    return {
        "documents": [
            {
                "id": g.id,
                "title": render(g.title, info),
                "summary": render(g.summary, info),
                "url": f"{info.base_url}/docs?id={g.id}",
            }
            for g in guides.values()
        ]
    }


def guide_document(info: X402Info, guide: Guide) -> views.GuideDocument:
    """``GET /api/docs?id=<id>``: ``{id, title, format: "markdown", body}``."""
    return {
        "id": guide.id,
        "title": render(guide.title, info),
        "format": "markdown",
        "body": render(guide.markdown, info),
    }


# ---------------------------------------------------------------------------- OpenAPI 3.1


def _without_null(prop: Mapping[str, Any]) -> dict[str, Any]:
    """A query parameter's schema from an optional field's: a parameter is absent or a
    value, never JSON null (the null branch goes; the title and null default too)."""
    branches = [b for b in prop.get("anyOf", ()) if b.get("type") != "null"]
    if not branches:
        schema = {k: v for k, v in prop.items() if k not in ("default", "title")}
    elif len(branches) == 1:
        schema = {**branches[0], **{k: v for k, v in prop.items() if k not in ("anyOf", "default", "title")}}
    else:
        schema = {k: v for k, v in prop.items() if k not in ("anyOf", "default", "title")}
        schema["anyOf"] = branches
    if prop.get("default") is not None:
        schema["default"] = prop["default"]
    return schema


def _ref_name(prop: Mapping[str, Any]) -> str | None:
    """The component a property refers to (directly or as the non-null branch of anyOf)."""
    for branch in (prop, *prop.get("anyOf", ())):
        ref = branch.get("$ref")
        if isinstance(ref, str):
            return ref.rsplit("/", 1)[1]
    return None


def _no_nul(schema: Any) -> None:
    """Every free string of a request (no pattern, enum or const of its own) says the rule
    every request string keeps: no NUL character (see ``schemas._Strict``)."""
    if isinstance(schema, list):
        for item in schema:
            _no_nul(item)
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "string" and not {"pattern", "enum", "const"} & set(schema):
        schema["pattern"] = "^[^\\x00]*$"
    for value in schema.values():
        _no_nul(value)


@dataclass(frozen=True, slots=True)
class _Model:
    """:class:`ActionRequest`'s JSON Schema as the document refers to it, with this host's
    facts: the one ``chainId`` served and the input tokens accepted (symbols and addresses,
    matched without regard to case)."""

    properties: dict[str, Any]
    defs: dict[str, Any]

    @classmethod
    def of(cls, info: X402Info) -> _Model:
        model = ActionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        properties = dict(model["properties"])
        properties["chainId"] = {"type": "integer", "enum": [info.chain_id]}
        tokens = [t[k] for t in info.input_tokens for k in ("symbol", "address")]
        properties["inputToken"] = {"type": "string", "enum": tokens, "description": "default USDC"}
        defs = model.get("$defs", {})
        for schema in (*properties.values(), *defs.values()):
            _no_nul(schema)
        return cls(properties, defs)


def action_request_schema(model: _Model, action: str, major: int, with_action: bool) -> dict[str, Any]:
    """The body of ``action`` (by POST; ``with_action``: to ``/api``, naming it in
    ``action``): the fields it reads (:data:`ACTION_FIELDS`), those it needs required, exactly
    one way to choose the credit, and on major 1 the beneficiary named and no unknown key."""
    fields = ACTION_FIELDS[action]
    required = ACTION_REQUIRED[action]
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            name: _without_null(model.properties[name]) if name in required else model.properties[name]
            for name in fields
        },
        "required": list(required),
        "additionalProperties": ignores_unknown_keys(major),
    }
    if with_action:
        schema["properties"] = {"action": {"type": "string", "const": action}, **schema["properties"]}
        schema["required"] = ["action", *schema["required"]]
    rules: list[dict[str, Any]] = []
    if action in CHOOSES_CREDIT:
        rules.append(_ONE_CREDIT)
    if action in NAMES_BENEFICIARY and major != 0:
        schema["required"].append("details")
        rules.append({"properties": {"details": _BENEFICIARY_NAMED}})
    if rules:
        schema["allOf"] = rules
    return schema


def _given(name: str) -> dict[str, Any]:
    """``name`` is given: present and not null (the server reads null as absent)."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


_ONE_CREDIT: Final = {
    "oneOf": [
        {"allOf": [_given("carbonClass")], "not": _given("listingId")},
        {"allOf": [_given("listingId")], "not": _given("carbonClass")},
        {"allOf": [_given("credit")], "not": {"anyOf": [_given("carbonClass"), _given("listingId")]}},
    ],
    "description": "exactly one of carbonClass and listingId, or credit alone",
}
_BENEFICIARY_NAMED: Final = {
    "anyOf": [
        {"required": ["beneficiaryAddress"], "properties": {"beneficiaryAddress": {"type": "string"}}},
        {"required": ["beneficiaryIsPayer"], "properties": {"beneficiaryIsPayer": {"const": True}}},
    ],
    "description": "names the beneficiary (rule 6): beneficiaryAddress, or beneficiaryIsPayer true",
}


_BY_POST_ONLY: Final = frozenset({"listingId", "credit"})
"""Ways to choose a credit the GET document leaves to POST (one query cannot say "exactly one
of" in OpenAPI): by GET an action that chooses a credit names its ``carbonClass``."""


def _query_parameters(model: _Model, action: str, major: int) -> list[dict[str, Any]]:
    """GET query parameters of ``action``: its fields, a nested object's fields as
    ``object.field`` (one level, as the GET route nests them); ``authPayload`` never goes in
    a URL (only actions/retire, POST only, takes it)."""
    required = set(ACTION_REQUIRED[action])
    if action in CHOOSES_CREDIT:
        required.add("carbonClass")  # by GET, the class; a listing or a credit alone by POST
    if action in NAMES_BENEFICIARY and major != 0:
        required.add("details.beneficiaryIsPayer")  # by GET, the payer: an address goes by POST
    params: list[dict[str, Any]] = []
    for name in ACTION_FIELDS[action]:
        if action in CHOOSES_CREDIT and name in _BY_POST_ONLY:
            continue
        prop = model.properties[name]
        ref = _ref_name(prop)
        nested = (
            {name: prop}
            if ref is None
            else {f"{name}.{k}": v for k, v in model.defs[ref]["properties"].items()}
        )
        params.extend(
            {"name": key, "in": "query", "required": key in required, "schema": _without_null(value)}
            for key, value in nested.items()
        )
    return params


_RETRY_AFTER: Final = {
    "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer", "minimum": 1}}
}
_ALWAYS: Final = ("rate_limited",)
"""What every route can answer beside its own codes (the per-client rate limit)."""


def _error_responses(codes: tuple[str, ...]) -> dict[str, Any]:
    """The error responses of an operation by HTTP status, from the registry, with the rate
    limit's 429 (``Retry-After``) that every route can answer (a body over the limit is 400
    ``schema_validation``)."""
    by_status: dict[int, list[str]] = {}
    for code in dict.fromkeys((*codes, *_ALWAYS)):
        by_status.setdefault(REGISTRY[code].http_status, []).append(code)
    out: dict[str, Any] = {}
    for status, found in sorted(by_status.items()):
        response: dict[str, Any] = {
            "description": ", ".join(found),
            "content": {
                JSON: {
                    "schema": {
                        "allOf": [
                            {"$ref": "#/components/schemas/Error"},
                            {"properties": {"error": {"enum": found}}},
                        ]
                    }
                }
            },
        }
        if status == 429:
            response["headers"] = _RETRY_AFTER
        out[str(status)] = response
    return out


ERROR_SCHEMA: Final = {
    "type": "object",
    "required": ["error", "message", "x402FacilitatorVersion"],
    "properties": {
        "error": {"type": "string", "enum": list(X402_REGISTRY), "description": "the code: match on it"},
        "message": {"type": "string", "description": "human text; never match on it"},
        "x402FacilitatorVersion": {"const": X402_FACILITATOR_VERSION},
        "issues": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["path", "keys", "message"],
                "properties": {
                    "path": {"type": "array", "items": {"type": ["string", "integer"]}},
                    "keys": {"type": "array", "items": {"type": "string"}},
                    "message": {"type": "string", "description": "the rule the field broke"},
                },
            },
        },
        "allow": {"type": "array", "items": {"type": "string"}, "description": "405: the methods served"},
        "retryAfterSeconds": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": True,
    "description": "The error envelope; code-specific context fields beside these three.",
}


def _component(action: str, suffix: str = "Request") -> str:
    """``prepare/retire`` -> ``PrepareRetireRequest``."""
    return "".join(part.capitalize() for part in re.split(r"[/-]", action)) + suffix


def _ok(description: str, schema: dict[str, Any], media: str = JSON) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": schema}}}


def _answer(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _action_responses(action: str) -> dict[str, Any]:
    if action != "actions/retire":
        return {
            "200": _ok(PURPOSES[action], _answer(_component(action, "Answer"))),
            **_error_responses(allowed_codes(action)),
        }
    return {
        "200": _ok("final: " + " or ".join(FINAL_STATUSES), _status_schema(FINAL_STATUSES)),
        "202": _ok(
            "still on its way after the wait: post the identical request again",
            _status_schema(WAITING_STATUSES),
        ),
        **_error_responses(allowed_codes(action)),
    }


def _status_schema(statuses: tuple[str, ...]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["status", "transactionHash"],
        "properties": {
            "status": {"enum": list(statuses)},
            "transactionHash": {"type": ["string", "null"]},
        },
    }


_META_CODES: Final = ("schema_validation", "internal_error")


ANSWERS: Final = (
    views.Index,
    views.DiscoverAnswer,
    views.QuoteAnswer,
    views.PrepareRetireAnswer,
    views.PrepareAuthAnswer,
    views.CertificateAnswer,
    views.Manifest,
    views.Changelog,
    views.ErrorsDocument,
    views.GuideIndex,
    views.GuideDocument,
    views.OpenApiDocument,
)
"""The typed answers of the actions, the index and the self-description documents (the
builders return them)."""


def answer_schemas() -> dict[str, Any]:
    """The JSON Schemas of :data:`ANSWERS` and the shapes they nest, by name."""
    schemas: dict[str, Any] = {}
    for shape in ANSWERS:
        schema = views.json_schema(shape)
        schemas.update(schema.pop("$defs", {}))
        schemas[shape.__name__] = schema
    return schemas


def openapi_document(info: X402Info) -> views.OpenApiDocument:
    """The whole x402 endpoint as OpenAPI 3.1: each action by GET (its query parameters)
    and by POST (its own request schema, from the request model: the fields it reads, those
    it needs, unknown keys refused on major 1), the meta routes, each operation's answers
    (typed: :data:`ANSWERS`) and errors by HTTP status from the registry."""
    model = _Model.of(info)
    paths: dict[str, Any] = {"/api": _post_any_action()}
    for action in ACTIONS:
        paths[f"/api/{action}"] = _action_operations(model, action, info.major)
    paths.update(_meta_paths())
    schemas: dict[str, Any] = {"Error": ERROR_SCHEMA, **model.defs, **answer_schemas()}
    for action in ACTIONS:
        schemas[_component(action)] = action_request_schema(model, action, info.major, False)
        schemas[_component(action, "ApiRequest")] = action_request_schema(model, action, info.major, True)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "x402 carbon retirement endpoint",
            "version": served_version(info),
            "description": f"Major {info.major}. Each action by GET with query parameters or by POST "
            "to /api with `action`; both answer the same. Errors: {error, message, "
            "x402FacilitatorVersion, ...context}; match on `error`. A method a path does not serve "
            "answers 405 `method_not_allowed` with Allow.",
        },
        "servers": [{"url": _origin(info)}],
        "components": {"schemas": schemas},
        "paths": paths,
    }


def _post_any_action() -> dict[str, Any]:
    """``/api``: the action index by GET, and any action by POST (chosen by the body's
    ``action``), with every action's errors."""
    every_code = tuple(dict.fromkeys(c for a in ACTIONS for c in allowed_codes(a)))
    mapping = {a: f"#/components/schemas/{_component(a, 'ApiRequest')}" for a in ACTIONS}
    return {
        "get": {
            "operationId": "index",
            "summary": "the action index",
            "responses": {"200": _ok("index", _answer("Index")), **_error_responses(_META_CODES)},
        },
        "post": {
            "operationId": "post_action",
            "summary": "any action, chosen by the body's `action`",
            "requestBody": {
                "required": True,
                "content": {
                    JSON: {
                        "schema": {
                            "oneOf": [{"$ref": ref} for ref in mapping.values()],
                            "discriminator": {"propertyName": "action", "mapping": mapping},
                        }
                    }
                },
            },
            "responses": {
                "200": _ok(
                    "the action's answer",
                    {
                        "anyOf": [
                            *(_answer(_component(a, "Answer")) for a in ACTIONS if a != "actions/retire"),
                            _status_schema(FINAL_STATUSES),
                        ]
                    },
                ),
                "202": _ok("actions/retire still on its way", _status_schema(WAITING_STATUSES)),
                **_error_responses(every_code),
            },
        },
    }


def _action_operations(model: _Model, action: str, major: int) -> dict[str, Any]:
    """``/api/<action>``: by POST (its request schema as body), and unless the action is
    POST only, by GET with its query parameters."""
    operations: dict[str, Any] = {
        "post": {
            "operationId": f"post_{_component(action)}",
            "summary": PURPOSES[action],
            "requestBody": {
                "required": True,
                "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{_component(action)}"}}},
            },
            "responses": _action_responses(action),
        }
    }
    if action not in POST_ONLY:
        operations["get"] = {
            "operationId": f"get_{_component(action)}",
            "summary": PURPOSES[action],
            "parameters": _query_parameters(model, action, major),
            "responses": _action_responses(action),
        }
    return operations


def _meta_paths() -> dict[str, Any]:
    """The self-description routes: manifest, changelog, errors documents, this document,
    security.txt and the guides; the probes."""
    meta_errors = _error_responses(_META_CODES)
    paths: dict[str, Any] = {}
    for path, description, shape in (
        (MANIFEST_PATH, "the discovery manifest", views.Manifest),
        (CHANGELOG_PATH, "the changelog", views.Changelog),
        (ERRORS_PATH, "the errors document", views.ErrorsDocument),
        (API_ERRORS_PATH, "the errors document", views.ErrorsDocument),
        (OPENAPI_PATH, "this document", views.OpenApiDocument),
    ):
        paths[path] = {
            "get": {
                "summary": description,
                "responses": {"200": _ok(description, _answer(shape.__name__)), **meta_errors},
            }
        }
    paths[SECURITY_TXT_PATH] = {
        "get": {
            "summary": "RFC 9116 security.txt",
            "responses": {
                "200": _ok("security.txt", {"type": "string"}, "text/plain"),
                **_error_responses(()),
            },
        }
    }
    paths[DOCS_PATH] = {
        "get": {
            "summary": "the guide index, or one guide by id",
            "parameters": [
                {
                    "name": "id",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "enum": list(GUIDE_IDS)},
                }
            ],
            "responses": {
                "200": _ok(
                    "{documents: [{id, title, summary, url}]}, or {id, title, format, body}",
                    {"anyOf": [_answer("GuideIndex"), _answer("GuideDocument")]},
                ),
                **_error_responses(("document_not_found", *_META_CODES)),
            },
        }
    }
    return paths


# ---------------------------------------------------------------------------- routes

X402_INFO: Final[web.AppKey[Callable[[web.Request], X402Info]]] = web.AppKey("x402_info")
GUIDES: Final[web.AppKey[Mapping[str, Guide]]] = web.AppKey("x402_guides")


class DocsQuery(StrictModel):
    """The query of ``GET /api/docs``: ``id`` only."""

    id: str | None = Field(default=None, max_length=100)


class NoQuery(StrictModel):
    """The query of a route that takes none."""


_Q = TypeVar("_Q", bound=BaseModel)


def _query(request: web.Request, model: type[_Q]) -> _Q:
    """The request's query, strictly.

    Raises:
        Rejection: ``schema_validation`` (unknown or repeated keys; ``issues`` as every
            other schema error).
    """
    query = dict(request.query)
    if len(query) != len(request.query):
        keys = [key for key, _ in request.query.items()]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        raise Rejection(
            "schema_validation",
            "repeated query parameters",
            issues=[{"path": [], "keys": repeated, "message": "repeated"}],
        )
    try:
        return model.model_validate(query)
    except ValidationError as exc:
        raise Rejection("schema_validation", issues=validation_issues(exc, query)) from None


def _json(body: Mapping[str, Any]) -> web.Response:
    return web.Response(text=json.dumps(body), content_type=JSON)


def _info(request: web.Request) -> X402Info:
    return request.app[X402_INFO](request)


async def manifest(request: web.Request) -> web.Response:
    return _json(manifest_document(_info(request)))


async def changelog(request: web.Request) -> web.Response:
    return _json(changelog_document(_info(request)))


async def errors_well_known(request: web.Request) -> web.Response:
    return _json(errors_document(_info(request)))


async def errors_api(request: web.Request) -> web.Response:
    _query(request, NoQuery)
    return _json(errors_document(_info(request)))


async def security(request: web.Request) -> web.Response:
    return web.Response(text=security_txt(_info(request), datetime.now(UTC)), content_type="text/plain")


async def docs(request: web.Request) -> web.Response:
    """The guide index, or one guide.

    Raises:
        Rejection: ``document_not_found`` (``available`` lists the ids), ``schema_validation``.
    """
    wanted = _query(request, DocsQuery).id
    guides = request.app[GUIDES]
    info = _info(request)
    html = pages.wants_html(request)
    if wanted is None:
        if html:
            return pages.html_response(docs_index_page(info, guides))
        return _vary(_json(docs_index(info, guides)))
    guide = guides.get(wanted)
    if guide is None:
        raise Rejection(
            "document_not_found", f"no guide document {wanted!r}", id=wanted, available=list(guides)
        )
    if html:
        return pages.html_response(guide_page(info, guide))
    return _vary(_json(guide_document(info, guide)))


def _vary(response: web.Response) -> web.Response:
    response.headers["Vary"] = "Accept"
    return response


NAV: Final = (("/", "Home"), (DOCS_PATH, "Guides"), (OPENAPI_PATH, "OpenAPI"), (MANIFEST_PATH, "Manifest"))
"""The links above every HTML page (the root, the guides, the OpenAPI and x402 documents)."""


def docs_index_page(info: X402Info, guides: Mapping[str, Guide]) -> str:
    """``GET /api/docs`` for a browser: the guides' titles (links) and summaries."""
    e = pages.e
    items = "\n".join(
        f'<dt><a href="?id={e(g.id)}">{e(render(g.title, info))}</a></dt>'
        f'<dd class="summary">{e(render(g.summary, info))}</dd>'
        for g in guides.values()
    )
    body = (
        "<h1>Guides</h1>\n"
        f"<dl>\n{items}\n</dl>\n"
        f"<p>The same as JSON: <code>GET {e(DOCS_PATH)}</code> with <code>Accept: {JSON}</code>"
        f" (or without <code>Accept</code>); one guide: <code>?id=&lt;id&gt;</code>.</p>"
    )
    return pages.page("Guides: x402 carbon retirement endpoint", body, NAV)


def guide_page(info: X402Info, guide: Guide) -> str:
    """``GET /api/docs?id=<id>`` for a browser: the guide's Markdown as HTML (escaped)."""
    return pages.page(render(guide.title, info), pages.markdown_html(render(guide.markdown, info)), NAV)


async def openapi(request: web.Request) -> web.Response:
    _query(request, NoQuery)
    return _json(openapi_document(_info(request)))


def add_meta_routes(app: web.Application, info_of: Callable[[web.Request], X402Info]) -> None:
    """Mount ``GET /.well-known/x402.json``, ``/.well-known/x402-changelog.json``,
    ``/.well-known/x402-errors.json``, ``/.well-known/security.txt``, ``/api/errors``,
    ``/api/docs`` (``?id=``) and ``/api/openapi.json`` (before the ``/api/{action}`` routes).

    Args:
        app: the daemon's application; its envelope middleware answers the refusals.
        info_of: this host's :class:`X402Info` for a request (the ``Host`` decides the major).

    Raises:
        FileNotFoundError, ValueError: a guide document is missing or malformed (at start).
    """
    app[X402_INFO] = info_of
    app[GUIDES] = load_guides()
    r = app.router
    r.add_get(MANIFEST_PATH, manifest)
    r.add_get(CHANGELOG_PATH, changelog)
    r.add_get(ERRORS_PATH, errors_well_known)
    r.add_get(SECURITY_TXT_PATH, security)
    r.add_get(API_ERRORS_PATH, errors_api)
    r.add_get(DOCS_PATH, docs)
    r.add_get(OPENAPI_PATH, openapi)
