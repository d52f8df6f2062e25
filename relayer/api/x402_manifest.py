"""The x402 endpoint's self-description documents (spec: Endpoints, "Other routes"; Errors;
Versioning): the discovery manifest with each action's live schema, the changelog, the errors
document and ``security.txt`` (RFC 9116). Error lists and statuses come from the one registry
(:mod:`relayer.domain.errors`); the shapes are :mod:`relayer.domain.views`' TypedDicts."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from relayer.api.x402_versions import (
    CHANGELOG_PATH,
    DOCS_PATH,
    ERRORS_PATH,
    FINAL_STATUSES,
    MOVES_FUNDS,
    OPENAPI_PATH,
    POST_ONLY,
    PURPOSES,
    SECURITY_TXT_PATH,
    WAITING_STATUSES,
    X402Info,
    ignores_unknown_keys,
    origin_of,
    releases_up_to,
    served_version,
    versioned_hosts,
)
from relayer.domain import chains, views
from relayer.domain.errors import (
    ACTION_CODES,
    COMMON_CODES,
    REGISTRY,
    X402_FACILITATOR_VERSION,
    X402_REGISTRY,
    allowed_codes,
)
from relayer.domain.schemas import (
    ACTIONS,
    ActionRequest,
)

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


# ---------------------------------------------------------------------------- documents


def manifest_document(info: X402Info) -> views.Manifest:
    """``/.well-known/x402.json`` (spec: Endpoints; Versioning): versions and hosts, the
    chains served (each with its settlement; the top-level ``settlement`` is the first's),
    input tokens, and per action its routes, live schema and error codes."""
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
                "chainId": chain_id,
                "name": chains.display_name(chain_id),
                "network": chains.caip2(chain_id),
                "settlement": settlement,
            }
            for chain_id, settlement in info.chains()
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
    origin = origin_of(info)
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
        f"Canonical: {origin_of(info)}{SECURITY_TXT_PATH}\n"
        f"Policy: {info.base_url}/docs\n"
    )
