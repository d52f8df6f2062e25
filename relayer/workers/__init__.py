"""Long-running workers: broadcaster and chain follower, and what they share: a stoppable
sleep and the log of an upstream outage."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from relayer.domain.errors import Unavailable

log = logging.getLogger(__name__)


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class OutageLog:
    """Logs an upstream outage once when it starts (with what failed) and once when it ends,
    not on every retry of a worker's loop."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.down: str | None = None

    def failed(self, error: Unavailable) -> None:
        if self.down is None:
            self.down = str(error.context.get("upstream", "upstream"))
            log.warning(
                "upstream unavailable; retrying",
                extra={"worker": self.worker, "upstream": self.down, "reason": error.detail},
            )

    def recovered(self) -> None:
        if self.down is not None:
            log.info("upstream available again", extra={"worker": self.worker, "upstream": self.down})
            self.down = None
