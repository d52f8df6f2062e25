"""When to look for the next head: a little before the next block is due, then often until
it comes (issue 20: a new Base block is seen within a few milliseconds of its arrival, for
about three head reads a block, where a fixed cadence of half a block sees it 50 ms late on
average at 200 ms blocks and reads the head as often).

Pure timing logic (monotonic seconds in, seconds to wait out); the chain follower drives it
(:class:`relayer.workers.follower.ChainFollower`). A chain whose blocks do not come on time
(a devnet that mines on demand, a stalled sequencer) falls back to the slow cadence one block
after the next block was due, and locks on again at the first new head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

FINE_SHARE: Final = 12
"""The fine cadence is the block time over this (17 ms at 200 ms blocks)."""
MIN_FINE_S: Final = 0.010
MAX_FINE_S: Final = 0.100
EARLY_FINES: Final = 2
"""The fine looks start this many fine intervals before the next block is due: the arrival of
the last one is known within one fine interval, so two keep the clock locked on."""


@dataclass(slots=True)
class HeadClock:
    """The follower's clock. ``block_time_s``: the chain's block interval (seconds, > 0);
    ``slow_s``: the cadence while the blocks are off time or before the first new head
    (seconds; half a block: :meth:`relayer.domain.confirmation.ConfirmationPolicy.poll_interval_s`)."""

    block_time_s: float
    slow_s: float
    _head: int | None = None
    _seen_at: float | None = None  # when the current head was first seen (monotonic seconds)

    @property
    def fine_s(self) -> float:
        """The cadence while the next block is due (seconds)."""
        return min(MAX_FINE_S, max(MIN_FINE_S, self.block_time_s / FINE_SHARE))

    def observe(self, now: float, head: int) -> None:
        """A head read that ended at ``now`` (monotonic seconds) answered ``head``."""
        if self._head is None:
            self._head = head  # its arrival is not known: the next new one starts the clock
        elif head != self._head:
            self._head, self._seen_at = head, now

    def wait_s(self, now: float) -> float:
        """Seconds from ``now`` to the next head read: until the fine looks start before the
        next block is due, then the fine cadence until one block after it was due, then the
        slow cadence; the slow cadence until a new head was seen once."""
        if self._seen_at is None:
            return self.slow_s
        due = self._seen_at + self.block_time_s
        start = due - EARLY_FINES * self.fine_s
        if now < start:
            return start - now
        if now < due + self.block_time_s:
            return self.fine_s
        return self.slow_s
