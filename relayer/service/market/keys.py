"""Bearer API keys of the marketplace's quotes and orders (spec: marketplace-api.md, POST
/quotes, POST /orders): ``mk_<12-character prefix>_<secret>``, stored as SHA-256 hashes only,
looked up by prefix and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

from relayer.domain.errors import Rejection
from relayer.store.orders import Orders

API_KEY_PREFIX: Final = "mk_"


class ApiKeys:
    """Checks the bearer tokens of marketplace requests."""

    def __init__(self, orders: Orders) -> None:
        self.orders = orders

    async def authenticate(self, authorization: str | None) -> int:
        """The API key id of a ``Bearer`` token, its hash compared in constant time.

        Raises:
            Rejection: 401 ``unauthorized`` (missing, malformed, unknown or revoked).
        """
        refused = Rejection(
            "unauthorized",
            "a valid API key is required: Authorization: Bearer <key> (relayer apikey create)",
        )
        if authorization is None or not authorization.startswith("Bearer ") or len(authorization) > 200:
            raise refused
        token = authorization.removeprefix("Bearer ").strip()
        parts = token.split("_")
        if len(parts) < 3 or not token.startswith(API_KEY_PREFIX) or len(parts[1]) != 12:
            raise refused
        digest = hashlib.sha256(token.encode()).digest()
        matched = None
        for key_id, key_hash in await self.orders.keys_with_prefix(parts[1]):
            if hmac.compare_digest(key_hash, digest):
                matched = key_id
        if matched is None:
            raise refused
        return matched
