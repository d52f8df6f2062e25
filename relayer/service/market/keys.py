"""Bearer API keys of the marketplace's quotes and orders (spec: marketplace-api.md, POST
/quotes, POST /orders) and of the x402 facilitator's verify and settle (design:
docs/design/x402-v2.md, C3): ``mk_<12-character prefix>_<secret>``, stored as SHA-256 hashes
only, looked up by prefix and compared in constant time. Each key holds scopes (which routes it
may call), and for the facilitator a rate limit and a daily gas budget."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Final, Literal

from relayer.domain.errors import Rejection
from relayer.store.orders import Orders

API_KEY_PREFIX: Final = "mk_"
Scope = Literal["marketplace", "facilitator"]
SCOPES: Final[tuple[Scope, ...]] = ("marketplace", "facilitator")


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """An authenticated API key: its id and name, its rate limit (``limits`` notation, e.g.
    ``"50/second"``) and daily gas budget (wei per UTC day), each None for the settings'
    default (``facilitator_default_rate_limit``, ``facilitator_default_gas_budget_wei_per_day``)."""

    id: int
    name: str
    rate_limit: str | None = None
    gas_budget_wei_per_day: int | None = None


class ApiKeys:
    """Checks the bearer tokens of marketplace and facilitator requests."""

    def __init__(self, orders: Orders) -> None:
        self.orders = orders

    async def authenticate(self, authorization: str | None, scope: Scope) -> KeyInfo:
        """The API key of a ``Bearer`` token, its hash compared in constant time, when it holds
        ``scope``.

        Raises:
            Rejection: 401 ``unauthorized`` (missing, malformed, unknown or revoked, or a key
                without ``scope``: the same answer, so a token's other scopes are not told).
        """
        refused = Rejection(
            "unauthorized",
            f"a valid API key with scope {scope!r} is required: Authorization: Bearer <key> "
            f"(relayer apikey create --scope {scope})",
        )
        if authorization is None or not authorization.startswith("Bearer ") or len(authorization) > 200:
            raise refused
        token = authorization.removeprefix("Bearer ").strip()
        parts = token.split("_")
        if len(parts) < 3 or not token.startswith(API_KEY_PREFIX) or len(parts[1]) != 12:
            raise refused
        digest = hashlib.sha256(token.encode()).digest()
        matched = None
        for key in await self.orders.keys_with_prefix(parts[1]):
            if hmac.compare_digest(key.key_hash, digest):
                matched = key
        if matched is None or scope not in matched.scopes:
            raise refused
        return KeyInfo(matched.id, matched.name, matched.rate_limit, matched.gas_budget_wei_per_day)
