"""What a caller signs or sends: ``prepare-auth`` (EIP-712 typed data and a ready
``actions/retire`` request, with a fresh salt) and ``prepare/retire`` (the unsigned
``[approve, retire]`` batch of the caller-paid path). Amounts are atomic units of the
input token. Spec: prepare-auth, prepare/retire; Authentication."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from relayer.chain import calls
from relayer.chain.reads import ChainReads
from relayer.config import Settings
from relayer.domain import chains, views
from relayer.domain.amounts import format_tonnes, format_units
from relayer.domain.eip712 import Signature
from relayer.domain.retirement import bind_nonce, permit_deadline
from relayer.domain.schemas import ActionRequest, Details
from relayer.domain.verify import SignedAuthorization, Terms, typed_data
from relayer.service.gas import GasPricer
from relayer.service.supply import Supply
from relayer.service.terms import Resolved, resolve


@dataclass(frozen=True, slots=True)
class PreparedAuthorization:
    """An authorization ready to sign (amounts in input-token atomic units, times in unix
    seconds): ``deadline`` is the signed ``validBefore`` (EIP-3009) or the permit deadline
    carrying the bound nonce (EIP-2612); ``nonce`` the EIP-3009 bound nonce or the permit
    nonce; ``typed_data`` the EIP-712 message."""

    terms: Terms
    payer: str
    value: int
    gas_allowance: int
    gas_parts: dict[str, Any]
    valid_before: int
    deadline: int
    salt: bytes
    bound_nonce: bytes
    nonce: bytes | int
    typed_data: dict[str, Any]


class Prepare:
    """prepare-auth and prepare/retire."""

    def __init__(self, supply: Supply, reads: ChainReads, gas: GasPricer, settings: Settings) -> None:
        self.supply = supply
        self.reads = reads
        self.gas = gas
        self.settings = settings
        self.chain_id = supply.chain_id
        self.settlement = reads.contracts.settlement

    async def prepare_auth(self, request: ActionRequest, now: int) -> views.PrepareAuthAnswer:
        """EIP-712 ``typedData`` and a ready ``actionsRetireRequest`` (spec: prepare-auth).

        The signed value is the suggested maximum input plus the gas allowance; a USDC
        authorization's nonce is the bound nonce, a kVCM permit's deadline carries it.

        Raises:
            Rejection: the quote codes, registry_details_required, attribution_required,
                schema_validation.
            Unavailable: the chain node failed (gas_estimate_unavailable).
        """
        resolved = await resolve(self.supply, request, now)
        prepared = await self.authorization(resolved, now)
        route, terms, bound = resolved.route, prepared.terms, prepared.bound_nonce
        usdc = route.token.key == "usdc"
        allowance, value = prepared.gas_allowance, prepared.value
        return {
            "chainId": self.chain_id,
            "scheme": terms.scheme,
            "to": self.settlement,
            "authValue": str(value),
            "authValueFormatted": format_units(value, route.token.decimals),
            "gasAllowance": str(allowance),
            "gasAllowanceFormatted": format_units(allowance, route.token.decimals),
            "gasAllowanceParts": prepared.gas_parts,
            "validBefore": prepared.valid_before,
            "quote": self.supply.quote_body(route),
            "typedData": prepared.typed_data,
            "actionsRetireRequest": self._actions_request(
                request,
                resolved,
                prepared.salt,
                allowance,
                value,
                prepared.deadline,
                "0x" + bound.hex() if usdc else str(prepared.nonce),
            ),
            "onChainDetails": {
                "settlement": self.settlement,
                "function": "retireWithAuthorization" if usdc else "retireWithPermit",
                "retirementHash": "0x" + terms.retirement.struct_hash().hex(),
                "authorizationNonce": "0x" + bound.hex(),
                "salt": "0x" + prepared.salt.hex(),
            },
        }

    async def authorization(
        self, resolved: Resolved, now: int, salt: bytes | None = None
    ) -> PreparedAuthorization:
        """What the payer of ``resolved`` signs: the gas allowance priced now, the terms, the
        value (suggested maximum input plus allowance, input-token atomic units), the validity
        window and the bound nonce for ``salt`` (a fresh random one when None), as EIP-712
        typed data.

        Raises:
            Unavailable: the chain node failed (gas_estimate_unavailable).
        """
        route = resolved.route
        usdc = route.token.key == "usdc"
        call_size = calls.gasless_call_size(resolved.retirement(0), route.token.scheme)
        priced, permit_nonce = await asyncio.gather(
            self.gas.allowance(route, call_size), self._permit_nonce(resolved.payer, usdc)
        )
        allowance = priced.amount
        terms = resolved.terms(self.chain_id, self.settlement, allowance)
        value = route.suggested_max_input + allowance
        lifetime = (
            self.settings.class_auth_lifetime_s
            if route.carbon_class
            else self.settings.listing_auth_lifetime_s
        )
        valid_before = now + lifetime
        salt = os.urandom(32) if salt is None else salt
        bound = bind_nonce(terms.retirement, salt)
        deadline = valid_before if usdc else permit_deadline(bound, valid_before)
        nonce: bytes | int = bound if usdc else permit_nonce
        return PreparedAuthorization(
            terms=terms,
            payer=resolved.payer,
            value=value,
            gas_allowance=allowance,
            gas_parts=priced.parts(),
            valid_before=valid_before,
            deadline=deadline,
            salt=salt,
            bound_nonce=bound,
            nonce=nonce,
            typed_data=typed_data(terms, resolved.payer, value, 0, deadline, nonce),
        )

    def signed(self, prepared: PreparedAuthorization, signature: Signature) -> SignedAuthorization:
        """``prepared`` as signed with ``signature`` (the typed entry into the relay)."""
        return SignedAuthorization(
            payer=prepared.payer,
            value=prepared.value,
            valid_after=0,
            valid_before=prepared.deadline,
            nonce=prepared.nonce,
            salt=prepared.salt,
            gas_allowance=prepared.gas_allowance,
            signature=signature,
        )

    async def _permit_nonce(self, owner: str, usdc: bool) -> int:
        return 0 if usdc else await self.reads.permit_nonce(owner)

    def _actions_request(
        self,
        request: ActionRequest,
        resolved: Resolved,
        salt: bytes,
        allowance: int,
        value: int,
        valid_before: int,
        nonce: str,
    ) -> dict[str, Any]:
        """The ready actions/retire body: post it back with ``authPayload.signature`` set."""
        route = resolved.route
        source = (
            {"carbonClass": route.carbon_class.symbol}
            if route.carbon_class
            else {"listingId": str(route.source_id)}
        )
        return {
            "action": "actions/retire",
            "chainId": self.chain_id,
            "inputToken": route.token.symbol,
            "amount": format_tonnes(route.units),
            **source,
            "creditToken": route.credit_token,
            "tokenId": route.credit.token_id,
            "from": resolved.payer,
            "details": request.details.model_dump(exclude_none=True, exclude_defaults=True)
            if request.details
            else {},
            "salt": "0x" + salt.hex(),
            "gasAllowance": str(allowance),
            "authPayload": {
                "from": resolved.payer,
                "to": self.settlement,
                "value": str(value),
                "validAfter": "0",
                "validBefore": str(valid_before),
                "nonce": nonce,
            },
        }

    async def prepare_retire(self, request: ActionRequest, now: int) -> views.PrepareRetireAnswer:
        """Unsigned ``[approve, retire]`` batch for a caller that pays its own gas
        (spec: prepare/retire). The beneficiary defaults to ``from``.

        Raises:
            Rejection: the quote codes, registry_details_required, schema_validation.
            Unavailable: the chain node failed.
        """
        details = request.details
        if details is None or not (details.beneficiaryAddress or details.beneficiaryIsPayer):
            details = (details or Details()).model_copy(update={"beneficiaryIsPayer": True})
            request = request.model_copy(update={"details": details})
        resolved = await resolve(self.supply, request, now)
        route = resolved.route
        max_input = route.suggested_max_input
        approve = calls.approve(route.token.contract, self.settlement, max_input)
        retire = calls.retire(resolved.retirement(0), max_input)
        return {
            "chainId": self.chain_id,
            "chain": chains.network(self.chain_id),
            "to": self.settlement,
            "data": "0x" + retire.hex(),
            "transactions": [
                {
                    "step": "approve",
                    "to": route.token.address,
                    "data": "0x" + approve.hex(),
                    "value": "0",
                    "chainId": self.chain_id,
                },
                {
                    "step": "prepareRetire",
                    "to": self.settlement,
                    "data": "0x" + retire.hex(),
                    "value": "0",
                    "chainId": self.chain_id,
                },
            ],
            "quote": self.supply.quote_body(route),
            "approvalRequired": True,
            "approvalInstructions": {
                "token": route.token.address,
                "spender": self.settlement,
                "amount": str(max_input),
                "amountFormatted": format_units(max_input, route.token.decimals),
                "note": "Approve the settlement contract for the maximum input; unused input is refunded.",
            },
        }
