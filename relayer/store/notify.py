"""LISTEN/NOTIFY on a dedicated connection: wakes waiters of one job and the workers when
any job changes. The connection is watched and re-opened after the database drops it (a
restart, a failover); meanwhile, and for any notification lost in between, waiters fall back
to re-reading on their timeout, and everyone is woken once the connection is back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator
from typing import Final

import asyncpg

from relayer.domain.errors import Unavailable
from relayer.store.pool import translated
from relayer.store.relay_jobs import NOTIFY_CHANNEL

log = logging.getLogger(__name__)

RECONNECT_EVERY_S: Final = 1.0
PING_EVERY_S: Final = 5.0
PING: Final = "SELECT 1"


class JobNotifications:
    """In-process fan-out of ``relay_jobs`` notifications."""

    def __init__(self) -> None:
        self._dsn: str | None = None
        self._conn: asyncpg.Connection | None = None
        self._waiters: dict[int, set[asyncio.Event]] = defaultdict(set)
        self._lost = asyncio.Event()
        self.any_change = asyncio.Event()
        self.reconnects = 0

    async def start(self, dsn: str) -> None:
        """Open the LISTEN connection.

        Raises:
            StoreUnavailable: the server cannot be reached.
            ConfigError: the server refused the DSN.
        """
        self._dsn = dsn
        await self._connect()

    async def _connect(self) -> None:
        assert self._dsn is not None
        with translated():
            conn = await asyncpg.connect(self._dsn)
            try:
                conn.add_termination_listener(self._on_terminated)
                await conn.add_listener(NOTIFY_CHANNEL, self._on_notify)
            except BaseException:
                conn.terminate()
                raise
        self._conn = conn
        self._lost.clear()

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the LISTEN connection up until ``stop``: re-open it (every
        :data:`RECONNECT_EVERY_S` while the database is down) when it drops, and wake every
        waiter once it is back, since notifications may have been missed meanwhile."""
        while not stop.is_set():
            waits = [asyncio.ensure_future(self._lost.wait()), asyncio.ensure_future(stop.wait())]
            try:
                await asyncio.wait(waits, timeout=PING_EVERY_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
            if stop.is_set():
                return
            if not self._lost.is_set() and await self._alive():
                continue
            await self._reconnect(stop)

    async def _alive(self) -> bool:
        conn = self._conn
        if conn is None or conn.is_closed():
            return False
        try:
            await conn.fetchval(PING, timeout=PING_EVERY_S)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False
        return True

    async def _reconnect(self, stop: asyncio.Event) -> None:
        log.warning("LISTEN connection lost; re-opening it (waiters poll meanwhile)")
        old, self._conn = self._conn, None
        if old is not None and not old.is_closed():
            old.terminate()
        while not stop.is_set():
            try:
                await self._connect()
            except Unavailable:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RECONNECT_EVERY_S)
                continue
            self.reconnects += 1
            log.info("LISTEN connection re-opened")
            self._wake_all()
            return

    async def stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            await conn.close()

    def _on_terminated(self, _conn: object) -> None:
        self._lost.set()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        self.notify_local(int(str(payload)))

    def _wake_all(self) -> None:
        for events in self._waiters.values():
            for event in events:
                event.set()
        self.any_change.set()

    def notify_local(self, job_id: int) -> None:
        """Wake waiters of ``job_id`` and the workers (also used without Postgres round trip)."""
        for event in self._waiters.get(job_id, ()):
            event.set()
        self.any_change.set()

    @contextlib.contextmanager
    def watch(self, job_id: int) -> Iterator[asyncio.Event]:
        """An event that every change of ``job_id`` sets, from now until the block ends.
        Clear it, read the job, then wait on it: a change that lands between the read and
        the wait has already set it, so no wake-up is lost."""
        event = asyncio.Event()
        self._waiters[job_id].add(event)
        try:
            yield event
        finally:
            self._waiters[job_id].discard(event)
            if not self._waiters[job_id]:
                del self._waiters[job_id]

    async def wait(self, job_id: int, timeout_s: float) -> None:
        """Return when ``job_id`` changes or after ``timeout_s`` seconds (changes before
        this call are not seen: see :meth:`watch`)."""
        with self.watch(job_id) as event, contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)
