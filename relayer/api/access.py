"""The access log: one JSON line per HTTP request answered (aiohttp's access-logger hook,
called once the answer is written; the request's id comes from
:func:`relayer.api.kernel.request_context`)."""

from __future__ import annotations

import logging
from typing import Final

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from relayer.api.kernel import RATE_LIMIT, REQUEST_ID

ACCESS_LOGGER: Final = logging.getLogger("relayer.access")
"""The access log's logger (INFO; raise its level to WARNING to turn the access log off)."""


class AccessLog(AbstractAccessLogger):
    """One INFO line ``"request"`` per answer: ``request_id``, ``method``, ``route`` (the
    route's template, e.g. ``/retirements/{id}``; ``unmatched`` when no route took it, None
    for a request the HTTP parser refused), ``status``, ``duration_ms`` (from the head read
    to the answer written, milliseconds), ``client`` (the peer's address, or the address the
    trusted proxies name when ``RELAYER_RATE_LIMIT_FORWARDED_FOR`` is on: the rate limit's
    client) and ``bytes`` (the answer body's length; None for a streamed answer)."""

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        route: str | None = None
        client = request.remote
        if REQUEST_ID in request:  # routed (a request the HTTP parser refused is not)
            assert isinstance(request, web.Request)
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "unmatched"
            limit = request.app.get(RATE_LIMIT)
            if limit is not None and limit.forwarded_for:
                client = limit.client_of(client, request.headers.getall("x-forwarded-for", []))
        self.logger.info(
            "request",
            extra={
                "request_id": request.get(REQUEST_ID),
                "method": request.method,
                "route": route,
                "status": response.status,
                "duration_ms": round(time * 1000, 3),
                "client": client,
                "bytes": response.content_length,
            },
        )
