"""The one place an error becomes an HTTP answer, for both surfaces: the status is the
registry's for the error's code (the same on every surface), the body is the surface's own
wire format (:data:`BODIES`).

- x402 endpoint (spec: x402-retirement-endpoint.md, Errors):
  ``{...context, error, message, x402FacilitatorVersion}``.
- marketplace API (marketplace-api.md): ``{statusCode, error, message, code, ...context}``,
  ``error`` being the status's HTTP reason phrase and ``code`` the registry code.
- x402 facilitator (``/facilitator``): ``{error, message}`` (payments themselves are answered
  200 with ``isValid``/``success`` false and the spec's reason).

The envelope's own fields win over context fields of the same name. Every error answered
is one line: ``refused`` at INFO (4xx) or ``failed`` at WARNING (5xx), with its ``code``,
``status`` and ``surface`` (and the request's id, see :mod:`relayer.logs`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from http import HTTPStatus
from types import MappingProxyType
from typing import Any, Final, Literal

from aiohttp import web

from relayer.domain.errors import X402_FACILITATOR_VERSION, RelayerError

log = logging.getLogger(__name__)

Surface = Literal["x402", "marketplace", "facilitator"]


def surface_of(path: str) -> Surface:
    """The surface a path belongs to (whose error body it answers): the x402 endpoint's
    paths, the x402 facilitator's, or else the marketplace API's."""
    x402 = path == "/" or path.startswith(("/api", "/.well-known", "/metrics", "/healthz", "/readyz"))
    if x402:
        return "x402"
    return "facilitator" if path == "/facilitator" or path.startswith("/facilitator/") else "marketplace"


def status_of(error: RelayerError) -> int:
    """The HTTP status of ``error`` on any surface: its code's row of the registry."""
    return error.spec.http_status


def x402_body(error: RelayerError) -> dict[str, Any]:
    """The x402 envelope ``{...context, error, message, x402FacilitatorVersion}``."""
    return {
        **error.context,
        "error": error.code,
        "message": error.message,
        "x402FacilitatorVersion": X402_FACILITATOR_VERSION,
    }


def marketplace_body(error: RelayerError) -> dict[str, Any]:
    """The marketplace body ``{statusCode, error (reason phrase), message, code, ...context}``."""
    status = status_of(error)
    envelope = {
        "statusCode": status,
        "error": HTTPStatus(status).phrase,
        "message": error.message,
        "code": error.code,
    }
    return {**envelope, **{k: v for k, v in error.context.items() if k not in envelope}}


def facilitator_body(error: RelayerError) -> dict[str, Any]:
    """The x402 facilitator's small body ``{error, message}`` (a refusal that is not about the
    payment: 401 without an API key, 400 not JSON, 404, 429)."""
    return {"error": error.code, "message": error.message}


BODIES: Final[Mapping[Surface, Callable[[RelayerError], dict[str, Any]]]] = MappingProxyType(
    {"x402": x402_body, "marketplace": marketplace_body, "facilitator": facilitator_body}
)
"""The body of an error on each surface (the status is :func:`status_of` on both)."""
_ENCODE: Final[Mapping[Surface, Callable[[dict[str, Any]], str]]] = MappingProxyType(
    {
        "x402": json.dumps,
        "facilitator": json.dumps,
        "marketplace": lambda body: json.dumps(body, separators=(",", ":"), ensure_ascii=False),
    }
)
"""Each surface's JSON encoding, as its successful answers have it."""


def error_body(error: RelayerError, surface: Surface) -> dict[str, Any]:
    """The error body of ``surface`` for ``error``."""
    return BODIES[surface](error)


def error_response(error: RelayerError, surface: Surface) -> web.Response:
    """The HTTP answer to ``error`` on ``surface``: the registry's status and the surface's
    body (JSON; a 429 also says ``Retry-After`` from ``retryAfterSeconds``, a 405 ``Allow`` from
    ``allow``); logs it (one line, see the module's docstring)."""
    status = status_of(error)
    fields = {"code": error.code, "status": status, "surface": surface}
    if isinstance(error.context.get("cause"), str):  # the code it stands for (internal_error)
        fields["cause"] = error.context["cause"]
    if status < 500:
        log.info("refused", extra=fields)
    else:
        log.warning("failed", extra=fields)
    body = _ENCODE[surface](error_body(error, surface))
    response = web.Response(text=body, status=status, content_type="application/json")
    if status == 429:
        response.headers["Retry-After"] = str(error.context.get("retryAfterSeconds", 1))
    if status_of(error) == 405:
        response.headers["Allow"] = ", ".join(error.context.get("allow", ()))
    return response
