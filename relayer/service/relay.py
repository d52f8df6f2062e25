"""The gasless relay: prepare-auth (typed data + a ready request), actions/retire (check,
reserve the salt, simulate, cap gas, hand over to the broadcaster, wait for the outcome)
and certificate lookup. Spec: x402-retirement-endpoint.md, Authentication and Errors.

Checks run cheap before expensive: shape, attribution, resolution, from/to/scheme, nonce
binding, signature, validity window and value; then the salt is reserved in Postgres and
the call simulated. Nothing is signed unless the signed gas allowance covers
``gasLimit * maxFeePerGas`` at the price the transaction is sent with.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from eth_abi.abi import encode
from eth_utils.crypto import keccak

from relayer.chain.client import ChainClient, ChainRevert, ChainUnavailable
from relayer.config import Settings
from relayer.domain import eip712, fees
from relayer.domain.amounts import format_tonnes, format_units
from relayer.domain.errors import Rejection
from relayer.domain.retirement import (
    Retirement,
    RetirementDetails,
    authorization_nonce,
    permit_binds,
    permit_deadline,
    permit_expiry,
)
from relayer.domain.schemas import ActionRequest, Details, require
from relayer.domain.states import JobState
from relayer.service.catalog import Catalog, Route, missing_registry_details
from relayer.store.jobs import Job, JobStore, NewJob, PermitInUse, SaltReused
from relayer.store.retirements import IndexedRetirement, RetirementStore

AUTH_EXPIRY_MARGIN_S: Final = 30


@dataclass(frozen=True, slots=True)
class GasPrice:
    """EIP-1559 fees (wei per gas) the executor would send with now."""

    max_fee_per_gas: int
    max_priority_fee_per_gas: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """What actions/retire answers: an HTTP status and a JSON body."""

    status: int
    body: dict[str, Any]


class Relay:
    """prepare-auth, actions/retire and certificate."""

    def __init__(
        self,
        settings: Settings,
        chain: ChainClient,
        catalog: Catalog,
        jobs: JobStore,
        retirements: RetirementStore,
        executor_address: str,
        wait_for_change: Callable[[int, float], Awaitable[None]],
        wake_broadcaster: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.chain = chain
        self.catalog = catalog
        self.jobs = jobs
        self.retirements = retirements
        self.executor_address = executor_address
        self._wait_for_change = wait_for_change
        self._wake_broadcaster = wake_broadcaster

    # ------------------------------------------------------------------ helpers

    async def gas_price(self) -> GasPrice:
        """Current EIP-1559 fees. Raises ``gas_estimate_unavailable``."""
        try:
            base = await self.chain.base_fee()
        except ChainUnavailable:
            raise Rejection("gas_estimate_unavailable") from None
        tip = self.settings.priority_fee_wei
        return GasPrice(base * self.settings.base_fee_multiplier + tip, tip)

    def _gas_budget(self, route: Route) -> int:
        return self.settings.gas_budget_class if route.carbon_class else self.settings.gas_budget_listing

    def _details(self, req: ActionRequest, payer: str, route: Route) -> RetirementDetails:
        """Attribution from ``details`` (raises attribution_required, registry_details_required)."""
        d = req.details.model_dump(exclude_none=True) if req.details else {}
        if d.get("beneficiaryIsPayer"):
            beneficiary = payer
        elif d.get("beneficiaryAddress"):
            beneficiary = d["beneficiaryAddress"]
        else:
            raise Rejection(
                "attribution_required", fields=["details.beneficiaryAddress", "details.beneficiaryIsPayer"]
            )
        if d.get("retiringAddress", payer) != payer:
            raise Rejection(
                "schema_validation",
                "details.retiringAddress must equal from",
                issues=[{"path": ["details", "retiringAddress"], "keys": [], "message": "must equal from"}],
            )
        missing = missing_registry_details(route.credit, d)
        if missing:
            raise Rejection(
                "registry_details_required",
                fields=[f"details.{f}" for f in missing],
                registry=route.credit.registry,
            )
        return RetirementDetails(
            retiring_address=payer,
            beneficiary_address=beneficiary,
            beneficiary_string=d.get("beneficiaryString", ""),
            retiring_entity_string=d.get("retiringEntityString", ""),
            retirement_message=d.get("retirementMessage", ""),
            beneficiary_location=d.get("beneficiaryLocation", ""),
            consumption_country_code=d.get("consumptionCountryCode", ""),
            consumption_period_start=d.get("consumptionPeriodStart", ""),
            consumption_period_end=d.get("consumptionPeriodEnd", ""),
        )

    def _retirement(self, route: Route, details: RetirementDetails, gas_allowance: int) -> Retirement:
        return Retirement(
            source=route.source,
            source_id=route.source_id,
            credit_token=route.credit_token,
            token_id=route.credit.token_id,
            amount=route.units,
            input_token=route.token.address,
            gas_allowance=gas_allowance,
            details=details,
        )

    def _summary(self, route: Route, retirement: Retirement) -> dict[str, Any]:
        return {
            "source": "carbonClass" if route.carbon_class else "listing",
            "carbonClass": route.carbon_class.symbol if route.carbon_class else None,
            "listingId": None if route.carbon_class else str(route.source_id),
            "creditToken": route.credit_token,
            "tokenId": str(route.credit.token_id),
            "amount": format_tonnes(route.units),
            "inputToken": route.token.symbol,
            "payer": retirement.details.retiring_address,
            "beneficiaryAddress": retirement.details.beneficiary_address,
            "gasAllowance": str(retirement.gas_allowance),
        }

    def _typed_data(
        self, route: Route, payer: str, value: int, valid_after: int, valid_before: int, nonce: bytes | int
    ) -> dict[str, Any]:
        """EIP-712 typed data the payer signs: EIP-3009 ReceiveWithAuthorization (``nonce``
        the bound 32-byte nonce) for USDC, EIP-2612 Permit (``nonce`` the permit nonce) for kVCM."""
        settlement = self.chain.addresses["settlement"]
        if isinstance(nonce, bytes):
            return eip712.receive_with_authorization(
                chain_id=self.chain.chain_id,
                usdc=route.token.address,
                payer=payer,
                settlement=settlement,
                value=value,
                valid_after=valid_after,
                valid_before=valid_before,
                nonce=nonce,
            )
        return eip712.permit(
            chain_id=self.chain.chain_id,
            kvcm=route.token.address,
            owner=payer,
            spender=settlement,
            value=value,
            nonce=nonce,
            deadline=valid_before,
        )

    # ------------------------------------------------------------------ prepare-auth

    async def prepare_auth(self, req: ActionRequest, now: int) -> dict[str, Any]:
        """EIP-712 ``typedData`` and a ready ``actionsRetireRequest`` (spec: prepare-auth).

        Raises:
            Rejection: the quote codes, registry_details_required, attribution_required,
                gas_estimate_unavailable, schema_validation.
        """
        require(req, "from")
        assert req.from_ is not None
        payer = req.from_
        route = await self.catalog.resolve(req, now)
        details = self._details(req, payer, route)
        price, reserves = await asyncio.gather(self.gas_price(), self.chain.reserves())
        allowance = fees.gas_allowance(
            self._gas_budget(route),
            price.max_fee_per_gas,
            self.settings.eth_price_usdc,
            self.settings.gas_allowance_margin_bps,
            route.token.key == "usdc",
            reserves,
        )
        retirement = self._retirement(route, details, allowance)
        value = route.suggested_max_input + allowance
        lifetime = (
            self.settings.class_auth_lifetime_s
            if route.carbon_class
            else self.settings.listing_auth_lifetime_s
        )
        valid_before = now + lifetime
        settlement = self.chain.addresses["settlement"]
        salt = os.urandom(32)
        bound = authorization_nonce(retirement, salt)
        if route.token.key == "usdc":
            signed_nonce: bytes | int = bound
            nonce = "0x" + bound.hex()
            deadline = valid_before
            scheme = "eip3009"
        else:
            signed_nonce = await self.chain.permit_nonce(payer)
            nonce = str(signed_nonce)
            deadline = permit_deadline(bound, valid_before)
            scheme = "eip2612"
        typed = self._typed_data(route, payer, value, 0, deadline, signed_nonce)
        request_details = (
            req.details.model_dump(exclude_none=True, exclude_defaults=True) if req.details else {}
        )
        source = (
            {"carbonClass": route.carbon_class.symbol}
            if route.carbon_class
            else {"listingId": str(route.source_id)}
        )
        actions_request = {
            "action": "actions/retire",
            "chainId": self.chain.chain_id,
            "inputToken": route.token.symbol,
            "amount": format_tonnes(route.units),
            **source,
            "creditToken": route.credit_token,
            "tokenId": route.credit.token_id,
            "from": payer,
            "details": request_details,
            "salt": "0x" + salt.hex(),
            "gasAllowance": str(allowance),
            "authPayload": {
                "from": payer,
                "to": settlement,
                "value": str(value),
                "validAfter": "0",
                "validBefore": str(deadline),
                "nonce": nonce,
            },
        }
        d = route.token.decimals
        return {
            "chainId": self.chain.chain_id,
            "scheme": scheme,
            "to": settlement,
            "authValue": str(value),
            "authValueFormatted": format_units(value, d),
            "gasAllowance": str(allowance),
            "gasAllowanceFormatted": format_units(allowance, d),
            "validBefore": valid_before,
            "quote": self.catalog.quote_body(route),
            "typedData": typed,
            "actionsRetireRequest": actions_request,
            "onChainDetails": {
                "settlement": settlement,
                "function": "retireWithAuthorization" if scheme == "eip3009" else "retireWithPermit",
                "retirementHash": "0x" + retirement.struct_hash().hex(),
                "authorizationNonce": "0x" + bound.hex(),
                "salt": "0x" + salt.hex(),
            },
        }

    # ------------------------------------------------------------------ prepare/retire

    async def prepare_retire(self, req: ActionRequest, now: int) -> dict[str, Any]:
        """Unsigned ``[approve, retire]`` batch for a caller that pays its own gas
        (spec: prepare/retire). The beneficiary defaults to ``from``.

        Raises:
            Rejection: the quote codes, registry_details_required, schema_validation.
        """
        require(req, "from")
        assert req.from_ is not None
        payer = req.from_
        route = await self.catalog.resolve(req, now)
        if req.details is None or not (req.details.beneficiaryAddress or req.details.beneficiaryIsPayer):
            req = req.model_copy(
                update={"details": (req.details or Details()).model_copy(update={"beneficiaryIsPayer": True})}
            )
        details = self._details(req, payer, route)
        retirement = self._retirement(route, details, 0)
        settlement = self.chain.addresses["settlement"]
        max_input = route.suggested_max_input
        approve = self.chain.encode(route.token.key, "approve", settlement, max_input)
        retire = self.chain.encode("settlement", "retire", retirement.as_tuple(), max_input)
        chain_id = self.chain.chain_id
        d = route.token.decimals
        return {
            "chainId": chain_id,
            "chain": "base" if chain_id == 8453 else "base-sepolia",
            "to": settlement,
            "data": "0x" + retire.hex(),
            "transactions": [
                {
                    "step": "approve",
                    "to": route.token.address,
                    "value": "0",
                    "data": "0x" + approve.hex(),
                    "chainId": chain_id,
                },
                {
                    "step": "prepareRetire",
                    "to": settlement,
                    "value": "0",
                    "data": "0x" + retire.hex(),
                    "chainId": chain_id,
                },
            ],
            "quote": self.catalog.quote_body(route),
            "approvalRequired": True,
            "approvalInstructions": {
                "token": route.token.address,
                "spender": settlement,
                "amount": str(max_input),
                "amountFormatted": format_units(max_input, d),
                "note": "Approve the settlement contract for the maximum input; unused input is refunded.",
            },
        }

    # ------------------------------------------------------------------ actions/retire

    async def retire(self, req: ActionRequest, now: int) -> Outcome:
        """Relay a signed retirement (spec: actions/retire). Without ``authPayload`` answers
        402 ``payment_required`` with the prepare-auth body.

        Raises:
            Rejection: the prepare-auth codes, invalid_input_token, invalid_auth_payload,
                insufficient_authorized_value, params_mismatch, contract_revert,
                gas_limit_exceeds_cap.
        """
        if req.inputToken is not None:
            try:
                self.catalog.token(req.inputToken)
            except Rejection:
                raise Rejection("invalid_input_token", inputToken=req.inputToken) from None
        if req.authPayload is None:
            prepared = await self.prepare_auth(req, now)
            raise Rejection("payment_required", **prepared)
        auth = req.authPayload
        require(req, "from")
        assert req.from_ is not None
        payer = req.from_
        if auth.from_ != payer:
            raise Rejection("invalid_auth_payload", "authPayload.from must equal from")
        if auth.to != self.chain.addresses["settlement"]:
            raise Rejection(
                "invalid_auth_payload",
                "authPayload.to must be the settlement contract",
                expectedTo=self.chain.addresses["settlement"],
            )
        if req.salt is None:
            raise Rejection("invalid_auth_payload", "a relayed retirement needs the top-level salt")
        if req.gasAllowance is None:
            raise Rejection("invalid_auth_payload", "gasAllowance from prepare-auth is missing")
        signature = auth.signature_bytes()
        if signature is None:
            raise Rejection("invalid_auth_payload", "authPayload needs signature or v/r/s")
        salt = bytes.fromhex(req.salt[2:])
        request_hash = keccak(text=json.dumps(req.model_dump(mode="json", by_alias=True), sort_keys=True))
        # The identical request answers from its job, whatever live prices, supply or the
        # clock say now: the same transaction hash, never a second broadcast.
        existing = await self.jobs.find_by_salt(self.chain.chain_id, salt)
        if existing is not None and existing.state is not JobState.REJECTED:
            if existing.request_hash != request_hash:
                raise Rejection(
                    "params_mismatch",
                    "this salt was already spent by another request",
                    expectedNonce="0x" + existing.auth_key.hex(),
                    receivedNonce=auth.nonce,
                    submitted=existing.summary,
                )
            return await self.outcome(existing.id)
        route = await self.catalog.resolve(req, now)
        details = self._details(req, payer, route)
        signed_allowance = int(req.gasAllowance)
        retirement = self._retirement(route, details, signed_allowance)
        value = int(auth.value)
        valid_before = int(auth.validBefore)
        settlement = self.chain.addresses["settlement"]
        usdc = route.token.key == "usdc"
        expected = authorization_nonce(retirement, salt)
        permit_key: bytes | None = None
        if usdc:
            if not (auth.nonce.startswith("0x") and len(auth.nonce) == 66):
                raise Rejection("invalid_auth_payload", "USDC needs an EIP-3009 bytes32 nonce")
            received = auth.nonce.lower()
            if received != "0x" + expected.hex():
                raise Rejection(
                    "params_mismatch",
                    expectedNonce="0x" + expected.hex(),
                    receivedNonce=received,
                    submitted=self._summary(route, retirement),
                )
            expiry = valid_before
            typed = self._typed_data(route, payer, value, int(auth.validAfter), valid_before, expected)
        else:
            if not auth.nonce.isdigit() or int(auth.nonce) >= 2**256:
                raise Rejection("invalid_auth_payload", "kVCM needs an EIP-2612 permit nonce (decimal)")
            if not permit_binds(valid_before, expected):
                raise Rejection(
                    "params_mismatch",
                    "the permit deadline does not carry this retirement's nonce",
                    expectedNonce="0x" + expected.hex(),
                    receivedNonce=f"0x{valid_before >> 64:048x}",
                    submitted=self._summary(route, retirement),
                )
            expiry = permit_expiry(valid_before)
            typed = self._typed_data(route, payer, value, int(auth.validAfter), valid_before, int(auth.nonce))
            permit_key = keccak(
                encode(["address", "address", "uint256"], [route.token.address, payer, int(auth.nonce)])
            )
        auth_key = expected
        try:
            parsed = eip712.parse_signature(signature)
            signer = eip712.recover_signer(typed, parsed)
        except (ValueError, TypeError):
            raise Rejection("invalid_auth_payload", "signature does not recover") from None
        if signer != payer:
            raise Rejection("invalid_auth_payload", "signature is not from `from`")
        if expiry <= now + AUTH_EXPIRY_MARGIN_S:
            raise Rejection(
                "invalid_auth_payload",
                "authorization expired or about to expire",
                validBefore=str(expiry),
            )
        required = route.quote.total + signed_allowance
        if value < required:
            raise Rejection(
                "insufficient_authorized_value", requiredMinimum=str(required), authorized=str(value)
            )
        call = (
            self.chain.encode(
                "settlement",
                "retireWithAuthorization",
                retirement.as_tuple(),
                salt,
                (payer, value, int(auth.validAfter), valid_before, parsed.v, parsed.r_bytes, parsed.s_bytes),
            )
            if usdc
            else self.chain.encode(
                "settlement",
                "retireWithPermit",
                retirement.as_tuple(),
                salt,
                (payer, value, valid_before, parsed.v, parsed.r_bytes, parsed.s_bytes),
            )
        )
        new = NewJob(
            chain_id=self.chain.chain_id,
            auth_key=auth_key,
            permit_key=permit_key,
            salt=salt,
            scheme="eip3009" if usdc else "eip2612",
            payer=payer,
            input_token=route.token.address,
            auth_value=value,
            auth_expires_at=expiry,
            gas_allowance=signed_allowance,
            request_hash=request_hash,
            settlement=settlement,
            call_data=call,
            summary=self._summary(route, retirement),
        )
        try:
            job, owned = await self.jobs.reserve(new)
        except PermitInUse:
            raise Rejection(
                "params_mismatch",
                "this permit nonce is already being spent by another request",
                expectedNonce="0x" + expected.hex(),
                receivedNonce=auth.nonce,
                submitted=new.summary,
            ) from None
        except SaltReused as exc:
            raise Rejection(
                "params_mismatch",
                "salt already spent by another authorization",
                expectedNonce="0x" + exc.job.auth_key.hex(),
                receivedNonce=auth.nonce,
                submitted=new.summary,
            ) from None
        if job.request_hash != request_hash and not owned:
            raise Rejection(
                "params_mismatch",
                "this authorization was already used for another request",
                expectedNonce="0x" + job.auth_key.hex(),
                receivedNonce=auth.nonce,
                submitted=new.summary,
            )
        if owned:
            await self._simulate(job, route)
        return await self.outcome(job.id)

    async def _simulate(self, job: Job, route: Route) -> None:
        """Simulate, cap gas, price it against the signed allowance, then mark simulated.
        Any rejection here moves the job to rejected (nothing signed: retryable). Gas is
        priced against the allowance stored with the job (what its call data pays)."""
        signed_allowance = job.gas_allowance
        try:
            try:
                estimate = await self.chain.estimate_gas(
                    self.executor_address,
                    job.settlement,
                    job.call_data,
                    "retireWithAuthorization" if job.scheme == "eip3009" else "retireWithPermit",
                )
            except ChainRevert as exc:
                raise Rejection("contract_revert", **exc.info) from None
            except ChainUnavailable:
                raise Rejection("gas_estimate_unavailable") from None
            if estimate > self.settings.gas_cap:
                raise Rejection("gas_limit_exceeds_cap", gasEstimate=estimate, gasCap=self.settings.gas_cap)
            gas_limit = min(
                fees.ceil_div(estimate * (10_000 + self.settings.gas_limit_margin_bps), 10_000),
                self.settings.gas_cap,
            )
            price, reserves = await asyncio.gather(self.gas_price(), self.chain.reserves())
            pays_usdc = route.token.key == "usdc"
            needed = fees.gas_cost_in_usdc(gas_limit, price.max_fee_per_gas, self.settings.eth_price_usdc)
            if not pays_usdc:
                needed = fees.usdc_to_kvcm_spot(needed, reserves)
            if signed_allowance < needed:
                raise Rejection(
                    "insufficient_authorized_value",
                    "the signed gas allowance no longer covers gas",
                    requiredMinimum=str(route.quote.total + needed),
                    requiredGasAllowance=str(needed),
                    gasAllowance=str(signed_allowance),
                )
            cap = fees.max_fee_covered(
                signed_allowance, gas_limit, self.settings.eth_price_usdc, pays_usdc, reserves
            )
            max_fee = min(price.max_fee_per_gas, cap)
            moved = await self.jobs.move(
                job.id,
                JobState.SIMULATED,
                gas_limit=gas_limit,
                max_fee_per_gas=max_fee,
                max_priority_fee_per_gas=min(price.max_priority_fee_per_gas, max_fee),
            )
            if moved is not None:
                self._wake_broadcaster()
        except Rejection as rej:
            await self.jobs.move(
                job.id, JobState.REJECTED, error={"status": rej.spec.http_status, **rej.body()}
            )
            raise

    async def outcome(self, job_id: int) -> Outcome:
        """Wait (bounded by settings.settle_wait_s) until the job settles or fails, then answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.settle_wait_s
        while True:
            job = await self.jobs.get(job_id)
            assert job is not None
            if job.state is JobState.REJECTED and job.error is not None:
                body = dict(job.error)
                status = int(body.pop("status", 400))
                return Outcome(status, body)
            if job.state is JobState.REVERTED:
                # Anyone may submit a bound authorization; if another transaction settled
                # it first, the payer's retirement exists: answer with that, never "re-sign".
                elsewhere = await self.retirements.by_authorization(job.chain_id, job.auth_key)
                if elsewhere:
                    return Outcome(200, self._body(job, "settled", elsewhere[0].tx_hash, elsewhere))
                if not await self._consumed_elsewhere(job) or loop.time() >= deadline:
                    rej = Rejection("transaction_reverted", transactionHash=_hex(job.tx_hash))
                    return Outcome(rej.spec.http_status, rej.body())
                await self._wait_for_change(job_id, min(deadline - loop.time(), 1.0))
                continue
            if job.state is JobState.INDEXED:
                return Outcome(200, await self._settled_body(job, "settled"))
            remaining = deadline - loop.time()
            if remaining <= 0:
                if job.state in (JobState.MINED, JobState.CONFIRMED):
                    return Outcome(200, await self._settled_body(job, "pending_index"))
                return Outcome(
                    202,
                    {
                        "status": "submitted" if job.tx_hash else "accepted",
                        "transactionHash": _hex(job.tx_hash),
                        "jobId": job.id,
                        "chainId": job.chain_id,
                    },
                )
            await self._wait_for_change(job_id, min(remaining, 1.0))

    async def _consumed_elsewhere(self, job: Job) -> bool:
        """Whether the job's EIP-3009 authorization was used on-chain (by another transaction,
        since this one reverted) and only waits to be indexed."""
        if job.scheme != "eip3009":
            return False
        try:
            return await self.chain.authorization_used(job.payer, job.auth_key)
        except ChainUnavailable:
            return False

    async def _settled_body(self, job: Job, status: str) -> dict[str, Any]:
        found = []
        if job.tx_hash is not None and status == "settled":
            found = await self.retirements.by_transaction(job.chain_id, job.tx_hash)
        return self._body(job, status, job.tx_hash, found)

    def _body(
        self, job: Job, status: str, tx_hash: bytes | None, found: list[IndexedRetirement]
    ) -> dict[str, Any]:
        return {
            "status": status,
            "chainId": job.chain_id,
            "transactionHash": _hex(tx_hash),
            "retirements": [self.certificate_entry(r) for r in found],
            "submitted": job.summary,
        }

    # ------------------------------------------------------------------ certificate

    def retirement_id(self, r: IndexedRetirement) -> str:
        return f"{r.chain_id}-0x{r.tx_hash.hex()}-{r.retirement_index}"

    def certificate_entry(self, r: IndexedRetirement) -> dict[str, Any]:
        rid = self.retirement_id(r)
        d = r.details
        return {
            "retirementId": rid,
            "retirementIndex": r.retirement_index,
            "certificateUrl": f"{self.settings.public_base_url}/retirements/{rid}/certificate",
            "viewRetirementUrl": f"{self.settings.public_base_url}/retirements/{rid}",
            "amountInTonnes": format_tonnes(r.amount_units),
            "beneficiaryAddress": r.beneficiary,
            "beneficiaryName": d.get("beneficiaryString", ""),
            "beneficiaryLocation": d.get("beneficiaryLocation", ""),
            "message": d.get("retirementMessage", ""),
            "projectId": r.project_id,
            "creditId": f"{r.project_id}-{r.vintage}",
            "registry": r.registry,
            "retiringAddress": r.payer,
            "timestamp": r.block_timestamp,
            "transactionHash": "0x" + r.tx_hash.hex(),
            "blockNumber": r.block_number,
        }

    async def certificate(self, req: ActionRequest) -> dict[str, Any]:
        """Certificate URL(s) of an indexed transaction. Raises ``retirement_not_found``."""
        self.catalog.check_chain(req.chainId)
        require(req, "txHash")
        assert req.txHash is not None
        found = await self.retirements.by_transaction(
            self.chain.chain_id, bytes.fromhex(req.txHash[2:]), req.index
        )
        if not found:
            raise Rejection("retirement_not_found", txHash=req.txHash, retryAfterSeconds=3)
        return {
            "chainId": self.chain.chain_id,
            "transactionHash": req.txHash,
            "retirements": [self.certificate_entry(r) for r in found],
        }


def _hex(value: bytes | None) -> str | None:
    return None if value is None else "0x" + value.hex()
