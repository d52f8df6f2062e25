"""The daemon's aiohttp application: the kernel's middleware and probes
(:mod:`relayer.api.kernel`), the x402 endpoint's routes (:mod:`relayer.api.x402_routes`) and
self-description (:mod:`relayer.api.x402_meta`), another surface mounted (the marketplace),
and the catch-all."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from relayer.api.kernel import (
    DEFAULT_TIMEOUT_S,
    METRICS,
    RATE_LIMIT,
    READY,
    TIMEOUT_S,
    RateLimit,
    envelope,
    healthz,
    metrics_view,
    not_found,
    readyz,
    request_context,
)
from relayer.api.x402_meta import add_meta_routes
from relayer.api.x402_routes import (
    CHAIN_SERVICES,
    MAJORS,
    SERVICES,
    AppServices,
    get_action,
    index,
    major_of,
    post_action,
    post_api,
)
from relayer.api.x402_versions import (
    X402Info,
)
from relayer.metrics import Metrics

log = logging.getLogger(__name__)


def build_app(
    services: AppServices,
    metrics: Metrics,
    ready: Callable[[], Awaitable[bool]],
    max_body_bytes: int,
    mount: Callable[[web.Application], None] | None = None,
    majors: dict[str, int] | None = None,
    meta: Callable[[web.Request, int], X402Info] | None = None,
    rate_limit: RateLimit | None = None,
    request_timeout_s: float = DEFAULT_TIMEOUT_S,
    chain_services: Mapping[int, AppServices] | None = None,
) -> web.Application:
    """The aiohttp application over ``services`` (bodies bounded to ``max_body_bytes``);
    ``mount`` adds another surface's routes (the marketplace API) before the catch-all;
    ``majors`` maps a ``Host`` (``host[:port]``, lower case) to the API major it serves;
    ``meta(request, major)`` describes this endpoint for the manifest, changelog, errors
    document, guides, security.txt and OpenAPI document (see :mod:`relayer.api.x402_meta`);
    ``chain_services`` holds every relayed chain's services by chain id when the daemon
    relays on more than one (:func:`relayer.api.x402_routes.services_for`)."""
    app = web.Application(middlewares=[request_context, envelope], client_max_size=max_body_bytes)
    app[SERVICES] = services
    if chain_services is not None:
        app[CHAIN_SERVICES] = chain_services
    app[METRICS] = metrics
    app[READY] = ready
    app[MAJORS] = majors or {}
    app[RATE_LIMIT] = rate_limit or RateLimit(None)
    app[TIMEOUT_S] = request_timeout_s
    app.router.add_get("/", index)
    app.router.add_get("/api", index)
    app.router.add_post("/api", post_api)
    if meta is not None:
        describe = meta
        add_meta_routes(app, lambda request: describe(request, major_of(request)))
    app.router.add_get("/api/{action:.+}", get_action)
    app.router.add_post("/api/{action:.+}", post_action)
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if mount is not None:
        mount(app)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app
