"""HTTP surface of the standard x402 v2 facilitator, under ``/facilitator`` on the daemon
(design: docs/design/x402-v2.md, (a) Facilitator bodies and C2):

- ``GET /facilitator/supported`` (public): the kinds, extensions (``payment-identifier``)
  and signers served.
- ``POST /facilitator/verify`` and ``POST /facilitator/settle`` (``Authorization: Bearer``
  with an API key of scope ``facilitator``; 401 ``{error, message}`` without one): the body
  is ``{x402Version, paymentPayload, paymentRequirements}``. A payment that is invalid is
  answered HTTP 200 with ``isValid``/``success`` false and the spec's reason, since the SDKs
  treat any other status as a transport error; a body that is not one JSON object is 400.
- ``payment-identifier`` (x402-foundation/x402 specs/extensions/payment_identifier.md):
  ``paymentPayload.extensions["payment-identifier"].info.id`` is read here with the SHA-256
  of the payload's canonical JSON (:func:`payment_identifier`); a malformed extension or id
  is ``invalid_payload`` (200); the same id with another payload on settle is 409
  ``{error: "payment_identifier_conflict", message}`` (the service's refusal, rendered by
  :mod:`relayer.api.errors` on the facilitator surface).

- Each key has a request limit (its own or ``facilitator_default_rate_limit``; moving
  windows per process, so per replica): past it, 429 ``rate_limited`` with ``Retry-After``.
  A settle that would pass the key's daily gas budget (design C3) is 429
  ``gas_budget_exhausted`` with ``Retry-After`` (seconds to the next UTC day).
- ``GET /facilitator/discovery/resources`` (public): the retirement resource
  (:mod:`relayer.api.x402_resource`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from pydantic import ValidationError

from relayer.api.errors import error_response
from relayer.api.kernel import METRICS, RateLimit, read_object
from relayer.domain.addresses import checksum_address
from relayer.domain.errors import Rejection, RelayerError
from relayer.domain.x402_wire import (
    PAYMENT_IDENTIFIER,
    X402_VERSION,
    FacilitatorRequest,
    Payment,
    PaymentIdentifier,
    SettleResponse,
    payment_identifier,
)
from relayer.service.market.keys import ApiKeys, KeyInfo
from relayer.service.payments.facilitator import Facilitator, Settlement

log = logging.getLogger(__name__)

FACILITATOR: Final = web.AppKey("facilitator", Facilitator)
FACILITATOR_KEYS: Final = web.AppKey("facilitator_keys", ApiKeys)
PREFIX: Final = "/facilitator"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class KeyLimits:
    """Each facilitator API key's request limit and daily gas budget, its own or the
    defaults (``limits`` notation; wei per UTC day). The request limits are the ``limits``
    library's moving windows (:class:`RateLimit`) keyed ``facilitator:<key id>``, in this
    process's memory: each replica counts on its own. At most :data:`MAX_SPECS` distinct
    limits are kept; a key whose stored limit is unreadable or past that count has the
    default."""

    MAX_SPECS: Final = 64

    def __init__(self, default_rate: str, default_budget_wei: int, max_keys: int = 10_000) -> None:
        self.default_rate = default_rate
        self.default_budget_wei = default_budget_wei
        self.max_keys = max_keys
        self._limits: dict[str, RateLimit] = {default_rate: RateLimit(default_rate, max_clients=max_keys)}

    def budget_wei(self, key: KeyInfo) -> int:
        """The key's daily gas budget in wei."""
        return self.default_budget_wei if key.gas_budget_wei_per_day is None else key.gas_budget_wei_per_day

    def retry_after(self, key: KeyInfo) -> int | None:
        """Count a request of ``key``: None when within its limit, else the seconds until it
        may send again."""
        return self._limit(key.rate_limit or self.default_rate).hit(f"facilitator:{key.id}")

    def _limit(self, spec: str) -> RateLimit:
        limit = self._limits.get(spec)
        if limit is not None:
            return limit
        if len(self._limits) >= self.MAX_SPECS:
            return self._limits[self.default_rate]
        try:
            limit = RateLimit(spec, max_clients=self.max_keys)
        except ValueError:
            log.warning("an API key's rate limit is unreadable: the default applies")
            return self._limits[self.default_rate]
        self._limits[spec] = limit
        return limit


FACILITATOR_LIMITS: Final = web.AppKey("facilitator_limits", KeyLimits)
FACILITATORS: Final[web.AppKey[dict[str, Facilitator]]] = web.AppKey("facilitators")
"""Every relayed chain's facilitator by its CAIP-2 network (``eip155:8453``), first chain's first."""


def _facilitator_for(request: web.Request, model: FacilitatorRequest | None) -> Facilitator:
    """The facilitator of the network a payment's requirements name; the first chain's for a
    body refused before its network is read, or a network not served (which it refuses,
    naming the served ones)."""
    first = request.app[FACILITATOR]
    if model is None:
        return first
    return request.app[FACILITATORS].get(model.paymentRequirements.network, first)


def guarded(handler: Handler) -> Handler:
    """Answer a refusal of a facilitator handler (401, 400, 409) in the facilitator's small
    body ``{error, message}``; anything else is the envelope's 500."""

    async def run(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except RelayerError as error:
            request.app[METRICS].error_responses.labels(error.code).inc()
            return error_response(error, "facilitator")

    return run


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


def _payer_of(body: dict[str, Any]) -> str | None:
    """``paymentPayload.payload.authorization.from`` when it is an address, for refusals."""
    try:
        payer = body["paymentPayload"]["payload"]["authorization"]["from"]
    except (KeyError, TypeError):
        return None
    if not isinstance(payer, str) or re.fullmatch(r"0x[0-9a-fA-F]{40}", payer) is None:
        return None
    return checksum_address(payer)


def _version_ok(body: dict[str, Any]) -> bool:
    inner = body.get("paymentPayload")
    versions = [body.get("x402Version"), inner.get("x402Version") if isinstance(inner, dict) else None]
    return all(type(v) is int and v == X402_VERSION for v in versions)


@dataclass(frozen=True, slots=True)
class _Parsed:
    """A request authenticated and read: the API key, the model (None when the payload is
    refused before any check: ``reason`` and ``message`` say why), the raw body."""

    key: KeyInfo
    model: FacilitatorRequest | None
    body: dict[str, Any]
    reason: str = ""
    message: str = ""
    identifier: PaymentIdentifier | None = None

    def payment(self) -> Payment:
        assert self.model is not None
        return self.model.payment(self.identifier)


async def _parsed(request: web.Request) -> _Parsed:
    """Authenticate (401 without a valid key of scope ``facilitator``), count the request
    against the key's limit (429 ``rate_limited`` past it), read (400 unless one JSON object)
    and validate the body."""
    key = await request.app[FACILITATOR_KEYS].authenticate(
        request.headers.get("Authorization"), "facilitator"
    )
    wait = request.app[FACILITATOR_LIMITS].retry_after(key)
    if wait is not None:
        request.app[METRICS].rate_limited.inc()
        message = f"too many requests with this API key; retry in {wait} s"
        raise Rejection("rate_limited", message, retryAfterSeconds=wait)
    body = await read_object(request)
    if not _version_ok(body):
        return _Parsed(key, None, body, "invalid_x402_version", f"x402Version must be {X402_VERSION}")
    try:
        model = FacilitatorRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return _Parsed(key, None, body, "invalid_payload", f"{where}: {first['msg']}"[:300])
    try:
        identifier = payment_identifier(body)
    except ValueError as exc:
        return _Parsed(key, None, body, "invalid_payload", str(exc))
    return _Parsed(key, model, body, identifier=identifier)


@guarded
async def supported(request: web.Request) -> web.Response:
    served = request.app[FACILITATORS]
    executors = list(dict.fromkeys(a for f in served.values() for a in f.executors))
    return _json(
        {
            "kinds": [
                {"x402Version": X402_VERSION, "scheme": "exact", "network": network} for network in served
            ],
            "extensions": [PAYMENT_IDENTIFIER],
            "signers": {"eip155:*": executors},
        }
    )


@guarded
async def verify(request: web.Request) -> web.Response:
    p = await _parsed(request)
    if p.model is None:
        refused = {"isValid": False, "invalidReason": p.reason, "invalidMessage": p.message}
        return _payment_answer(_drop_none({**refused, "payer": _payer_of(p.body)}), p.reason)
    verdict = await _facilitator_for(request, p.model).verify(p.payment(), int(time.time()))
    return _payment_answer(
        _drop_none(
            {
                "isValid": verdict.valid,
                "invalidReason": verdict.reason,
                "invalidMessage": verdict.message,
                "payer": verdict.payer,
            }
        ),
        None if verdict.valid else verdict.reason,
    )


@guarded
async def settle(request: web.Request) -> web.Response:
    p = await _parsed(request)
    f = _facilitator_for(request, p.model)
    if p.model is None:
        refused = Settlement(False, _payer_of(p.body) or "", reason=p.reason, message=p.message)
        return _payment_answer(_settle_body(refused, f.network), p.reason)
    budget = request.app[FACILITATOR_LIMITS].budget_wei(p.key)
    settled = await f.settle(p.payment(), int(time.time()), api_key_id=p.key.id, gas_budget_wei=budget)
    return _payment_answer(_settle_body(settled, f.network), None if settled.success else settled.reason)


def _payment_answer(body: dict[str, Any], refused: str | None) -> web.Response:
    """The 200 answer to a verify or settle; a payment refused (``refused``: the spec's
    reason) is one INFO line, as an error answer is (see :mod:`relayer.api.errors`)."""
    if refused is not None:
        log.info("refused", extra={"code": refused, "status": 200, "surface": "facilitator"})
    return _json(body)


def _settle_body(s: Settlement, network: str) -> dict[str, Any]:
    return SettleResponse(
        success=s.success,
        errorReason=s.reason,
        errorMessage=s.message,
        payer=s.payer or None,
        transaction=s.transaction,
        network=network,
        amount=None if s.amount is None else str(s.amount),
    ).canonical()


def _drop_none(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def add_facilitator_routes(
    app: web.Application,
    facilitator: Facilitator,
    keys: ApiKeys,
    limits: KeyLimits,
    others: Sequence[Facilitator] = (),
) -> None:
    """Mount the facilitator routes under :data:`PREFIX` on the daemon's application:
    ``facilitator`` of the first chain, ``others`` of the other relayed chains (``/supported``
    lists a kind per chain; ``/verify`` and ``/settle`` go by the requirements' network)."""
    app[FACILITATOR] = facilitator
    app[FACILITATORS] = {f.network: f for f in (facilitator, *others)}
    app[FACILITATOR_KEYS] = keys
    app[FACILITATOR_LIMITS] = limits
    app.router.add_get(f"{PREFIX}/supported", supported)
    app.router.add_post(f"{PREFIX}/verify", verify)
    app.router.add_post(f"{PREFIX}/settle", settle)
