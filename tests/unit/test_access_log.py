"""The access line's fields from aiohttp's request and answer: the route's template, the
client as the rate limit counts it (behind trusted proxies, the address they name)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from relayer.api.access import ACCESS_LOGGER, AccessLog
from relayer.api.kernel import RATE_LIMIT, REQUEST_ID, RateLimit


async def _ok(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _routed(path: str, limit: RateLimit, headers: dict[str, str]) -> web.Request:
    """A request as aiohttp hands it to the access log after the middlewares ran."""
    app = web.Application()
    app[RATE_LIMIT] = limit
    app.router.add_get("/retirements/{id}", _ok)
    request = make_mocked_request("GET", path, app=app, headers=headers)
    match = await app.router.resolve(request)
    match.add_app(app)
    request._match_info = match
    request[REQUEST_ID] = "req-7"
    return request


def _line(
    caplog: pytest.LogCaptureFixture, request: web.BaseRequest, response: web.Response
) -> dict[str, Any]:
    with caplog.at_level(logging.INFO, ACCESS_LOGGER.name):
        AccessLog(ACCESS_LOGGER, "").log(request, response, 0.0123456)
    (record,) = caplog.records
    fields = ("request_id", "method", "route", "status", "duration_ms", "client", "bytes")
    return {"message": record.getMessage(), **{k: getattr(record, k) for k in fields}}


async def test_a_routed_request_names_its_route_template_and_its_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    forwarded = {"X-Forwarded-For": "203.0.113.9, 198.51.100.4"}
    request = await _routed("/retirements/84532-0xab-0", RateLimit(None), forwarded)
    assert _line(caplog, request, web.Response(text="x" * 42, status=404)) == {
        "message": "request",
        "request_id": "req-7",
        "method": "GET",
        "route": "/retirements/{id}",
        "status": 404,
        "duration_ms": 12.346,
        "client": request.remote,  # the header is not trusted unless the operator says so
        "bytes": 42,
    }


async def test_behind_trusted_proxies_the_client_is_the_address_they_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    forwarded = {"X-Forwarded-For": "10.0.0.1, 203.0.113.9, 198.51.100.4"}
    request = await _routed("/retirements/1", RateLimit(None, forwarded_for=True, proxy_hops=2), forwarded)
    assert _line(caplog, request, web.Response(text="ok"))["client"] == "203.0.113.9"


def test_a_request_the_parser_refused_has_no_route_and_no_id(caplog: pytest.LogCaptureFixture) -> None:
    request = make_mocked_request("GET", "/", headers={})  # never routed: no middleware ran
    line = _line(caplog, request, web.Response(status=400, text="bad"))
    assert (line["route"], line["request_id"], line["status"]) == (None, None, 400)
