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
from relayer.domain import chains
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
from relayer.domain.schemas import ACTIONS, ActionRequest, validation_issues
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
    "`v0` serves the previous major, 0, kept reachable for migration only and not extended."
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

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
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
        "Major 1: the two breaking changes, bundled into one major bump.",
        (
            "Breaking: a newly required attribution field. A relayed retirement (prepare-auth "
            "and actions/retire) must name its beneficiary: `details.beneficiaryAddress`, or "
            "`details.beneficiaryIsPayer: true` (rule 6); without one it answers 400 "
            "`attribution_required`. Major 0 retired for the payer.",
            "Breaking: rejecting unknown top-level keys. A request with a top-level key the "
            "endpoint does not know answers 400 `schema_validation`, naming the keys in "
            "`issues[].keys`; major 0 ignored them.",
        ),
        migration=(
            "Send `details.beneficiaryAddress` (the beneficiary's address) or "
            "`details.beneficiaryIsPayer: true` with every prepare-auth and actions/retire "
            "request (prepare-auth's `actionsRetireRequest` then carries it: post it back "
            "unchanged), and remove every top-level key the manifest's schemas do not list. "
            "Until then the v0 host keeps serving major 0."
        ),
    ),
    Release(
        "0.9.0",
        "2026-11-22",  # no earlier date of its own here: the day this service began (with 1.0.0)
        False,
        "The previous major (the public endpoint's rules before 1.0.0), served on the v0 host "
        "for migration only.",
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


def _semver(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def releases_up_to(api_version: str) -> list[Release]:
    """The releases up to and including ``api_version``, newest first."""
    latest = _semver(api_version)
    return [r for r in RELEASES if _semver(r.version) <= latest]


def served_version(info: X402Info) -> str:
    """The version this host serves: the newest release of its major (up to the latest)."""
    return next(
        (r.version for r in releases_up_to(info.api_version) if _semver(r.version)[0] == info.major),
        info.api_version,
    )


def versioned_hosts(info: X402Info) -> dict[str, str]:
    """``versionedHosts``: ``latest``, ``current``, ``v0`` and the pinning ``note``."""
    return {**info.versioned_hosts, "note": PINNING_NOTE}


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
    if major == 0:
        schema["additionalProperties"] = True
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _origin(info: X402Info) -> str:
    """The host's root URL (well-known documents live there), from its x402 base URL."""
    return info.base_url.removesuffix("/").removesuffix("/api")


# ---------------------------------------------------------------------------- documents


def manifest_document(info: X402Info) -> dict[str, Any]:
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


def standard_x402(info: X402Info) -> dict[str, Any]:
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


def extensions() -> list[dict[str, Any]]:
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


def changelog_document(info: X402Info) -> dict[str, Any]:
    """``/.well-known/x402-changelog.json`` (spec: Versioning): every release up to the
    latest, newest first; each breaking one with its ``migration``."""
    return {
        "apiVersion": served_version(info),
        "latestApiVersion": info.api_version,
        "versionedHosts": versioned_hosts(info),
        "releases": [r.body() for r in releases_up_to(info.api_version)],
    }


def errors_document(info: X402Info) -> dict[str, Any]:
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


def docs_index(info: X402Info, guides: Mapping[str, Guide]) -> dict[str, Any]:
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


def guide_document(info: X402Info, guide: Guide) -> dict[str, Any]:
    """``GET /api/docs?id=<id>``: ``{id, title, format: "markdown", body}``."""
    return {
        "id": guide.id,
        "title": render(guide.title, info),
        "format": "markdown",
        "body": render(guide.markdown, info),
    }


# ---------------------------------------------------------------------------- OpenAPI 3.1


def _ref_name(prop: Mapping[str, Any]) -> str | None:
    """The component a property refers to (directly or as the non-null branch of anyOf)."""
    for branch in (prop, *prop.get("anyOf", ())):
        ref = branch.get("$ref")
        if isinstance(ref, str):
            return ref.rsplit("/", 1)[1]
    return None


def _query_parameters(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """GET query parameters from the request model's fields; a nested object's fields as
    ``object.field`` (one level, as the GET route nests them). ``action`` is the path, and
    ``authPayload`` never goes in a URL (only actions/retire, POST only, takes it)."""
    params: list[dict[str, Any]] = []
    for name, prop in schema["properties"].items():
        if name in ("action", "authPayload"):
            continue
        ref = _ref_name(prop)
        nested = (
            {name: prop} if ref is None else {f"{name}.{k}": v for k, v in defs[ref]["properties"].items()}
        )
        params.extend(
            {"name": key, "in": "query", "required": False, "schema": value} for key, value in nested.items()
        )
    return params


def _error_responses(codes: tuple[str, ...]) -> dict[str, Any]:
    """The error responses of an operation by HTTP status, from the registry."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(REGISTRY[code].http_status, []).append(code)
    return {
        str(status): {
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
        for status, found in sorted(by_status.items())
    }


ERROR_SCHEMA: Final = {
    "type": "object",
    "required": ["error", "message", "x402FacilitatorVersion"],
    "properties": {
        "error": {"type": "string", "enum": list(X402_REGISTRY), "description": "the code: match on it"},
        "message": {"type": "string", "description": "human text; never match on it"},
        "x402FacilitatorVersion": {"const": X402_FACILITATOR_VERSION},
    },
    "additionalProperties": True,
    "description": "The error envelope; code-specific context fields beside these three.",
}


def _component(action: str) -> str:
    """``prepare/retire`` -> ``PrepareRetireRequest``."""
    return "".join(part.capitalize() for part in re.split(r"[/-]", action)) + "Request"


def _ok(description: str, media: str = JSON) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"} if media != JSON else {"type": "object"}
    return {"description": description, "content": {media: {"schema": schema}}}


def _action_responses(action: str) -> dict[str, Any]:
    if action != "actions/retire":
        return {"200": _ok(PURPOSES[action]), **_error_responses(allowed_codes(action))}
    return {
        "200": {
            "description": "final: " + " or ".join(FINAL_STATUSES),
            "content": {JSON: {"schema": _status_schema(FINAL_STATUSES)}},
        },
        "202": {
            "description": "still on its way after the wait: post the identical request again",
            "content": {JSON: {"schema": _status_schema(WAITING_STATUSES)}},
        },
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


def openapi_document(info: X402Info) -> dict[str, Any]:
    """The whole x402 endpoint as OpenAPI 3.1: each action by GET (query parameters from
    the request model) and by POST (the model's schema, unknown keys refused on major 1),
    the meta routes, and each operation's errors by HTTP status from the registry."""
    model = ActionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    defs: dict[str, Any] = model.pop("$defs", {})
    if info.major == 0:
        model["additionalProperties"] = True
    parameters = {p["name"]: p for p in _query_parameters(model, defs)}
    paths: dict[str, Any] = {"/api": _post_any_action()}
    for action in ACTIONS:
        paths[f"/api/{action}"] = _action_operations(action, list(parameters))
    paths.update(_meta_paths())
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "x402 carbon retirement endpoint",
            "version": served_version(info),
            "description": f"Major {info.major}. Each action by GET with query parameters or by POST "
            "to /api with `action`; both answer the same. Errors: {error, message, "
            "x402FacilitatorVersion, ...context}; match on `error`.",
        },
        "servers": [{"url": _origin(info)}],
        "components": {"schemas": _request_schemas(model, defs), "parameters": parameters},
        "paths": paths,
    }


def _request_schemas(model: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The document's schemas: the error body, the request model (``ActionRequest``) with
    its definitions, and per action the model with its ``action`` fixed."""
    schemas: dict[str, Any] = {"Error": ERROR_SCHEMA, **defs, "ActionRequest": model}
    for action in ACTIONS:
        schemas[_component(action)] = {
            "allOf": [{"$ref": "#/components/schemas/ActionRequest"}],
            "properties": {"action": {"const": action, "type": "string"}},
            "required": ["action"],
        }
    return schemas


def _post_any_action() -> dict[str, Any]:
    """``/api``: the action index by GET, and any action by POST (chosen by the body's
    ``action``), with every action's errors."""
    every_code = tuple(dict.fromkeys(c for a in ACTIONS for c in allowed_codes(a)))
    return {
        "get": {
            "operationId": "index",
            "summary": "the action index",
            "responses": {"200": _ok("index")},
        },
        "post": {
            "operationId": "post_action",
            "summary": "any action, chosen by the body's `action`",
            "requestBody": {
                "required": True,
                "content": {
                    JSON: {
                        "schema": {
                            "oneOf": [{"$ref": f"#/components/schemas/{_component(a)}"} for a in ACTIONS],
                            "discriminator": {
                                "propertyName": "action",
                                "mapping": {a: f"#/components/schemas/{_component(a)}" for a in ACTIONS},
                            },
                        }
                    }
                },
            },
            "responses": {
                "200": _ok("the action's answer"),
                "202": _ok("actions/retire still on its way"),
                **_error_responses(every_code),
            },
        },
    }


def _action_operations(action: str, parameters: list[str]) -> dict[str, Any]:
    """``/api/<action>``: by POST (the request model as body), and unless the action is
    POST only, by GET with the query ``parameters`` (names of the document's parameters)."""
    operations: dict[str, Any] = {
        "post": {
            "operationId": f"post_{_component(action)}",
            "summary": PURPOSES[action],
            "requestBody": {
                "required": True,
                "content": {JSON: {"schema": {"$ref": "#/components/schemas/ActionRequest"}}},
            },
            "responses": _action_responses(action),
        }
    }
    if action not in POST_ONLY:
        operations["get"] = {
            "operationId": f"get_{_component(action)}",
            "summary": PURPOSES[action],
            "parameters": [{"$ref": f"#/components/parameters/{name}"} for name in parameters],
            "responses": _action_responses(action),
        }
    return operations


def _meta_paths() -> dict[str, Any]:
    """The self-description routes: manifest, changelog, errors documents, this document,
    security.txt and the guides."""
    meta_errors = _error_responses(_META_CODES)
    paths: dict[str, Any] = {}
    for path, description in (
        (MANIFEST_PATH, "the discovery manifest"),
        (CHANGELOG_PATH, "the changelog"),
        (ERRORS_PATH, "the errors document"),
        (API_ERRORS_PATH, "the errors document"),
        (OPENAPI_PATH, "this document"),
    ):
        paths[path] = {"get": {"summary": description, "responses": {"200": _ok(description), **meta_errors}}}
    paths[SECURITY_TXT_PATH] = {
        "get": {"summary": "RFC 9116 security.txt", "responses": {"200": _ok("security.txt", "text/plain")}}
    }
    paths[DOCS_PATH] = {
        "get": {
            "summary": "the guide index, or one guide by id",
            "parameters": [
                {
                    "name": "id",
                    "in": "query",
                    "required": False,
                    "schema": {"enum": list(GUIDE_IDS)},
                }
            ],
            "responses": {
                "200": _ok("{documents: [{id, title, summary, url}]}, or {id, title, format, body}"),
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
    if wanted is None:
        return _json(docs_index(info, guides))
    guide = guides.get(wanted)
    if guide is None:
        raise Rejection(
            "document_not_found", f"no guide document {wanted!r}", id=wanted, available=list(guides)
        )
    return _json(guide_document(info, guide))


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
