"""The certificate's pictures in the docs (``docs/images/certificate-pdf.png`` and
``certificate-html.png``): a sample retirement rendered as the PDF (poppler's ``pdftoppm``) and
as the HTML page printed by headless Chromium, both at 80 dpi. Run with
``python -m relayer_dev pictures`` (``make pictures``) after changing the certificate."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Final

from relayer.service.documents import CertificateView, certificate_html, certificate_pdf

TX: Final = "0x9c1f4b6e2a7d8c3f5e0b1a2d4c6e8f0a1b3c5d7e9f2a4b6c8d0e1f3a5b7c9d2e"
RID: Final = f"84532-{TX}-0"
BASE: Final = "https://relay.example.org"
SAMPLE: Final = CertificateView(
    retirement_id=RID,
    chain_id=84532,
    chain_name="Base Sepolia",
    transaction_hash=TX,
    retirement_index=0,
    beneficiary_name="Müller & Söhne GmbH",
    beneficiary_address="0x5B38Da6a701c568545dCfcB03FcB875f56beddC4",
    retiring_address="0xAb8483F64d9C6d1EcF9b849Ae677dD3315835cb2",
    retiring_name="Acme Travel",
    message="Offsetting our team's 2024 flights to Nairobi and Tokyo",
    amount_tonnes="2.5",
    project_key="VCS-1052",
    project_name="Kasigau Corridor REDD+ Project - Phase II The Community Ranches",
    vintage="2019",
    registry="VCS",
    timestamp=1_714_564_800,
    verify_url=f"{BASE}/retirements/{RID}",
    view_url=f"{BASE}/retirements/{RID}/certificate?format=html",
    explorer_url=f"https://sepolia.basescan.org/tx/{TX}",
    project_country="Kenya",
    project_region="Taita-Taveta",
    methodology="VM0009 — Methodology for Avoided Ecosystem Conversion",
    project_category="Forestry",
    registry_serials=(),
    issuer="Carbon Relay Ltd",
)
"""A plausible retirement on the public Base Sepolia (so its explorer link shows)."""
CHROMIUM_FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-pdf-header-footer",
)


def render(out_dir: Path, chromium: str = "chromium", dpi: int = 80) -> list[Path]:
    """Write ``certificate-pdf.png`` and ``certificate-html.png`` (one A4 page each) into
    ``out_dir``; returns their paths.

    Raises:
        subprocess.CalledProcessError: pdftoppm or Chromium failed.
        subprocess.TimeoutExpired: Chromium took more than 60 s.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pictures-") as tmp:
        work = Path(tmp)
        (work / "certificate.pdf").write_bytes(certificate_pdf(SAMPLE))
        (work / "certificate.html").write_text(certificate_html(SAMPLE), encoding="utf-8")
        subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={work / 'profile'}",
             f"--print-to-pdf={work / 'printed.pdf'}", (work / "certificate.html").as_uri()],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        made = []
        for source, name in (("certificate.pdf", "certificate-pdf"), ("printed.pdf", "certificate-html")):
            stem = out_dir / name
            subprocess.run(
                ["pdftoppm", "-png", "-r", str(dpi), "-singlefile", str(work / source), str(stem)], check=True
            )
            made.append(stem.with_suffix(".png"))
    return made
