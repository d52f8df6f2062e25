"""The retirement endpoint as a standard x402 v2 resource (design: docs/design/x402-v2.md,
C4-C6): ``payTo`` is the operator's treasury, and the retirement is then relayed from the
treasury exactly as marketplace orders are (:mod:`relayer.service.market.orders`).

:class:`Payments` is what the HTTP resource and the payment keeper hold; it composes the
room's units, each given the collaborators it uses:

- the 402: :class:`~relayer.service.payments.offer.Quoting` prices the ``exact`` requirement
  and signs and checks its quote reference;
- the paid request: :class:`~relayer.service.payments.take.Taking` checks and records a
  payment and takes its transfer;
- the payment's states: :class:`~relayer.service.payments.drive.Driver` (by the request,
  then by the keeper by due time), with the treasury's retirement
  (:class:`~relayer.service.payments.retire.Retiring`) and the refund
  (:class:`~relayer.service.payments.refund.Refunds`).

Amounts in USDC atomic units; times in unix seconds."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from relayer.chain.signer import TreasurySigner
from relayer.domain.schemas import ActionRequest
from relayer.domain.verify import Refusal
from relayer.domain.x402_wire import PaymentPayload
from relayer.service.gas import GasPricer
from relayer.service.payments.drive import Driver, Paid
from relayer.service.payments.facilitator import Facilitator
from relayer.service.payments.offer import Offer, Quoting
from relayer.service.payments.refund import Refunds
from relayer.service.payments.retire import Retiring
from relayer.service.payments.take import Taking
from relayer.service.prepare import Prepare
from relayer.service.proofs import TransferProofs
from relayer.service.relay import Relay
from relayer.service.treasury import TreasuryRetirements
from relayer.store.x402_payments import PaymentRow, X402Payments


class Payments:
    """The standard x402 payment of ``actions/retire`` (see the module)."""

    def __init__(
        self,
        relay: Relay,
        prepare: Prepare,
        gas: GasPricer,
        store: X402Payments,
        facilitator: Facilitator,
        proofs: TransferProofs,
        treasury: TreasurySigner | None,
        secret: bytes | None,
        lifetime_s: int,
        wait_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        domain, jobs, outcomes = facilitator.domain, relay.jobs, relay.outcomes
        self.quoting = Quoting(
            relay.supply, prepare, gas, domain, facilitator.network, treasury, secret, lifetime_s
        )
        refunds = Refunds(store, relay, jobs, outcomes, treasury, domain)
        signed = TreasuryRetirements(relay, prepare)
        retiring = Retiring(store, jobs, outcomes.retirements, self.quoting, signed, treasury, refunds)
        pay_to = "" if treasury is None else treasury.address
        self.driver = Driver(
            store,
            relay,
            jobs,
            outcomes,
            proofs,
            facilitator,
            retiring,
            refunds,
            domain.address,
            pay_to,
            wait_s,
            clock,
        )
        self.taking = Taking(
            self.quoting, prepare, facilitator, store, relay.supply.chain, proofs, self.driver
        )
        self.network = facilitator.network
        self.chain_id = relay.chain_id

    @property
    def enabled(self) -> bool:
        """A treasury key and a quote secret are configured."""
        return self.quoting.enabled

    @property
    def pay_to(self) -> str:
        """The treasury's address (checksummed): ``payTo``."""
        return self.quoting.pay_to

    async def offer(self, request: ActionRequest, now: int, *, quote: bool = True) -> Offer | None:
        """:meth:`Quoting.offer`."""
        return await self.quoting.offer(request, now, quote=quote)

    async def example_class(self) -> str | None:
        """:meth:`Quoting.example_class`."""
        return await self.quoting.example_class()

    async def pay(self, request: ActionRequest, payload: PaymentPayload, now: int) -> Paid | Refusal:
        """:meth:`Taking.pay`."""
        return await self.taking.pay(request, payload, now)

    async def advance(self, payment_id: uuid.UUID) -> PaymentRow | None:
        """:meth:`Driver.advance`."""
        return await self.driver.advance(payment_id)

    async def resume(self) -> int:
        """:meth:`Driver.resume`: the payment keeper's step."""
        return await self.driver.resume()
