"""Relay jobs, spent salts, signed transactions and executor nonces.

Policy: the salt and the authorization key are unique in Postgres, so an identical request
reuses its job; every state change is ``UPDATE ... WHERE state = ANY(allowed sources)``
(mirroring ``domain.states``) and NOTIFYs channel ``relay_jobs``; a transaction's raw
bytes and hash are committed before it is broadcast.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import asyncpg

from relayer.domain.states import JobState, sources_of

NOTIFY_CHANNEL: Final = "relay_jobs"

# Moves written as literal SQL below (batch paths); each must be allowed by the domain's
# transition table (tests/unit/test_states.py checks it). Everything else goes through move().
FIXED_TRANSITIONS: Final = (
    (JobState.REJECTED, JobState.ACCEPTED),  # _REOPEN
    (JobState.ACCEPTED, JobState.REJECTED),  # expire_stale_accepted
    (JobState.SIMULATED, JobState.REJECTED),  # sign_simulated: expiring authorization
    (JobState.SIMULATED, JobState.SIGNED),  # sign_simulated
    (JobState.SIGNED, JobState.SUBMITTED),  # mark_broadcast
    (JobState.MINED, JobState.CONFIRMED),  # mined_up_to
    (JobState.CONFIRMED, JobState.INDEXED),  # index_jobs
)

# Columns a transition may set, besides state and its timestamp (never from input).
_SETTABLE: Final = frozenset(
    {"error", "gas_limit", "max_fee_per_gas", "max_priority_fee_per_gas", "block_number", "block_hash"}
)
_STAMP: Final = {
    JobState.ACCEPTED: "accepted_at",
    JobState.SIMULATED: "simulated_at",
    JobState.SIGNED: "signed_at",
    JobState.SUBMITTED: "submitted_at",
    JobState.MINED: "mined_at",
    JobState.CONFIRMED: "confirmed_at",
    JobState.INDEXED: "indexed_at",
}


@dataclass(frozen=True, slots=True)
class NewJob:
    """What ``reserve`` records for an accepted request. Money in atomic units."""

    chain_id: int
    auth_key: bytes
    permit_key: bytes | None
    salt: bytes
    scheme: str
    payer: str
    input_token: str
    auth_value: int
    auth_expires_at: int
    gas_allowance: int
    request_hash: bytes
    settlement: str
    call_data: bytes
    summary: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Job:
    """A relay job row."""

    id: int
    chain_id: int
    state: JobState
    auth_key: bytes
    salt: bytes
    scheme: str
    payer: str
    request_hash: bytes
    settlement: str
    call_data: bytes
    gas_allowance: int
    summary: dict[str, Any]
    error: dict[str, Any] | None
    gas_limit: int | None
    max_fee_per_gas: int | None
    max_priority_fee_per_gas: int | None
    executor: str | None
    executor_nonce: int | None
    tx_hash: bytes | None
    block_number: int | None
    timestamps: dict[str, float | None]

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> Job:
        def opt_int(v: Any) -> int | None:
            return None if v is None else int(v)

        return cls(
            id=row["id"],
            chain_id=row["chain_id"],
            state=JobState(row["state"]),
            auth_key=bytes(row["auth_key"]),
            salt=bytes(row["salt"]),
            scheme=row["scheme"],
            payer=row["payer"],
            request_hash=bytes(row["request_hash"]),
            settlement=row["settlement"],
            call_data=bytes(row["call_data"]),
            gas_allowance=int(row["gas_allowance"]),
            summary=json.loads(row["summary"]),
            error=None if row["error"] is None else json.loads(row["error"]),
            gas_limit=opt_int(row["gas_limit"]),
            max_fee_per_gas=opt_int(row["max_fee_per_gas"]),
            max_priority_fee_per_gas=opt_int(row["max_priority_fee_per_gas"]),
            executor=row["executor"],
            executor_nonce=opt_int(row["executor_nonce"]),
            tx_hash=None if row["tx_hash"] is None else bytes(row["tx_hash"]),
            block_number=opt_int(row["block_number"]),
            timestamps={col: (None if row[col] is None else row[col].timestamp()) for col in _STAMP.values()},
        )


class PermitInUse(Exception):
    """Another live job already holds this EIP-2612 permit nonce."""


class SaltReused(Exception):
    """The salt was already spent by another authorization (``job`` is that job)."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"salt already spent by job {job.id}")
        self.job = job


@dataclass(frozen=True, slots=True)
class SignedTx:
    """A signed executor transaction, as committed before broadcast."""

    job_id: int
    tx_hash: bytes
    raw: bytes
    nonce: int
    gas_limit: int
    max_fee_per_gas: int
    max_priority_fee_per_gas: int


_INSERT_JOB: Final = """
INSERT INTO relay_jobs (chain_id, auth_key, salt, scheme, payer, input_token, auth_value, gas_allowance,
                        request_hash, settlement, call_data, summary, permit_key, auth_expires_at, state)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb, $13, $14, 'accepted')
ON CONFLICT (chain_id, auth_key) DO NOTHING
RETURNING *
"""
_INSERT_SALT: Final = """
INSERT INTO spent_salts (chain_id, salt, job_id) VALUES ($1, $2, $3)
ON CONFLICT (chain_id, salt) DO NOTHING
RETURNING job_id
"""
# A job rejected before anything was signed may be taken up again by the identical request
# (same request hash), never by a different one.
_REOPEN: Final = """
UPDATE relay_jobs SET state = 'accepted', error = NULL, attempts = attempts + 1,
       accepted_at = now(), updated_at = now()
WHERE id = $1 AND state = 'rejected' AND tx_hash IS NULL AND request_hash = $2
RETURNING *
"""


class JobStore:
    """Repository of relay jobs (one Postgres round trip per state change)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def reserve(self, new: NewJob) -> tuple[Job, bool]:
        """Record the job and spend its salt, or find the job the identical request made.

        Returns:
            (job, owned): ``owned`` is True when this caller must drive the job (it was
            created now, or re-opened after a rejection that signed nothing).

        Raises:
            SaltReused: the salt belongs to a different authorization.
            PermitInUse: another live job holds the same permit nonce.
        """
        try:
            return await self._reserve(new)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == "relay_jobs_live_permit":
                raise PermitInUse() from None
            raise

    async def _reserve(self, new: NewJob) -> tuple[Job, bool]:
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                _INSERT_JOB,
                new.chain_id,
                new.auth_key,
                new.salt,
                new.scheme,
                new.payer,
                new.input_token,
                new.auth_value,
                new.gas_allowance,
                new.request_hash,
                new.settlement,
                new.call_data,
                json.dumps(new.summary),
                new.permit_key,
                new.auth_expires_at,
            )
            if row is not None:
                owner = await conn.fetchval(_INSERT_SALT, new.chain_id, new.salt, row["id"])
                if owner is None:
                    other = await conn.fetchrow(
                        "SELECT j.* FROM relay_jobs j JOIN spent_salts s ON s.job_id = j.id "
                        "WHERE s.chain_id = $1 AND s.salt = $2",
                        new.chain_id,
                        new.salt,
                    )
                    assert other is not None
                    raise SaltReused(Job.from_row(other))
                await conn.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, str(row["id"]))
                return Job.from_row(row), True
            existing = await conn.fetchrow(
                "SELECT * FROM relay_jobs WHERE chain_id = $1 AND auth_key = $2", new.chain_id, new.auth_key
            )
            assert existing is not None
            reopened = await conn.fetchrow(_REOPEN, existing["id"], new.request_hash)
            if reopened is not None:
                return Job.from_row(reopened), True
            return Job.from_row(existing), False

    async def find_by_salt(self, chain_id: int, salt: bytes) -> Job | None:
        """The job that spent ``salt``, if any."""
        row = await self._pool.fetchrow(
            "SELECT j.* FROM spent_salts s JOIN relay_jobs j ON j.id = s.job_id "
            "WHERE s.chain_id = $1 AND s.salt = $2",
            chain_id,
            salt,
        )
        return None if row is None else Job.from_row(row)

    async def get(self, job_id: int) -> Job | None:
        row = await self._pool.fetchrow("SELECT * FROM relay_jobs WHERE id = $1", job_id)
        return None if row is None else Job.from_row(row)

    async def move(self, job_id: int, target: JobState, **fields: Any) -> Job | None:
        """Move a job to ``target`` if the transition table allows it from its current state.

        Args:
            fields: columns to set at the same time (a fixed whitelist; ``error`` is a dict).

        Returns:
            The updated job, or None when the job was not in an allowed source state.
        """
        unknown = set(fields) - _SETTABLE
        if unknown:
            raise ValueError(f"not settable: {sorted(unknown)}")
        sets = ["state = $2", "updated_at = now()"]
        if target in _STAMP:
            sets.append(f"{_STAMP[target]} = now()")
        args: list[Any] = [job_id, target.value, [s.value for s in sources_of(target)]]
        for name, value in sorted(fields.items()):
            args.append(json.dumps(value) if name == "error" and value is not None else value)
            sets.append(f"{name} = ${len(args)}")
        sql = (
            f"WITH moved AS (UPDATE relay_jobs SET {', '.join(sets)} "
            "WHERE id = $1 AND state = ANY($3::text[]) RETURNING *) "
            f"SELECT moved.*, pg_notify('{NOTIFY_CHANNEL}', moved.id::text) FROM moved"
        )
        row = await self._pool.fetchrow(sql, *args)
        return None if row is None else Job.from_row(row)

    async def expire_stale_accepted(self, older_than_s: float, error: dict[str, Any]) -> int:
        """Reject jobs left in ``accepted`` (nothing signed) by a process that died mid-check,
        so the identical request can take them up again. Returns how many."""
        rows = await self._pool.fetch(
            "WITH moved AS (UPDATE relay_jobs SET state = 'rejected', error = $2::jsonb, updated_at = now() "
            "WHERE state = 'accepted' AND accepted_at < now() - make_interval(secs => $1) RETURNING id) "
            f"SELECT moved.id, pg_notify('{NOTIFY_CHANNEL}', moved.id::text) FROM moved",
            older_than_s,
            json.dumps(error),
        )
        return len(rows)

    async def count_by_state(self) -> dict[str, int]:
        rows = await self._pool.fetch("SELECT state, count(*) AS n FROM relay_jobs GROUP BY state")
        return {r["state"]: int(r["n"]) for r in rows}

    # ---------------------------------------------------------------- executor side

    async def reconcile_nonce(self, chain_id: int, executor: str, chain_pending: int) -> int:
        """Set the lane's next nonce to max(stored, chain pending count); returns it."""
        return int(
            await self._pool.fetchval(
                "INSERT INTO executor_nonces (chain_id, executor, next_nonce) VALUES ($1, $2, $3) "
                "ON CONFLICT (chain_id, executor) DO UPDATE SET "
                "next_nonce = GREATEST(executor_nonces.next_nonce, EXCLUDED.next_nonce), updated_at = now() "
                "RETURNING next_nonce",
                chain_id,
                executor,
                chain_pending,
            )
        )

    async def sign_simulated(
        self,
        chain_id: int,
        executor: str,
        limit: int,
        sign: Callable[[Job, int], SignedTx],
        expiry_margin_s: int = 30,
        expired_error: dict[str, Any] | None = None,
    ) -> list[SignedTx]:
        """Claim simulated jobs (SKIP LOCKED), allocate executor nonces, sign, and commit the
        raw transactions with the jobs moved to ``signed`` — all in one database
        transaction, before anything is broadcast. Jobs whose authorization expires within
        ``expiry_margin_s`` seconds are rejected instead (``expired_error`` as their error)."""
        expired_error = expired_error or {"status": 400, "error": "invalid_auth_payload"}
        signed: list[SignedTx] = []
        async with self._pool.acquire() as conn, conn.transaction():
            # Never sign an authorization that would expire before it can be mined.
            await conn.execute(
                "WITH moved AS (UPDATE relay_jobs SET state = 'rejected', error = $3::jsonb, "
                "updated_at = now() WHERE chain_id = $1 AND state = 'simulated' "
                "AND auth_expires_at <= extract(epoch FROM now())::bigint + $2 RETURNING id) "
                f"SELECT pg_notify('{NOTIFY_CHANNEL}', moved.id::text) FROM moved",
                chain_id,
                expiry_margin_s,
                json.dumps(expired_error),
            )
            rows = await conn.fetch(
                "SELECT * FROM relay_jobs WHERE chain_id = $1 AND state = 'simulated' "
                "ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED",
                chain_id,
                limit,
            )
            for row in rows:
                job = Job.from_row(row)
                nonce = await conn.fetchval(
                    "UPDATE executor_nonces SET next_nonce = next_nonce + 1, updated_at = now() "
                    "WHERE chain_id = $1 AND executor = $2 RETURNING next_nonce - 1",
                    chain_id,
                    executor,
                )
                if nonce is None:
                    raise RuntimeError(f"executor nonce lane missing for {executor}; reconcile first")
                tx = sign(job, int(nonce))
                await conn.execute(
                    "INSERT INTO relay_transactions (tx_hash, job_id, chain_id, executor, nonce, raw_tx, "
                    "gas_limit, max_fee_per_gas, max_priority_fee_per_gas) "
                    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    tx.tx_hash,
                    job.id,
                    chain_id,
                    executor,
                    tx.nonce,
                    tx.raw,
                    tx.gas_limit,
                    tx.max_fee_per_gas,
                    tx.max_priority_fee_per_gas,
                )
                await conn.execute(
                    "UPDATE relay_jobs SET state = 'signed', signed_at = now(), updated_at = now(), "
                    "tx_hash = $2, executor = $3, executor_nonce = $4 WHERE id = $1 AND state = 'simulated'",
                    job.id,
                    tx.tx_hash,
                    executor,
                    tx.nonce,
                )
                await conn.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, str(job.id))
                signed.append(tx)
        return signed

    async def mark_broadcast(self, txs: Sequence[SignedTx]) -> list[Job]:
        """Record the broadcast and move the jobs signed -> submitted."""
        if not txs:
            return []
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "UPDATE relay_transactions SET broadcast_at = now() WHERE tx_hash = ANY($1::bytea[])",
                [t.tx_hash for t in txs],
            )
            rows = await conn.fetch(
                "WITH moved AS (UPDATE relay_jobs SET state = 'submitted', submitted_at = now(), "
                "updated_at = now() WHERE id = ANY($1::bigint[]) AND state = 'signed' RETURNING *) "
                f"SELECT moved.*, pg_notify('{NOTIFY_CHANNEL}', moved.id::text) FROM moved",
                [t.job_id for t in txs],
            )
        return [Job.from_row(r) for r in rows]

    async def unsettled_transactions(self, chain_id: int, executor: str) -> list[SignedTx]:
        """Latest signed transaction of each job in signed/submitted state (for re-sending
        the same bytes after a restart), in nonce order."""
        rows = await self._pool.fetch(
            "SELECT t.* FROM relay_jobs j JOIN relay_transactions t ON t.tx_hash = j.tx_hash "
            "WHERE j.chain_id = $1 AND j.executor = $2 AND j.state IN ('signed', 'submitted') "
            "ORDER BY t.nonce",
            chain_id,
            executor,
        )
        return [_signed(r) for r in rows]

    async def stale_transactions(
        self, chain_id: int, executor: str, unsent_after_s: float, unmined_after_s: float
    ) -> list[SignedTx]:
        """Transactions to send again with the same bytes: signed but not recorded as
        broadcast for ``unsent_after_s`` (a failed send), or submitted and unmined for
        ``unmined_after_s`` seconds since the last send."""
        rows = await self._pool.fetch(
            "SELECT t.* FROM relay_jobs j JOIN relay_transactions t ON t.tx_hash = j.tx_hash "
            "WHERE j.chain_id = $1 AND j.executor = $2 AND ("
            "(j.state = 'signed' AND j.signed_at < now() - make_interval(secs => $3)) OR "
            "(j.state = 'submitted' AND t.broadcast_at < now() - make_interval(secs => $4))) "
            "ORDER BY t.nonce LIMIT 100",
            chain_id,
            executor,
            unsent_after_s,
            unmined_after_s,
        )
        return [_signed(r) for r in rows]

    async def pending_hashes(self, chain_id: int) -> dict[bytes, int]:
        """tx hash -> job id of every job waiting for its receipt (submitted)."""
        rows = await self._pool.fetch(
            "SELECT tx_hash, id FROM relay_jobs WHERE chain_id = $1 AND state IN ('signed', 'submitted')",
            chain_id,
        )
        return {bytes(r["tx_hash"]): r["id"] for r in rows}

    async def mined_up_to(self, chain_id: int, block_number: int) -> list[Job]:
        """Move jobs mined at or below ``block_number`` to confirmed."""
        rows = await self._pool.fetch(
            "WITH moved AS (UPDATE relay_jobs SET state = 'confirmed', confirmed_at = now(), "
            "updated_at = now() WHERE chain_id = $1 AND state = 'mined' AND block_number <= $2 RETURNING *) "
            f"SELECT moved.*, pg_notify('{NOTIFY_CHANNEL}', moved.id::text) FROM moved",
            chain_id,
            block_number,
        )
        return [Job.from_row(r) for r in rows]

    async def index_jobs(self, chain_id: int, tx_hashes: Sequence[bytes]) -> list[Job]:
        """Move the confirmed jobs of these transactions to indexed."""
        if not tx_hashes:
            return []
        rows = await self._pool.fetch(
            "WITH moved AS (UPDATE relay_jobs SET state = 'indexed', indexed_at = now(), updated_at = now() "
            "WHERE chain_id = $1 AND state = 'confirmed' AND tx_hash = ANY($2::bytea[]) RETURNING *) "
            f"SELECT moved.*, pg_notify('{NOTIFY_CHANNEL}', moved.id::text) FROM moved",
            chain_id,
            list(tx_hashes),
        )
        return [Job.from_row(r) for r in rows]


def _signed(row: asyncpg.Record) -> SignedTx:
    return SignedTx(
        job_id=row["job_id"],
        tx_hash=bytes(row["tx_hash"]),
        raw=bytes(row["raw_tx"]),
        nonce=int(row["nonce"]),
        gas_limit=int(row["gas_limit"]),
        max_fee_per_gas=int(row["max_fee_per_gas"]),
        max_priority_fee_per_gas=int(row["max_priority_fee_per_gas"]),
    )
