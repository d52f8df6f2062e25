"""The payment keeper: every second it advances the standard x402 payments of the retirement
resource that are due (see :mod:`relayer.service.x402_payments`; earliest due first, a batch
at a time, each put off a little after its step, so however many stay open every one gets its
turn): a transfer the chain proves after its request stopped waiting, or whose process died,
gets its retirement; one the chain shows can never happen fails; a retirement that can never
execute gets its refund; a refund proven ends its payment. A payment is
advanced by one actor at a time (its advisory lock), and every step is idempotent (salts and
the refund's EIP-3009 nonce derive from the payment id), so keepers in several processes
never make two retirements or two refunds."""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from relayer.domain.errors import Unavailable
from relayer.service.x402_payments import Payments
from relayer.workers import OutageLog, sleep_or_stop

log = logging.getLogger(__name__)

KEEP_EVERY_S: Final = 1.0
"""Seconds between the keeper's steps."""


class PaymentKeeper:
    """Advances open x402 payments."""

    def __init__(self, payments: Payments, every_s: float = KEEP_EVERY_S) -> None:
        self.payments = payments
        self.every_s = every_s

    async def run(self, stop: asyncio.Event) -> None:
        """Step every ``every_s`` seconds until ``stop`` (an outage is logged once)."""
        outage = OutageLog("payment keeper")
        while not stop.is_set():
            try:
                advanced = await self.payments.resume()
                outage.recovered()
                if advanced:
                    log.debug("advanced open x402 payments", extra={"count": advanced})
            except Unavailable as exc:
                outage.failed(exc)
            await sleep_or_stop(stop, self.every_s)
