"""The executor lane: nonces allocated per executor key in Postgres, and every signed
transaction, whose raw bytes and hash are committed before anything is broadcast.

Policy: claims take simulated jobs with ``FOR UPDATE SKIP LOCKED``; a nonce is allocated,
the transaction signed and recorded and the job moved to ``signed`` in one database
transaction; an authorization about to expire is rejected instead of signed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import asyncpg

from relayer.domain.errors import RelayerError
from relayer.store.pool import Database
from relayer.store.relay_jobs import Job

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
# Reject simulated jobs whose authorization expires within $2 seconds (never signed).
REJECT_EXPIRING: Final = """
UPDATE relay_jobs SET state = 'rejected', error = $3::jsonb, updated_at = now()
WHERE chain_id = $1 AND state = 'simulated' AND auth_expires_at <= extract(epoch FROM now())::bigint + $2
"""
# Claim up to $2 simulated jobs, oldest first, skipping those another worker holds.
CLAIM_SIMULATED: Final = """
SELECT * FROM relay_jobs WHERE chain_id = $1 AND state = 'simulated'
ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED
"""
# Allocate the lane's next nonce; returns it (NULL when the lane was never reconciled).
NEXT_NONCE: Final = """
UPDATE executor_nonces SET next_nonce = next_nonce + 1, updated_at = now()
WHERE chain_id = $1 AND executor = $2
RETURNING next_nonce - 1
"""
# Record a signed transaction (raw bytes and hash) before it is broadcast.
INSERT_TRANSACTION: Final = """
INSERT INTO relay_transactions (tx_hash, job_id, chain_id, executor, nonce, raw_tx,
                                gas_limit, max_fee_per_gas, max_priority_fee_per_gas)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
"""
# Move a claimed job simulated -> signed with its transaction.
MARK_SIGNED: Final = """
UPDATE relay_jobs SET state = 'signed', signed_at = now(), updated_at = now(),
       tx_hash = $2, executor = $3, executor_nonce = $4
WHERE id = $1 AND state = 'simulated'
"""
# Record the broadcast of these transactions.
MARK_BROADCAST: Final = "UPDATE relay_transactions SET broadcast_at = now() WHERE tx_hash = ANY($1::bytea[])"
# Move the jobs of these transactions signed -> submitted.
MARK_SUBMITTED: Final = """
UPDATE relay_jobs SET state = 'submitted', submitted_at = now(), updated_at = now()
WHERE id = ANY($1::bigint[]) AND state = 'signed'
RETURNING *
"""
# The latest transaction of every signed or submitted job of an executor, in nonce order.
UNSETTLED: Final = """
SELECT t.* FROM relay_jobs j JOIN relay_transactions t ON t.tx_hash = j.tx_hash
WHERE j.chain_id = $1 AND j.executor = $2 AND j.state IN ('signed', 'submitted')
ORDER BY t.nonce
"""
# Transactions to send again: signed and unsent for $3 s, or submitted and unmined $4 s after the last send.
STALE: Final = """
SELECT t.* FROM relay_jobs j JOIN relay_transactions t ON t.tx_hash = j.tx_hash
WHERE j.chain_id = $1 AND j.executor = $2 AND (
    (j.state = 'signed' AND j.signed_at < now() - make_interval(secs => $3)) OR
    (j.state = 'submitted' AND t.broadcast_at < now() - make_interval(secs => $4)))
ORDER BY t.nonce LIMIT 100
"""


@dataclass(frozen=True, slots=True)
class SignedTx:
    """A signed executor transaction as committed before broadcast (fees in wei per gas)."""

    job_id: int
    tx_hash: bytes
    raw: bytes
    nonce: int
    gas_limit: int
    max_fee_per_gas: int
    max_priority_fee_per_gas: int

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> SignedTx:
        return cls(
            job_id=row["job_id"],
            tx_hash=bytes(row["tx_hash"]),
            raw=bytes(row["raw_tx"]),
            nonce=int(row["nonce"]),
            gas_limit=int(row["gas_limit"]),
            max_fee_per_gas=int(row["max_fee_per_gas"]),
            max_priority_fee_per_gas=int(row["max_priority_fee_per_gas"]),
        )


class LaneNotReconciled(RelayerError):
    """A nonce was asked of a lane that was never reconciled with the chain (a bug)."""


class LeaseLost(RelayerError):
    """Another process took this executor key's lease (its epoch moved on): stop signing."""


class ExecutorLane:
    """Repository of executor nonces and signed transactions for one chain.

    Every method raises ``StoreUnavailable`` when the database fails.
    """

    def __init__(self, db: Database, chain_id: int) -> None:
        self.db = db
        self.chain_id = chain_id

    async def reconcile_nonce(self, executor: str, chain_pending: int) -> int:
        """Set the lane's next nonce to max(stored, chain pending count); returns it."""
        return int(await self.db.fetchval(RECONCILE_NONCE, self.chain_id, executor, chain_pending))

    async def holds(self, executor: str, epoch: int) -> bool:
        """Whether the lease of ``executor`` is still at ``epoch`` (this process's)."""
        return bool(await self.db.fetchval(CURRENT_EPOCH, self.chain_id, executor) == epoch)

    async def sign_simulated(
        self,
        executor: str,
        epoch: int,
        limit: int,
        sign: Callable[[Job, int], SignedTx],
        expiry_margin_s: int,
        expired: RelayerError,
    ) -> list[SignedTx]:
        """Claim simulated jobs, allocate executor nonces, sign, and commit the raw
        transactions with the jobs moved to ``signed``, all in one database transaction,
        before anything is broadcast, and only while the lease is still at ``epoch``. Jobs
        whose authorization expires within ``expiry_margin_s`` seconds are rejected
        instead, with ``expired`` as their error.

        Raises:
            LeaseLost: another process took the lease; nothing was signed.
            LaneNotReconciled: the lane has no nonce row yet.
        """
        signed: list[SignedTx] = []
        async with self.db.transaction() as conn:
            if await conn.fetchval(LEASE_EPOCH, self.chain_id, executor) != epoch:
                raise LeaseLost(message=f"the lease of {executor} moved past epoch {epoch}")
            await conn.execute(REJECT_EXPIRING, self.chain_id, expiry_margin_s, json.dumps(expired.record()))
            for row in await conn.fetch(CLAIM_SIMULATED, self.chain_id, limit):
                job = Job.from_row(row)
                nonce = await conn.fetchval(NEXT_NONCE, self.chain_id, executor)
                if nonce is None:
                    raise LaneNotReconciled(message=f"executor nonce lane missing for {executor}")
                tx = sign(job, int(nonce))
                await conn.execute(
                    INSERT_TRANSACTION,
                    tx.tx_hash,
                    job.id,
                    self.chain_id,
                    executor,
                    tx.nonce,
                    tx.raw,
                    tx.gas_limit,
                    tx.max_fee_per_gas,
                    tx.max_priority_fee_per_gas,
                )
                await conn.execute(MARK_SIGNED, job.id, tx.tx_hash, executor, tx.nonce)
                signed.append(tx)
        return signed

    async def mark_broadcast(self, txs: Sequence[SignedTx]) -> list[Job]:
        """Record the broadcast and move the jobs signed -> submitted."""
        if not txs:
            return []
        async with self.db.transaction() as conn:
            await conn.execute(MARK_BROADCAST, [t.tx_hash for t in txs])
            rows = await conn.fetch(MARK_SUBMITTED, [t.job_id for t in txs])
        return [Job.from_row(r) for r in rows]

    async def unsettled_transactions(self, executor: str) -> list[SignedTx]:
        """Latest signed transaction of each job in signed/submitted state (for re-sending
        the same bytes after a restart), in nonce order."""
        return [SignedTx.from_row(r) for r in await self.db.fetch(UNSETTLED, self.chain_id, executor)]

    async def stale_transactions(
        self, executor: str, unsent_after_s: float, unmined_after_s: float
    ) -> list[SignedTx]:
        """Transactions to send again with the same bytes: signed but not recorded as
        broadcast for ``unsent_after_s`` (a failed send), or submitted and unmined for
        ``unmined_after_s`` seconds since the last send (at most 100, in nonce order)."""
        rows = await self.db.fetch(STALE, self.chain_id, executor, unsent_after_s, unmined_after_s)
        return [SignedTx.from_row(r) for r in rows]
