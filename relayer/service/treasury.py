"""Retirements the operator's treasury signs and pays for, on behalf of someone who paid it
another way: marketplace orders (:mod:`relayer.service.market.orders`) and x402 payments
(:mod:`relayer.service.payments.retire`). Each retirement's salt and request key derive from
its order's or payment's id, so one order or payment has at most one live relay job and a
repeated attempt is answered with the first attempt's job."""

from __future__ import annotations

import uuid

from eth_utils.crypto import keccak

from relayer.chain.signer import TreasurySigner
from relayer.domain.eip712 import parse_signature, typed_data_digest
from relayer.domain.errors import Rejection
from relayer.service.prepare import Prepare
from relayer.service.relay import Relay
from relayer.service.supply import FillRefuser
from relayer.service.terms import Resolved
from relayer.store.relay_jobs import Job


def derived_key(purpose: str, ident: uuid.UUID) -> bytes:
    """The 32-byte key ``keccak256("relayer/<purpose>/v1" ‖ id)``: a salt, a request key or an
    EIP-3009 nonce that belongs to one order or payment (``purpose`` names which, e.g.
    ``marketplace-order/salt``)."""
    return keccak(f"relayer/{purpose}/v1".encode() + ident.bytes)


def retirement_cost(resolved: Resolved, gas_allowance: int) -> int:
    """What the retirement costs now (the quoted total and the gas allowance, atomic units of
    the input token). The treasury signs more (the slippage budget of a class retirement);
    what is not spent comes back to it."""
    return resolved.route.quote.total + gas_allowance


class TreasuryRetirements:
    """Prepares a retirement authorization, has the treasury sign it, and hands it to the relay
    (the same checks, salt binding and exactly-once rule as any payer's)."""

    def __init__(self, relay: Relay, prepare: Prepare) -> None:
        self.relay = relay
        self.prepare = prepare

    async def accept(
        self,
        treasury: TreasurySigner,
        resolved: Resolved,
        salt: bytes,
        request_key: bytes,
        now: int,
        *,
        ceiling: int | None = None,
        refuse: FillRefuser | None = None,
    ) -> Job:
        """The relay job of ``resolved`` signed by ``treasury`` under ``salt`` (32 bytes) and
        ``request_key`` (32 bytes); ``ceiling``: the most it may cost (atomic units, see
        :func:`retirement_cost`), else ``insufficient_authorized_value`` before anything is
        signed; ``refuse``: the caller's fill rule.

        Raises:
            RelayerError: the relay's refusals (the retirement cannot execute as asked).
            Unavailable: the node or the database failed.
        """
        prepared = await self.prepare.authorization(resolved, now, salt)
        if ceiling is not None and retirement_cost(resolved, prepared.gas_allowance) > ceiling:
            raise Rejection("insufficient_authorized_value", "the retirement now costs more than was paid")
        signature = parse_signature(treasury.sign_digest(typed_data_digest(prepared.typed_data)))
        return await self.relay.accept_authorization(
            resolved, self.prepare.signed(prepared, signature), request_key, now, refuse
        )
