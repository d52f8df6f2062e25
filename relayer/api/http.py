"""HTTP surface of the x402 retirement endpoint (aiohttp): routes, strict parsing, the
spec's JSON error envelope, ``/metrics``, ``/healthz``, ``/readyz``. Errors are answered
through :mod:`relayer.api.errors` (the registry's status, the surface's body), and any
exception that is not a :class:`RelayerError` is the only way to a 500."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import limits
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from relayer.api.errors import Surface, error_response
from relayer.api.x402_meta import LATEST_VERSION, X402Info, add_meta_routes
from relayer.domain.errors import Rejection, RelayerError, allowed_codes
from relayer.domain.schemas import ACTIONS, ActionRequest, nest_query, parse_request
from relayer.metrics import Metrics
from relayer.service.certificate import Certificates
from relayer.service.prepare import Prepare
from relayer.service.relay import Relay
from relayer.service.supply import Supply

log = logging.getLogger(__name__)

API_VERSION: Final = LATEST_VERSION
LATEST_MAJOR: Final = 1
_TOP_LEVEL_KEYS: Final = frozenset(f.alias or name for name, f in ActionRequest.model_fields.items())
_NEEDS_BENEFICIARY: Final = ("prepare-auth", "actions/retire")

# Request ids: a random prefix per process and a counter (unique without the system call per
# request that uuid4 makes).
_REQUEST_IDS: Final = (f"{uuid.uuid4().hex[:12]}-{n}" for n in itertools.count(1))


@dataclass(frozen=True, slots=True)
class AppServices:
    """The services the routes call."""

    supply: Supply
    prepare: Prepare
    relay: Relay
    certificates: Certificates


SERVICES: Final = web.AppKey("services", AppServices)
METRICS: Final = web.AppKey("metrics", Metrics)
REQUEST_ID: Final = web.RequestKey("request_id", str)
MAJORS: Final[web.AppKey[dict[str, int]]] = web.AppKey("majors")
READY: Final[web.AppKey[Callable[[], Awaitable[bool]]]] = web.AppKey("ready")
RATE_LIMIT: Final[web.AppKey[RateLimit]] = web.AppKey("rate_limit")
TIMEOUT_S: Final = web.AppKey("timeout_s", float)
DEFAULT_TIMEOUT_S: Final = 75.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


class RateLimit:
    """The per-client request limit (the ``limits`` library's moving windows, in this
    process's memory: each replica counts its own clients). ``spec`` in its notation, e.g.
    ``"50/second;1000/minute"``; ``"off"`` or None: no limit. The client is the peer
    address, or the first ``X-Forwarded-For`` address when ``forwarded_for`` (only behind a
    proxy that sets it)."""

    EXEMPT: Final = frozenset({"/healthz", "/readyz", "/metrics"})

    def __init__(self, spec: str | None, forwarded_for: bool = False) -> None:
        off = spec is None or spec.strip().lower() in ("", "off", "none")
        self.items = [] if off else limits.parse_many(spec or "")
        self.limiter = limits.strategies.MovingWindowRateLimiter(limits.storage.MemoryStorage())
        self.forwarded_for = forwarded_for

    def retry_after(self, request: web.Request) -> int | None:
        """None when the request is within the limit (and counts it); else the seconds until
        the client may send again."""
        if not self.items or request.path in self.EXEMPT:
            return None
        client = request.remote or "unknown"
        if self.forwarded_for:
            client = request.headers.get("x-forwarded-for", client).split(",", 1)[0].strip()[:64]
        for item in self.items:
            if not self.limiter.hit(item, client):
                reset = self.limiter.get_window_stats(item, client).reset_time
                return max(1, math.ceil(reset - time.time()))
        return None


def _surface(path: str) -> Surface:
    """The surface a path belongs to (whose error body it answers): the x402 endpoint's
    paths, or else the marketplace API's."""
    x402 = path == "/" or path.startswith(("/api", "/.well-known", "/metrics", "/healthz", "/readyz"))
    return "x402" if x402 else "marketplace"


@web.middleware
async def envelope(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id (``X-Request-ID`` kept or made, echoed back), the per-client rate limit, the
    request timeout, the error envelope for every failure with no internals leaked, and the
    HTTP metrics (route template, method, status, duration; error responses by code)."""
    request_id = request.headers.get("x-request-id") or next(_REQUEST_IDS)
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
        surface = _surface(request.path)
    else:
        try:
            async with asyncio.timeout(request.app.get(TIMEOUT_S, DEFAULT_TIMEOUT_S)):
                response = await handler(request)
        except RelayerError as err:
            error = err
        except web.HTTPRequestEntityTooLarge:
            error = Rejection(
                "schema_validation",
                "request body too large",
                issues=[{"path": [], "keys": [], "message": "body too large"}],
            )
        except web.HTTPNotFound:
            error = Rejection("not_found", path=request.path)
        except web.HTTPMethodNotAllowed:
            error = Rejection("not_found", f"no {request.method} route at {request.path}", path=request.path)
        except TimeoutError:
            log.warning("request timed out", extra={"request_id": request_id, "path": request.path})
            message = "the request ran past the operator's time limit; retry with backoff"
            surface = _surface(request.path)
            if surface == "x402":
                error = Rejection("internal_error", message, cause="timeout")
            else:
                error = Rejection("timeout", message)
        except Exception:
            log.exception("unhandled error", extra={"request_id": request_id, "path": request.path})
            metrics.unhandled_errors.inc()
            error = Rejection("internal_error", requestId=request_id)
    if error is not None:
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
    return response


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        raw = await request.read()
        data = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError):
        raise Rejection("invalid_json") from None
    except RecursionError:  # nesting deeper than the interpreter's stack: not a request body
        raise Rejection("invalid_json", "the JSON is nested too deeply") from None
    if not isinstance(data, dict):
        raise Rejection("invalid_json", "one JSON object is expected")
    return data


def major_of(request: web.Request) -> int:
    """The API major a request is served as, chosen by its ``Host`` alone (spec: Versioning:
    no header, query parameter or Accept negotiation): the v0 host serves major 0, every
    other host the latest major."""
    return request.app[MAJORS].get(request.host.lower(), LATEST_MAJOR)


def as_major_0(action: str, body: dict[str, Any]) -> dict[str, Any]:
    """A request as major 0 took it, before the two breaking releases of 1.0.0: unknown
    top-level keys are ignored, and a relayed retirement that names no beneficiary retires
    for the payer (no attribution field required)."""
    body = {k: v for k, v in body.items() if k in _TOP_LEVEL_KEYS}
    details = body.get("details")
    if action in _NEEDS_BENEFICIARY and (details is None or isinstance(details, dict)):
        named = isinstance(details, dict) and (
            details.get("beneficiaryAddress") is not None or details.get("beneficiaryIsPayer") is not None
        )
        if not named:
            body["details"] = {**(details or {}), "beneficiaryIsPayer": True}
    return body


_FIELD_OF: Final = {"unsupported_chain_id": "chainId", "unsupported_input_token": "inputToken"}


def _within_action(action: str, err: RelayerError) -> RelayerError:
    """``err`` when the spec lets ``action`` answer its code; otherwise the common code that
    says the same to a caller, naming the original as ``cause``: each action answers only the
    codes the spec lists for it and the common ones (spec: Errors). A transient failure (an
    upstream outage in discover, say) is the retryable ``internal_error``; a request that
    must change (a ``chainId`` discover does not serve) is ``schema_validation`` naming the
    field."""
    if err.code in allowed_codes(action):
        return err
    if err.transient:
        return Rejection(
            "internal_error",
            f"{action} could not be served: {err.message}",
            cause=err.code,
            **{k: v for k, v in err.context.items() if k == "upstream"},
        )
    field = _FIELD_OF.get(err.code)
    return Rejection(
        "schema_validation",
        f"{action}: {err.message}",
        cause=err.code,
        issues=[{"path": [field] if field else [], "keys": [field] if field else [], "message": err.message}],
        **{k: v for k, v in err.context.items() if k in ("supported",)},
    )


async def _dispatch(request: web.Request, action: str | None, body: dict[str, Any]) -> web.Response:
    metrics = request.app[METRICS]
    label = action if action in ACTIONS else "unknown"
    started = time.perf_counter()
    code = "ok"
    try:
        if action not in ACTIONS:
            raise Rejection("unknown_action", supported=list(ACTIONS), action=action)
        if major_of(request) == 0:
            body = as_major_0(action, body)
        signed = action == "actions/retire" and body.get("authPayload") is not None
        try:
            answer = await _run(request.app[SERVICES], action, parse_request(body))
        except RelayerError as err:
            if signed:
                metrics.authorizations.labels("refused", err.code).inc()
            raise _within_action(action, err) from None
        if signed:
            metrics.authorizations.labels("accepted", "").inc()
        return answer
    except RelayerError as err:
        code = err.code
        raise
    except Exception:
        code = "internal_error"
        raise
    finally:
        metrics.requests.labels(label, code).inc()
        metrics.request_seconds.labels(label).observe(time.perf_counter() - started)


async def _run(services: AppServices, action: str, req: ActionRequest) -> web.Response:
    now = int(time.time())
    if action == "discover":
        return _json(await services.supply.discover(req, now))
    if action == "quote":
        return _json(services.supply.quote_body(await services.supply.resolve(req, now)))
    if action == "prepare-auth":
        return _json(await services.prepare.prepare_auth(req, now))
    if action == "prepare/retire":
        return _json(await services.prepare.prepare_retire(req, now))
    if action == "certificate":
        return _json(await services.certificates.certificate(req))
    outcome = await services.relay.retire(req, now)
    # Past its wait, a relay still on its way answers 202 (post the identical request again).
    return _json(outcome.body, 200 if outcome.final else 202)


async def post_api(request: web.Request) -> web.Response:
    body = await _body(request)
    action = body.pop("action", None)
    return await _dispatch(request, action if isinstance(action, str) else None, body)


async def get_action(request: web.Request) -> web.Response:
    action = request.match_info["action"]
    if action == "actions/retire":  # moves funds: POST only, signatures never in a URL
        raise Rejection("not_found", "actions/retire is POST only (POST /api with action)", path=request.path)
    query = dict(request.query)
    if len(query) != len(request.query):
        raise Rejection(
            "schema_validation",
            "repeated query parameters",
            issues=[{"path": [], "keys": sorted(set(request.query)), "message": "repeated"}],
        )
    return await _dispatch(request, action, nest_query(query))


async def post_action(request: web.Request) -> web.Response:
    body = await _body(request)
    action = request.match_info["action"]
    if body.get("action", action) != action:
        raise Rejection("unknown_action", "action in path and body differ", supported=list(ACTIONS))
    body.pop("action", None)
    return await _dispatch(request, action, body)


async def index(request: web.Request) -> web.Response:
    supply = request.app[SERVICES].supply
    return _json(
        {
            "name": "x402 carbon retirement endpoint",
            "apiVersion": API_VERSION,
            "x402FacilitatorVersion": 2,
            "chainId": supply.chain_id,
            "settlement": supply.contracts.settlement,
            "actions": [
                {"action": a, "get": f"/api/{a}" if a != "actions/retire" else None, "post": "/api"}
                for a in ACTIONS
            ],
        }
    )


async def metrics_view(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"content-type": CONTENT_TYPE_LATEST})


async def healthz(_request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    ready = await request.app[READY]()
    return _json({"status": "ready" if ready else "not_ready"}, 200 if ready else 503)


async def not_found(request: web.Request) -> web.Response:
    raise Rejection("not_found", path=request.path)


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
) -> web.Application:
    """The aiohttp application over ``services`` (bodies bounded to ``max_body_bytes``);
    ``mount`` adds another surface's routes (the marketplace API) before the catch-all;
    ``majors`` maps a ``Host`` (``host[:port]``, lower case) to the API major it serves;
    ``meta(request, major)`` describes this endpoint for the manifest, changelog, errors
    document, guides, security.txt and OpenAPI document (see :mod:`relayer.api.x402_meta`)."""
    app = web.Application(middlewares=[envelope], client_max_size=max_body_bytes)
    app[SERVICES] = services
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
