"""``actions/retire`` as a standard x402 v2 resource (design: docs/design/x402-v2.md, (a) Wire
shapes and C4): the x402 headers in and out of the endpoint's retirement action, and the
facilitator's discovery list of this resource.

- Without a payment: today's 402 body, plus ``PAYMENT-REQUIRED`` (standard base64 of compact
  JSON ``PaymentRequired``: ``x402Version`` 2, ``resource``, one ``exact`` entry in ``accepts``
  with ``extra.quoteRef``).
- With ``PAYMENT-SIGNATURE`` (the same body): the payment is taken
  (:meth:`~relayer.service.payments.resource.Payments.pay`): HTTP 200 with ``PAYMENT-RESPONSE``
  (``SettleResponse``) and today's outcome body plus ``paymentId`` and ``payment``; a payment
  refused before anything was charged is a 402 with a fresh ``PAYMENT-REQUIRED`` whose
  ``error`` is the reason.
- ``GET /facilitator/discovery/resources``: the resource, from the same builder as its 402.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Final

from aiohttp import web

from relayer.api.facilitator import guarded
from relayer.api.kernel import RESPONSE_HEADERS
from relayer.api.x402_routes import X402_RESOURCE, X402Resource, services_for
from relayer.domain.errors import Rejection, RelayerError
from relayer.domain.schemas import ActionRequest
from relayer.domain.verify import Refusal
from relayer.domain.x402_wire import (
    X402_VERSION,
    PaymentPayload,
    PaymentRequired,
    PaymentRequirements,
    ResourceInfo,
    SettleResponse,
)
from relayer.service.payments.drive import Paid
from relayer.service.payments.offer import Offer
from relayer.service.payments.resource import Payments

log = logging.getLogger(__name__)

PAYMENT_REQUIRED: Final = "PAYMENT-REQUIRED"
PAYMENT_SIGNATURE: Final = "PAYMENT-SIGNATURE"
PAYMENT_RESPONSE: Final = "PAYMENT-RESPONSE"
EXPOSE: Final = {"Access-Control-Expose-Headers": f"{PAYMENT_REQUIRED}, {PAYMENT_RESPONSE}"}
PAYMENTS: Final = web.AppKey("x402_payments", Payments)


def resource_info(offer: Offer, url: str) -> ResourceInfo:
    return ResourceInfo(url=url, description=offer.description, mimeType="application/json")


def payment_required(offer: Offer, url: str, error: str | None) -> PaymentRequired:
    """The ``PaymentRequired`` object of a 402 (``error``: why a payment was refused)."""
    return PaymentRequired(
        x402Version=X402_VERSION,
        error=error,
        resource=resource_info(offer, url),
        accepts=[PaymentRequirements.of(offer.requirements)],
    )


class Resource(X402Resource):
    """The hooks :mod:`relayer.api.x402_routes` calls for ``actions/retire``."""

    def __init__(self, payments: Payments, url: str) -> None:
        self.payments = payments
        self.url = url

    async def retire(self, request: web.Request, req: ActionRequest, now: int) -> web.Response:
        """``actions/retire`` with the x402 headers (see the module).

        Raises:
            Rejection: as the endpoint's actions/retire (402 ``payment_required`` with the
                ``PAYMENT-REQUIRED`` header set on the request's response headers).
            Unavailable: the node or the database failed before a payment was recorded.
        """
        request[RESPONSE_HEADERS] = dict(EXPOSE)
        header = request.headers.get(PAYMENT_SIGNATURE)
        error: str | None = None
        if header is not None and req.authPayload is None:
            answer = await self._pay(req, header, now)
            if isinstance(answer, Paid):
                return self._paid(answer)
            error = answer.reason
            request[RESPONSE_HEADERS][PAYMENT_RESPONSE] = SettleResponse(
                success=False,
                errorReason=answer.reason,
                errorMessage=answer.message,
                transaction="",
                network=self.payments.network,
            ).header()
        services = services_for(request, req.chainId)
        try:
            outcome = await services.relay.retire(req, now)
        except Rejection as err:
            if err.code == "payment_required":
                await self._challenge(request, req, now, error, err)
            raise
        return web.json_response(outcome.body, status=200 if outcome.final else 202, headers=EXPOSE)

    async def _pay(self, req: ActionRequest, header: str, now: int) -> Paid | Refusal:
        try:
            payload = PaymentPayload.from_header(header)
        except ValueError as exc:  # pydantic's ValidationError among them
            return Refusal("invalid_payload", f"PAYMENT-SIGNATURE: {exc}"[:300])
        return await self.payments.pay(req, payload, now)

    async def _challenge(
        self, request: web.Request, req: ActionRequest, now: int, error: str | None, err: Rejection
    ) -> None:
        """Set the ``PAYMENT-REQUIRED`` header of a 402 (no header when the resource is not
        offered for this request, or its offer could not be priced now)."""
        if error is not None:
            err.context["x402Error"] = error
        try:
            offer = await self.payments.offer(req, now)
        except RelayerError as exc:
            log.warning("no standard x402 offer for this 402", extra={"code": exc.code})
            return
        if offer is not None:
            request[RESPONSE_HEADERS][PAYMENT_REQUIRED] = payment_required(offer, self.url, error).header()

    async def items(self, now: int) -> list[dict[str, Any]]:
        """The discovery items: the retirement resource, its ``accepts`` priced for an example
        retirement (1 t of the first class, for a payer-named beneficiary), with the bazaar
        input/output description and the JSON Schema of the request; none when it is not
        offered or cannot be priced now."""
        payments = self.payments
        if not payments.enabled:
            return []
        try:
            symbol = await payments.example_class()
            if symbol is None:
                return []
            example = {
                "action": "actions/retire",
                "carbonClass": symbol,
                "amount": "1",
                "inputToken": "USDC",
                "from": payments.pay_to,
                "details": {"beneficiaryIsPayer": True, "beneficiaryString": "Example beneficiary"},
            }
            req = ActionRequest.model_validate({k: v for k, v in example.items() if k != "action"})
            offer = await payments.offer(req, now, quote=False)
        except RelayerError as exc:
            log.warning("discovery could not price the retirement resource", extra={"code": exc.code})
            return []
        if offer is None:
            return []
        output = {
            "status": "settled",
            "transactionHash": "0x…",
            "retirements": [],
            "paymentId": "…",
            "payment": {"transaction": "0x…", "status": "retired", "amount": str(offer.requirements.amount)},
        }
        return [
            {
                "resource": self.url,
                "type": "http",
                "x402Version": X402_VERSION,
                "accepts": [PaymentRequirements.of(offer.requirements).canonical()],
                "lastUpdated": now,
                "description": "Retire carbon credits on chain (actions/retire); priced per request: "
                + offer.description,
                "mimeType": "application/json",
                "extensions": {
                    "bazaar": {
                        "info": {
                            "input": {"type": "http", "method": "POST", "bodyType": "json", "body": example},
                            "output": {"type": "json", "example": output},
                        },
                        "schema": {"input": ActionRequest.model_json_schema(by_alias=True)},
                    }
                },
            }
        ]

    def _paid(self, answer: Paid) -> web.Response:
        row = answer.payment
        tx = "" if answer.payment_tx is None else "0x" + answer.payment_tx.hex()
        settle = SettleResponse(
            success=answer.paid,
            errorReason=None if answer.paid else "settlement_pending",
            payer=row.payer,
            transaction=tx,
            network=self.payments.network,
            amount=str(row.amount) if answer.paid else None,
        )
        body = dict(answer.retirement or {"status": _status(row.state)})
        body["paymentId"] = str(row.id)
        body["payment"] = {"transaction": tx or None, "status": row.state, "amount": str(row.amount)}
        if row.refund_job_id is not None:
            refund = None if answer.refund_tx is None else "0x" + answer.refund_tx.hex()
            body["refund"] = {"transaction": refund, "status": row.state, "reason": row.error}
        headers = {**EXPOSE, PAYMENT_RESPONSE: settle.header()}
        return web.json_response(body, status=200, headers=headers)


def _status(state: str) -> str:
    """The body's ``status`` of a payment without a retirement outcome."""
    return {"refunding": "refund_pending", "refunded": "refunded"}.get(state, "accepted")


DISCOVERY_LIMIT_MAX: Final = 100


@guarded
async def discovery(request: web.Request) -> web.Response:
    """``GET /facilitator/discovery/resources``: this daemon's retirement resource (spec §8),
    built by the same builder as its 402 (no ``quoteRef``: discovery is not a quote)."""
    resource: Resource = request.app[PAYMENTS_RESOURCE]
    try:
        limit = int(request.query.get("limit", "20"))
        offset = int(request.query.get("offset", "0"))
    except ValueError:
        raise Rejection("invalid_json", "limit and offset are integers") from None
    limit, offset = max(1, min(limit, DISCOVERY_LIMIT_MAX)), max(0, offset)
    kind = request.query.get("type", "http")
    items = await resource.items(int(time.time())) if kind == "http" else []
    return web.json_response(
        {
            "x402Version": X402_VERSION,
            "items": items[offset : offset + limit],
            "pagination": {"limit": limit, "offset": offset, "total": len(items)},
        }
    )


PAYMENTS_RESOURCE: Final = web.AppKey("x402_resource", Resource)


def add_resource_routes(
    app: web.Application, payments: Payments, url: str, others: Sequence[Payments] = ()
) -> None:
    """Serve ``actions/retire`` as a standard x402 resource at ``url`` on the first chain
    (``payments``) and on each other relayed chain (``others``), each request's ``chainId``
    choosing, and list the first chain's at ``/facilitator/discovery/resources``."""
    resource = Resource(payments, url)
    app[X402_RESOURCE] = {p.chain_id: Resource(p, url) for p in others} | {payments.chain_id: resource}
    app[PAYMENTS_RESOURCE] = resource
    app.router.add_get("/facilitator/discovery/resources", discovery)
