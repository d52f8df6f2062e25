"""Payments of the standard x402 retirement resource (design: docs/design/x402-v2.md C4-C6,
table ``x402_payments``): one row per payer authorization, single use per quote reference,
and where the payment stands (its transfer, retirement and refund relay jobs). Amounts in USDC
atomic units; times in unix seconds. Every method raises ``StoreUnavailable`` when the
database fails."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import asyncpg

from relayer.domain.errors import RelayerError
from relayer.domain.payment_states import OPEN_PAYMENT_STATES, PaymentState, guard_payment_move
from relayer.domain.schemas import ActionRequest
from relayer.domain.x402_wire import PaymentPayload
from relayer.store.pool import Database

_OPEN: Final = ", ".join(f"'{s.value}'" for s in OPEN_PAYMENT_STATES)  # constants of the table

_COLUMNS: Final = (
    "id, chain_id, quote_id, request_hash, request::text AS request, payload::text AS payload, payload_hash, "
    "payer, auth_nonce, amount, transfer_job_id, payment_tx, retire_job_id, refund_job_id, "
    "refund_valid_before, "
    "state, error::text AS error, created_at, updated_at, from_block, received, due_at"
)
INSERT: Final = """
INSERT INTO x402_payments (id, chain_id, quote_id, request_hash, request, payload, payload_hash, payer,
                           auth_nonce, amount, from_block, state, created_at, updated_at, due_at)
VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb, $7, $8, $9, $10, $11, 'accepted', $12, $12, $13)
"""
BY_ID: Final = f"SELECT {_COLUMNS} FROM x402_payments WHERE id = $1"
BY_AUTHORIZATION: Final = (
    f"SELECT {_COLUMNS} FROM x402_payments WHERE chain_id = $1 AND payer = $2 AND auth_nonce = $3"
)
BY_QUOTE: Final = f"SELECT {_COLUMNS} FROM x402_payments WHERE quote_id = $1"
# Payments not final that are due at $1 (unix seconds), the earliest due first.
DUE: Final = f"""
SELECT {_COLUMNS} FROM x402_payments
WHERE state IN ({_OPEN}) AND due_at <= $1 AND chain_id = $3 ORDER BY due_at LIMIT $2
"""
# Put payment $1 off until $2 (unix seconds), while it is not final.
DEFER: Final = f"""
UPDATE x402_payments SET due_at = $2
WHERE id = $1 AND state IN ({_OPEN})
"""
# Forget payment $1 that was refused before any money moved: the refusal records nothing, and its
# quote may be used again. Only while its authorization's transfer job (salt $3 on chain $2), if
# any, is rejected: nothing of it was ever signed.
FORGET: Final = """
DELETE FROM x402_payments p
WHERE p.id = $1 AND p.state = 'accepted' AND p.payment_tx IS NULL
  AND NOT EXISTS (SELECT 1 FROM relay_jobs j WHERE j.chain_id = $2 AND j.salt = $3 AND j.state <> 'rejected')
"""
# Move payment $1 from one of states $2 to $3, setting the given columns (NULL keeps a column).
MOVE: Final = f"""
UPDATE x402_payments SET state = $3,
    transfer_job_id = COALESCE($4, transfer_job_id), payment_tx = COALESCE($5, payment_tx),
    retire_job_id = COALESCE($6, retire_job_id), refund_job_id = COALESCE($7, refund_job_id),
    refund_valid_before = COALESCE($8, refund_valid_before), error = COALESCE($9::jsonb, error),
    updated_at = $10, received = COALESCE($11, received)
WHERE id = $1 AND state = ANY($2::text[])
RETURNING {_COLUMNS}
"""
# Payments by state (relayer status) and refunds (relayer ledger).
BY_STATE: Final = "SELECT state, count(*) AS n FROM x402_payments WHERE chain_id = $1 GROUP BY state"
REFUNDS: Final = """
SELECT count(*) AS refunds, COALESCE(sum(p.amount) FILTER (WHERE p.state = 'refunded'), 0) AS refunded_usdc,
       COALESCE(sum(t.paid_wei), 0) AS paid_wei
FROM x402_payments p
LEFT JOIN LATERAL (SELECT sum(r.paid_wei) AS paid_wei FROM relay_transactions r
                   WHERE r.job_id = p.refund_job_id AND r.mined_block IS NOT NULL) t ON true
WHERE p.chain_id = $1 AND p.refund_job_id IS NOT NULL
"""
# The per-payment ledger of chain $1 (relayer ledger): the payments $2 (ids, oldest first), each
# with what the treasury received for it (the proven transfer's value) and what it paid out on
# its behalf: the retirement index's RetirementSettled value less its refund, for the job that
# spent the payment's retirement salt ($3; one salt, at most one job that ever signs), and the
# value of the refund transfer job (bound nonce $4) once mined (the funds left the treasury).
PAYMENT_IDS: Final = "SELECT id FROM x402_payments WHERE chain_id = $1 ORDER BY created_at, id LIMIT $2"
PAYMENT_LEDGER: Final = """
SELECT p.id, p.state, p.amount, p.received, p.payment_tx,
       COALESCE((SELECT sum(r.value - r.refunded) FROM spent_salts s JOIN relay_jobs j ON j.id = s.job_id
                 JOIN retirements r ON r.chain_id = j.chain_id AND r.bound_nonce = j.bound_nonce
                 WHERE s.chain_id = $1 AND s.salt = k.salt), 0) AS retired_out,
       COALESCE((SELECT j.auth_value FROM relay_jobs j
                 WHERE j.chain_id = $1 AND j.bound_nonce = k.refund
                   AND j.state IN ('mined', 'confirmed', 'indexed')), 0) AS refunded_out
FROM unnest($2::uuid[], $3::bytea[], $4::bytea[]) AS k(id, salt, refund)
JOIN x402_payments p ON p.id = k.id
ORDER BY p.created_at, p.id
"""
LOCK_KEY: Final = 0x7834_3032  # "x402": the advisory lock class of payments


class QuoteSpent(RelayerError):
    """The quote reference was already used by another payment."""

    default_code = "quote_consumed"


@dataclass(frozen=True, slots=True)
class NewPayment:
    """A payment to record: its quote reference's id, the request (the ``actions/retire`` body
    as parsed) and its hash, the PaymentPayload and its hash, the payer, the
    authorization's 32-byte nonce, the amount (USDC atomic units) and the block its proof is
    searched from (None: a payment of an older release)."""

    id: uuid.UUID
    chain_id: int
    quote_id: str
    request_hash: bytes
    request: ActionRequest
    payload: PaymentPayload
    payload_hash: bytes
    payer: str
    auth_nonce: bytes
    amount: int
    from_block: int | None


@dataclass(frozen=True, slots=True)
class PaymentRow(NewPayment):
    """A recorded payment (what :class:`NewPayment` holds) and its jobs (ids; None until made);
    ``payment_tx`` and ``received`` (USDC atomic units) are the transaction the chain proves
    moved the funds and the value it moved (None until paid); ``due_at`` when the keeper looks
    at it next (unix seconds)."""

    transfer_job_id: int | None
    payment_tx: bytes | None
    retire_job_id: int | None
    refund_job_id: int | None
    refund_valid_before: int | None
    state: PaymentState
    error: dict[str, Any] | None
    created_at: int
    updated_at: int
    received: int | None
    due_at: int


@dataclass(frozen=True, slots=True)
class PaymentLedgerRow:
    """One payment in the ledger: what the treasury received for it (``received``: the proven
    transfer's value, 0 when none) and paid out on its behalf (``retired_out``: the settled
    retirement's value less its refund; ``refunded_out``: the mined refund), USDC atomic units;
    ``payment_tx`` the proven transfer (None when none)."""

    id: uuid.UUID
    state: PaymentState
    amount: int
    received: int
    payment_tx: bytes | None
    retired_out: int
    refunded_out: int

    @property
    def paid_out(self) -> int:
        """USDC the treasury sent out for this payment (atomic units)."""
        return self.retired_out + self.refunded_out

    @property
    def agrees(self) -> bool:
        """The treasury paid out at most what it received for this payment, and a refund, if
        any, is all of it and the only thing paid out."""
        if self.paid_out > self.received:
            return False
        return self.refunded_out == 0 or (self.refunded_out == self.received and self.retired_out == 0)


def _row(r: asyncpg.Record) -> PaymentRow:
    def opt(v: Any) -> int | None:
        return None if v is None else int(v)

    return PaymentRow(
        r["id"],
        int(r["chain_id"]),
        r["quote_id"],
        bytes(r["request_hash"]),
        ActionRequest.model_validate(json.loads(r["request"])),
        PaymentPayload.model_validate(json.loads(r["payload"])),
        bytes(r["payload_hash"]),
        r["payer"],
        bytes(r["auth_nonce"]),
        int(r["amount"]),
        opt(r["from_block"]),
        opt(r["transfer_job_id"]),
        None if r["payment_tx"] is None else bytes(r["payment_tx"]),
        opt(r["retire_job_id"]),
        opt(r["refund_job_id"]),
        opt(r["refund_valid_before"]),
        PaymentState(r["state"]),
        None if r["error"] is None else json.loads(r["error"]),
        int(r["created_at"]),
        int(r["updated_at"]),
        opt(r["received"]),
        int(r["due_at"]),
    )


class X402Payments:
    """The ``x402_payments`` table."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def record(self, new: NewPayment, now: int, due_at: int) -> PaymentRow:
        """Record ``new`` in state ``accepted``, due for the keeper at ``due_at``; the payment
        of the same authorization when one is recorded (a concurrent identical request).

        Raises:
            QuoteSpent: another payment used the quote reference.
        """
        try:
            await self.db.execute(
                INSERT,
                new.id,
                new.chain_id,
                new.quote_id,
                new.request_hash,
                json.dumps(new.request.model_dump(mode="json", by_alias=True, exclude_none=True)),
                json.dumps(new.payload.canonical()),
                new.payload_hash,
                new.payer,
                new.auth_nonce,
                new.amount,
                new.from_block,
                now,
                due_at,
            )
        except asyncpg.UniqueViolationError as exc:
            same = await self.by_authorization(new.chain_id, new.payer, new.auth_nonce)
            if same is not None:
                return same
            if "quote_id" in str(exc.constraint_name or ""):
                raise QuoteSpent() from None
            raise
        found = await self.get(new.id)
        assert found is not None
        return found

    async def get(self, payment_id: uuid.UUID) -> PaymentRow | None:
        row = await self.db.fetchrow(BY_ID, payment_id)
        return None if row is None else _row(row)

    async def by_authorization(self, chain_id: int, payer: str, nonce: bytes) -> PaymentRow | None:
        """The payment of the payer's authorization ``nonce``, if recorded."""
        row = await self.db.fetchrow(BY_AUTHORIZATION, chain_id, payer, nonce)
        return None if row is None else _row(row)

    async def by_quote(self, quote_id: str) -> PaymentRow | None:
        """The payment that used the quote reference ``quote_id``, if any."""
        row = await self.db.fetchrow(BY_QUOTE, quote_id)
        return None if row is None else _row(row)

    async def due(self, chain_id: int, now: int, limit: int) -> list[PaymentRow]:
        """At most ``limit`` payments on ``chain_id`` not final that are due at ``now``, the
        earliest due first (each chain's keeper drives its own)."""
        return [_row(r) for r in await self.db.fetch(DUE, now, limit, chain_id)]

    async def defer(self, payment_id: uuid.UUID, due_at: int) -> None:
        """Put the payment off until ``due_at`` (unix seconds), unless it is final."""
        await self.db.execute(DEFER, payment_id, due_at)

    async def forget(self, payment_id: uuid.UUID, chain_id: int, transfer_salt: bytes) -> bool:
        """Delete a payment refused before any money moved (``accepted``, no proven transfer,
        its transfer job, salt ``transfer_salt``, absent or rejected); whether it was deleted."""
        return str(await self.db.execute(FORGET, payment_id, chain_id, transfer_salt)) == "DELETE 1"

    async def move(
        self,
        payment_id: uuid.UUID,
        sources: Sequence[PaymentState],
        target: PaymentState,
        now: int,
        *,
        transfer_job_id: int | None = None,
        payment_tx: bytes | None = None,
        retire_job_id: int | None = None,
        refund_job_id: int | None = None,
        refund_valid_before: int | None = None,
        error: dict[str, Any] | None = None,
        received: int | None = None,
    ) -> PaymentRow | None:
        """Move the payment from one of ``sources`` to ``target`` setting the given columns
        (None keeps one); None when it was in none of ``sources``. The table refuses a paid
        state without the proven ``payment_tx`` and ``received`` (migration 0025).

        Raises:
            PaymentMoveRefused: a source the payment state table
                (:mod:`relayer.domain.payment_states`) does not allow into ``target``.
        """
        guard = guard_payment_move(sources, target)
        row = await self.db.fetchrow(
            MOVE,
            payment_id,
            guard,
            target.value,
            transfer_job_id,
            payment_tx,
            retire_job_id,
            refund_job_id,
            refund_valid_before,
            None if error is None else json.dumps(error),
            now,
            received,
        )
        return None if row is None else _row(row)

    @contextlib.asynccontextmanager
    async def locked(self, payment_id: uuid.UUID) -> AsyncIterator[bool]:
        """Hold the payment's advisory lock (session-level, on a connection of its own) for
        the block; yields whether it was taken (False: another request or keeper holds it).
        A process that dies releases it with its connection."""
        key = int.from_bytes(payment_id.bytes[:4], "big", signed=True)
        async with self.db.connection() as conn:
            taken = bool(await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", LOCK_KEY, key))
            try:
                yield taken
            finally:
                if taken:
                    await conn.fetchval("SELECT pg_advisory_unlock($1, $2)", LOCK_KEY, key)

    async def expires_at(self, job_id: int) -> int:
        """The signed authorization's expiry (``validBefore``, unix seconds) of relay job ``job_id``."""
        return int(await self.db.fetchval("SELECT auth_expires_at FROM relay_jobs WHERE id = $1", job_id))

    async def count_by_state(self, chain_id: int) -> dict[str, int]:
        """Payments by state (``relayer status``)."""
        return {r["state"]: int(r["n"]) for r in await self.db.fetch(BY_STATE, chain_id)}

    async def payment_ids(self, chain_id: int, limit: int) -> list[uuid.UUID]:
        """The ids of chain ``chain_id``'s payments, oldest first, at most ``limit``."""
        return [r["id"] for r in await self.db.fetch(PAYMENT_IDS, chain_id, limit)]

    async def ledger(
        self, chain_id: int, keys: Sequence[tuple[uuid.UUID, bytes, bytes]]
    ) -> list[PaymentLedgerRow]:
        """The ledger rows of the payments ``keys`` names: (id, its retirement salt, its refund
        transfer's bound nonce), oldest first (see :data:`PAYMENT_LEDGER`)."""
        rows = await self.db.fetch(
            PAYMENT_LEDGER, chain_id, [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]
        )
        return [
            PaymentLedgerRow(
                r["id"],
                r["state"],
                int(r["amount"]),
                int(r["received"] or 0),
                None if r["payment_tx"] is None else bytes(r["payment_tx"]),
                int(r["retired_out"]),
                int(r["refunded_out"]),
            )
            for r in rows
        ]

    async def refunds(self, chain_id: int) -> dict[str, str]:
        """Refunds made (``relayer ledger``): count, USDC refunded (atomic, decimal string) and
        the wei their transactions paid."""
        row = await self.db.fetchrow(REFUNDS, chain_id)
        assert row is not None
        return {
            "refunds": str(int(row["refunds"])),
            "refundedUsdc": str(int(row["refunded_usdc"])),
            "paidWei": str(int(row["paid_wei"])),
        }
