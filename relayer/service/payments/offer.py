"""The 402 of the standard x402 retirement resource (design: docs/design/x402-v2.md, C4):
the ``exact`` requirement for an ``actions/retire`` body, priced as the treasury's retirement
authorization will carry it plus the gas of the payment's own transfer in USDC, paid to the
treasury, with a **quote reference**: a stateless HMAC (``x402_quote_secret``) over the chain,
the request's canonical hash, the amount, asset, payTo, lifetime and expiry, with 16 random
bytes that name it. An unpaid 402 writes nothing. Amounts in USDC atomic units; times in unix
seconds."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hmac
import os
from dataclasses import dataclass
from typing import Any, Final

from relayer.chain.signer import TreasurySigner
from relayer.domain import fees
from relayer.domain.schemas import ActionRequest
from relayer.domain.verify import Refusal, TokenDomain, request_hash
from relayer.domain.x402_wire import SCHEME, Requirements
from relayer.service.gas import GasPricer
from relayer.service.payments.quotes import QUOTE_VERSION, quote_ref
from relayer.service.prepare import Prepare
from relayer.service.supply import Supply
from relayer.service.terms import Resolved, resolve

TRANSFER_GAS: Final = 100_000
"""Gas priced into the amount for the payment's own ``transferWithAuthorization`` (it uses
about 60 000; the rest is margin, as the retirement's budget has)."""


@dataclass(frozen=True, slots=True)
class Offer:
    """One ``accepts`` entry of the retirement's 402 and what it pays for (``description``)."""

    requirements: Requirements
    description: str


class Quoting:
    """Prices and checks the quotes of the retirement resource: the supply it resolves on,
    the retirement authorization it prices (``prepare``), today's gas, the token's EIP-712
    domain and the x402 network, the treasury (``payTo``), the quote secret and lifetime."""

    def __init__(
        self,
        supply: Supply,
        prepare: Prepare,
        gas: GasPricer,
        domain: TokenDomain,
        network: str,
        treasury: TreasurySigner | None,
        secret: bytes | None,
        lifetime_s: int,
    ) -> None:
        self.supply = supply
        self.prepare = prepare
        self.gas = gas
        self.domain = domain
        self.network = network
        self.treasury = treasury
        self.secret = secret
        self.lifetime_s = lifetime_s
        self.chain_id = supply.chain_id

    @property
    def enabled(self) -> bool:
        """A treasury key and a quote secret are configured."""
        return self.treasury is not None and self.secret is not None

    async def offer(self, request: ActionRequest, now: int, *, quote: bool = True) -> Offer | None:
        """The ``exact`` requirement for ``request`` (None when the resource is not offered:
        no treasury or quote secret, or an input token other than USDC); with a fresh quote
        reference in ``extra.quoteRef`` unless ``quote`` is False (discovery).

        Raises:
            Rejection: the quote codes of ``request`` (as prepare-auth raises them).
            Unavailable: the chain node failed.
        """
        if not self.enabled or self.supply.token(request.inputToken).key != "usdc":
            return None
        resolved = await self.resolved(request, now)
        prepared, transfer_gas = await asyncio.gather(
            self.prepare.authorization(resolved, now), self._transfer_gas_usdc()
        )
        amount = prepared.value + transfer_gas
        lifetime = min(self.lifetime_s, prepared.valid_before - now)
        extra: dict[str, Any] = {"name": self.domain.name, "version": self.domain.version}
        offered = Requirements(
            SCHEME, self.network, self.domain.address, amount, self.pay_to, lifetime, extra
        )
        if quote:
            assert self.secret is not None
            ref = quote_ref(
                self.secret, self.chain_id, request_hash(request), offered, now + lifetime, os.urandom(16)
            )
            offered = dataclasses.replace(offered, extra={**extra, "quoteRef": ref})
        route = resolved.route
        what = route.carbon_class.symbol if route.carbon_class else f"listing {route.source_id}"
        description = f"Retire {prepared.terms.summary['amount']} t of {what} (carbon credits), gas included"
        return Offer(offered, description)

    @property
    def pay_to(self) -> str:
        """The treasury's address (checksummed): ``payTo``."""
        assert self.treasury is not None
        return self.treasury.address

    async def _transfer_gas_usdc(self) -> int:
        """The payment transfer's gas (:data:`TRANSFER_GAS` at today's fees, its L1 data and
        operator fees) in USDC atomic units, rounded up."""
        price, eth, (l1, operator) = await asyncio.gather(
            self.gas.price(), self.gas.eth_price(), self.gas.extra_wei(228, TRANSFER_GAS)
        )
        return fees.wei_in_usdc(TRANSFER_GAS * price.max_fee_per_gas + l1 + operator, eth.usdc)

    async def resolved(self, request: ActionRequest, now: int) -> Resolved:
        """``request`` resolved and attributed as its body says (``from``, beneficiary), then
        paid and retired by the treasury.

        Raises:
            Rejection: the quote and attribution codes.
            Unavailable: the chain node failed.
        """
        r = await resolve(self.supply, request, now)
        # the treasury pays and retires (the contract's retiring address is the payer); the
        # beneficiary stays the one the body names (``beneficiaryIsPayer``: its ``from``)
        return Resolved(self.pay_to, r.route, dataclasses.replace(r.details, retiring_address=self.pay_to))

    def check_quote(self, request: ActionRequest, accepted: Requirements, now: int) -> str | Refusal:
        """The quote reference of ``accepted`` against this body and the echoed requirement
        (its MAC, its expiry, ``payTo`` the treasury); the quote's id (its random part).
        ``invalid_payment_requirements`` when it does not hold."""
        ref = str(accepted.extra.get("quoteRef", ""))
        parts = ref.split(".")
        if len(parts) != 4 or parts[0] != QUOTE_VERSION or not parts[1].isdigit():
            return Refusal("invalid_payment_requirements", "accepted.extra.quoteRef is missing or malformed")
        expires_at = int(parts[1])
        try:
            nonce = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
        except ValueError:
            return Refusal("invalid_payment_requirements", "accepted.extra.quoteRef is malformed")
        assert self.secret is not None
        expected = quote_ref(self.secret, self.chain_id, request_hash(request), accepted, expires_at, nonce)
        if not hmac.compare_digest(expected, ref):
            return Refusal(
                "invalid_payment_requirements",
                "the quote reference does not match this request and requirement: ask for a new one",
            )
        if expires_at <= now:
            return Refusal(
                "invalid_payment_requirements", "the quote reference has expired: ask for a new one"
            )
        if accepted.pay_to.lower() != self.pay_to.lower():
            return Refusal("invalid_payment_requirements", "payTo is not this operator's treasury")
        return parts[2]

    async def example_class(self) -> str | None:
        """The first carbon class's symbol (discovery's example retirement); None when none."""
        classes = await self.supply.chain.classes()
        return classes[0].symbol if classes else None
