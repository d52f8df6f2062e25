"""The x402 endpoint's self-description routes (spec: Endpoints, "Other routes"; Errors;
Versioning): the discovery manifest, the changelog, the errors document, ``security.txt``
(RFC 9116), the guides and the OpenAPI 3.1 document, each built by its module
(:mod:`~relayer.api.x402_versions`, :mod:`~relayer.api.x402_manifest`,
:mod:`~relayer.api.x402_guides`, :mod:`~relayer.api.x402_openapi`).

Policy: nothing here is written twice. Request schemas are generated from the pydantic
models that validate requests (:class:`~relayer.domain.schemas.ActionRequest`), error lists
and statuses come from the one registry (:mod:`relayer.domain.errors`), the retire statuses
from :mod:`relayer.service.outcome`; only the release history and the guides are prose.
Refusals are :class:`~relayer.domain.errors.Rejection`s, answered by the API's envelope."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from relayer.api import pages
from relayer.api.x402_guides import Guide, docs_index, guide_document, load_guides, render
from relayer.api.x402_manifest import changelog_document, errors_document, manifest_document, security_txt
from relayer.api.x402_openapi import openapi_document
from relayer.api.x402_versions import (
    API_ERRORS_PATH,
    CHANGELOG_PATH,
    DOCS_PATH,
    ERRORS_PATH,
    JSON,
    MANIFEST_PATH,
    OPENAPI_PATH,
    SECURITY_TXT_PATH,
    X402Info,
)
from relayer.domain.errors import (
    Rejection,
)
from relayer.domain.models import StrictModel
from relayer.domain.schemas import (
    validation_issues,
)

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
