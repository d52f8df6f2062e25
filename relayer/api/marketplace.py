"""HTTP surface of the marketplace catalogue API, release v18 (spec: marketplace-api.md),
served by the same daemon beside the x402 endpoint, at the daemon's root: ``/categories``,
``/carbonProjects``, ``/retirements``, ``/prices``, ``/quotes``, ``/orders``; removed and
replaced v17 endpoints answer 410 naming the replacement; ``/marketplace/openapi.json`` is its
OpenAPI 3.1 document, generated from the models that validate the requests.

Every refusal has one body: ``{statusCode, error, message, code, ...}`` with the registry's
status for its code (the same as on the x402 endpoint), shaped by :mod:`relayer.api.errors`.
Lists are JSON arrays (as the spec says) of at most ``limit`` items (default 20, at most 100);
``X-Total-Count`` and a ``Link: <…>; rel="next"`` header tell the rest.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from decimal import Decimal
from typing import Any, Final, TypeVar
from urllib.parse import urlencode

from aiohttp import web
from pydantic import BaseModel

from relayer.api.errors import error_response
from relayer.api.kernel import METRICS, REQUEST_ID, read_json
from relayer.domain import views
from relayer.domain.errors import Rejection, RelayerError
from relayer.domain.marketplace import (
    REMOVED_PRICE_PARAMETERS,
    REMOVED_PRODUCTS,
    REMOVED_QUOTE_FIELDS,
    REPLACED_RETIREMENT,
    RETIREMENT_ID_PATTERN,
    CarbonProjectsQuery,
    OrderRequest,
    PricesQuery,
    QuoteRequest,
    RetirementsQuery,
    bad_request,
    looks_like_address,
    parse_retirement_id,
    parse_source_id,
    removed_parameters,
    validated,
)
from relayer.service.documents import certificate_html, certificate_pdf
from relayer.service.market import projects
from relayer.service.market.marketplace import Marketplace
from relayer.service.market.projects import Page as ResultPage
from relayer.service.market.snapshot import recall, remember

log = logging.getLogger(__name__)

_R = TypeVar("_R")
RENDERS_AT_ONCE: Final = 2
"""Certificates rendered at once by a process (a CJK one is about 1 s of CPU, and a render
thread shares the GIL with the event loop): more wait their turn, within the request timeout."""
_renders = asyncio.Semaphore(RENDERS_AT_ONCE)


async def rendered(render: Callable[[Any], _R], view: Any) -> _R:
    """``render(view)`` in a worker thread, at most :data:`RENDERS_AT_ONCE` at once."""
    async with _renders:
        return await asyncio.to_thread(render, view)


MARKETPLACE: Final = web.AppKey("marketplace", Marketplace)
JSON: Final = "application/json"
_M = TypeVar("_M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _respond(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=body, status=status, content_type=JSON, headers=headers)


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def guarded(handler: Handler) -> Handler:
    """Answer every failure of a marketplace handler in the marketplace's one error body."""

    async def run(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except RelayerError as error:
            refused = error
        except web.HTTPException:
            raise
        except Exception:
            request_id = request.get(REQUEST_ID, "-")
            log.exception(
                "marketplace handler failed", extra={"request_id": request_id, "path": request.path}
            )
            refused = Rejection("internal_error", "unhandled server failure")
            request.app[METRICS].unhandled_errors.inc()
        request.app[METRICS].error_responses.labels(refused.code).inc()
        return error_response(refused, "marketplace")

    return run


def _query(request: web.Request) -> dict[str, str]:
    """The query as a dict; a repeated parameter is refused (400 ``schema_validation``)."""
    query = dict(request.query)
    if len(query) != len(request.query):
        raise bad_request("schema_validation", "a query parameter is repeated", fields=[])
    return query


async def _body(request: web.Request) -> dict[str, Any]:
    """One JSON object (decimals exact) under the x402 endpoint's policy (:func:`read_json`:
    UTF-8 only), else 400 ``invalid_json``."""
    try:
        data = await read_json(request, parse_float=Decimal)
    except ValueError as exc:
        raise bad_request("invalid_json", f"the body must be one JSON object: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("invalid_json", "the body must be one JSON object")
    return data


def _paged(request: web.Request, page: ResultPage) -> web.Response:
    headers = {"X-Total-Count": str(page.total)}
    following = page.offset + page.limit
    if following < page.total:
        query = {**request.query, "offset": str(following), "limit": str(page.limit)}
        base = request.app[MARKETPLACE].public_base_url
        headers["Link"] = f'<{base}{request.path}?{urlencode(query)}>; rel="next"'
    return _respond(_dump(page.items), headers=headers)


@guarded
async def categories(request: web.Request) -> web.Response:
    return _respond(_dump(projects.categories()))


@guarded
async def carbon_projects(request: web.Request) -> web.Response:
    """The hot path: an answer rendered for this raw query string is sent as it is (only
    valid queries are kept); otherwise validate, select, render and keep it."""
    market = request.app[MARKETPLACE]
    snap = await market.snapshots.snapshot()
    key = "list?" + request.query_string
    hit = recall(snap, key)
    if hit is None:
        q = validated(CarbonProjectsQuery, _query(request))
        body, total = projects.project_page_json(snap, q)
        headers = {"X-Total-Count": str(total)}
        if q.offset + q.limit < total:
            following = {**request.query, "offset": str(q.offset + q.limit), "limit": str(q.limit)}
            headers["Link"] = f'<{market.public_base_url}/carbonProjects?{urlencode(following)}>; rel="next"'
        hit = (headers, body)
        remember(snap, key, hit)
    return _respond(hit[1], headers=hit[0])


@guarded
async def carbon_project(request: web.Request) -> web.Response:
    market = request.app[MARKETPLACE]
    if request.query:
        validated(_NoQuery, _query(request))
    key = request.match_info["key"]
    snap = await market.snapshots.snapshot()
    hit = recall(snap, "detail:" + key)
    if hit is None:
        hit = ({}, _dump(projects.project_detail(snap, key)))
        remember(snap, "detail:" + key, hit)
    return _respond(hit[1])


class _NoQuery(BaseModel):
    model_config = {"extra": "forbid"}


@guarded
async def retirements(request: web.Request) -> web.Response:
    q = validated(RetirementsQuery, _query(request))
    return _paged(request, await request.app[MARKETPLACE].retirements.retirement_page(q))


@guarded
async def retirement(request: web.Request) -> web.Response:
    if request.query:
        validated(_NoQuery, _query(request))
    views = request.app[MARKETPLACE].retirements
    return _respond(_dump(await views.one(parse_retirement_id(request.match_info["id"]))))


class _CertificateQuery(BaseModel):
    model_config = {"extra": "forbid"}
    format: str | None = None


@guarded
async def retirement_part(request: web.Request) -> web.StreamResponse:
    """``/retirements/{id}/certificate|provenance``, or the replaced
    ``/retirements/{beneficiaryAddress}/{retirementIndex}`` (410)."""
    first, second = request.match_info["first"], request.match_info["second"]
    if second not in ("certificate", "provenance"):
        if looks_like_address(first) or second.isdigit():
            raise REPLACED_RETIREMENT[""].error()
        raise Rejection("not_found", f"no route at {request.path[:200]}")
    views = request.app[MARKETPLACE].retirements
    if looks_like_address(first):
        raise REPLACED_RETIREMENT[second].error()
    rid = parse_retirement_id(first)
    if second == "provenance":
        if request.query:
            validated(_NoQuery, _query(request))
        return _respond(_dump(await views.provenance(rid)))
    fmt = validated(_CertificateQuery, _query(request)).format
    if fmt is None:
        fmt = "html" if "text/html" in request.headers.get("Accept", "") else "pdf"
    if fmt not in ("html", "pdf"):
        raise bad_request(
            "schema_validation",
            "format is html or pdf",
            fields=[{"field": "format", "problem": "html or pdf"}],
        )
    view = await views.certificate(rid)
    if fmt == "html":
        page = await rendered(certificate_html, view)  # embeds font subsets: off the loop
        return web.Response(text=page, content_type="text/html", charset="utf-8", headers={"Vary": "Accept"})
    return web.Response(
        body=await rendered(certificate_pdf, view),  # 0.2 to 1.5 s of CPU: off the loop
        content_type="application/pdf",
        headers={
            "Content-Disposition": f'inline; filename="retirement-{view.retirement_id}.pdf"',
            "Vary": "Accept",  # without ?format=, Accept chose HTML or PDF
        },
    )


@guarded
async def replaced_retirement_part(request: web.Request) -> web.Response:
    """``/retirements/{beneficiaryAddress}/{retirementIndex}/certificate|provenance`` (410)."""
    part = request.match_info["part"]
    if part not in ("certificate", "provenance"):
        raise Rejection("not_found", f"no route at {request.path[:200]}")
    raise REPLACED_RETIREMENT[part].error()


@guarded
async def prices(request: web.Request) -> web.Response:
    query = _query(request)
    removed = removed_parameters(query, REMOVED_PRICE_PARAMETERS, "GET /prices")
    if removed is not None:
        raise removed
    q = validated(PricesQuery, query)
    market = request.app[MARKETPLACE]
    return _paged(request, projects.prices(await market.snapshots.snapshot(), q, market.desks.keys()))


async def _keyed(request: web.Request) -> tuple[Marketplace, int]:
    """The marketplace and the id of the request's API key (scope ``marketplace``).

    Raises:
        Rejection: 401 without a valid key of that scope (:meth:`ApiKeys.authenticate`).
    """
    market = request.app[MARKETPLACE]
    key = await market.keys.authenticate(request.headers.get("Authorization"), "marketplace")
    return market, key.id


@guarded
async def quotes(request: web.Request) -> web.Response:
    market, key_id = await _keyed(request)
    body = await _body(request)
    removed = removed_parameters(body, REMOVED_QUOTE_FIELDS, "POST /quotes")
    if removed is not None:
        raise removed
    q = validated(QuoteRequest, body)
    return _respond(_dump(await market.quote(key_id, q, int(time.time()))), 201)


@guarded
async def orders(request: web.Request) -> web.Response:
    market, key_id = await _keyed(request)
    body = await _body(request)
    if isinstance(body.get("asset_price_source_id"), str):
        parse_source_id(body["asset_price_source_id"])  # a non-listing source is a 400 before anything
    q = validated(OrderRequest, body)
    return _respond(_dump(await market.place(key_id, q, int(time.time()))), 201)


@guarded
async def order(request: web.Request) -> web.Response:
    market, key_id = await _keyed(request)
    return _respond(_dump(await market.desk.order(key_id, request.match_info["id"])))


@guarded
async def removed_products(request: web.Request) -> web.Response:
    raise REMOVED_PRODUCTS.error()


@guarded
async def openapi(request: web.Request) -> web.Response:
    market = request.app[MARKETPLACE]
    return _respond(_dump(openapi_document(market.public_base_url, sorted(market.retirements.chains))))


def add_routes(app: web.Application, market: Marketplace) -> None:
    """Mount the marketplace routes on the daemon's application."""
    app[MARKETPLACE] = market
    r = app.router
    r.add_get("/categories", categories)
    r.add_get("/carbonProjects", carbon_projects)
    r.add_get("/carbonProjects/{key}", carbon_project)
    r.add_get("/retirements", retirements)
    r.add_get("/retirements/{id}", retirement)
    r.add_get("/retirements/{first}/{second}", retirement_part)
    r.add_get("/retirements/{first}/{second}/{part}", replaced_retirement_part)
    r.add_get("/prices", prices)
    r.add_post("/quotes", quotes)
    r.add_post("/orders", orders)
    r.add_get("/orders/{id}", order)
    r.add_get("/products", removed_products)
    r.add_get("/products/{id}", removed_products)
    r.add_get("/products/{id}/stats", removed_products)
    r.add_get("/marketplace/openapi.json", openapi)


# ---------------------------------------------------------------------------- OpenAPI 3.1

ERROR_BODY: Final = {
    "type": "object",
    "required": ["statusCode", "error", "message", "code"],
    "properties": {
        "statusCode": {"type": "integer", "minimum": 400, "maximum": 599},
        "error": {"type": "string", "description": "the HTTP reason phrase"},
        "message": {"type": "string", "description": "names the field and the rule it broke"},
        "code": {"type": "string", "description": "a stable machine code: match on it"},
        "replacement": {"type": ["string", "null"], "description": "what replaces a removed endpoint"},
        "fields": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["field", "problem"],
                "properties": {"field": {"type": "string"}, "problem": {"type": "string"}},
            },
        },
        "allowed": {"type": "array", "items": {"type": "string"}},
        "allow": {"type": "array", "items": {"type": "string"}},
        "retryAfterSeconds": {"type": "integer", "minimum": 1},
    },
}
_ERROR_CODES: Final = {
    400: "the request broke a rule (`fields` names each field and rule)",
    401: "no valid API key (Authorization: Bearer <key>)",
    404: "no such resource",
    409: "the resource's state forbids it now",
    410: "removed or replaced in release v18 (`replacement`)",
    422: "the amount does not fit the listing",
    429: "too many requests (or the key's daily gas budget is spent): wait Retry-After seconds",
    503: "unavailable or past the request time limit; retry with backoff",
}
_COMMON: Final = (429, 503)
"""What any route can answer: the rate limit, the request time limit."""
_RETRY_AFTER: Final = {
    "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer", "minimum": 1}}
}


def _query_schema(prop: dict[str, Any]) -> dict[str, Any]:
    """A query parameter's schema from a model field's: a parameter is absent or a value,
    never JSON null, so the null branch of an optional field goes."""
    branches = [b for b in prop.get("anyOf", ()) if b.get("type") != "null"]
    schema = dict(branches[0]) if len(branches) == 1 else {k: v for k, v in prop.items() if k != "anyOf"}
    if len(branches) > 1:
        schema["anyOf"] = branches
    schema.pop("title", None)
    if "default" in prop and prop["default"] is not None:
        schema["default"] = prop["default"]
    return schema


def _parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """Query parameters from the model that validates the query (its bounds and patterns as
    JSON Schema keywords)."""
    schema = model.model_json_schema()
    return [
        {
            "name": name,
            "in": "query",
            "required": name in schema.get("required", ()),
            "schema": _query_schema(prop),
            "description": prop.get("description", ""),
        }
        for name, prop in schema.get("properties", {}).items()
    ]


def _errors(*statuses: int) -> dict[str, Any]:
    """The refusals ``statuses`` and those of every route, in the marketplace's body."""
    out: dict[str, Any] = {}
    for status in sorted({*statuses, *_COMMON}):
        response: dict[str, Any] = {
            "description": _ERROR_CODES[status],
            "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        if status == 429:
            response["headers"] = _RETRY_AFTER
        out[str(status)] = response
    return out


def _ok(shape: str, description: str, *, many: bool = False, status: str = "200") -> dict[str, Any]:
    """A JSON answer of the component ``shape`` (an array of it with ``many``: at most
    ``limit`` items, ``X-Total-Count`` and ``Link`` page the rest)."""
    ref = {"$ref": f"#/components/schemas/{shape}"}
    answer: dict[str, Any] = {
        "description": description,
        "content": {JSON: {"schema": {"type": "array", "items": ref} if many else ref}},
    }
    if many and shape != "Category":
        answer["description"] += " (at most `limit`; X-Total-Count and Link rel=next page the rest)"
        answer["headers"] = {
            "X-Total-Count": {"schema": {"type": "integer", "minimum": 0}},
            "Link": {"schema": {"type": "string"}, "required": False},
        }
    return {status: answer}


def _components() -> dict[str, Any]:
    """Request models and answer shapes, each generated from the code that validates or
    builds it (:mod:`relayer.domain.views` for the typed answers)."""
    ref = "#/components/schemas/{model}"
    schemas: dict[str, Any] = {"Error": ERROR_BODY}
    for model in (QuoteRequest, OrderRequest):
        schema = model.model_json_schema(ref_template=ref)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    shapes = (
        views.Category,
        views.Project,
        views.ProjectDetail,
        views.Price,
        views.Retirement,
        views.ProvenanceRecord,
        views.Quote,
        views.Order,
    )
    for shape in shapes:
        schema = views.json_schema(shape, ref)
        schemas.update(schema.pop("$defs", {}))
        schemas[shape.__name__] = schema
    return schemas


def openapi_document(server: str, chain_ids: Sequence[int] = ()) -> dict[str, Any]:
    """The marketplace API's OpenAPI 3.1 document; query and body schemas come from the
    pydantic models that validate requests (``extra`` keys forbidden), answers from the
    typed shapes their builders return. ``server`` is the configured public base URL
    (``RELAYER_PUBLIC_BASE_URL``), never a request's ``Host``: the document is cacheable and
    a client cannot write into it. ``chain_ids``: the chains whose retirements are indexed
    (``GET /retirements?chainId`` takes no other)."""
    gone = {"deprecated": True, "responses": _errors(410)}
    product_id = [_path_parameter("id", {"type": "string", "minLength": 1})]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Marketplace carbon project catalogue and retirement API",
            "version": "18",
            "description": "Release v18: seller listings only; one retirement id across Polygon and "
            "Base. Refusals: {statusCode, error, message, code, ...}; match on `code`. A method a "
            "path does not serve answers 405 with Allow.",
        },
        "servers": [{"url": server}],
        "components": {
            "schemas": _components(),
            "securitySchemes": {
                "apiKey": {"type": "http", "scheme": "bearer", "description": "relayer apikey create"}
            },
        },
        "paths": {
            **_catalogue_paths(),
            **_retirement_paths(chain_ids),
            **_order_paths(),
            "/products": {"get": gone},
            "/products/{id}": {"get": {**gone, "parameters": product_id}},
            "/products/{id}/stats": {"get": {**gone, "parameters": product_id}},
        },
    }


def _path_parameter(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _catalogue_paths() -> dict[str, Any]:
    """The public reads: categories, carbon projects and prices."""
    return {
        "/categories": {"get": {"responses": {**_ok("Category", "categories", many=True), **_errors()}}},
        "/carbonProjects": {
            "get": {
                "parameters": _parameters(CarbonProjectsQuery),
                "responses": {**_ok("Project", "projects", many=True), **_errors(400)},
            }
        },
        "/carbonProjects/{key}": {
            "get": {
                "parameters": [_path_parameter("key", {"type": "string", "minLength": 1, "maxLength": 200})],
                "responses": {**_ok("ProjectDetail", "the project and its listings"), **_errors(400, 404)},
            }
        },
        "/prices": {
            "get": {
                "parameters": _parameters(PricesQuery),
                "responses": {**_ok("Price", "live seller listings", many=True), **_errors(400)},
            }
        },
    }


def _retirement_paths(chain_ids: Sequence[int]) -> dict[str, Any]:
    """Retirements, one retirement, its certificate (PDF or HTML) and its provenance."""
    listed = _parameters(RetirementsQuery)
    for parameter in listed:
        if parameter["name"] == "chainId" and chain_ids:
            parameter["schema"] = {"type": "integer", "enum": sorted(chain_ids)}
    retirement_id = _path_parameter("id", {"type": "string", "pattern": RETIREMENT_ID_PATTERN})
    certificate_format = {
        "name": "format",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "enum": ["pdf", "html"]},
        "description": "pdf (default) or html; without it, an Accept of text/html picks html",
    }
    return {
        "/retirements": {
            "get": {
                "parameters": listed,
                "responses": {**_ok("Retirement", "retirements, newest first", many=True), **_errors(400)},
            }
        },
        "/retirements/{id}": {
            "get": {
                "parameters": [retirement_id],
                "responses": {**_ok("Retirement", "the retirement"), **_errors(400, 404)},
            }
        },
        "/retirements/{id}/certificate": {
            "get": {
                "parameters": [retirement_id, certificate_format],
                "responses": {
                    "200": {
                        "description": "the certificate: a PDF, or an HTML page",
                        "content": {
                            "application/pdf": {"schema": {"type": "string", "format": "binary"}},
                            "text/html": {"schema": {"type": "string"}},
                        },
                    },
                    **_errors(400, 404),
                },
            }
        },
        "/retirements/{id}/provenance": {
            "get": {
                "parameters": [retirement_id],
                "responses": {
                    **_ok("ProvenanceRecord", "the credit's transfers, oldest first", many=True),
                    **_errors(400, 404),
                },
            }
        },
    }


def _order_paths() -> dict[str, Any]:
    """The keyed writes and reads (bearer API key): quotes and orders."""
    bearer: list[dict[str, list[str]]] = [{"apiKey": []}]

    def body(model: str) -> dict[str, Any]:
        return {"required": True, "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{model}"}}}}

    return {
        "/quotes": {
            "post": {
                "security": bearer,
                "requestBody": body("QuoteRequest"),
                "responses": {**_ok("Quote", "the quote", status="201"), **_errors(400, 401, 404, 409, 422)},
            }
        },
        "/orders": {
            "post": {
                "security": bearer,
                "requestBody": body("OrderRequest"),
                "responses": {**_ok("Order", "the order", status="201"), **_errors(400, 401, 404, 409, 422)},
            }
        },
        "/orders/{id}": {
            "get": {
                "security": bearer,
                "parameters": [_path_parameter("id", {"type": "string", "format": "uuid"})],
                "responses": {**_ok("Order", "the order and its status"), **_errors(401, 404)},
            }
        },
    }
