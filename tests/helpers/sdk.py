"""The official x402 Python SDK, unmodified, as a merchant and a payer use it against our
facilitator: a paid resource served by the SDK's own Flask middleware (``x402ResourceServerSync``
+ ``HTTPFacilitatorClientSync`` with a bearer auth provider, scheme ``exact`` on a daemon's
chain), fresh payers funded in the chain's USDC, and the SDK's client (``x402ClientSync`` +
``ExactEvmScheme`` through ``x402_requests``) that pays a 402 once. Used by ``test_x402_sdk``
and, once per chain, by ``test_two_chains``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import requests
from eth_account import Account
from flask import Flask, jsonify
from flask import request as flask_request
from werkzeug.serving import BaseWSGIServer, make_server
from x402 import x402ClientSync, x402ResourceServerSync
from x402.http import (
    AuthHeaders,
    FacilitatorConfig,
    HTTPFacilitatorClientSync,
    PaymentOption,
    RouteConfig,
    decode_payment_response_header,
)
from x402.http.clients import x402_requests
from x402.http.middleware.flask import payment_middleware
from x402.mechanisms.evm.exact import ExactEvmScheme, ExactEvmServerScheme
from x402.schemas import AssetAmount, SettleResponse

from relayer.domain.chains import usdc_domain_name
from relayer_dev.ports import free_port
from tests.chain_helpers import transact_as_deployer
from tests.conftest import Daemon

PRICE = 12_345  # atomic USDC units a request
FUNDED = 1_000_000  # what each fresh payer gets


class Bearer:
    """The SDK's ``AuthProvider``: our key on verify and settle; supported stays public."""

    def __init__(self, key: str) -> None:
        self.key = key

    def get_auth_headers(self) -> AuthHeaders:
        auth = {"Authorization": f"Bearer {self.key}"}
        return AuthHeaders(verify=auth, settle=auth)


@dataclass
class Resource:
    """A paid resource served by the SDK's Flask middleware: ``POST {url}`` costs ``price``
    USDC units paid to ``merchant``; the paid requests' PAYMENT-SIGNATURE headers are kept."""

    url: str
    merchant: str
    price: int
    server: BaseWSGIServer
    facilitator: HTTPFacilitatorClientSync
    seen: list[str] = field(default_factory=list)


def start_resource(d: Daemon, key: str | None, *, price: int = PRICE, max_timeout_s: int = 300) -> Resource:
    """Build and start the resource server (blocking: the middleware fetches our /supported
    at start, so call it off the daemon's event loop)."""
    chain_id, usdc = d.chain["chainId"], d.chain["contracts"]["usdc"]
    network, merchant, port = f"eip155:{chain_id}", Account.create().address, free_port()
    facilitator = HTTPFacilitatorClientSync(
        FacilitatorConfig(
            url=f"{d.base_url}/facilitator", auth_provider=None if key is None else Bearer(key), timeout=60
        )
    )
    server = x402ResourceServerSync(facilitator).register(network, ExactEvmServerScheme())
    option = PaymentOption(
        scheme="exact",
        pay_to=merchant,
        network=network,
        max_timeout_seconds=max_timeout_s,
        price=AssetAmount(
            amount=str(price), asset=usdc, extra={"name": usdc_domain_name(chain_id), "version": "2"}
        ),
    )
    app = Flask("x402-sdk-resource")
    seen: list[str] = []

    @app.post("/paid")
    def paid() -> Any:
        seen.append(flask_request.headers["PAYMENT-SIGNATURE"])
        return jsonify({"served": True, "echo": flask_request.get_json(silent=True)})

    payment_middleware(app, {"POST /paid": RouteConfig(accepts=option, description="a paid echo")}, server)
    wsgi = make_server("127.0.0.1", port, app, threaded=True)
    threading.Thread(target=wsgi.serve_forever, daemon=True).start()
    return Resource(f"http://127.0.0.1:{port}/paid", merchant, price, wsgi, facilitator, seen)


@contextlib.asynccontextmanager
async def resource(d: Daemon, key: str | None, **options: Any) -> AsyncIterator[Resource]:
    served = await asyncio.to_thread(start_resource, d, key, **options)
    try:
        yield served
    finally:
        await asyncio.to_thread(served.server.shutdown)
        served.server.server_close()
        served.facilitator.close()


def fresh_payer(d: Daemon, funded: int = FUNDED) -> Any:
    """A new account holding ``funded`` USDC units (and no ETH)."""
    payer = Account.create()
    if funded:
        usdc = d.chain["contracts"]["usdc"]
        transact_as_deployer(d.chain, usdc, "UsdcEip3009", "mint", payer.address, funded)
    return payer


def sdk_session(d: Daemon, payer: Any) -> requests.Session:
    """``requests`` wrapped by the SDK: pays a 402 once, in the devnet USDC up to 1 USDC."""
    client = x402ClientSync().register(f"eip155:{d.chain['chainId']}", ExactEvmScheme(signer=payer))
    client.set_spend_controls(
        {
            "allowed_assets": [
                {
                    "network": f"eip155:{d.chain['chainId']}",
                    "asset": d.chain["contracts"]["usdc"],
                    "max_amount_per_payment": "1000000",
                }
            ]
        }
    )
    return x402_requests(client)


def pay(d: Daemon, payer: Any, url: str, body: dict[str, Any]) -> requests.Response:
    with sdk_session(d, payer) as session:
        return session.post(url, json=body, timeout=120)


def settle_answer(response: requests.Response) -> SettleResponse:
    return decode_payment_response_header(response.headers["PAYMENT-RESPONSE"])
