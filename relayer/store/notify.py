"""LISTEN/NOTIFY on a dedicated connection: wakes waiters of one job when it changes, and the
broadcasters when a job becomes simulated (new work). The connection is watched and re-opened
after the database drops it (a restart, a failover); meanwhile, and for any notification lost
in between, waiters fall back to re-reading on their timeout, and everyone is woken once the
connection is back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Final

import asyncpg

from relayer.domain.errors import Unavailable
from relayer.store.pool import translated
from relayer.store.relay_jobs import NOTIFY_CHANNEL

log = logging.getLogger(__name__)

RECONNECT_EVERY_S: Final = 1.0
PING_EVERY_S: Final = 5.0
PING: Final = "SELECT 1"
NEW_WORK_STATE: Final = "simulated"
"""The state whose notification wakes the broadcasters (a job they may sign)."""


@dataclass(eq=False, slots=True)
class _Watch:
    event: asyncio.Event
    states: frozenset[str] | None


class JobNotifications:
    """In-process fan-out of ``relay_jobs`` notifications."""

    def __init__(self) -> None:
        self._dsn: str | None = None
        self._conn: asyncpg.Connection | None = None
        self._waiters: dict[int, set[_Watch]] = defaultdict(set)
        self._lost = asyncio.Event()
        # one event per broadcaster (each clears its own), set by a job that became simulated
        # (new work) or a change of an unknown state: not by every step of every job
        self._new_work: list[asyncio.Event] = []
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
        job_id, _, state = str(payload).partition(":")
        try:
            self.notify_local(int(job_id), state or None)
        except ValueError:  # not ours: wake everyone rather than lose a change
            log.warning("unexpected notification payload on the jobs channel")
            self._wake_all()

    def _wake_all(self) -> None:
        for watches in self._waiters.values():
            for watch in watches:
                watch.event.set()
        self.wake_broadcasters()

    def notify_local(self, job_id: int, state: str | None = None) -> None:
        """Wake the waiters of ``job_id`` that wait for ``state`` (all of them when the
        state is not known), and the broadcasters (:meth:`new_work`) for a job now simulated
        or a state not known (also used without a Postgres round trip)."""
        for watch in self._waiters.get(job_id, ()):
            if watch.states is None or state is None or state in watch.states:
                watch.event.set()
        if state is None or state == NEW_WORK_STATE:
            self.wake_broadcasters()

    def new_work(self) -> asyncio.Event:
        """An event of its own for one broadcaster (it clears it, others keep theirs), set
        whenever a job becomes simulated here or in another process."""
        event = asyncio.Event()
        self._new_work.append(event)
        return event

    def wake_broadcasters(self, but: asyncio.Event | None = None) -> None:
        """Set every broadcaster's :meth:`new_work` event (a job it may sign), except ``but``
        (the event of the broadcaster that wakes the others)."""
        for event in self._new_work:
            if event is not but:
                event.set()

    @contextlib.contextmanager
    def watch(self, job_id: int, states: Collection[str] | None = None) -> Iterator[asyncio.Event]:
        """An event that every change of ``job_id`` into one of ``states`` (any state when
        None) sets, from now until the block ends; a re-opened LISTEN connection sets it
        too. Clear it, read the job, then wait on it: a change that lands between the read
        and the wait has already set it, so no wake-up is lost."""
        watch = _Watch(asyncio.Event(), None if states is None else frozenset(states))
        self._waiters[job_id].add(watch)
        try:
            yield watch.event
        finally:
            self._waiters[job_id].discard(watch)
            if not self._waiters[job_id]:
                del self._waiters[job_id]
