"""What ``relayer status`` and ``relayer config check --connect`` read from the database:
jobs by state, the executor lanes and leases, the indexer cursors, the chains recorded and the
migrations applied. Read-only: no statement here writes or takes a lock (a lease's holder is
read from ``pg_locks``, so a daemon taking or renewing it never finds it busy because of us).

Every method raises ``StoreUnavailable`` when the database fails."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from relayer.domain.states import JOB_KINDS, JobState, open_states
from relayer.package_data import migrations_dir
from relayer.store.lease import lease_name
from relayer.store.pool import Database

OPEN_STATES: Final = tuple(dict.fromkeys(s.value for kind in JOB_KINDS for s in open_states(kind)))
"""The states in which the relay still owes some kind of job work (the outcomes move only on a
reorg or a retry): ``relayer status`` and the gauges show the age of the oldest open job in
each. A job is open only in its own kind's open states (:func:`open_states`)."""
FINAL_IN_OPEN: Final = tuple(
    f"{kind}:{state}"
    for kind in JOB_KINDS
    for state in OPEN_STATES
    if JobState(state) not in open_states(kind)
)
"""``kind:state`` of the jobs in an open state that are final for their kind (a confirmed
transfer): never counted as open."""
# Jobs per state, with the age (seconds) of the oldest open one (NULL: none open), counted from
# its acceptance. $1: FINAL_IN_OPEN.
JOBS_BY_STATE: Final = """
SELECT state, count(*) AS jobs,
       extract(epoch FROM now() - min(created_at) FILTER (
         WHERE NOT (kind || ':' || state) = ANY($1::text[])))::float8 AS oldest_s
FROM relay_jobs GROUP BY state
"""
# Seconds since the oldest open job of each open state last changed (how long it has been
# stuck). $1: OPEN_STATES, $2: FINAL_IN_OPEN.
OLDEST_BY_STATE: Final = """
SELECT state, extract(epoch FROM now() - min(updated_at))::float8 AS age FROM relay_jobs
WHERE state = ANY($1::text[]) AND NOT (kind || ':' || state) = ANY($2::text[]) GROUP BY state
"""
# Every executor lane: its next nonce, per chain.
LANES: Final = "SELECT chain_id, executor, next_nonce FROM executor_nonces ORDER BY chain_id, executor"
# Every lease's last taking: epoch, holder, and seconds since it was taken.
LEASE_ROWS: Final = """
SELECT chain_id, executor, epoch, holder, extract(epoch FROM now() - taken_at)::float8 AS taken_s
FROM executor_leases
"""
# The transactions of each executor still in flight (as the lane keeper counts them: the newest
# at a nonce, unmined, whose nonce the chain has not passed, whose job still waits for it).
IN_FLIGHT: Final = """
SELECT t.chain_id, t.executor, count(*) AS txs
FROM relay_transactions t LEFT JOIN relay_jobs j ON j.id = t.job_id
WHERE t.mined_block IS NULL AND t.replaced_by IS NULL AND t.passed_at IS NULL
  AND (j.id IS NULL OR j.state IN ('signed', 'submitted'))
GROUP BY t.chain_id, t.executor
"""
# Which of the advisory lock names $1 a session of this database holds, by which backend
# pid: pg_locks shows a bigint lock key as classid (its high 32 bits) and objid (its low 32
# bits) with objsubid 1. Reading pg_locks takes no lock.
LOCK_HOLDERS: Final = """
SELECT n.name, l.pid FROM unnest($1::text[]) AS n(name)
JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.mode = 'ExclusiveLock'
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended(n.name, 0)
"""
# Every indexer cursor: last indexed block, and seconds since it last moved.
CURSORS: Final = """
SELECT chain_id, name, block_number, extract(epoch FROM now() - updated_at)::float8 AS updated_s
FROM indexer_cursor ORDER BY chain_id, name
"""
# The chains this database belongs to (chain id -> genesis block hash).
CHAINS: Final = "SELECT chain_id, genesis_hash FROM chain_identity ORDER BY chain_id"
# Whether yoyo's table of applied migrations exists (not before the first migration).
HAS_MIGRATIONS: Final = "SELECT to_regclass('_yoyo_migration') IS NOT NULL"
# The ids of the migrations applied (yoyo's own table).
APPLIED_MIGRATIONS: Final = "SELECT migration_id FROM _yoyo_migration ORDER BY migration_id"


@dataclass(frozen=True)
class StateCount:
    state: str
    jobs: int
    oldest_s: float | None


@dataclass(frozen=True)
class Lane:
    chain_id: int
    executor: str
    next_nonce: int


@dataclass(frozen=True)
class LeaseRow:
    """A lease's last taking (``executor_leases``): the advisory lock may be free since."""

    chain_id: int
    executor: str
    epoch: int
    holder: str
    taken_s: float


@dataclass(frozen=True)
class Cursor:
    chain_id: int
    name: str
    block_number: int
    updated_s: float


class StatusQueries:
    """Read-only operator queries over one pool."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def jobs_by_state(self) -> list[StateCount]:
        """Jobs per state present (of every chain), with the oldest open one's age in seconds
        (None: none in that state is open, e.g. only confirmed transfers)."""
        rows = await self.db.fetch(JOBS_BY_STATE, list(FINAL_IN_OPEN))
        return [
            StateCount(r["state"], int(r["jobs"]), None if r["oldest_s"] is None else float(r["oldest_s"]))
            for r in rows
        ]

    async def lanes(self) -> list[Lane]:
        """Every executor lane (an executor's nonces on a chain), by chain and address."""
        return [
            Lane(int(r["chain_id"]), r["executor"], int(r["next_nonce"])) for r in await self.db.fetch(LANES)
        ]

    async def lease_rows(self) -> list[LeaseRow]:
        """Every lease's last taking."""
        return [
            LeaseRow(int(r["chain_id"]), r["executor"], int(r["epoch"]), r["holder"], float(r["taken_s"]))
            for r in await self.db.fetch(LEASE_ROWS)
        ]

    async def in_flight(self) -> dict[tuple[int, str], int]:
        """(chain id, executor address in lower case) -> its transactions in flight."""
        rows = await self.db.fetch(IN_FLIGHT)
        return {(int(r["chain_id"]), str(r["executor"]).lower()): int(r["txs"]) for r in rows}

    async def lease_holders(self, leases: Sequence[tuple[int, str]]) -> dict[tuple[int, str], int]:
        """Of the leases ``(chain id, executor address)``, those some session holds now
        (its advisory lock is granted), with that session's backend pid; keyed with the
        address in lower case."""
        names = {
            lease_name(chain_id, executor): (chain_id, executor.lower()) for chain_id, executor in leases
        }
        if not names:
            return {}
        rows = await self.db.fetch(LOCK_HOLDERS, list(names))
        return {names[r["name"]]: int(r["pid"]) for r in rows}

    async def cursors(self) -> list[Cursor]:
        """Every indexer cursor, by chain and name."""
        return [
            Cursor(int(r["chain_id"]), r["name"], int(r["block_number"]), float(r["updated_s"]))
            for r in await self.db.fetch(CURSORS)
        ]

    async def chains(self) -> dict[int, bytes]:
        """Chain id -> genesis block hash of each chain this database recorded."""
        return {int(r["chain_id"]): bytes(r["genesis_hash"]) for r in await self.db.fetch(CHAINS)}

    async def applied_migrations(self) -> list[str]:
        """The ids of the migrations applied (none on a database never migrated)."""
        if not await self.db.fetchval(HAS_MIGRATIONS):
            return []
        return [r["migration_id"] for r in await self.db.fetch(APPLIED_MIGRATIONS)]

    async def oldest_by_state(self) -> dict[str, float]:
        """Seconds since the oldest open job of each open state last changed (absent: none; a
        job final for its kind, such as a confirmed transfer, is not open)."""
        rows = await self.db.fetch(OLDEST_BY_STATE, list(OPEN_STATES), list(FINAL_IN_OPEN))
        return {r["state"]: float(r["age"]) for r in rows}

    async def leases_held(self, chain_id: int, executors: Sequence[str]) -> set[str]:
        """The executors (as given) whose lease some live session holds now (from
        ``pg_locks``: asking takes no lock)."""
        held = await self.lease_holders([(chain_id, e) for e in executors])
        return {e for e in executors if (chain_id, e.lower()) in held}

    async def at_head(self) -> bool:
        """Whether every packaged migration is applied."""
        packaged = {p.stem for p in migrations_dir().glob("*.sql")}
        return packaged <= set(await self.applied_migrations())
