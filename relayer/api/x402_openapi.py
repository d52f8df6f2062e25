"""The x402 endpoint as an OpenAPI 3.1 document: each action by GET (its query parameters)
and by POST (its request schema, generated from the pydantic model that validates requests),
the self-description routes, each operation's answers typed from the TypedDicts the builders
return, and its errors by HTTP status from the one registry."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from relayer.api.x402_versions import (
    API_ERRORS_PATH,
    CHANGELOG_PATH,
    DOCS_PATH,
    ERRORS_PATH,
    FINAL_STATUSES,
    GUIDE_IDS,
    JSON,
    MANIFEST_PATH,
    OPENAPI_PATH,
    POST_ONLY,
    PURPOSES,
    SECURITY_TXT_PATH,
    WAITING_STATUSES,
    X402Info,
    ignores_unknown_keys,
    origin_of,
    served_version,
)
from relayer.domain import views
from relayer.domain.errors import (
    REGISTRY,
    X402_FACILITATOR_VERSION,
    X402_REGISTRY,
    allowed_codes,
)
from relayer.domain.schemas import (
    ACTION_FIELDS,
    ACTION_REQUIRED,
    ACTIONS,
    CHOOSES_CREDIT,
    NAMES_BENEFICIARY,
    ActionRequest,
)

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
        properties["chainId"] = {"type": "integer", "enum": [chain_id for chain_id, _ in info.chains()]}
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
        "servers": [{"url": origin_of(info)}],
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
