"""Certificates of indexed retirements: the ``certificate`` action and the certificate
entry every settled answer carries (spec: certificate; retirement_not_found). Retirement
ids are ``{chainId}-{txHash}-{retirementIndex}``."""

from __future__ import annotations

from relayer.domain import views
from relayer.domain.amounts import format_tonnes
from relayer.domain.errors import Rejection
from relayer.domain.retirement import retirement_links, retiring_address
from relayer.domain.schemas import ActionRequest, require
from relayer.service.supply import Supply
from relayer.store.retirements import IndexedRetirement, RetirementStore


class Certificates:
    """Looks retirements up by transaction and shapes their certificate entries.

    Args:
        public_base_url: where callers reach this daemon (no trailing slash).
    """

    def __init__(self, retirements: RetirementStore, supply: Supply, public_base_url: str) -> None:
        self.retirements = retirements
        self.supply = supply
        self.chain_id = supply.chain_id
        self.public_base_url = public_base_url

    def entry(self, r: IndexedRetirement) -> views.CertificateEntry:
        """One retirement's certificate entry (amount in tonnes, timestamp unix seconds)."""
        rid = f"{r.chain_id}-0x{r.tx_hash.hex()}-{r.retirement_index}"
        d = r.details
        links = retirement_links(self.public_base_url, rid)
        return {
            "retirementId": rid,
            "retirementIndex": r.retirement_index,
            "certificateUrl": links["certificateUrl"],
            "viewRetirementUrl": links["viewRetirementUrl"],
            "amountInTonnes": format_tonnes(r.amount_units),
            "beneficiaryAddress": r.beneficiary,
            "beneficiaryName": d.get("beneficiaryString", ""),
            "beneficiaryLocation": d.get("beneficiaryLocation", ""),
            "message": d.get("retirementMessage", ""),
            "projectId": r.project_id,
            "creditId": f"{r.project_id}-{r.vintage}",
            "registry": r.registry,
            "retiringAddress": retiring_address(r.payer, d),
            "timestamp": r.block_timestamp,
            "transactionHash": "0x" + r.tx_hash.hex(),
            "blockNumber": r.block_number,
        }

    async def certificate(self, request: ActionRequest) -> views.CertificateAnswer:
        """Certificate URL(s) of an indexed transaction (optionally one ``index``).

        Raises:
            Rejection: schema_validation (no ``txHash``, or a ``chainId`` not served here),
                retirement_not_found (not indexed, or not yet: poll again).
            Unavailable: the database failed.
        """
        self.supply.check_chain_field(request.chainId)
        require(request, "txHash")
        assert request.txHash is not None
        found = await self.retirements.by_transaction(
            self.chain_id, bytes.fromhex(request.txHash[2:]), request.index
        )
        if not found:
            raise Rejection("retirement_not_found", txHash=request.txHash, retryAfterSeconds=3)
        return {
            "chainId": self.chain_id,
            "transactionHash": request.txHash,
            "retirements": [self.entry(r) for r in found],
        }
