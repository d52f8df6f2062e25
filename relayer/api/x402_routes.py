"""The x402 retirement endpoint's routes (spec: Endpoints; the actions by ``GET /api/<action>``
with query parameters or ``POST /api`` with ``action``): strict parsing, the API major a host
serves, the index, and the action's service call. Errors are raised and answered by the
kernel's envelope (:mod:`relayer.api.kernel`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from aiohttp import web

from relayer.api import pages
from relayer.api.kernel import METRICS, _json, allowed_methods, method_not_allowed, read_object
from relayer.api.x402_meta import NAV
from relayer.api.x402_versions import (
    LATEST_VERSION,
    ignores_unknown_keys,
    newest_of_major,
)
from relayer.domain import views
from relayer.domain.errors import Rejection, RelayerError, allowed_codes
from relayer.domain.schemas import ACTIONS, ActionRequest, nest_query, parse_request
from relayer.service.certificate import Certificates
from relayer.service.discover import Discover
from relayer.service.prepare import Prepare
from relayer.service.relay import Relay
from relayer.service.supply import Supply

log = logging.getLogger(__name__)

API_VERSION: Final = LATEST_VERSION
LATEST_MAJOR: Final = int(LATEST_VERSION.split(".")[0])
_TOP_LEVEL_KEYS: Final = frozenset(f.alias or name for name, f in ActionRequest.model_fields.items())
_NEEDS_BENEFICIARY: Final = ("prepare-auth", "actions/retire")


@dataclass(frozen=True, slots=True)
class AppServices:
    """The services the routes call."""

    supply: Supply
    discover: Discover
    prepare: Prepare
    relay: Relay
    certificates: Certificates


SERVICES: Final = web.AppKey("services", AppServices)
CHAIN_SERVICES: Final[web.AppKey[Mapping[int, AppServices]]] = web.AppKey("chain_services")
"""Every relayed chain's services by chain id (the first chain's are :data:`SERVICES`)."""


def services_for(request: web.Request, chain_id: int | None) -> AppServices:
    """The services of the chain a request names (spec: What the service does: 8453 and
    84532 at one endpoint): that chain's when this daemon relays on it; else the first
    chain's, which serve a request without ``chainId`` and refuse another chain
    (``unsupported_chain_id``, or ``schema_validation`` where the action has no such code,
    naming the chains served)."""
    first = request.app[SERVICES]
    by_chain = request.app.get(CHAIN_SERVICES)
    if chain_id is None or by_chain is None:
        return first
    return by_chain.get(chain_id, first)


MAJORS: Final[web.AppKey[dict[str, int]]] = web.AppKey("majors")


class X402Resource(Protocol):
    """``actions/retire`` as a standard x402 resource (see :mod:`relayer.api.x402_resource`),
    when the daemon mounts it."""

    async def retire(self, request: web.Request, req: ActionRequest, now: int) -> web.Response: ...


X402_RESOURCE: Final[web.AppKey[Mapping[int, X402Resource]]] = web.AppKey("x402_resource_hooks")
"""The standard x402 resource of each relayed chain that offers it, by chain id."""


def major_of(request: web.Request) -> int:
    """The API major a request is served as, chosen by its ``Host`` alone (spec: Versioning:
    no header, query parameter or Accept negotiation): the v0 host serves major 0, the v1
    host major 1, every other host the latest major."""
    return request.app[MAJORS].get(request.host.lower(), LATEST_MAJOR)


def as_major(major: int, action: str, body: dict[str, Any]) -> dict[str, Any]:
    """A request as ``major`` takes it: major 0 (before the two breaking releases that led to
    1.0.0) ignores unknown top-level keys, and retires for the payer a relayed retirement
    that names no beneficiary (no attribution field required)."""
    if ignores_unknown_keys(major):
        body = {k: v for k, v in body.items() if k in _TOP_LEVEL_KEYS}
    if major >= 1:
        return body
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
        body = as_major(major_of(request), action, body)
        signed = action == "actions/retire" and body.get("authPayload") is not None
        try:
            answer = await _run(request, action, parse_request(body))
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


async def _run(request: web.Request, action: str, req: ActionRequest) -> web.Response:
    services = services_for(request, req.chainId)
    now = int(time.time())
    if action == "discover":
        return _json(await services.discover.discover(req, now))
    if action == "quote":
        return _json(services.supply.quote_body(await services.supply.resolve(req, now)))
    if action == "prepare-auth":
        return _json(await services.prepare.prepare_auth(req, now))
    if action == "prepare/retire":
        return _json(await services.prepare.prepare_retire(req, now))
    if action == "certificate":
        return _json(await services.certificates.certificate(req))
    resource = request.app.get(X402_RESOURCE, {}).get(services.supply.chain_id)
    if resource is not None:  # the standard x402 headers in and out, on the request's chain
        return await resource.retire(request, req, now)
    outcome = await services.relay.retire(req, now)
    # Past its wait, a relay still on its way answers 202 (post the identical request again).
    return _json(outcome.body, 200 if outcome.final else 202)


async def post_api(request: web.Request) -> web.Response:
    body = await read_object(request)
    action = body.pop("action", None)
    return await _dispatch(request, action if isinstance(action, str) else None, body)


async def get_action(request: web.Request) -> web.Response:
    action = request.match_info["action"]
    if action == "actions/retire":  # moves funds: POST only, signatures never in a URL
        raise method_not_allowed(request, ["POST"])
    query = dict(request.query)
    if len(query) != len(request.query):
        raise Rejection(
            "schema_validation",
            "repeated query parameters",
            issues=[{"path": [], "keys": sorted(set(request.query)), "message": "repeated"}],
        )
    return await _dispatch(request, action, nest_query(query))


async def post_action(request: web.Request) -> web.Response:
    action = request.match_info["action"]
    if action not in ACTIONS:  # a meta document's path (GET only) is 405, not an unknown action
        allowed = await allowed_methods(request)
        if "POST" not in allowed:
            raise method_not_allowed(request, allowed)
    body = await read_object(request)
    if body.get("action", action) != action:
        raise Rejection("unknown_action", "action in path and body differ", supported=list(ACTIONS))
    body.pop("action", None)
    return await _dispatch(request, action, body)


async def index(request: web.Request) -> web.Response:
    """``GET /`` and ``GET /api``: what this endpoint is, as JSON, or as an HTML page for a
    client that prefers ``text/html`` (:func:`relayer.api.pages.wants_html`)."""
    supply = request.app[SERVICES].supply
    body: views.Index = {
        "name": "x402 carbon retirement endpoint",
        "apiVersion": newest_of_major(major_of(request)),
        "x402FacilitatorVersion": 2,
        "chainId": supply.chain_id,
        "settlement": supply.contracts.settlement,
        "actions": [
            {"action": a, "get": f"/api/{a}" if a != "actions/retire" else None, "post": "/api"}
            for a in ACTIONS
        ],
    }
    if pages.wants_html(request):
        return pages.html_response(index_page(body))
    response = _json(body)
    response.headers["Vary"] = "Accept"
    return response


def index_page(body: views.Index) -> str:
    """The root document as an HTML page: name, versions, chain, contract, actions, links."""
    e = pages.e
    rows = "\n".join(
        f"<tr><td><code>{e(a['action'])}</code></td>"
        + (
            f'<td><a href="{e(a["get"])}"><code>GET {e(a["get"])}</code></a></td>'
            if a["get"]
            else "<td>—</td>"
        )
        + f"<td><code>POST {e(a['post'])}</code></td></tr>"
        for a in body["actions"]
    )
    html = (
        f"<h1>{e(body['name'])}</h1>\n"
        "<p>Retire carbon credits on Base while holding only USDC or kVCM: x402 payments, "
        "settled gaslessly by this relay. Start with the guides.</p>\n"
        "<dl>\n"
        f"<dt>API version</dt><dd><code>{e(body['apiVersion'])}</code></dd>\n"
        f"<dt>x402 facilitator version</dt><dd>{e(body['x402FacilitatorVersion'])}</dd>\n"
        f"<dt>Chain id</dt><dd>{e(body['chainId'])}</dd>\n"
        f"<dt>Settlement contract</dt><dd><code>{e(body['settlement'])}</code></dd>\n"
        "</dl>\n"
        "<h2>Actions</h2>\n"
        "<table><thead><tr><th>action</th><th>read</th><th>call</th></tr></thead>\n"
        f"<tbody>\n{rows}\n</tbody></table>\n"
        "<p>The same as JSON: <code>GET /</code> with <code>Accept: application/json</code> "
        "(or without <code>Accept</code>).</p>"
    )
    return pages.page(str(body["name"]), html, NAV)
