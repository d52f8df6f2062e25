"""The x402 payment's derived keys and quote references (design: docs/design/x402-v2.md,
C4-C6): the salt and request key of a payment's treasury retirement, its refund's EIP-3009
nonce (each derived from the payment id, so a payment has at most one live retirement and one
refund), the stateless quote reference of a 402, and the treasury's ledger of payments."""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid
from typing import Final

from relayer.domain.verify import transfer_bound_nonce
from relayer.domain.x402_wire import Requirements
from relayer.service.treasury import derived_key
from relayer.store.x402_payments import PaymentLedgerRow, X402Payments

QUOTE_VERSION: Final = "q1"


def payment_salt(payment_id: uuid.UUID) -> bytes:
    """The salt of payment ``payment_id``'s retirement (one salt: one live job)."""
    return derived_key("x402-payment/salt", payment_id)


def payment_request_key(payment_id: uuid.UUID) -> bytes:
    """The request key of payment ``payment_id``'s retirement."""
    return derived_key("x402-payment/request", payment_id)


def refund_nonce(payment_id: uuid.UUID) -> bytes:
    """The EIP-3009 nonce of payment ``payment_id``'s refund: the token itself allows one."""
    return derived_key("x402-refund", payment_id)


LEDGER_MAX: Final = 100_000
"""At most this many payments in one ``relayer ledger`` (the oldest first)."""


async def payment_ledger(
    store: X402Payments, chain_id: int, token: str, treasury: str, limit: int = LEDGER_MAX
) -> list[PaymentLedgerRow]:
    """Per payment of chain ``chain_id`` (oldest first, at most ``limit``), what the treasury
    received for it and what it paid out on its behalf (USDC ``token`` atomic units;
    ``relayer ledger``, and the test suite's check after every daemon).

    Raises:
        StoreUnavailable: the database failed.
    """
    ids = await store.payment_ids(chain_id, limit)
    keys = [(i, payment_salt(i), transfer_bound_nonce(token, treasury, refund_nonce(i))) for i in ids]
    return await store.ledger(chain_id, keys)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def quote_ref(
    secret: bytes, chain_id: int, request_key: bytes, req: Requirements, expires_at: int, nonce: bytes
) -> str:
    """``q1.<expires_at>.<nonce>.<mac>``: the MAC (HMAC-SHA256, first 16 bytes, base64url)
    binds the chain, the request's hash, the requirement's amount, asset, payTo and
    ``maxTimeoutSeconds``, the expiry and the random ``nonce`` (16 bytes, the quote's id)."""
    message = "|".join(
        (
            QUOTE_VERSION,
            str(chain_id),
            request_key.hex(),
            str(req.amount),
            req.asset.lower(),
            req.pay_to.lower(),
            str(req.max_timeout_s),
            str(expires_at),
            nonce.hex(),
        )
    ).encode()
    mac = hmac.new(secret, message, hashlib.sha256).digest()[:16]
    return f"{QUOTE_VERSION}.{expires_at}.{_b64(nonce)}.{_b64(mac)}"
