"""The order keeper: every few seconds it attempts again the marketplace orders whose
hand-over to the relay did not finish (an outage during ``POST /orders``, or a process that
died between recording the order and its relay job), until each has a relay job or has failed
with its reason (see :mod:`relayer.service.market.orders`). An attempt is idempotent (the
order's salt derives from its id), so keepers in several processes never make two jobs."""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from relayer.domain.errors import Unavailable
from relayer.service.market.orders import OrderDesk
from relayer.workers import OutageLog, sleep_or_stop

log = logging.getLogger(__name__)

KEEP_EVERY_S: Final = 2.0
"""Seconds between the keeper's steps."""


class OrderKeeper:
    """Attempts pending marketplace orders again."""

    def __init__(self, desk: OrderDesk, every_s: float = KEEP_EVERY_S) -> None:
        self.desk = desk
        self.every_s = every_s

    async def run(self, stop: asyncio.Event) -> None:
        """Step every ``every_s`` seconds until ``stop`` (an outage is logged once)."""
        outage = OutageLog("order keeper")
        while not stop.is_set():
            try:
                attempted = await self.desk.resume()
                outage.recovered()
                if attempted:
                    log.info("attempted pending orders again", extra={"count": attempted})
            except Unavailable as exc:
                outage.failed(exc)
            await sleep_or_stop(stop, self.every_s)
