"""x402 ``payment-identifier`` keys (migration 0016, table ``x402_payment_ids``): a client's
idempotency key bound, per scope, to the SHA-256 of the first payload seen with it (spec:
x402-foundation/x402 specs/extensions/payment_identifier.md, Idempotency Behavior; design:
docs/design/x402-v2.md C2 settle step 2).

Scopes: ``facilitator:<api key id>`` for ``/facilitator/settle``; ``resource`` for the
retirement resource (a later part). The primary key ``(scope, id)`` makes the first claim
win: a concurrent claim of the same id with another payload finds the winner's hash.
Every method raises ``StoreUnavailable`` when the database fails."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Final

import asyncpg

from relayer.domain.x402_wire import ID_PATTERN
from relayer.store.pool import Database

# The row of id $2 in scope $1.
FIND: Final = (
    "SELECT scope, id, payload_hash, job_id, payment_id FROM x402_payment_ids WHERE scope = $1 AND id = $2"
)
# Claim id $2 in scope $1 for payload hash $3; nothing when the id is already claimed.
CLAIM: Final = """
INSERT INTO x402_payment_ids (scope, id, payload_hash) VALUES ($1, $2, $3)
ON CONFLICT (scope, id) DO NOTHING
RETURNING scope, id, payload_hash, job_id, payment_id
"""
# Link id $2 of scope $1 to job $3 (the job of the payload it is bound to: one per payload).
LINK_JOB: Final = (
    "UPDATE x402_payment_ids SET job_id = $3 WHERE scope = $1 AND id = $2 AND job_id IS DISTINCT FROM $3"
)


@dataclass(frozen=True, slots=True)
class PaymentId:
    """One stored identifier: ``payload_hash`` is 32 bytes; ``job_id`` the transfer job the
    payload made (None until made, or once a rejected job was purged); ``payment_id`` a
    retirement payment (a later part)."""

    scope: str
    id: str
    payload_hash: bytes
    job_id: int | None
    payment_id: uuid.UUID | None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> PaymentId:
        job_id = row["job_id"]
        return cls(
            str(row["scope"]),
            str(row["id"]),
            bytes(row["payload_hash"]),
            None if job_id is None else int(job_id),
            row["payment_id"],
        )


class PaymentIds:
    """Repository of payment identifiers (one round trip per call)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def find(self, scope: str, payment_id: str) -> PaymentId | None:
        """The identifier ``payment_id`` of ``scope``, if claimed."""
        row = await self.db.fetchrow(FIND, scope, payment_id)
        return None if row is None else PaymentId.from_row(row)

    async def claim(self, scope: str, payment_id: str, payload_hash: bytes) -> PaymentId:
        """Bind ``payment_id`` to ``payload_hash`` in ``scope`` unless it is already bound:
        the row as it now stands (this claim's, or the first claim's: compare its
        ``payload_hash``). Two claims racing: the primary key lets one insert; the other reads
        the winner's row.

        Raises:
            ValueError: ``payment_id`` is not a valid id (see :data:`ID_PATTERN`).
        """
        if ID_PATTERN.fullmatch(payment_id) is None:
            raise ValueError("not a payment identifier")
        row = await self.db.fetchrow(CLAIM, scope, payment_id, payload_hash)
        if row is None:  # claimed before: nothing deletes an identifier, so its row is there
            row = await self.db.fetchrow(FIND, scope, payment_id)
        if row is None:
            raise LookupError(f"payment identifier {payment_id!r} neither inserted nor found")
        return PaymentId.from_row(row)

    async def link_job(self, scope: str, payment_id: str, job_id: int) -> None:
        """Record that the payload bound to ``payment_id`` made job ``job_id``."""
        await self.db.execute(LINK_JOB, scope, payment_id, job_id)
