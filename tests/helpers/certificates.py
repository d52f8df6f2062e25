"""A plausible retirement certificate (:class:`CertificateView`) and the fields its HTML
shows, shared by the renderers' pure tests and the browser tests."""

from __future__ import annotations

import dataclasses
from typing import Any

from relayer.service.documents import CertificateView

TX = "0x" + "3f" * 32
"""The certificate's transaction hash (0x hex, 32 bytes)."""
RID = f"84532-{TX}-0"
"""Its retirement id: ``<chain id>-<transaction hash>-<retirement index>``."""
TIMESTAMP = 1_714_564_800  # 2024-05-01T12:00:00Z
"""Its retirement's block time (unix seconds)."""
HOSTILE_IMG = "<img src=x onerror=alert(1)>"
"""Markup a name may hold: shown as text, never run."""


def view(**changes: Any) -> CertificateView:
    """A plausible retirement (1.5 t of VCS-10 on Base Sepolia, :data:`TX`, :data:`RID`,
    :data:`TIMESTAMP`, its explorer link as on the public chain, no registry serial numbers),
    with ``changes`` (its fields) applied."""
    base = CertificateView(
        retirement_id=RID,
        chain_id=84532,
        chain_name="Base Sepolia",
        transaction_hash=TX,
        retirement_index=0,
        beneficiary_name="Alice Müller",
        beneficiary_address="0x5B38Da6a701c568545dCfcB03FcB875f56beddC4",
        retiring_address="0xAb8483F64d9C6d1EcF9b849Ae677dD3315835cb2",
        retiring_name="Acme Travel",
        message="Offsetting our 2024 flights",
        amount_tonnes="1.5",
        project_key="VCS-10",
        project_name="Kariba REDD+",
        vintage="2019",
        registry="VCS",
        timestamp=TIMESTAMP,
        verify_url=f"http://127.0.0.1:8402/retirements/{RID}",
        view_url=f"http://127.0.0.1:8402/retirements/{RID}/certificate?format=html",
        explorer_url=f"https://sepolia.basescan.org/tx/{TX}",
        project_country="Zimbabwe",
        project_region="Mashonaland West",
        methodology="VM0009 — Methodology for Avoided Ecosystem Conversion",
        project_category="Forestry",
        registry_serials=(),
        issuer="Carbon Relay Ltd",
    )
    return dataclasses.replace(base, **changes)


EXPECTED_FIELDS = {
    "beneficiary_name": "Alice Müller",
    "beneficiary_address": "0x5B38Da6a701c568545dCfcB03FcB875f56beddC4",
    "amount_tonnes": "1.5",
    "project": "VCS-10 — Kariba REDD+",
    "project_key": "VCS-10",
    "project_name": "Kariba REDD+",
    "vintage": "2019",
    "registry": "VCS",
    "transaction_hash": TX,
    "retirement_id": RID,
    "chain": "Base Sepolia (chain id 84532)",
    "chain_name": "Base Sepolia",
    "chain_id": "84532",
    "timestamp": "Wednesday, 1 May 2024 at 12:00:00 UTC",
    "message": "Offsetting our 2024 flights",
    "retiring_name": "Acme Travel",
    "retiring_address": "0xAb8483F64d9C6d1EcF9b849Ae677dD3315835cb2",
    "verify_url": f"http://127.0.0.1:8402/retirements/{RID}",
    "view_url": f"http://127.0.0.1:8402/retirements/{RID}/certificate?format=html",
    "explorer_url": f"https://sepolia.basescan.org/tx/{TX}",
    "place": "Mashonaland West, Zimbabwe",
    "methodology": "VM0009 — Methodology for Avoided Ecosystem Conversion",
    "project_category": "Forestry",
    "issuer": "Carbon Relay Ltd",
    "qr_code": "",
}
"""The text of each ``data-field`` of :func:`view`'s HTML certificate (by field name)."""
