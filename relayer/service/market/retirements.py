"""The marketplace's retirement views (spec: marketplace-api.md, GET /retirements,
/retirements/{id}, /retirements/{id}/certificate, /retirements/{id}/provenance): indexed
retirements on every indexed chain under the unified id ``{chainId}-{txHash}-{index}``, their
provenance from indexed ERC-1155 transfers, and what their certificate shows. Amounts in tonnes
as decimal strings; timestamps unix seconds as strings.
"""

from __future__ import annotations

from relayer.domain import views
from relayer.domain.amounts import format_tonnes
from relayer.domain.chains import display_name, explorer_tx_url
from relayer.domain.marketplace import (
    ZERO_ADDRESS,
    RetirementId,
    RetirementsQuery,
    Transfer,
    bad_request,
    not_found,
    provenance,
)
from relayer.domain.projects import ProjectRecord
from relayer.domain.retirement import retirement_links, retiring_address
from relayer.service.documents import CertificateView
from relayer.service.market.projects import Page
from relayer.service.market.snapshot import CatalogueSnapshots
from relayer.store.catalogue import CatalogueStore
from relayer.store.identity import ChainIdentity
from relayer.store.retirements import IndexedRetirement, RetirementStore


class RetirementViews:
    """Retirements as the marketplace shows them.

    Args:
        public_base_url: where callers reach this daemon (no trailing slash).
        identity: the recorded genesis of each chain: a retirement links to the public
            block explorer only where its chain is the public one (not a local devnet that
            uses the chain id).
        issuer: who issues the certificates, as each names it.
    """

    def __init__(
        self,
        retirements: RetirementStore,
        store: CatalogueStore,
        snapshots: CatalogueSnapshots,
        public_base_url: str,
        identity: ChainIdentity,
        issuer: str,
    ) -> None:
        self.retirements = retirements
        self.store = store
        self.snapshots = snapshots
        self.chains = snapshots.chains
        self.public_base_url = public_base_url
        self.identity = identity
        self.issuer = issuer
        # a chain's genesis, once recorded, never changes under a running daemon (a reset
        # chain halts it: chain_identity's guard), so a read one is kept
        self._geneses: dict[int, bytes] = {}

    async def geneses(self) -> dict[int, bytes]:
        """The recorded genesis hash of each indexed chain that has one (read until all
        are known, then kept).

        Raises:
            StoreUnavailable: the database failed.
        """
        missing = [c for c in self.chains if c not in self._geneses]
        if missing:
            self._geneses.update(await self.identity.geneses(missing))
        return self._geneses

    async def one(self, rid: RetirementId) -> views.Retirement:
        """GET /retirements/{id} (404 ``retirement_not_found``)."""
        r = await self.retirement(rid)
        return self.retirement_view(r, await self.geneses())

    def retirement_view(self, r: IndexedRetirement, geneses: dict[int, bytes]) -> views.Retirement:
        """One retirement (amount in tonnes, timestamp unix seconds as a string);
        ``geneses``: :meth:`geneses` (``onChainExplorerUrl`` is null unless the recorded
        genesis is the public chain's)."""
        rid = str(RetirementId(r.chain_id, r.tx_hash, r.retirement_index))
        d = r.details
        tx = "0x" + r.tx_hash.hex()
        links = retirement_links(self.public_base_url, rid)
        return {
            "id": rid,
            "chainId": r.chain_id,
            "chain": display_name(r.chain_id),
            "amount": format_tonnes(r.amount_units),
            "hash": tx,
            "index": r.retirement_index,
            "blockNumber": r.block_number,
            "timestamp": str(r.block_timestamp),
            "beneficiaryAddress": r.beneficiary,
            "beneficiaryName": d.get("beneficiaryString", ""),
            "beneficiaryLocation": d.get("beneficiaryLocation", ""),
            "retirementMessage": d.get("retirementMessage", ""),
            "retiringAddress": retiring_address(r.payer, d),
            "retiringName": d.get("retiringEntityString", ""),
            "token": r.credit_token,
            "tokenId": str(r.token_id),
            "creditId": f"{r.project_id}-{r.vintage}",
            "project": {"key": r.project_id, "vintage": str(r.vintage), "registry": r.registry},
            "onChainExplorerUrl": explorer_tx_url(r.chain_id, tx, geneses.get(r.chain_id)),
            "viewRetirementUrl": links["viewRetirementUrl"],
            "certificateUrl": links["certificateUrl"],
            "provenanceUrl": links["provenanceUrl"],
        }

    async def retirement_page(self, q: RetirementsQuery) -> Page:
        """GET /retirements: every indexed chain (or ``chainId``), newest first, one page."""
        if q.chainId is not None and q.chainId not in self.chains:
            raise bad_request(
                "unsupported_chain", f"chain {q.chainId} is not indexed here", supported=sorted(self.chains)
            )
        rows, total = await self.retirements.search(
            q.chainId, q.beneficiaryAddress, q.retiringAddress, q.projectKey, q.offset, q.limit
        )
        geneses = await self.geneses()
        return Page([self.retirement_view(r, geneses) for r in rows], total, q.offset, q.limit)

    async def retirement(self, rid: RetirementId) -> IndexedRetirement:
        """Raises Rejection 404 ``retirement_not_found`` (not indexed, or not yet)."""
        found = (
            await self.retirements.by_transaction(rid.chain_id, rid.tx_hash, rid.index)
            if rid.chain_id in self.chains
            else []
        )
        if not found:
            raise not_found("retirement", str(rid))
        return found[0]

    async def provenance(self, rid: RetirementId) -> list[views.ProvenanceRecord]:
        """GET /retirements/{id}/provenance: origination, transfers and the retirement of the
        retired credit, oldest first, from indexed ERC-1155 transfer events.

        Raises:
            Rejection: 404 ``retirement_not_found``.
        """
        r = await self.retirement(rid)
        transfers = await self.store.transfers_of(r.chain_id, r.credit_token, r.token_id, r.block_number)
        burns = [t for t in transfers if t.tx_hash == r.tx_hash and t.receiver == ZERO_ADDRESS]
        burn = _burn_of(burns, r)
        if burn is None:
            return []
        records: list[views.ProvenanceRecord] = []
        for step in provenance(transfers, burn):
            t = step.transfer
            records.append(
                {
                    "id": f"{r.chain_id}-0x{t.tx_hash.hex()}-{t.log_index}-{t.batch_index}",
                    "transactionType": step.kind,
                    "transactionHash": "0x" + t.tx_hash.hex(),
                    "registrySerialNumbers": [],
                    "token": {"address": r.credit_token, "tokenId": str(r.token_id)},
                    "creditId": f"{r.project_id}-{r.vintage}",
                    "sender": t.sender,
                    "receiver": t.receiver,
                    "originalAmount": format_tonnes(t.amount),
                    "remainingAmount": format_tonnes(step.remaining),
                    "createdAt": str(t.timestamp),
                    "updatedAt": str(t.timestamp),
                }
            )
        return records

    async def certificate(self, rid: RetirementId) -> CertificateView:
        """What a certificate shows (404 ``retirement_not_found``): the indexed retirement
        event, its project's catalogue record (name, country, region, methodologies,
        category; empty when the project is not in the catalogue), the explorer link only on
        the public chain, and this daemon's links."""
        r = await self.retirement(rid)
        view = self.retirement_view(r, await self.geneses())
        snap = await self.snapshots.snapshot()
        record = snap.records.get(r.project_id)
        links = retirement_links(self.public_base_url, view["id"])
        return CertificateView(
            retirement_id=view["id"],
            chain_id=r.chain_id,
            chain_name=view["chain"],
            transaction_hash=view["hash"],
            retirement_index=r.retirement_index,
            beneficiary_name=view["beneficiaryName"],
            beneficiary_address=r.beneficiary,
            retiring_address=view["retiringAddress"],
            retiring_name=view["retiringName"],
            message=view["retirementMessage"],
            amount_tonnes=view["amount"],
            project_key=r.project_id,
            project_name="" if record is None else record.name,
            vintage=str(r.vintage),
            registry=r.registry,
            timestamp=r.block_timestamp,
            verify_url=f"{self.public_base_url}/retirements/{view['id']}",
            view_url=links["viewRetirementUrl"],
            explorer_url=view["onChainExplorerUrl"] or "",
            project_country="" if record is None else record.country,
            project_region="" if record is None else record.region,
            methodology="" if record is None else methodology_text(record),
            project_category="" if record is None else record.category,
            registry_serials=(),  # the retirement event carries none, nor does the catalogue
            issuer=self.issuer,
        )


def methodology_text(record: ProjectRecord) -> str:
    """A record's methodologies as one line: each "code — name" (or whichever it has),
    joined by "; " ("" when the source named none)."""
    parts = [" — ".join(p for p in (m.id, m.name) if p) for m in record.methodologies]
    return "; ".join(p for p in parts if p)


def _burn_of(burns: list[Transfer], r: IndexedRetirement) -> Transfer | None:
    """The burn of this retirement among its transaction's burns of the credit: the one at its
    index's rank when several retire the same credit in one transaction."""
    matching = [t for t in burns if t.amount == r.amount_units] or burns
    if not matching:
        return None
    return matching[min(r.retirement_index, len(matching) - 1)]
