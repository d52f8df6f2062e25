"""The keepers: a loop that takes one step every few seconds until stopped, logging an outage
once (and its end), for work that a request began and may not have finished.

- The **order keeper** (every 2 s) attempts again the marketplace orders whose hand-over to
  the relay did not finish (an outage during ``POST /orders``, or a process that died between
  recording the order and its relay job), until each has a relay job or has failed with its
  reason (:meth:`relayer.service.market.orders.OrderDesk.resume`). An attempt is idempotent
  (the order's salt derives from its id), so keepers in several processes never make two jobs.
- The **payment keeper** (every second) advances the standard x402 payments of the retirement
  resource that are due (:meth:`relayer.service.payments.resource.Payments.resume`; earliest due
  first, a batch at a time, each put off a little after its step, so however many stay open
  every one gets its turn): a transfer the chain proves after its request stopped waiting, or
  whose process died, gets its retirement; one the chain shows can never happen fails; a
  retirement that can never execute gets its refund; a refund proven ends its payment. A
  payment is advanced by one actor at a time (its advisory lock), and every step is idempotent
  (salts and the refund's EIP-3009 nonce derive from the payment id), so keepers in several
  processes never make two retirements or two refunds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from relayer.domain.errors import Unavailable
from relayer.workers import OutageLog, sleep_or_stop

log = logging.getLogger(__name__)

ORDER_KEEPER_EVERY_S: Final = 2.0
"""Seconds between the order keeper's steps."""
PAYMENT_KEEPER_EVERY_S: Final = 1.0
"""Seconds between the payment keeper's steps."""


class Keeper:
    """Takes ``step`` every ``every_s`` seconds until stopped.

    Args:
        name: what the outage lines call it ("order keeper").
        step: one pass over the pending work; returns how many items it moved.
        done: the line logged when a pass moved some (with ``count``), at ``level``.

    ``step`` raising :class:`Unavailable` (the database or node is out) is logged once per
    outage and retried at the next step; anything else ends the task (its supervisor restarts
    it).
    """

    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[int]],
        every_s: float,
        done: str,
        level: int = logging.INFO,
    ) -> None:
        self.name = name
        self.step = step
        self.every_s = every_s
        self.done = done
        self.level = level

    async def run(self, stop: asyncio.Event) -> None:
        """Step every ``every_s`` seconds until ``stop`` (an outage is logged once)."""
        outage = OutageLog(self.name)
        while not stop.is_set():
            try:
                moved = await self.step()
                outage.recovered()
                if moved:
                    log.log(self.level, self.done, extra={"count": moved})
            except Unavailable as exc:
                outage.failed(exc)
            await sleep_or_stop(stop, self.every_s)
