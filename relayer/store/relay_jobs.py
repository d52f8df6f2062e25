"""Relay jobs and spent salts: the exactly-once record of every accepted authorization.

Policy: the salt and the authorization key are unique in Postgres, so an identical request
finds its job; every state change is ``UPDATE ... WHERE state = ANY(allowed sources)``
(mirroring ``domain.states``); the ``relay_jobs_notify`` trigger announces every new job and
every change of state on channel ``relay_jobs``. Errors are stored as ``{code, message,
context}`` records, never as HTTP.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import asyncpg

from relayer.domain.errors import RelayerError
from relayer.domain.fill import SupplyRule
from relayer.domain.states import JobKind, JobState, sources_of
from relayer.logs import CURRENT_REQUEST_ID
from relayer.store.pool import Database

NOTIFY_CHANNEL: Final = "relay_job_states"  # "<job id>:<state>" (migration 0008)

# Moves written as literal SQL below (batch paths) or in store/executor_lane.py and
# store/reorg.py; each must be
# allowed by the domain's transition table (tests/unit/test_states.py checks it).
# Everything else goes through RelayJobs.move().
FIXED_TRANSITIONS: Final = (
    (JobState.REJECTED, JobState.ACCEPTED),  # RESERVE (migration 0020: a re-opened job)
    (JobState.ACCEPTED, JobState.SIMULATED),  # MOVE_SIMULATED
    (JobState.SIMULATED, JobState.REJECTED),  # executor_lane.FENCE_REJECT_CLAIM
    (JobState.SIMULATED, JobState.SIGNED),  # executor_lane.MARK_SIGNED
    (JobState.SIGNED, JobState.SUBMITTED),  # executor_lane.MARK_SUBMITTED
    (JobState.SIGNED, JobState.SIGNED),  # executor_lane.MARK_RESIGNED
    (JobState.SUBMITTED, JobState.SIGNED),  # executor_lane.MARK_RESIGNED
    (JobState.MINED, JobState.CONFIRMED),  # CONFIRM_MINED
    (JobState.CONFIRMED, JobState.INDEXED),  # MARK_INDEXED
    (JobState.MINED, JobState.SUBMITTED),  # reorg.REWIND_JOBS
    (JobState.CONFIRMED, JobState.SUBMITTED),  # reorg.REWIND_JOBS
    (JobState.INDEXED, JobState.SUBMITTED),  # reorg.REWIND_JOBS
    (JobState.REVERTED, JobState.SUBMITTED),  # reorg.REWIND_JOBS
)

# -- statements -------------------------------------------------------------------------

# Record an accepted request as a new job ($22: the HTTP request's id, or NULL); nothing when
# its authorization key exists.
INSERT_JOB: Final = """
INSERT INTO relay_jobs (chain_id, bound_nonce, salt, scheme, payer, input_token, auth_value,
                        gas_allowance, request_hash, settlement, call_data, summary, permit_key,
                        auth_expires_at, quote_total, supply_source, supply_id, supply_token_id,
                        supply_units, kind, api_key_id, request_id, state)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb, $13, $14, $15, $16, $17, $18, $19,
        $20, $21, $22, 'accepted')
ON CONFLICT (chain_id, bound_nonce) DO NOTHING
RETURNING *
"""
# A reservation in one statement (migration 0020's relay_reserve: INSERT_JOB's columns $1 to
# $22; the payer's balance $23 read at block $24, NULL: unchecked; the supply rule's block $25,
# NULL: unchecked, and its left $26, minimum fill $27 and possibility $28, see
# relayer.domain.fill.SupplyRule): the asynchronous commit (below), the payer's lock
# and RESERVED_BY_PAYER, the job and its salt, or the job of the same authorization key
# (re-opened when it was rejected before signing, for the identical request only), then the
# supply's lock and RESERVED_SUPPLY. The job's row with ``owned``; a refusal is raised (RAISE
# 'payer_overdrawn' | 'salt_reused' | 'supply_short', DETAIL the sum) and rolls the whole
# reservation back.
# The asynchronous commit (set_config('synchronous_commit', 'off', true) in relay_reserve): a
# reservation's commit does not wait for its WAL flush (the supply's lock is held through the
# commit: every fill of that supply waited for each flush). Nothing outside the database acts on
# a reservation before a later synchronous commit (the job's simulation moves it, the signing
# transaction journals it) flushes the WAL through it; a server crash before that loses the job
# and its salt as if the request had not come (nothing was signed or sent; the identical
# request makes it again).
RESERVE: Final = """
SELECT (r.job).*, r.owned FROM relay_reserve(
    $1::integer, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb, $13, $14, $15, $16, $17, $18,
    $19, $20, $21, $22, $23, $24, $25, $26, $27, $28) AS r
"""
# The job that spent a salt.
JOB_BY_SALT: Final = """
SELECT j.* FROM spent_salts s JOIN relay_jobs j ON j.id = s.job_id WHERE s.chain_id = $1 AND s.salt = $2
"""
# The reservation's locks and sums as statements (RESERVE runs them inside migration 0019's
# functions, with the same lock keys, so a daemon of an earlier release serialises with it).
# Serialise the reservations of one payer's token until the transaction ends ($1 chain id,
# $2 payer, $3 token).
LOCK_PAYER: Final = """
SELECT pg_advisory_xact_lock(hashtextextended('payer:' || $1::integer || ':' || $2 || ':' || $3, 0))
"""
# What the payer's other jobs may still take from its token balance as read at block $4:
# the value of every job not yet mined whose authorization has not expired (an expired one
# can no longer pull funds; a minute of grace for clocks), and of every job mined after that
# block (the balance does not show it spent yet). $5 is the new job's own authorization key.
RESERVED_BY_PAYER: Final = """
SELECT (SELECT coalesce(sum(auth_value), 0) FROM relay_jobs
        WHERE chain_id = $1 AND payer = $2 AND input_token = $3 AND bound_nonce <> $5
          AND state IN ('accepted', 'simulated', 'signed', 'submitted')
          AND auth_expires_at > extract(epoch FROM now())::bigint - 60)
     + (SELECT coalesce(sum(auth_value), 0) FROM relay_jobs
        WHERE chain_id = $1 AND payer = $2 AND input_token = $3 AND bound_nonce <> $5
          AND state IN ('mined', 'confirmed', 'indexed') AND block_number > $4)
"""
# What the payer's jobs not yet mined may still take from its token balance (their
# authorization not expired; a minute of grace for clocks): beside a balance read at the
# latest block, which shows every mined job spent. $4 is an authorization key left out.
IN_FLIGHT_BY_PAYER: Final = """
SELECT coalesce(sum(auth_value), 0) FROM relay_jobs
WHERE chain_id = $1 AND payer = $2 AND input_token = $3 AND bound_nonce <> $4
  AND state IN ('accepted', 'simulated', 'signed', 'submitted')
  AND auth_expires_at > extract(epoch FROM now())::bigint - 60
"""
# What the signed jobs of payers $2 (each with its token, $4) will take from their token
# balances as read at block $3 (signed or sent and not yet mined, or mined after that block):
# a signing batch must fit beside it. A row a part a (payer, token), over the part's partial
# index (migration 0023); the caller adds the two.
COMMITTED_BY_PAYERS: Final = """
SELECT w.payer, w.token AS input_token, sum(j.auth_value) AS committed
FROM unnest($2::text[], $4::text[]) AS w(payer, token)
JOIN relay_jobs j ON j.chain_id = $1 AND j.payer = w.payer AND j.input_token = w.token
 AND j.state IN ('signed', 'submitted') AND j.auth_expires_at > extract(epoch FROM now())::bigint - 60
GROUP BY w.payer, w.token
UNION ALL
SELECT w.payer, w.token, sum(j.auth_value)
FROM unnest($2::text[], $4::text[]) AS w(payer, token)
JOIN relay_jobs j ON j.chain_id = $1 AND j.payer = w.payer AND j.input_token = w.token
 AND j.state IN ('mined', 'confirmed', 'indexed') AND j.block_number > $3
GROUP BY w.payer, w.token
"""
# Serialise the reservations of one supply until the transaction ends ($1 chain id, $2 source,
# $3 class or listing id, $4 credit token id); always taken after the payer's lock.
LOCK_SUPPLY: Final = """
SELECT pg_advisory_xact_lock(
    hashtextextended('supply:' || $1::integer || ':' || $2::integer || ':' || ($3::numeric)::text || ':'
                     || ($4::numeric)::text, 0))
"""
# What the other jobs of a supply ($2 source, $3 id, $4 token id) may still take from it as
# read at block $5 (credit units): every job not yet mined whose authorization has not expired,
# and every job mined after that block (the figure does not show it taken yet). $6 is the new
# job's own bound nonce.
# (Two sums, each over its partial index, as migration 0022's relay_supply_reserved: the index
# scans mark the entries of dead row versions, which a bitmap scan of an OR never does.)
RESERVED_SUPPLY: Final = """
SELECT (SELECT coalesce(sum(supply_units), 0) FROM relay_jobs
        WHERE chain_id = $1 AND supply_source = $2 AND supply_id = $3 AND supply_token_id = $4
          AND bound_nonce <> $6 AND state IN ('accepted', 'simulated', 'signed', 'submitted')
          AND auth_expires_at > extract(epoch FROM now())::bigint - 60)
     + (SELECT coalesce(sum(supply_units), 0) FROM relay_jobs
        WHERE chain_id = $1 AND supply_source = $2 AND supply_id = $3 AND supply_token_id = $4
          AND bound_nonce <> $6 AND state IN ('mined', 'confirmed', 'indexed') AND block_number > $5)
"""
# For each job $1 of a signing batch, what other jobs of its supply take from it before it, as
# read at block $2 (credit units): ``mined_after``, the jobs mined after that block; ``ahead``,
# the jobs signed or sent and not yet mined, and the older ones not yet signed (they are
# signed first). Jobs whose authorization expired are not counted. Each supply of the batch
# is read once a part, each part over its partial index (relay_jobs_supply_in_flight,
# relay_jobs_supply_mined), as migration 0022's supply sum; the batch's jobs sum what was read.
# Before, a join on an OR of the two parts for each job was a bitmap scan, which never marks
# the index entries of dead row versions dead, so every batch read them all again.
SUPPLY_AHEAD: Final = """
WITH b AS (
    SELECT id, chain_id, supply_source, supply_id, supply_token_id FROM relay_jobs
    WHERE id = ANY($1::bigint[]) AND supply_units IS NOT NULL
), supplies AS (
    SELECT DISTINCT chain_id, supply_source, supply_id, supply_token_id FROM b
), flight AS MATERIALIZED (
    SELECT o.id, o.state, o.supply_units, o.chain_id, o.supply_source, o.supply_id, o.supply_token_id
    FROM supplies s JOIN relay_jobs o
      ON o.chain_id = s.chain_id AND o.supply_source = s.supply_source AND o.supply_id = s.supply_id
     AND o.supply_token_id = s.supply_token_id
    WHERE o.state IN ('accepted', 'simulated', 'signed', 'submitted')
      AND o.auth_expires_at > extract(epoch FROM now())::bigint - 60
), mined AS MATERIALIZED (
    SELECT o.id, o.supply_units, o.chain_id, o.supply_source, o.supply_id, o.supply_token_id
    FROM supplies s JOIN relay_jobs o
      ON o.chain_id = s.chain_id AND o.supply_source = s.supply_source AND o.supply_id = s.supply_id
     AND o.supply_token_id = s.supply_token_id
    WHERE o.state IN ('mined', 'confirmed', 'indexed') AND o.block_number > $2
)
SELECT b.id,
       (SELECT coalesce(sum(m.supply_units), 0) FROM mined m
        WHERE (m.chain_id, m.supply_source, m.supply_id, m.supply_token_id)
              = (b.chain_id, b.supply_source, b.supply_id, b.supply_token_id)
          AND m.id <> b.id) AS mined_after,
       (SELECT coalesce(sum(f.supply_units), 0) FROM flight f
        WHERE (f.chain_id, f.supply_source, f.supply_id, f.supply_token_id)
              = (b.chain_id, b.supply_source, b.supply_id, b.supply_token_id) AND f.id <> b.id
          AND (f.state IN ('signed', 'submitted') OR f.id < b.id)) AS ahead
FROM b
"""
# Re-plan simulated job $1 with the gas and fees of a fresh simulation (still simulated only).
REPLAN: Final = """
UPDATE relay_jobs SET gas_limit = $2, max_fee_per_gas = $3, max_priority_fee_per_gas = $4,
       allowance_wei = $5, updated_at = now()
WHERE id = $1 AND state = 'simulated'
"""
# Reserve $3 wei of key $1's gas budget $4 on chain $5 for UTC day $2: the day's row of that
# chain grows by it only if what its jobs in flight reserve, what its mined ones paid and this
# ceiling stay within the budget (the row lock serialises concurrent settles of one key); no
# row: over budget. A budget is per chain (migration 0027): another chain's gas is other money.
RESERVE_GAS: Final = """
INSERT INTO api_key_gas_days AS d (api_key_id, day, reserved_wei, chain_id)
SELECT $1, $2, $3::numeric, $5 WHERE $3::numeric <= $4::numeric
ON CONFLICT (api_key_id, chain_id, day) DO UPDATE SET reserved_wei = d.reserved_wei + EXCLUDED.reserved_wei
WHERE d.reserved_wei + d.paid_wei + EXCLUDED.reserved_wei <= $4::numeric
RETURNING reserved_wei
"""
# Job $1 holds a reservation of $2 wei in day $3's row (given back when it ends: migration 0015).
SET_GAS_RESERVED: Final = """
UPDATE relay_jobs SET gas_reserved_wei = $2, gas_reserved_on = $3 WHERE id = $1 RETURNING *
"""
# One job by id.
JOB_BY_ID: Final = "SELECT * FROM relay_jobs WHERE id = $1"
# Move the accepted jobs $1 to simulated, each with its plan: gas limit $2, max fee and
# priority fee per gas $3 and $4 (wei), allowance $5 (wei); the ids moved.
MOVE_SIMULATED: Final = """
UPDATE relay_jobs AS j SET state = 'simulated', simulated_at = now(), updated_at = now(),
       gas_limit = u.gas_limit, max_fee_per_gas = u.max_fee, max_priority_fee_per_gas = u.priority_fee,
       allowance_wei = u.allowance
FROM unnest($1::bigint[], $2::bigint[], $3::numeric[], $4::numeric[], $5::numeric[])
     AS u(id, gas_limit, max_fee, priority_fee, allowance)
WHERE j.id = u.id AND j.state = 'accepted'
RETURNING j.id
"""
# Move a job to $2 if it is in one of the states $3; stamp the target's column; set the
# given columns ($4-$11) and keep the others.
MOVE_JOB: Final = """
UPDATE relay_jobs SET
    state = $2, updated_at = now(),
    accepted_at  = CASE WHEN $2 = 'accepted'  THEN now() ELSE accepted_at END,
    simulated_at = CASE WHEN $2 = 'simulated' THEN now() ELSE simulated_at END,
    signed_at    = CASE WHEN $2 = 'signed'    THEN now() ELSE signed_at END,
    submitted_at = CASE WHEN $2 = 'submitted' THEN now() ELSE submitted_at END,
    mined_at     = CASE WHEN $2 = 'mined'     THEN now() ELSE mined_at END,
    confirmed_at = CASE WHEN $2 = 'confirmed' THEN now() ELSE confirmed_at END,
    indexed_at   = CASE WHEN $2 = 'indexed'   THEN now() ELSE indexed_at END,
    error = COALESCE($4::jsonb, error),
    gas_limit = COALESCE($5, gas_limit),
    max_fee_per_gas = COALESCE($6, max_fee_per_gas),
    max_priority_fee_per_gas = COALESCE($7, max_priority_fee_per_gas),
    block_number = COALESCE($8, block_number),
    block_hash = COALESCE($9, block_hash),
    tx_hash = COALESCE($10, tx_hash),
    allowance_wei = COALESCE($11, allowance_wei)
WHERE id = $1 AND state = ANY($3::text[])
RETURNING *
"""
# Take over job $1 left in accepted for longer than $2 seconds (its owner died mid-check).
CLAIM_ORPHAN: Final = """
UPDATE relay_jobs SET accepted_at = now(), attempts = attempts + 1, updated_at = now()
WHERE id = $1 AND state = 'accepted' AND accepted_at < now() - make_interval(secs => $2)
RETURNING *
"""
# Take over up to $2 jobs of chain $3 left in accepted for longer than $1 seconds, skipping
# locked ones (a process simulates only its own chain's jobs: another chain's settlement and
# call data mean nothing to its node).
CLAIM_ORPHANS: Final = """
UPDATE relay_jobs SET accepted_at = now(), attempts = attempts + 1, updated_at = now()
WHERE id IN (SELECT id FROM relay_jobs
             WHERE state = 'accepted' AND chain_id = $3
               AND accepted_at < now() - make_interval(secs => $1)
             ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)
RETURNING *
"""
# Hand back the jobs $1 taken over as orphans and not simulated (their taker is stopping):
# their accepted_at set $2 seconds back, so the next sweeper or identical request takes them
# at once.
HAND_BACK_ORPHANS: Final = """
UPDATE relay_jobs SET accepted_at = now() - make_interval(secs => $2), updated_at = now()
WHERE id = ANY($1::bigint[]) AND state = 'accepted'
"""
# Delete up to $2 jobs of chain $3 rejected before anything was signed more than $1 seconds
# ago, with their spent salts (the identical request may be posted again and starts afresh).
# A job a marketplace order or a standard x402 payment references is kept: the order reads
# FAILED with the job's error, the payment keeps its history (and orders.job_id and
# x402_payments' job columns have no ON DELETE, so deleting it would fail the whole batch).
PURGE_REJECTED: Final = """
WITH doomed AS (
    SELECT id FROM relay_jobs j
    WHERE chain_id = $3 AND state = 'rejected' AND tx_hash IS NULL
      AND updated_at < now() - make_interval(secs => $1)
      AND NOT EXISTS (SELECT 1 FROM relay_transactions t WHERE t.job_id = j.id)
      AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.job_id = j.id)
      AND NOT EXISTS (SELECT 1 FROM x402_payments p
                      WHERE j.id IN (p.transfer_job_id, p.retire_job_id, p.refund_job_id))
    ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED
), salts AS (
    DELETE FROM spent_salts WHERE job_id IN (SELECT id FROM doomed)
)
DELETE FROM relay_jobs WHERE id IN (SELECT id FROM doomed) RETURNING id
"""
# Jobs per state (for the gauge).
COUNT_BY_STATE: Final = "SELECT state, count(*) AS n FROM relay_jobs GROUP BY state"
# Confirm the jobs mined at or below block $2.
CONFIRM_MINED: Final = """
UPDATE relay_jobs SET state = 'confirmed', confirmed_at = now(), updated_at = now()
WHERE chain_id = $1 AND state = 'mined' AND block_number <= $2
RETURNING id, kind, state, tx_hash, request_id
"""
# The blocks of the jobs still mined (a follower's start or rewind: which blocks it waits on).
MINED_BLOCKS: Final = """
SELECT DISTINCT block_number FROM relay_jobs
WHERE chain_id = $1 AND state = 'mined' AND block_number IS NOT NULL
"""
# Mark the confirmed retirement jobs of these transactions indexed (a transfer is final at
# confirmed: domain.states.can_move).
MARK_INDEXED: Final = """
UPDATE relay_jobs SET state = 'indexed', indexed_at = now(), updated_at = now()
WHERE chain_id = $1 AND state = 'confirmed' AND kind = 'retire' AND tx_hash = ANY($2::bytea[])
RETURNING id, kind, state, tx_hash, request_id, mined_at, indexed_at
"""


# -- values -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SupplyTake:
    """The supply a job's fill takes: ``source`` (0 carbon class, 1 listing, as the
    retirement's), the class or listing id ``source_id``, the credit's ``token_id``, and
    ``units`` credit units (1000 a tonne)."""

    source: int
    source_id: int
    token_id: int
    units: int


@dataclass(frozen=True, slots=True)
class SupplyCheck:
    """How a new job's supply is checked when it is reserved: the supply figure was read at
    ``block_number``; ``rule`` (applied in the reservation's statement) admits what the other
    jobs of that supply may still take from it (credit units, see :data:`RESERVED_SUPPLY`)
    exactly when ``check``, given that figure, does not raise; ``check`` raises the refusal of
    a job that does not fit beside them."""

    block_number: int
    rule: SupplyRule
    check: Callable[[int], None]


@dataclass(frozen=True, slots=True)
class SimulatedPlan:
    """How a job simulated now will be sent: its gas limit, max fee and priority fee per gas
    (wei per gas) and what its signed allowance is worth (wei)."""

    job_id: int
    gas_limit: int
    max_fee_per_gas: int
    max_priority_fee_per_gas: int
    allowance_wei: int


@dataclass(frozen=True, slots=True)
class SupplyAhead:
    """What other jobs take from a batch job's supply before it, as read at a block (credit
    units): ``mined_after`` by jobs mined after that block, ``ahead`` by jobs in flight
    signed already or older (see :data:`SUPPLY_AHEAD`)."""

    mined_after: int
    ahead: int


@dataclass(frozen=True, slots=True)
class NewJob:
    """What ``reserve`` records for an accepted request. Money in atomic units, times in
    unix seconds (``auth_expires_at`` at most 2**63 - 1). ``kind`` is ``retire`` (a
    settlement call) or ``transfer`` (``transferWithAuthorization`` on the token, which
    ``settlement`` then names); ``api_key_id`` names who pays a transfer's gas (None: the
    operator); ``request_id`` is the id of the HTTP request being served when it is made
    (None outside one; see :mod:`relayer.logs`), kept so that every line about the job
    names it."""

    chain_id: int
    bound_nonce: bytes
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
    quote_total: int
    supply: SupplyTake | None = None
    kind: JobKind = "retire"
    api_key_id: int | None = None
    request_id: str | None = field(default_factory=CURRENT_REQUEST_ID.get)


@dataclass(frozen=True, slots=True)
class Job:
    """A relay job row. ``error`` is the ``{code, message, context}`` record of a rejection;
    ``kind`` as :class:`NewJob`'s (a ``transfer`` is final at confirmed); ``gas_reserved_wei``
    what it holds of its API key's daily gas budget while in flight (None: nothing);
    ``request_id`` the id of the HTTP request that made it (None: none did);
    ``auth_expires_at`` the unix second its authorization expires (None: not read)."""

    id: int
    chain_id: int
    state: JobState
    bound_nonce: bytes
    salt: bytes
    scheme: str
    payer: str
    input_token: str
    request_hash: bytes
    settlement: str
    call_data: bytes
    gas_allowance: int
    quote_total: int | None
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
    allowance_wei: int | None = None
    auth_value: int = 0
    supply: SupplyTake | None = None
    kind: JobKind = "retire"
    api_key_id: int | None = None
    gas_reserved_wei: int | None = None
    request_id: str | None = None
    auth_expires_at: int | None = None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> Job:
        def opt_int(v: Any) -> int | None:
            return None if v is None else int(v)

        return cls(
            id=row["id"],
            chain_id=row["chain_id"],
            state=JobState(row["state"]),
            bound_nonce=bytes(row["bound_nonce"]),
            salt=bytes(row["salt"]),
            scheme=row["scheme"],
            payer=row["payer"],
            input_token=row["input_token"],
            request_hash=bytes(row["request_hash"]),
            settlement=row["settlement"],
            call_data=bytes(row["call_data"]),
            gas_allowance=int(row["gas_allowance"]),
            quote_total=opt_int(row["quote_total"]),
            summary=json.loads(row["summary"]),
            error=None if row["error"] is None else json.loads(row["error"]),
            gas_limit=opt_int(row["gas_limit"]),
            max_fee_per_gas=opt_int(row["max_fee_per_gas"]),
            max_priority_fee_per_gas=opt_int(row["max_priority_fee_per_gas"]),
            executor=row["executor"],
            executor_nonce=opt_int(row["executor_nonce"]),
            tx_hash=None if row["tx_hash"] is None else bytes(row["tx_hash"]),
            block_number=opt_int(row["block_number"]),
            timestamps={col: (None if row[col] is None else row[col].timestamp()) for col in STAMPS},
            allowance_wei=opt_int(row["allowance_wei"]),
            auth_value=int(row["auth_value"]),
            supply=_supply_of(row),
            kind=row["kind"],
            api_key_id=opt_int(row["api_key_id"]),
            gas_reserved_wei=opt_int(row.get("gas_reserved_wei")),
            request_id=row.get("request_id"),
            auth_expires_at=opt_int(row.get("auth_expires_at")),
        )


@dataclass(frozen=True, slots=True)
class MovedJob:
    """A job a state move moved, as the move returns it (``RETURNING id, kind, state,
    tx_hash, request_id``, the stamps its stage metric reads and, for a move to mined or
    reverted, ``block_number`` and ``allowance_wei``): what the move's log line and metrics
    read, without decoding the whole row (its call data, summary and gas plan) as
    :class:`Job` does. ``timestamps``: the stamps returned (unix seconds, None while unset);
    ``allowance_wei``: wei; None when not returned or unset."""

    id: int
    kind: str
    state: JobState
    tx_hash: bytes | None
    request_id: str | None
    timestamps: dict[str, float | None]
    block_number: int | None = None
    allowance_wei: int | None = None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> MovedJob:
        tx_hash = row["tx_hash"]
        stamps = {col: row[col] for col in STAMPS if col in row}
        return cls(
            id=row["id"],
            kind=row["kind"],
            state=JobState(row["state"]),
            tx_hash=None if tx_hash is None else bytes(tx_hash),
            request_id=row["request_id"],
            timestamps={col: None if at is None else at.timestamp() for col, at in stamps.items()},
            block_number=row.get("block_number"),
            allowance_wei=None if (allowance := row.get("allowance_wei")) is None else int(allowance),
        )


STAMPS: Final = (
    "accepted_at",
    "simulated_at",
    "signed_at",
    "submitted_at",
    "mined_at",
    "confirmed_at",
    "indexed_at",
)


class PermitInUse(RelayerError):
    """Another live job already holds this EIP-2612 permit nonce."""

    default_code = "params_mismatch"


class SaltReused(RelayerError):
    """The salt was already spent by another authorization (``job`` is that job)."""

    default_code = "params_mismatch"

    def __init__(self, job: Job) -> None:
        super().__init__(message="salt already spent by another authorization")
        self.job = job


# -- repository -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PayerBalance:
    """The payer's balance of the job's token (atomic units) as of ``block_number``."""

    amount: int
    block_number: int


class PayerOverdrawn(RelayerError):
    """The payer's balance, less what its other jobs in flight may still take, does not
    cover this authorization's value (atomic units)."""

    default_code = "contract_revert"

    def __init__(self, balance: int, reserved: int) -> None:
        super().__init__(message="the payer's balance does not cover this authorization")
        self.balance = balance
        self.reserved = reserved


@dataclass(frozen=True, slots=True)
class GasReservation:
    """A share of API key ``api_key_id``'s daily gas budget (``budget_wei`` for UTC ``day``)
    a sponsored transfer takes while in flight: ``ceiling_wei``, the most it can cost the
    executor (design: docs/design/x402-v2.md, C3). ``retry_after_s``: seconds until the next
    UTC day, for the refusal."""

    api_key_id: int
    day: dt.date
    ceiling_wei: int
    budget_wei: int
    retry_after_s: int


class GasBudgetExhausted(RelayerError):
    """The key's daily gas budget cannot take another reservation (429
    ``gas_budget_exhausted``, ``retryAfterSeconds`` the seconds to the next UTC day);
    nothing was recorded."""

    default_code = "gas_budget_exhausted"

    def __init__(self, reservation: GasReservation) -> None:
        super().__init__(
            message="this API key's daily gas budget is spent; retry on the next UTC day",
            retryAfterSeconds=reservation.retry_after_s,
        )


class RelayJobs:
    """Repository of relay jobs and spent salts (one round trip per state change).

    Every method raises ``StoreUnavailable`` when the database fails.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    async def reserve(
        self,
        new: NewJob,
        balance: PayerBalance | None = None,
        supply: SupplyCheck | None = None,
        gas: GasReservation | None = None,
    ) -> tuple[Job, bool]:
        """Record the job and spend its salt, or find the job the identical request made.
        With ``balance``, the payer's reservations of its token are serialised and the job
        is recorded only if that balance, less what the payer's other jobs may still take
        (see :data:`RESERVED_BY_PAYER`), covers its value: concurrent authorizations of one
        payer never promise the executor more than the payer holds. With ``supply`` (and
        ``new.supply``), the reservations of that listing or class credit are serialised too
        (after the payer's) and ``supply.rule`` must admit what the other jobs of that supply
        may still take (see :data:`RESERVED_SUPPLY`; ``supply.check`` makes the refusal):
        concurrent fills never promise more than the supply holds. All of it is one statement
        in one round trip (:data:`RESERVE`). With ``gas``, a job created or re-opened now
        reserves ``gas.ceiling_wei`` of its API key's daily budget in the same transaction
        (see :data:`RESERVE_GAS`; given back when the job ends, migration 0015).

        Returns:
            (job, owned): ``owned`` is True when this caller must drive the job (it was
            created now, or re-opened after a rejection that signed nothing).

        Raises:
            SaltReused: the salt belongs to a different authorization.
            PermitInUse: another live job holds the same permit nonce.
            PayerOverdrawn: the balance does not cover it (nothing was recorded).
            RelayerError: what ``supply.check`` raised (nothing was recorded).
            GasBudgetExhausted: the key's budget cannot take ``gas`` (nothing was recorded).
        """
        args = (*_job_args(new), *_balance_args(balance), *_supply_args(new, supply))
        try:
            if gas is None:  # one statement, its own transaction: one round trip
                row = await self.db.fetchrow(RESERVE, *args)
                assert row is not None
                return Job.from_row(row), bool(row["owned"])
            async with self.db.transaction() as conn:
                row = await conn.fetchrow(RESERVE, *args)
                assert row is not None
                if not row["owned"]:
                    return Job.from_row(row), False
                return Job.from_row(await self._reserve_gas(conn, row, gas)), True
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == "relay_jobs_live_permit":
                raise PermitInUse() from None
            raise
        except asyncpg.RaiseError as exc:
            raise await self._refusal(exc, new, balance, supply) from None

    async def _refusal(
        self, exc: asyncpg.RaiseError, new: NewJob, balance: PayerBalance | None, supply: SupplyCheck | None
    ) -> RelayerError:
        """The refusal :data:`RESERVE` raised (nothing was recorded), as the caller's error."""
        reason, detail = exc.message, exc.detail or "0"
        if reason == "payer_overdrawn" and balance is not None:
            return PayerOverdrawn(balance.amount, int(detail))
        if reason == "salt_reused":
            other = await self.db.fetchrow(JOB_BY_SALT, new.chain_id, new.salt)
            if other is not None:
                return SaltReused(Job.from_row(other))
        if reason == "supply_short" and supply is not None:
            try:
                supply.check(int(detail))
            except RelayerError as refusal:
                return refusal
            raise AssertionError(f"the supply rule refused what its check admits: {supply.rule}") from exc
        raise exc

    @staticmethod
    async def _reserve_gas(conn: Any, row: asyncpg.Record, gas: GasReservation | None) -> asyncpg.Record:
        """The job's row holding ``gas`` (the row as it is without one).

        Raises:
            GasBudgetExhausted: the key's budget cannot take it.
        """
        if gas is None:
            return row
        taken = await conn.fetchval(
            RESERVE_GAS, gas.api_key_id, gas.day, gas.ceiling_wei, gas.budget_wei, row["chain_id"]
        )
        if taken is None:
            raise GasBudgetExhausted(gas)
        reserved: asyncpg.Record = await conn.fetchrow(SET_GAS_RESERVED, row["id"], gas.ceiling_wei, gas.day)
        return reserved

    async def in_flight(self, chain_id: int, payer: str, token: str, except_bound_nonce: bytes) -> int:
        """What ``payer``'s jobs not yet mined may still take of its ``token`` balance (atomic
        units; see :data:`IN_FLIGHT_BY_PAYER`), the job of ``except_bound_nonce`` left out.
        Read it before the balance: a job mined in between is then counted twice (a stricter
        answer), never missed."""
        return int(await self.db.fetchval(IN_FLIGHT_BY_PAYER, chain_id, payer, token, except_bound_nonce))

    async def supply_ahead(self, job_ids: Sequence[int], block_number: int) -> dict[int, SupplyAhead]:
        """For each of ``job_ids`` that takes supply, what other jobs take from its supply
        before it, as read at ``block_number`` (see :data:`SUPPLY_AHEAD`). One round trip."""
        if not job_ids:
            return {}
        rows = await self.db.fetch(SUPPLY_AHEAD, list(job_ids), block_number)
        return {int(r["id"]): SupplyAhead(int(r["mined_after"]), int(r["ahead"])) for r in rows}

    async def find_by_salt(self, chain_id: int, salt: bytes) -> Job | None:
        """The job that spent ``salt``, if any."""
        row = await self.db.fetchrow(JOB_BY_SALT, chain_id, salt)
        return None if row is None else Job.from_row(row)

    async def get(self, job_id: int) -> Job | None:
        row = await self.db.fetchrow(JOB_BY_ID, job_id)
        return None if row is None else Job.from_row(row)

    async def move(
        self,
        job_id: int,
        target: JobState,
        *,
        error: RelayerError | None = None,
        gas_limit: int | None = None,
        max_fee_per_gas: int | None = None,
        max_priority_fee_per_gas: int | None = None,
        block_number: int | None = None,
        block_hash: bytes | None = None,
        tx_hash: bytes | None = None,
        allowance_wei: int | None = None,
    ) -> Job | None:
        """Move a job to ``target`` if the transition table allows it from its current
        state, setting the given columns (wei per gas for fees). A column given as None
        keeps its value: clearing one (as a reorg will the block) needs its own statement.

        Returns:
            The updated job, or None when the job was not in an allowed source state.
        """
        row = await self.db.fetchrow(
            MOVE_JOB,
            job_id,
            target.value,
            [s.value for s in sources_of(target)],
            None if error is None else json.dumps(error.record()),
            gas_limit,
            max_fee_per_gas,
            max_priority_fee_per_gas,
            block_number,
            block_hash,
            tx_hash,
            allowance_wei,
        )
        return None if row is None else Job.from_row(row)

    async def move_simulated(self, plans: Sequence[SimulatedPlan]) -> list[bool]:
        """Move the accepted jobs of ``plans`` to simulated with their plans, in one statement
        (:data:`MOVE_SIMULATED`); whether each moved (False: it was no longer accepted).

        Raises:
            StoreUnavailable: the database failed (none moved).
        """
        rows = await self.db.fetch(
            MOVE_SIMULATED,
            [p.job_id for p in plans],
            [p.gas_limit for p in plans],
            [p.max_fee_per_gas for p in plans],
            [p.max_priority_fee_per_gas for p in plans],
            [p.allowance_wei for p in plans],
        )
        moved = {int(r["id"]) for r in rows}
        return [p.job_id in moved for p in plans]

    async def claim_orphan(self, job_id: int, older_than_s: float) -> Job | None:
        """Take over the job if it has sat in ``accepted`` for ``older_than_s`` seconds (its
        owner died between reserving and simulating); None when it has not, or another
        caller took it first."""
        row = await self.db.fetchrow(CLAIM_ORPHAN, job_id, older_than_s)
        return None if row is None else Job.from_row(row)

    async def claim_orphans(self, chain_id: int, older_than_s: float, limit: int) -> list[Job]:
        """Take over up to ``limit`` jobs of ``chain_id`` that have sat in ``accepted`` for
        ``older_than_s`` seconds (oldest first)."""
        rows = await self.db.fetch(CLAIM_ORPHANS, older_than_s, limit, chain_id)
        return [Job.from_row(r) for r in rows]

    async def hand_back_orphans(self, job_ids: Sequence[int], orphan_after_s: float) -> None:
        """Give back orphans this process took over but did not simulate (it is stopping):
        they are orphans again at once (see :data:`HAND_BACK_ORPHANS`)."""
        if job_ids:
            await self.db.execute(HAND_BACK_ORPHANS, list(job_ids), orphan_after_s)

    async def purge_rejected(self, chain_id: int, older_than_s: float, limit: int) -> int:
        """Delete up to ``limit`` jobs of ``chain_id`` rejected before signing more than
        ``older_than_s`` seconds ago, with their salts, except those a marketplace order or a
        standard x402 payment references (they show the job's error); returns how many (see
        :data:`PURGE_REJECTED`)."""
        return len(await self.db.fetch(PURGE_REJECTED, older_than_s, limit, chain_id))

    async def committed(
        self, chain_id: int, payers: Sequence[tuple[str, str]], block_number: int
    ) -> dict[tuple[str, str], int]:
        """What the signed jobs of each (payer, token) will still take from its balance as
        read at ``block_number`` (atomic units; absent: nothing; see
        :data:`COMMITTED_BY_PAYERS`). One round trip for all of them."""
        wanted = sorted(set(payers))
        rows = await self.db.fetch(
            COMMITTED_BY_PAYERS, chain_id, [p for p, _ in wanted], block_number, [t for _, t in wanted]
        )
        committed: dict[tuple[str, str], int] = {}
        for r in rows:  # a row a part
            key = (r["payer"], r["input_token"])
            committed[key] = committed.get(key, 0) + int(r["committed"])
        return committed

    async def replan(
        self,
        job_id: int,
        gas_limit: int,
        max_fee_per_gas: int,
        max_priority_fee_per_gas: int,
        allowance_wei: int,
    ) -> bool:
        """Give a simulated job the gas and fees (wei per gas) of a fresh simulation; False
        when it is no longer simulated."""
        status = await self.db.execute(
            REPLAN, job_id, gas_limit, max_fee_per_gas, max_priority_fee_per_gas, allowance_wei
        )
        return status.endswith(" 1")

    async def count_by_state(self) -> dict[str, int]:
        rows = await self.db.fetch(COUNT_BY_STATE)
        return {r["state"]: int(r["n"]) for r in rows}

    async def confirm_mined(self, chain_id: int, block_number: int) -> list[MovedJob]:
        """Move jobs mined at or below ``block_number`` to confirmed; the jobs moved."""
        return [MovedJob.from_row(r) for r in await self.db.fetch(CONFIRM_MINED, chain_id, block_number)]

    async def mined_blocks(self, chain_id: int) -> list[int]:
        """The block numbers of the jobs still ``mined`` on ``chain_id`` (any process's)."""
        return [int(r["block_number"]) for r in await self.db.fetch(MINED_BLOCKS, chain_id)]


def _job_args(new: NewJob) -> tuple[Any, ...]:
    return (
        new.chain_id,
        new.bound_nonce,
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
        new.quote_total,
        *(
            (None, None, None, None)
            if new.supply is None
            else (new.supply.source, new.supply.source_id, new.supply.token_id, new.supply.units)
        ),
        new.kind,
        new.api_key_id,
        new.request_id,
    )


def _balance_args(balance: PayerBalance | None) -> tuple[Any, ...]:
    """RESERVE's payer check: the balance and its block (NULLs: unchecked)."""
    return (None, None) if balance is None else (balance.amount, balance.block_number)


def _supply_args(new: NewJob, supply: SupplyCheck | None) -> tuple[Any, ...]:
    """RESERVE's supply check: the rule's block, left, minimum fill and possibility (NULLs:
    unchecked, as for a job that takes no supply)."""
    if supply is None or new.supply is None:
        return (None, None, None, None)
    rule = supply.rule
    return (supply.block_number, rule.left, rule.min_fill, rule.possible)


def _supply_of(row: asyncpg.Record) -> SupplyTake | None:
    """The supply a job row takes (None for a row recorded before migration 0012)."""
    units = row.get("supply_units")
    if units is None:
        return None
    source, source_id, token_id = row["supply_source"], row["supply_id"], row["supply_token_id"]
    return SupplyTake(int(source), int(source_id), int(token_id), int(units))
