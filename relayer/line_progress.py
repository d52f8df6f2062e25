"""Progress for a stream that is no terminal (a Kubernetes Job's log, a pipe): plain lines
instead of a redrawn bar, so ``kubectl logs`` shows how far a long command is."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, Final

DEFAULT_EVERY_S: Final = 5.0


class LineProgress:
    """``label: done/total (percent %), rate unit/s`` on ``stream``: once at the start, then
    after an :meth:`update` at most every ``every_s`` seconds (by ``clock``, monotonic
    seconds), and once when the work is done (at ``total``, or when the block ends short of
    it). Used as a context manager, like ``click.progressbar``."""

    def __init__(
        self,
        total: int,
        label: str,
        stream: IO[str],
        *,
        unit: str = "items",
        every_s: float = DEFAULT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.label, self.stream, self.unit = total, label, stream, unit
        self.every_s, self.clock = every_s, clock
        self.done = 0
        self.started = self.last = clock()
        self.shown = -1  # the count of the last line written

    def __enter__(self) -> LineProgress:
        self.started = self.last = self.clock()
        self._line(self.started)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.shown != self.done:
            self._line(self.clock())

    def update(self, n: int) -> None:
        """Count ``n`` more done; write a line when ``every_s`` has passed or all are done."""
        self.done += n
        now = self.clock()
        if self.done >= self.total or now - self.last >= self.every_s:
            self._line(now)

    def _line(self, now: float) -> None:
        percent = 100 * self.done // self.total if self.total else 100
        elapsed = now - self.started
        rate = f", {self.done / elapsed:,.0f} {self.unit}/s" if self.done and elapsed > 0 else ""
        self.stream.write(f"{self.label}: {self.done}/{self.total} ({percent} %){rate}\n")
        self.stream.flush()
        self.last, self.shown = now, self.done
