"""Bearer API keys of the marketplace's quotes and orders (spec: marketplace-api.md, POST
/quotes, POST /orders) and of the x402 facilitator's verify and settle (design:
docs/design/x402-v2.md, C3): ``mk_<12-character prefix>_<secret>``, stored as SHA-256 hashes
only and looked up by the hash (the same work whether or not a key of the prefix exists: the
prefix is for people, never for the lookup). Each key holds scopes (which routes it
may call), and for the facilitator a rate limit and a daily gas budget."""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Final, Literal

from relayer.domain.errors import Rejection, Unavailable
from relayer.store.orders import Orders

log = logging.getLogger(__name__)

API_KEY_PREFIX: Final = "mk_"
TOUCH_EVERY_S: Final = 60.0
"""A key's ``last_used_at`` is written at most once per this many seconds per process."""
TOUCHED_MAX: Final = 10_000
"""At most this many keys' last writes are remembered per process."""
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
        self._touched: dict[int, float] = {}  # key id -> monotonic time its use was last written

    async def authenticate(self, authorization: str | None, scope: Scope) -> KeyInfo:
        """The API key of a ``Bearer`` token, found by the token's SHA-256 (a unique index:
        no lookup by the public prefix, whose existence would show in the time), when it holds
        ``scope``; its use is recorded (``last_used_at``, at most once a minute per process).

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
        matched = await self.orders.key_by_hash(digest)  # the same work for any well-formed token
        if matched is None or scope not in matched.scopes:
            raise refused
        await self._used(matched.id)
        return KeyInfo(matched.id, matched.name, matched.rate_limit, matched.gas_budget_wei_per_day)

    async def _used(self, key_id: int) -> None:
        """Record the key's use (``last_used_at``) at most once per :data:`TOUCH_EVERY_S` in
        this process; a failed write is only logged (the request goes on)."""
        now = time.monotonic()
        if now - self._touched.get(key_id, float("-inf")) < TOUCH_EVERY_S:
            return
        self._touched[key_id] = now
        if len(self._touched) > TOUCHED_MAX:  # bounded: forget the oldest half
            for stale in sorted(self._touched, key=self._touched.__getitem__)[: TOUCHED_MAX // 2]:
                del self._touched[stale]
        try:
            await self.orders.touch_key(key_id)
        except Unavailable:
            log.warning("an API key's last use was not recorded", extra={"api_key_id": key_id})
