"""The executor lane: nonces allocated per executor key in Postgres, and the journal of
every transaction signed from it (a job's first transaction, its same-nonce replacements and
no-ops), whose raw bytes and hash are committed before anything is broadcast.

Policy: claims take simulated jobs with ``FOR UPDATE SKIP LOCKED``; a nonce is allocated,
the transaction signed and recorded and the job moved to ``signed`` in one database
transaction; an authorization about to expire is rejected instead of signed. Every write
that signs checks, in its own transaction, that the lease is still at this process's epoch.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from relayer.domain.errors import RelayerError
from relayer.domain.states import JobState, sources_of
from relayer.store.pool import Database
from relayer.store.relay_jobs import Job, MovedJob

# -- statements -------------------------------------------------------------------------

# Start or raise the lane's next nonce to the chain's pending count; returns it.
RECONCILE_NONCE: Final = """
INSERT INTO executor_nonces (chain_id, executor, next_nonce) VALUES ($1, $2, $3)
ON CONFLICT (chain_id, executor) DO UPDATE SET
    next_nonce = GREATEST(executor_nonces.next_nonce, EXCLUDED.next_nonce), updated_at = now()
RETURNING next_nonce
"""
# The lease epoch of executor $2 on chain $1, its row locked for share until the transaction
# ends (a takeover, which bumps the epoch, waits for it).
LEASE_EPOCH: Final = "SELECT epoch FROM executor_leases WHERE chain_id = $1 AND executor = $2 FOR SHARE"
# The lease epoch of executor $2 on chain $1, as it is now.
CURRENT_EPOCH: Final = "SELECT epoch FROM executor_leases WHERE chain_id = $1 AND executor = $2"
# The signing transaction's first statement, one round trip where four statements were (the
# fence, the rejection of expiring jobs, the claim, the nonces' allocation): reject the
# simulated jobs whose authorization expires within $4 seconds (error $5), claim up to $2 of
# the others among the ids $3 (oldest first, skipping those another worker holds), allocate
# the lane's next nonces for them, one each (first_nonce: the first; NULL when none is claimed
# or the lane was never reconciled), and read the lease epoch of executor $6 FOR SHARE (the
# fence: the caller rolls everything back when it is not its own, the allocation with it).
# One row at least: the epoch and the first nonce, beside each claimed job's columns (NULL
# when none is claimed).
FENCE_REJECT_CLAIM: Final = """
WITH expiring AS (
    UPDATE relay_jobs SET state = 'rejected', error = $5::jsonb, updated_at = now()
    WHERE chain_id = $1 AND state = 'simulated' AND auth_expires_at <= extract(epoch FROM now())::bigint + $4
    RETURNING id
), claimed AS (
    SELECT * FROM relay_jobs
    WHERE chain_id = $1 AND state = 'simulated' AND id = ANY($3::bigint[])
      AND id NOT IN (SELECT id FROM expiring)
    ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED
), nonces AS (
    UPDATE executor_nonces SET next_nonce = next_nonce + (SELECT count(*) FROM claimed), updated_at = now()
    WHERE chain_id = $1 AND executor = $6 AND EXISTS (SELECT 1 FROM claimed)
    RETURNING next_nonce - (SELECT count(*) FROM claimed) AS first_nonce
)
SELECT (SELECT epoch FROM executor_leases WHERE chain_id = $1 AND executor = $6 FOR SHARE) AS lease_epoch,
       (SELECT first_nonce FROM nonces) AS first_nonce, claimed.*
FROM (SELECT 1) AS fence LEFT JOIN claimed ON true ORDER BY claimed.id
"""
# How many transactions of executor $2 on chain $1 are in flight: the rows LIVE returns.
IN_FLIGHT: Final = """
SELECT count(*) FROM relay_transactions t LEFT JOIN relay_jobs j ON j.id = t.job_id
WHERE t.chain_id = $1 AND t.executor = $2 AND t.mined_block IS NULL AND t.replaced_by IS NULL
  AND t.passed_at IS NULL AND (j.id IS NULL OR j.state IN ('signed', 'submitted'))
"""
# Up to $2 simulated jobs, oldest first (a look, no lock: the next signing batch).
NEXT_SIMULATED: Final = """
SELECT * FROM relay_jobs WHERE chain_id = $1 AND state = 'simulated' ORDER BY id LIMIT $2
"""
# Allocate the lane's next $3 nonces; returns the first (NULL when the lane was never
# reconciled).
NEXT_NONCES: Final = """
UPDATE executor_nonces SET next_nonce = next_nonce + $3, updated_at = now()
WHERE chain_id = $1 AND executor = $2
RETURNING next_nonce - $3
"""
# Journal the signed transactions of a batch (arrays $1..$10, one element a transaction, in
# INSERT_ANY_TRANSACTION's order: ExecutorLane._row), then (the statement's UPDATE) move each
# job to signed with its transaction: one statement, one round trip whatever the batch's size
# (two before: one for the journal, one for the jobs).
_JOURNAL: Final = """
WITH journal AS (
    INSERT INTO relay_transactions (tx_hash, job_id, chain_id, executor, nonce, raw_tx,
                                    gas_limit, max_fee_per_gas, max_priority_fee_per_gas, kind)
    SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::integer[], $4::text[], $5::bigint[], $6::bytea[],
                         $7::bigint[], $8::numeric[], $9::numeric[], $10::text[])
)
"""
# Journal a batch (as _JOURNAL) and move its claimed jobs simulated -> signed.
MARK_SIGNED: Final = (
    _JOURNAL
    + """UPDATE relay_jobs j SET state = 'signed', signed_at = now(), updated_at = now(),
       tx_hash = t.tx_hash, executor = t.executor, executor_nonce = t.nonce
FROM unnest($1::bytea[], $2::bigint[], $4::text[], $5::bigint[]) AS t(tx_hash, job_id, executor, nonce)
WHERE j.id = t.job_id AND j.state = 'simulated'
"""
)
# A signing batch signed before its claim, in one statement, its own transaction (issue 20:
# one round trip where BEGIN, FENCE_REJECT_CLAIM, MARK_SIGNED and COMMIT are four): the batch's
# transactions (arrays $1..$10 as _JOURNAL's, signed at the lane's next nonces from $13) are
# journaled and their jobs moved simulated -> signed only if every job is claimed (still
# simulated, at the plan it was signed with, its authorization not expiring within $14 seconds,
# locked by no other lane), the lane's next nonce is still $13 and the lease of executor $12 on
# chain $11 is still at epoch $15. Otherwise nothing is written (no row returned) and the
# batch goes the general way (ExecutorLane.sign_simulated).
SIGN_CLAIMED: Final = """
WITH claimed AS (
    SELECT j.id FROM relay_jobs j
    JOIN unnest($2::bigint[], $7::bigint[], $8::numeric[], $9::numeric[])
         AS t(job_id, gas_limit, max_fee, tip) ON j.id = t.job_id
    WHERE j.chain_id = $11 AND j.state = 'simulated' AND j.gas_limit = t.gas_limit
      AND j.max_fee_per_gas = t.max_fee AND coalesce(j.max_priority_fee_per_gas, 0) = t.tip
      AND j.auth_expires_at > extract(epoch FROM now())::bigint + $14
    FOR UPDATE OF j SKIP LOCKED
), nonces AS (
    UPDATE executor_nonces SET next_nonce = next_nonce + cardinality($2::bigint[]), updated_at = now()
    WHERE chain_id = $11 AND executor = $12 AND next_nonce = $13
      AND (SELECT count(*) FROM claimed) = cardinality($2::bigint[])
      AND (SELECT epoch FROM executor_leases WHERE chain_id = $11 AND executor = $12 FOR SHARE) = $15
    RETURNING next_nonce
), journal AS (
    INSERT INTO relay_transactions (tx_hash, job_id, chain_id, executor, nonce, raw_tx,
                                    gas_limit, max_fee_per_gas, max_priority_fee_per_gas, kind)
    SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::integer[], $4::text[], $5::bigint[], $6::bytea[],
                         $7::bigint[], $8::numeric[], $9::numeric[], $10::text[])
    WHERE EXISTS (SELECT 1 FROM nonces)
)
UPDATE relay_jobs j SET state = 'signed', signed_at = now(), updated_at = now(),
       tx_hash = t.tx_hash, executor = t.executor, executor_nonce = t.nonce
FROM unnest($1::bytea[], $2::bigint[], $4::text[], $5::bigint[]) AS t(tx_hash, job_id, executor, nonce)
WHERE j.id = t.job_id AND j.state = 'simulated' AND EXISTS (SELECT 1 FROM nonces)
RETURNING j.id
"""
# Record the broadcast of these transactions ($1) and move their jobs ($2) signed -> submitted:
# one statement, its own transaction (before, BEGIN, two statements and COMMIT: four round trips).
MARK_SUBMITTED: Final = """
WITH broadcast AS (
    UPDATE relay_transactions SET broadcast_at = now() WHERE tx_hash = ANY($1::bytea[])
)
UPDATE relay_jobs SET state = 'submitted', submitted_at = now(), updated_at = now()
WHERE id = ANY($2::bigint[]) AND state = 'signed'
RETURNING id, kind, state, tx_hash, request_id, accepted_at, submitted_at
"""
# The lane's live transactions, in nonce order: the newest at each nonce (not replaced), not
# seen mined, whose nonce the chain has not passed (however old: a job waits at most until its
# authorization expires, then a no-op takes its nonce), whose job (if any) still waits for it,
# with what upkeep and replacement need.
LIVE: Final = """
SELECT t.tx_hash, t.job_id, t.nonce, t.kind, t.raw_tx, t.gas_limit, t.max_fee_per_gas,
       t.max_priority_fee_per_gas, extract(epoch FROM t.created_at)::float8 AS signed_at,
       extract(epoch FROM t.broadcast_at)::float8 AS broadcast_at,
       j.auth_expires_at, j.gas_allowance, j.input_token, j.settlement, j.call_data, j.kind AS job_kind
FROM relay_transactions t LEFT JOIN relay_jobs j ON j.id = t.job_id
WHERE t.chain_id = $1 AND t.executor = $2 AND t.mined_block IS NULL AND t.replaced_by IS NULL
  AND t.passed_at IS NULL AND (j.id IS NULL OR j.state IN ('signed', 'submitted'))
ORDER BY t.nonce
"""
# Every hash that may still be mined on chain $1 (a job's replacements and no-ops included),
# with its job and kind: the follower looks for all of them in new blocks.
PENDING: Final = """
SELECT t.tx_hash, t.job_id, t.kind FROM relay_transactions t LEFT JOIN relay_jobs j ON j.id = t.job_id
WHERE t.chain_id = $1 AND t.mined_block IS NULL AND t.passed_at IS NULL
  AND (j.id IS NULL OR j.state IN ('signed', 'submitted'))
"""
# Record a signed transaction of kind $10 for job $2 (NULL for a no-op filling a hole).
INSERT_ANY_TRANSACTION: Final = """
INSERT INTO relay_transactions (tx_hash, job_id, chain_id, executor, nonce, raw_tx,
                                gas_limit, max_fee_per_gas, max_priority_fee_per_gas, kind)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
"""
# Point transaction $1 (still live) to the one that replaces it at its nonce.
MARK_REPLACED: Final = """
UPDATE relay_transactions SET replaced_by = $2
WHERE tx_hash = $1 AND replaced_by IS NULL AND mined_block IS NULL
RETURNING tx_hash
"""
# A job's current transaction is now $2 (a fee-bumped replacement), still waiting.
SET_JOB_TRANSACTION: Final = """
UPDATE relay_jobs SET tx_hash = $2, max_fee_per_gas = $3, max_priority_fee_per_gas = $4, updated_at = now()
WHERE id = $1 AND state IN ('signed', 'submitted')
RETURNING id
"""
# Record why a job will be dropped (a no-op takes its nonce); its state moves when it is mined.
SET_JOB_ERROR: Final = """
UPDATE relay_jobs SET error = $2::jsonb, updated_at = now()
WHERE id = $1 AND state IN ('signed', 'submitted')
RETURNING id
"""
# A block's transactions of ours mined ($1-$5: hash, block, gas used, wei paid, success each)
# and their jobs moved ($6-$10: id, target state, block number, block hash, transaction hash
# each; a move to mined only from the states $11, to reverted from $12), then the jobs $13
# whose nonces no-ops took moved to dropped (from the states $14): migration 0024's
# relay_record_mined, one round trip. Inside it the transactions are marked by a statement of
# their own before the jobs move: the trigger that settles an API key's gas day (migration
# 0015) reads the transactions' paid_wei as a job moves, and a move in the same statement
# would not see it. The jobs moved, each with its new state.
RECORD_MINED: Final = """
SELECT * FROM relay_record_mined($1::bytea[], $2::bigint[], $3::bigint[], $4::numeric[], $5::boolean[],
    $6::bigint[], $7::text[], $8::bigint[], $9::bytea[], $10::bytea[], $11::text[], $12::text[],
    $13::bigint[], $14::text[])
"""
# -- nonces the chain passed (see relayer.workers.nonces) --------------------------------

# Per executor of chain $1, the lowest nonce holding a transaction neither mined nor passed.
LOWEST_OPEN: Final = """
SELECT executor, min(nonce) AS nonce FROM relay_transactions
WHERE chain_id = $1 AND mined_block IS NULL AND passed_at IS NULL
GROUP BY executor ORDER BY executor
"""
# Up to $4 nonces of executor $2 below $3 holding a transaction neither mined nor passed.
OPEN_BELOW: Final = """
SELECT DISTINCT nonce FROM relay_transactions
WHERE chain_id = $1 AND executor = $2 AND nonce < $3 AND mined_block IS NULL AND passed_at IS NULL
ORDER BY nonce LIMIT $4
"""
# Every transaction journaled at nonce $3 of executor $2 (mined, replaced and passed ones too).
AT_NONCE: Final = """
SELECT tx_hash, job_id, kind, mined_block FROM relay_transactions
WHERE chain_id = $1 AND executor = $2 AND nonce = $3 ORDER BY created_at
"""
# The chain passed nonce $3 of executor $2: its transactions not mined never will be.
MARK_PASSED: Final = """
UPDATE relay_transactions SET passed_at = now()
WHERE chain_id = $1 AND executor = $2 AND nonce = $3 AND mined_block IS NULL AND passed_at IS NULL
RETURNING tx_hash
"""
# A job of chain $1 that waits for a transaction (signed or submitted) and has none left to
# wait for: none mined, every one passed (a transaction not in the journal took its nonce).
_LOST_JOBS: Final = """
FROM relay_jobs j
WHERE j.chain_id = $1 AND j.state IN ('signed', 'submitted')
  AND NOT EXISTS (SELECT 1 FROM relay_transactions t
                  WHERE t.job_id = j.id AND (t.mined_block IS NOT NULL OR t.passed_at IS NULL))
"""
# Up to $2 lost jobs, oldest first, with when their authorization expires (a look, no lock).
LOST: Final = "SELECT j.*" + _LOST_JOBS + "ORDER BY j.id LIMIT $2"
# Claim the lost jobs among the ids $2, oldest first, skipping those another worker holds.
CLAIM_LOST: Final = (
    "SELECT j.*" + _LOST_JOBS + "AND j.id = ANY($2::bigint[]) ORDER BY j.id FOR UPDATE SKIP LOCKED"
)
# Journal a batch (as _JOURNAL) of lost jobs signed again at new nonces: signed once more.
MARK_RESIGNED: Final = (
    _JOURNAL
    + """UPDATE relay_jobs j SET state = 'signed', signed_at = now(), updated_at = now(),
       tx_hash = t.tx_hash, executor = t.executor, executor_nonce = t.nonce
FROM unnest($1::bytea[], $2::bigint[], $4::text[], $5::bigint[]) AS t(tx_hash, job_id, executor, nonce)
WHERE j.id = t.job_id AND j.state IN ('signed', 'submitted')
"""
)
# End lost job $1 (dropped, from one of the states $3) with error $2, unless it already
# holds the error a no-op standing in for it was to end it with.
DROP_LOST: Final = """
UPDATE relay_jobs j SET state = 'dropped', error = COALESCE(j.error, $2::jsonb), updated_at = now()
WHERE j.id = $1 AND j.state = ANY($3::text[])
  AND NOT EXISTS (SELECT 1 FROM relay_transactions t
                  WHERE t.job_id = j.id AND (t.mined_block IS NOT NULL OR t.passed_at IS NULL))
RETURNING j.*
"""
# The solvency ledger of chain $1: per kind (relay, noop, and transfer: a transfer job's
# transactions, whose gas is sponsored) and outcome, mined transactions, what the executor
# paid for them and what the allowances of the successful relays were worth (wei).
LEDGER: Final = """
SELECT k.kind, t.succeeded, count(*) AS transactions, coalesce(sum(t.paid_wei), 0) AS paid_wei,
       coalesce(sum(CASE WHEN k.kind = 'relay' AND t.succeeded THEN j.allowance_wei ELSE 0 END), 0)
           AS received_wei,
       count(*) FILTER (WHERE k.kind <> 'transfer'
                          AND t.paid_wei > CASE WHEN k.kind = 'relay' AND t.succeeded
                                                THEN coalesce(j.allowance_wei, 0) ELSE 0 END) AS at_a_loss
FROM relay_transactions t LEFT JOIN relay_jobs j ON j.id = t.job_id
CROSS JOIN LATERAL (SELECT CASE WHEN j.kind = 'transfer' THEN 'transfer' ELSE t.kind END AS kind) k
WHERE t.chain_id = $1 AND t.mined_block IS NOT NULL
GROUP BY k.kind, t.succeeded ORDER BY k.kind, t.succeeded
"""


# Per API key with a gas budget row: its settles whose receipts were recorded, the gas their
# transactions cost the executor and what its transfers in flight reserve (wei), on UTC day $1
# and in total (migration 0015), on chain $2 (a budget is per chain: migration 0027).
KEY_LEDGER: Final = """
SELECT k.id, k.name,
       coalesce(sum(d.settles), 0) AS settles, coalesce(sum(d.paid_wei), 0) AS paid_wei,
       coalesce(sum(d.reserved_wei), 0) AS reserved_wei,
       coalesce(sum(d.settles) FILTER (WHERE d.day = $1), 0) AS settles_today,
       coalesce(sum(d.paid_wei) FILTER (WHERE d.day = $1), 0) AS paid_today_wei,
       coalesce(sum(d.reserved_wei) FILTER (WHERE d.day = $1), 0) AS reserved_today_wei
FROM api_key_gas_days d JOIN api_keys k ON k.id = d.api_key_id
WHERE d.chain_id = $2
GROUP BY k.id, k.name ORDER BY k.id
"""


@dataclass(frozen=True, slots=True)
class KeyLedgerRow:
    """One API key's sponsored transfers (facilitator settles): how many had their receipt
    recorded, what their transactions cost the executor and what its transfers in flight
    reserve of its budget (wei), in total and on the day asked for."""

    api_key_id: int
    name: str
    settles: int
    paid_wei: int
    reserved_wei: int
    settles_today: int
    paid_today_wei: int
    reserved_today_wei: int


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """Mined transactions of one kind (relay, noop, transfer: sponsored, nothing received) and
    outcome: what the executor paid (wei), what the allowances of those that succeeded were
    worth (wei; a revert, a no-op or a transfer receives nothing), and how many paid more than
    they received (never counted for a transfer)."""

    kind: str
    succeeded: bool
    transactions: int
    paid_wei: int
    received_wei: int
    at_a_loss: int


@dataclass(frozen=True, slots=True)
class LiveTx:
    """A live transaction of the lane with what its upkeep needs: the pure view
    (:class:`relayer.domain.lane.LaneTx`, without the ceiling, which needs prices), its
    bytes to re-send, and (relay) the call to sign again with other fees."""

    tx_hash: bytes
    job_id: int | None
    nonce: int
    kind: Literal["relay", "noop"]
    raw: bytes
    gas_limit: int
    max_fee_per_gas: int
    max_priority_fee_per_gas: int
    signed_at: float
    broadcast_at: float | None
    expires_at: int | None
    gas_allowance: int | None
    input_token: str | None
    to: str | None
    data: bytes | None
    job_kind: str | None = None  # the job's kind (retire, transfer); None for a hole's no-op

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> LiveTx:
        return cls(
            tx_hash=bytes(row["tx_hash"]),
            job_id=row["job_id"],
            nonce=int(row["nonce"]),
            kind=row["kind"],
            raw=bytes(row["raw_tx"]),
            gas_limit=int(row["gas_limit"]),
            max_fee_per_gas=int(row["max_fee_per_gas"]),
            max_priority_fee_per_gas=int(row["max_priority_fee_per_gas"]),
            signed_at=float(row["signed_at"]),
            broadcast_at=None if row["broadcast_at"] is None else float(row["broadcast_at"]),
            expires_at=None if row["auth_expires_at"] is None else int(row["auth_expires_at"]),
            gas_allowance=None if row["gas_allowance"] is None else int(row["gas_allowance"]),
            input_token=row["input_token"],
            to=row["settlement"],
            data=None if row["call_data"] is None else bytes(row["call_data"]),
            job_kind=row["job_kind"],
        )

    def signed(self) -> SignedTx:
        """The journaled transaction (to broadcast again)."""
        return SignedTx(
            self.job_id,
            self.tx_hash,
            self.raw,
            self.nonce,
            self.gas_limit,
            self.max_fee_per_gas,
            self.max_priority_fee_per_gas,
            self.kind,
        )


@dataclass(frozen=True, slots=True)
class PendingTx:
    """A hash that may still be mined, with its job (None: a no-op filling a hole)."""

    job_id: int | None
    kind: Literal["relay", "noop"]


@dataclass(frozen=True, slots=True)
class SignedTx:
    """A signed executor transaction as committed before broadcast (fees in wei per gas);
    ``job_id`` is None for a no-op that fills a hole; ``request_id`` names the HTTP request
    that made its job (for the logs; not journaled)."""

    job_id: int | None
    tx_hash: bytes
    raw: bytes
    nonce: int
    gas_limit: int
    max_fee_per_gas: int
    max_priority_fee_per_gas: int
    kind: Literal["relay", "noop"] = "relay"
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class NonceTx:
    """A transaction journaled at a nonce: its job (None: a no-op filling a hole), its kind,
    and the block it was seen mined in (None: not seen mined)."""

    tx_hash: bytes
    job_id: int | None
    kind: Literal["relay", "noop"]
    mined_block: int | None


@dataclass(frozen=True, slots=True)
class LostJob:
    """A job that waits for a transaction and has none left (a transaction not in the
    journal took its nonce), with when its authorization expires (unix seconds)."""

    job: Job
    expires_at: int


class LaneNotReconciled(RelayerError):
    """A nonce was asked of a lane that was never reconciled with the chain (a bug)."""


class LeaseLost(RelayerError):
    """Another process took this executor key's lease (its epoch moved on): stop signing."""


def _columns(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """``rows`` (each ``width`` values) as ``width`` columns (lists), for a statement's arrays."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


class ExecutorLane:
    """Repository of executor nonces and signed transactions for one chain.

    Every method raises ``StoreUnavailable`` when the database fails.
    """

    def __init__(self, db: Database, chain_id: int) -> None:
        self.db = db
        self.chain_id = chain_id
        # executor -> the lane's next nonce as this process last wrote or read it: the lease
        # holder's guess when it signs before the claim (a wrong one costs the general way)
        self._next: dict[str, int] = {}

    async def reconcile_nonce(self, executor: str, chain_pending: int) -> int:
        """Set the lane's next nonce to max(stored, chain pending count); returns it."""
        self._next.pop(executor, None)
        nxt = int(await self.db.fetchval(RECONCILE_NONCE, self.chain_id, executor, chain_pending))
        self._next[executor] = nxt
        return nxt

    async def holds(self, executor: str, epoch: int) -> bool:
        """Whether the lease of ``executor`` is still at ``epoch`` (this process's)."""
        return bool(await self.db.fetchval(CURRENT_EPOCH, self.chain_id, executor) == epoch)

    async def in_flight(self, executor: str) -> int:
        """How many of the lane's transactions are in flight (see :data:`IN_FLIGHT`)."""
        return int(await self.db.fetchval(IN_FLIGHT, self.chain_id, executor))

    async def next_simulated(self, limit: int) -> list[Job]:
        """Up to ``limit`` simulated jobs, oldest first: the next signing batch, to be
        checked again before :meth:`sign_simulated` claims it (no lock taken)."""
        return [Job.from_row(r) for r in await self.db.fetch(NEXT_SIMULATED, self.chain_id, limit)]

    async def sign_simulated(
        self,
        executor: str,
        epoch: int,
        job_ids: Sequence[int],
        sign: Callable[[Job, int], SignedTx],
        expiry_margin_s: int,
        expired: RelayerError,
    ) -> list[SignedTx]:
        """Claim the simulated jobs among ``job_ids``, allocate executor nonces, sign, and
        commit the raw transactions with the jobs moved to ``signed``, all in one database
        transaction, before anything is broadcast, and only while the lease is still at
        ``epoch``. Jobs whose authorization expires within ``expiry_margin_s`` seconds are
        rejected instead, with ``expired`` as their error.

        Raises:
            LeaseLost: another process took the lease; nothing was signed.
            LaneNotReconciled: the lane has no nonce row yet.
        """
        try:
            async with self.db.transaction() as conn:
                rows = await conn.fetch(
                    FENCE_REJECT_CLAIM,
                    self.chain_id,
                    len(job_ids),
                    list(job_ids),
                    expiry_margin_s,
                    json.dumps(expired.record()),
                    executor,
                )
                if rows[0]["lease_epoch"] != epoch:  # rolls the rejections and the claim back
                    raise LeaseLost(message=f"the lease of {executor} moved past epoch {epoch}")
                claimed = [row for row in rows if row["id"] is not None]
                first = rows[0]["first_nonce"]
                signed = await self._sign_in_order(conn, executor, claimed, sign, MARK_SIGNED, first)
        except BaseException:
            self._next.pop(executor, None)  # its commit's fate may be unknown: read again
            raise
        if first is not None:  # this transaction allocated nonces: the next one is known
            self._next[executor] = int(first) + len(signed)
        return signed

    async def sign_batch(
        self,
        executor: str,
        epoch: int,
        jobs: Sequence[Job],
        sign: Callable[[Job, int], SignedTx],
        expiry_margin_s: int,
        expired: RelayerError,
    ) -> list[SignedTx]:
        """:meth:`sign_simulated` for ``jobs`` as the broadcaster read them (simulated, then
        checked again), in one round trip when it can: each job is signed first, in id order
        at the lane's next nonces as this process last knew them, and :data:`SIGN_CLAIMED`
        journals the transactions and moves the jobs to ``signed`` in one statement, only if
        every job is still simulated at the plan it was signed with and not expiring within
        ``expiry_margin_s`` seconds, the next nonce is the one guessed and the lease is at
        ``epoch``. Otherwise (a job another lane took or planned again meanwhile, an
        expiring one, a lane this process has not read) nothing was written, the signatures
        are dropped and the batch goes :meth:`sign_simulated`'s way (four round trips; it
        rejects the chain's expiring jobs). Nothing is broadcast before either commits.

        Raises:
            LeaseLost: another process took the lease; nothing was signed.
            LaneNotReconciled: the lane has no nonce row yet.
        """
        ordered = sorted(jobs, key=lambda job: job.id)  # nonce order is id order, as the claim's
        first = self._next.get(executor) if ordered else None
        if first is not None:
            del self._next[executor]  # known again once the statement answers
            signed = [sign(job, first + i) for i, job in enumerate(ordered)]
            columns = zip(*(self._row(executor, tx) for tx in signed), strict=True)  # an array a column
            arrays = [list(column) for column in columns]
            rows = await self.db.fetch(
                SIGN_CLAIMED, *arrays, self.chain_id, executor, first, expiry_margin_s, epoch
            )
            if len(rows) == len(signed):
                self._next[executor] = first + len(signed)
                return signed
            assert not rows, "SIGN_CLAIMED writes the whole batch or nothing"
        ids = [job.id for job in ordered]
        return await self.sign_simulated(executor, epoch, ids, sign, expiry_margin_s, expired)

    async def _sign_in_order(
        self,
        conn: PoolConnectionProxy[asyncpg.Record],
        executor: str,
        rows: Sequence[asyncpg.Record],
        sign: Callable[[Job, int], SignedTx],
        mark: str,
        first: int | None,
    ) -> list[SignedTx]:
        """Sign each claimed job at the lane's next nonce, journal it and mark it with
        ``mark`` (:data:`MARK_SIGNED` or :data:`MARK_RESIGNED`), inside the caller's fenced
        transaction: the batch's transactions journaled and its jobs marked in one statement
        (one round trip), whatever its size. ``first``: the first of the nonces allocated to
        the batch (None: the lane has no nonce row).

        Raises:
            LaneNotReconciled: the executor's nonce lane is missing.
        """
        if not rows:
            return []
        if first is None:
            raise LaneNotReconciled(message=f"executor nonce lane missing for {executor}")
        signed = [sign(Job.from_row(row), int(first) + i) for i, row in enumerate(rows)]
        columns = zip(*(self._row(executor, tx) for tx in signed), strict=True)  # an array a column
        await conn.execute(mark, *(list(column) for column in columns))
        return signed

    async def mark_broadcast(self, txs: Sequence[SignedTx]) -> list[MovedJob]:
        """Record the broadcast and move the jobs still ``signed`` to ``submitted`` (one
        statement, :data:`MARK_SUBMITTED`); returns the jobs moved (with their
        ``accepted_at`` and ``submitted_at`` stamps).

        Raises:
            StoreUnavailable: the database failed (nothing recorded: the upkeep sends again).
        """
        if not txs:
            return []
        jobs = [t.job_id for t in txs if t.job_id is not None]
        rows = await self.db.fetch(MARK_SUBMITTED, [t.tx_hash for t in txs], jobs)
        return [MovedJob.from_row(r) for r in rows]

    async def live(self, executor: str) -> list[LiveTx]:
        """The lane's live transactions, in nonce order (see :data:`LIVE`)."""
        return [LiveTx.from_row(r) for r in await self.db.fetch(LIVE, self.chain_id, executor)]

    async def pending(self) -> dict[bytes, PendingTx]:
        """Every hash on this chain that may still be mined, with its job and kind."""
        rows = await self.db.fetch(PENDING, self.chain_id)
        return {bytes(r["tx_hash"]): PendingTx(r["job_id"], r["kind"]) for r in rows}

    async def record_mined(
        self,
        mined: Sequence[tuple[bytes, int, int, int, bool]],
        moves: Mapping[JobState, Sequence[tuple[int, int, bytes, bytes]]],
        dropped: Sequence[int] = (),
    ) -> dict[JobState, list[MovedJob]]:
        """Record a block's transactions of ours mined and move their jobs, in one
        transaction: a transaction is never seen mined (and so no longer looked for) while
        its job still waits for it, even if the process dies in between. One round trip
        (:data:`RECORD_MINED`; four before: BEGIN, the transactions, the jobs, COMMIT).

        Args:
            mined: (transaction hash, block number, gas used, what it cost the executor in
                wei: gas used times effective gas price plus any L1 data fee, whether it
                succeeded) each.
            moves: per target (mined or reverted), (job id, block number, block hash,
                transaction hash) each; a job moves only from a state the transition table
                allows.
            dropped: the jobs whose nonces the block's no-ops took (moved to dropped).

        Returns:
            The jobs moved, per target.
        """
        moved: dict[JobState, list[MovedJob]] = {}
        if not mined:
            return moved
        unknown = set(moves) - {JobState.MINED, JobState.REVERTED}
        if unknown:
            raise ValueError(f"a mined transaction moves its job to mined or reverted, not {unknown}")
        jobs = [(job_id, target.value, *at) for target, each in moves.items() for job_id, *at in each]
        rows = await self.db.fetch(
            RECORD_MINED,
            *_columns(mined, 5),  # hash, block, gas used, wei paid, success
            *_columns(jobs, 5),  # id, target, block number, block hash, transaction hash
            [s.value for s in sources_of(JobState.MINED)],
            [s.value for s in sources_of(JobState.REVERTED)],
            list(dropped),
            [s.value for s in sources_of(JobState.DROPPED)],
        )
        for row in rows:
            job = MovedJob.from_row(row)
            moved.setdefault(job.state, []).append(job)
        return moved

    async def ledger(self) -> list[LedgerRow]:
        """The solvency ledger (see :data:`LEDGER`)."""
        return [
            LedgerRow(
                kind=r["kind"],
                succeeded=bool(r["succeeded"]),
                transactions=int(r["transactions"]),
                paid_wei=int(r["paid_wei"]),
                received_wei=int(r["received_wei"]),
                at_a_loss=int(r["at_a_loss"]),
            )
            for r in await self.db.fetch(LEDGER, self.chain_id)
        ]

    async def key_ledger(self, day: dt.date) -> list[KeyLedgerRow]:
        """Gas paid and reserved per API key on this chain, in total and on UTC ``day`` (see
        :data:`KEY_LEDGER`)."""
        return [
            KeyLedgerRow(
                int(r["id"]),
                r["name"],
                int(r["settles"]),
                int(r["paid_wei"]),
                int(r["reserved_wei"]),
                int(r["settles_today"]),
                int(r["paid_today_wei"]),
                int(r["reserved_today_wei"]),
            )
            for r in await self.db.fetch(KEY_LEDGER, day, self.chain_id)
        ]

    async def record_replacement(self, executor: str, epoch: int, old: LiveTx, new: SignedTx) -> bool:
        """Journal ``new``, a same-nonce replacement of ``old`` with other fees, as the job's
        current transaction. False (nothing written) when ``old`` is no longer live.

        Raises:
            LeaseLost: another process took the lease.
        """
        try:
            async with self.db.transaction() as conn:
                await self._fence(conn, executor, epoch)
                await self._insert(conn, executor, new)
                if await conn.fetchval(MARK_REPLACED, old.tx_hash, new.tx_hash) is None:
                    raise _Moved()
                fees = (new.max_fee_per_gas, new.max_priority_fee_per_gas)
                current = new.job_id is None or await conn.fetchval(
                    SET_JOB_TRANSACTION, new.job_id, new.tx_hash, *fees
                )
                if current is None:
                    raise _Moved()
        except _Moved:
            return False
        return True

    async def record_noop(
        self, executor: str, epoch: int, noop: SignedTx, replaces: LiveTx | None, error: RelayerError | None
    ) -> bool:
        """Journal a no-op at a nonce: filling a hole, or standing in for the job of
        ``replaces`` (which will be dropped with ``error`` once the no-op is mined). False
        (nothing written) when ``replaces`` is no longer live.

        Raises:
            LeaseLost: another process took the lease.
        """
        try:
            async with self.db.transaction() as conn:
                await self._fence(conn, executor, epoch)
                await self._insert(conn, executor, noop)
                replaced = replaces is None or await conn.fetchval(
                    MARK_REPLACED, replaces.tx_hash, noop.tx_hash
                )
                if replaced is None:
                    raise _Moved()
                if noop.job_id is not None and error is not None:
                    record = json.dumps(error.record())
                    if await conn.fetchval(SET_JOB_ERROR, noop.job_id, record) is None:
                        raise _Moved()
        except _Moved:
            return False
        return True

    # -- nonces the chain passed ------------------------------------------------------------

    async def lowest_open(self) -> dict[str, int]:
        """Per executor, the lowest nonce holding a transaction neither mined nor passed."""
        return {r["executor"]: int(r["nonce"]) for r in await self.db.fetch(LOWEST_OPEN, self.chain_id)}

    async def open_below(self, executor: str, below: int, limit: int) -> list[int]:
        """Up to ``limit`` nonces of ``executor`` under ``below``, lowest first, that hold a
        transaction neither mined nor passed."""
        rows = await self.db.fetch(OPEN_BELOW, self.chain_id, executor, below, limit)
        return [int(r["nonce"]) for r in rows]

    async def at_nonce(self, executor: str, nonce: int) -> list[NonceTx]:
        """Every transaction journaled at ``nonce`` of ``executor``, oldest first."""
        return [
            NonceTx(bytes(r["tx_hash"]), r["job_id"], r["kind"], r["mined_block"])
            for r in await self.db.fetch(AT_NONCE, self.chain_id, executor, nonce)
        ]

    async def mark_passed(self, executor: str, nonce: int) -> int:
        """The chain passed ``nonce`` of ``executor``: its transactions not mined are no
        longer live (never re-sent, looked for or counted again). Returns how many."""
        return len(await self.db.fetch(MARK_PASSED, self.chain_id, executor, nonce))

    async def lost(self, limit: int) -> list[LostJob]:
        """Up to ``limit`` lost jobs, oldest first (see :data:`LOST`; no lock taken)."""
        return [
            LostJob(Job.from_row(r), int(r["auth_expires_at"]))
            for r in await self.db.fetch(LOST, self.chain_id, limit)
        ]

    async def resign_lost(
        self, executor: str, epoch: int, job_ids: Sequence[int], sign: Callable[[Job, int], SignedTx]
    ) -> list[SignedTx]:
        """Claim the jobs among ``job_ids`` still lost, allocate each a new nonce of
        ``executor``, sign and journal its transaction and move it to ``signed`` again, in
        one database transaction, only while the lease is still at ``epoch``.

        Raises:
            LeaseLost: another process took the lease; nothing was signed.
            LaneNotReconciled: the lane has no nonce row yet.
        """
        signed: list[SignedTx] = []
        if not job_ids:
            return signed
        self._next.pop(executor, None)  # known again once this transaction commits
        async with self.db.transaction() as conn:
            await self._fence(conn, executor, epoch)
            rows = await conn.fetch(CLAIM_LOST, self.chain_id, list(job_ids))
            if not rows:
                return signed
            first = await conn.fetchval(NEXT_NONCES, self.chain_id, executor, len(rows))
            signed = await self._sign_in_order(conn, executor, rows, sign, MARK_RESIGNED, first)
        self._next[executor] = int(first) + len(signed)
        return signed

    async def drop_lost(self, job_id: int, error: RelayerError) -> Job | None:
        """End a lost job (dropped) with ``error``, or with the error it already holds (a
        no-op was to stand in for it); None when it is no longer lost."""
        sources = [s.value for s in sources_of(JobState.DROPPED)]
        row = await self.db.fetchrow(DROP_LOST, job_id, json.dumps(error.record()), sources)
        return None if row is None else Job.from_row(row)

    async def _fence(self, conn: PoolConnectionProxy[asyncpg.Record], executor: str, epoch: int) -> None:
        if await conn.fetchval(LEASE_EPOCH, self.chain_id, executor) != epoch:
            raise LeaseLost(message=f"the lease of {executor} moved past epoch {epoch}")

    async def _insert(self, conn: PoolConnectionProxy[asyncpg.Record], executor: str, tx: SignedTx) -> None:
        await conn.execute(INSERT_ANY_TRANSACTION, *self._row(executor, tx))

    def _row(self, executor: str, tx: SignedTx) -> tuple[object, ...]:
        """The arguments of :data:`INSERT_ANY_TRANSACTION` for ``tx`` (a batch's, transposed:
        :data:`MARK_SIGNED`'s and :data:`MARK_RESIGNED`'s arrays)."""
        return (
            tx.tx_hash,
            tx.job_id,
            self.chain_id,
            executor,
            tx.nonce,
            tx.raw,
            tx.gas_limit,
            tx.max_fee_per_gas,
            tx.max_priority_fee_per_gas,
            tx.kind,
        )


class _Moved(RelayerError):
    """The transaction or job changed meanwhile (mined, replaced): roll back (caught in this
    module; never leaves it)."""
