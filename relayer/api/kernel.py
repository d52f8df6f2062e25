"""The shared HTTP kernel of every surface (aiohttp): the request id and request context,
the error envelope middleware (the registry's status, the surface's body, a timeout and any
exception that is not a :class:`RelayerError` being the only way to a 500), bounded JSON
bodies, the per-client rate limit, ``/metrics``, ``/healthz``, ``/readyz``, and the catch-all
that answers 405 with ``Allow`` or 404. The surfaces' routes are their own modules."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import json
import logging
import math
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import limits
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from relayer.api.errors import Surface, error_response, surface_of
from relayer.api.x402_versions import (
    POST_ONLY,
)
from relayer.domain.errors import Rejection, RelayerError
from relayer.logs import request_scope
from relayer.metrics import Metrics

log = logging.getLogger(__name__)

# Request ids: a random prefix per process and a counter (unique without the system call per
# request that uuid4 makes).
_REQUEST_IDS: Final = (f"{uuid.uuid4().hex[:12]}-{n}" for n in itertools.count(1))

METRICS: Final = web.AppKey("metrics", Metrics)
REQUEST_ID: Final = web.RequestKey("request_id", str)
READY: Final[web.AppKey[Callable[[], Awaitable[bool]]]] = web.AppKey("ready")
READY_CHAINS: Final[web.AppKey[Callable[[], Mapping[int, bool]]]] = web.AppKey("ready_chains")
"""Each relayed chain's readiness as of the last ``READY`` check (a daemon on several chains)."""
RATE_LIMIT: Final[web.AppKey[RateLimit]] = web.AppKey("rate_limit")
TIMEOUT_S: Final = web.AppKey("timeout_s", float)
RESPONSE_HEADERS: Final = web.RequestKey("response_headers", dict[str, str])
"""Headers a handler sets for its answer, whatever it is (an error's too): the x402 headers."""

DEFAULT_TIMEOUT_S: Final = 75.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: Mapping[str, Any], status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


class RateLimit:
    """The per-client request limit (the ``limits`` library's moving windows, in this
    process's memory: each replica counts its own clients). ``spec`` in its notation, e.g.
    ``"50/second;1000/minute"``; ``"off"`` or None: no limit.

    The client is the peer address; with ``forwarded_for`` (only behind proxies that append
    to ``X-Forwarded-For``) it is the address the outermost of ``proxy_hops`` trusted proxies
    added: the ``proxy_hops``-th entry from the right, which a client cannot choose (the
    entries left of it are the client's own). A header with fewer entries, or an entry that
    is not an IP address, counts as the peer.

    At most ``max_clients`` clients are tracked (their windows, some bytes each): a client
    idle for the longest window is forgotten, and while the table is full of live clients
    every new one shares one window (``"overflow"``), so many addresses buy no more
    requests and no more memory."""

    EXEMPT: Final = frozenset({"/healthz", "/readyz", "/metrics"})
    OVERFLOW: Final = "overflow"

    def __init__(
        self, spec: str | None, forwarded_for: bool = False, proxy_hops: int = 1, max_clients: int = 10_000
    ) -> None:
        off = spec is None or spec.strip().lower() in ("", "off", "none")
        self.items = [] if off else limits.parse_many(spec or "")
        self.limiter = limits.strategies.MovingWindowRateLimiter(limits.storage.MemoryStorage())
        self.forwarded_for = forwarded_for
        self.proxy_hops = max(1, proxy_hops)
        self.max_clients = max(1, max_clients)
        self.window_s = max((item.get_expiry() for item in self.items), default=0)
        self.clients: OrderedDict[str, float] = OrderedDict()  # client -> last hit (monotonic), oldest first

    def client_of(self, peer: str | None, forwarded: list[str]) -> str:
        """The client a request counts for: ``peer`` (the socket's address), or with
        ``forwarded_for`` the trusted proxies' entry of the ``X-Forwarded-For`` values."""
        client = peer or "unknown"
        if not self.forwarded_for:
            return client
        entries = [e.strip() for value in forwarded for e in value.split(",")]
        if len(entries) < self.proxy_hops:
            return client
        entry = entries[-self.proxy_hops]
        try:
            return str(ipaddress.ip_address(entry[:64]))
        except ValueError:
            return client

    def _tracked(self, client: str) -> str:
        """The key ``client`` is counted under (itself, or :data:`OVERFLOW` while the table is
        full of live clients); forgets clients idle past the longest window."""
        now = time.monotonic()
        while self.clients:
            oldest, seen = next(iter(self.clients.items()))
            if now - seen <= self.window_s:
                break
            del self.clients[oldest]
            for item in self.items:
                self.limiter.clear(item, oldest)
        if client not in self.clients and len(self.clients) >= self.max_clients:
            return self.OVERFLOW
        self.clients[client] = now
        self.clients.move_to_end(client)
        return client

    def retry_after(self, request: web.Request) -> int | None:
        """None when the request is within the limit (and counts it); else the seconds until
        the client may send again."""
        if not self.items or request.path in self.EXEMPT:
            return None
        return self.hit(self.client_of(request.remote, request.headers.getall("x-forwarded-for", [])))

    def hit(self, client: str) -> int | None:
        """Count a request of ``client`` (see :meth:`client_of`): None when within the limit,
        else the seconds until it may send again."""
        key = self._tracked(client)
        for item in self.items:
            if not self.limiter.hit(item, key):
                reset = self.limiter.get_window_stats(item, key).reset_time
                return max(1, math.ceil(reset - time.time()))
        return None


_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9_.:+/=-]{1,64}")


def request_id_of(sent: str | None) -> str:
    """The request's id: the client's ``X-Request-ID`` when it is 1 to 64 characters of
    letters, digits and ``_.:+/=-`` (logged and echoed as it is); otherwise a new one."""
    if sent is not None and _REQUEST_ID.fullmatch(sent):
        return sent
    return next(_REQUEST_IDS)


async def read_json(request: web.Request, parse_float: Callable[[str], Any] | None = None) -> Any:
    """The request body as one JSON document, under the one policy of both APIs: UTF-8 only
    (no byte order mark, no UTF-16 or UTF-32), at most the application's ``client_max_size``
    bytes (aiohttp refuses more with ``HTTPRequestEntityTooLarge``); an empty body is None.

    Raises:
        ValueError: the body is not UTF-8 JSON, is nested deeper than the interpreter's
            stack, or ended early (the client aborted its upload: logged at INFO, it is no
            server failure); the message says which.
        web.HTTPRequestEntityTooLarge: the body is over the limit.
    """
    try:
        raw = await request.read()
    except (ConnectionError, web.RequestPayloadError) as exc:
        log.info(
            "request body aborted",
            extra={
                "request_id": request.get(REQUEST_ID, "-"),
                "path": request.path[:200],
                "error": str(exc)[:200],
            },
        )
        raise ValueError("the request body ended early") from None
    try:
        return json.loads(raw.decode("utf-8") or "null", parse_float=parse_float)
    except ValueError:  # not UTF-8 (UnicodeDecodeError), or not JSON (a BOM included)
        raise ValueError("the body is not JSON in UTF-8 (without a byte order mark)") from None
    except RecursionError:  # nesting deeper than the interpreter's stack: not a request body
        raise ValueError("the JSON is nested too deeply") from None


async def read_object(request: web.Request) -> dict[str, Any]:
    """The request body as one JSON object, read by :func:`read_json`'s policy.

    Raises:
        Rejection: ``invalid_json`` (400) when the body is not JSON or not one object.
        web.HTTPRequestEntityTooLarge: the body is over the limit.
    """
    try:
        body = await read_json(request)
    except ValueError as exc:
        raise Rejection("invalid_json", str(exc)) from None
    if not isinstance(body, dict):
        raise Rejection("invalid_json", "one JSON object is expected")
    return body


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The request's id (``X-Request-ID`` kept when well formed, else a new one: see
    :func:`request_id_of`) on the request and on every line written while it is served
    (:func:`relayer.logs.request_scope`); the outermost middleware."""
    request_id = request_id_of(request.headers.get("x-request-id"))
    request[REQUEST_ID] = request_id
    with request_scope(request_id):
        return await handler(request)


@web.middleware
async def envelope(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id (``X-Request-ID`` kept or made, echoed back), the per-client rate limit, the
    request timeout, the error envelope for every failure with no internals leaked, and the
    HTTP metrics (route template, method, status, duration; error responses by code)."""
    request_id = request.get(REQUEST_ID) or request_id_of(request.headers.get("x-request-id"))
    request[REQUEST_ID] = request_id
    metrics = request.app[METRICS]
    started = time.perf_counter()
    error: RelayerError | None = None
    response: web.StreamResponse | None = None
    limit = request.app.get(RATE_LIMIT)
    wait = None if limit is None else limit.retry_after(request)
    surface: Surface = "x402"
    if wait is not None:
        metrics.rate_limited.inc()
        message = f"too many requests from this client; retry in {wait} s"
        error = Rejection("rate_limited", message, retryAfterSeconds=wait)
        surface = surface_of(request.path)
    else:
        try:
            async with asyncio.timeout(request.app.get(TIMEOUT_S, DEFAULT_TIMEOUT_S)):
                response = await handler(request)
        except RelayerError as err:
            error = err
        except web.HTTPRequestEntityTooLarge:
            surface = surface_of(request.path)
            error = Rejection(
                "schema_validation",
                "request body too large",
                issues=[{"path": [], "keys": [], "message": "body too large"}],
            )
        except web.HTTPNotFound:
            error = Rejection("not_found", path=request.path)
        except web.HTTPMethodNotAllowed as exc:
            error = method_not_allowed(request, sorted(exc.allowed_methods))
        except TimeoutError:
            log.warning("request timed out", extra={"request_id": request_id, "path": request.path})
            message = "the request ran past the operator's time limit; retry with backoff"
            surface = surface_of(request.path)
            if surface == "x402":
                error = Rejection("internal_error", message, cause="timeout")
            else:
                error = Rejection("timeout", message)
        except Exception:
            log.exception("unhandled error", extra={"request_id": request_id, "path": request.path})
            metrics.unhandled_errors.inc()
            error = Rejection("internal_error", requestId=request_id)
    if error is not None:
        if error.code in ("method_not_allowed", "not_found"):  # the path's own surface answers
            surface = surface_of(request.path)  # (an unknown /projects: the marketplace's body)
        response = error_response(error, surface)
        metrics.error_responses.labels(error.code).inc()
        if error.code == "payment_required":
            metrics.challenges.inc()
    assert response is not None
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    metrics.server_requests.labels(route, request.method, str(response.status)).inc()
    metrics.server_seconds.labels(route, request.method).observe(time.perf_counter() - started)
    response.headers["x-request-id"] = request_id
    response.headers.update(request.get(RESPONSE_HEADERS, {}))
    return response


async def metrics_view(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"content-type": CONTENT_TYPE_LATEST})


async def healthz(_request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """``/readyz``: 200 ``ready`` or 503 ``not_ready``; a daemon relaying on several chains
    adds ``chains``, each chain id's ``ready`` or ``not_ready`` (one chain's node down keeps
    the process ready while another chain is)."""
    ready = await request.app[READY]()
    body: dict[str, Any] = {"status": "ready" if ready else "not_ready"}
    chains = request.app.get(READY_CHAINS)
    if chains is not None and len(state := chains()) > 1:
        body["chains"] = {str(c): "ready" if ok else "not_ready" for c, ok in state.items()}
    return _json(body, 200 if ready else 503)


async def allowed_methods(request: web.Request) -> list[str]:
    """The methods some route other than the catch-all serves at ``request.path`` (sorted;
    HEAD beside GET as aiohttp answers it): a fixed path's own routes when it has some (the
    meta documents under ``/api`` are GET only, whatever ``/api/{action}`` takes), else every
    pattern's that matches; empty when no route knows the path."""
    fixed: set[str] = set()
    matched: set[str] = set()
    for resource in request.app.router.resources():
        _match, methods = await resource.resolve(request)
        if "*" in methods:  # the catch-all serves every path and method
            continue
        matched |= methods
        if methods and resource.canonical == request.path:
            fixed |= methods
    if request.path.removeprefix("/api/") in POST_ONLY:  # its GET route only refuses
        matched -= {"GET", "HEAD"}
    return sorted(fixed or matched)


def method_not_allowed(request: web.Request, allowed: list[str]) -> Rejection:
    """405 ``method_not_allowed`` for a known path asked with another method; ``allow``
    lists the methods it serves (the envelope also sends them as the ``Allow`` header)."""
    return Rejection(
        "method_not_allowed",
        f"{request.method} is not served at {request.path[:200]}; use {', '.join(allowed)}",
        allow=allowed,
    )


async def not_found(request: web.Request) -> web.Response:
    """The catch-all: 405 with ``Allow`` when another method serves the path, else 404."""
    allowed = await allowed_methods(request)
    if allowed:
        raise method_not_allowed(request, allowed)
    raise Rejection("not_found", path=request.path)
