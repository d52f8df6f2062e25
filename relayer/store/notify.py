"""LISTEN/NOTIFY on a dedicated connection: wakes waiters of one job and the workers when
any job changes. Waiters also re-read on a timeout, so a lost notification only delays."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

import asyncpg

from relayer.store.pool import translated
from relayer.store.relay_jobs import NOTIFY_CHANNEL

log = logging.getLogger(__name__)


class JobNotifications:
    """In-process fan-out of ``relay_jobs`` notifications."""

    def __init__(self) -> None:
        self._conn: asyncpg.Connection | None = None
        self._waiters: dict[int, set[asyncio.Event]] = defaultdict(set)
        self.any_change = asyncio.Event()

    async def start(self, dsn: str) -> None:
        """Open the LISTEN connection. Raises ``StoreUnavailable`` when the server cannot
        be reached."""
        with translated():
            self._conn = await asyncpg.connect(dsn)
            await self._conn.add_listener(NOTIFY_CHANNEL, self._on_notify)

    async def stop(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        self.notify_local(int(str(payload)))

    def notify_local(self, job_id: int) -> None:
        """Wake waiters of ``job_id`` and the workers (also used without Postgres round trip)."""
        for event in self._waiters.get(job_id, ()):
            event.set()
        self.any_change.set()

    async def wait(self, job_id: int, timeout_s: float) -> None:
        """Return when ``job_id`` changes or after ``timeout_s`` seconds."""
        event = asyncio.Event()
        self._waiters[job_id].add(event)
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            self._waiters[job_id].discard(event)
            if not self._waiters[job_id]:
                del self._waiters[job_id]
