"""Certificates are rendered off the event loop, at most ``RENDERS_AT_ONCE`` at once (a CJK
certificate costs about 1 s of CPU and its thread shares the GIL with the loop): many requests
for distinct certificates queue rather than starve every other request."""

from __future__ import annotations

import asyncio
import threading
import time

from relayer.api.marketplace import RENDERS_AT_ONCE, rendered


async def test_at_most_renders_at_once_run_together_and_all_finish() -> None:
    lock = threading.Lock()
    running, most = 0, 0

    def slow(view: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return view * 2

    answers = await asyncio.gather(*(rendered(slow, n) for n in range(8)))
    assert answers == [n * 2 for n in range(8)]
    assert most == RENDERS_AT_ONCE == 2
