"""The certificate as a person gets it (issue 37, item 4): the PDF rendered to a picture by
poppler's ``pdftoppm``, and the HTML page printed to PDF by headless Chromium and rendered the
same way. On each picture: the page is filled (ink from the top band to the issuer's statement
near the foot, no empty band of more than an eighth of the page), its QR code, read back from
the pixels with zxing-cpp as a phone would, opens the verification page, and the text extracts
(``pdftotext``). Needs Chromium and poppler only (no Postgres, no anvil): skipped without them,
failed without them in CI."""

from __future__ import annotations

import asyncio
import io
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zxingcpp
from PIL import Image
from pypdf import PdfReader

from relayer.service.documents import (
    MAX_CHARS,
    MAX_SERIALS,
    SERIAL_MAX_CHARS,
    CertificateView,
    certificate_html,
    certificate_pdf,
)
from relayer_dev.pictures import SAMPLE, render
from tests.browser import print_to_pdf, require_chromium, require_poppler
from tests.helpers.certificates import RID, TX, view
from tests.helpers.loopback import pages_app, served

pytestmark = pytest.mark.timeout(120)

DPI = 150
VIEW_URL = f"http://127.0.0.1:8402/retirements/{RID}/certificate?format=html"
MULTI_SCRIPT = "Café Zürich — 北京 Ёж Ελλάδα 서울"
RTL_MESSAGE = "שלום עולם · مرحبا بالعالم"


def picture(pdf: Path) -> Image.Image:
    """The PDF's one page as a greyscale picture at :data:`DPI`."""
    require_poppler()
    stem = pdf.with_suffix("")
    subprocess.run(
        ["pdftoppm", "-png", "-gray", "-r", str(DPI), "-singlefile", str(pdf), str(stem)], check=True
    )
    with Image.open(stem.with_suffix(".png")) as image:
        return image.convert("L")


def text_of(pdf: Path) -> str:
    """The page's text as poppler extracts it, its lines joined by spaces."""
    out = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, check=True)
    return " ".join(out.stdout.decode("utf-8").split())


def inked_rows(image: Image.Image) -> list[bool]:
    """For each pixel row: whether it holds ink (any pixel darker than mid-grey)."""
    dark = image.point(lambda v: 255 if v < 128 else 0)
    rows = dark.resize((1, image.height), Image.Resampling.BOX)  # a row's mean darkness
    return [rows.getpixel((0, y)) != 0 for y in range(image.height)]


def assert_filled(image: Image.Image) -> None:
    """Ink starts in the page's top tenth and ends in its bottom fifth, and no blank band
    between is taller than an eighth of the page (a body that stopped half-way, a foot that
    floated up)."""
    rows = inked_rows(image)
    h = image.height
    first = rows.index(True)
    last = h - 1 - rows[::-1].index(True)
    assert first < h * 0.10, f"the first ink is at {first / h:.0%} of the page"
    assert last > h * 0.80, f"the last ink is at {last / h:.0%} of the page"
    gap = longest = 0
    for inked in rows[first : last + 1]:
        gap = 0 if inked else gap + 1
        longest = max(longest, gap)
    assert longest < h / 8, f"a blank band of {longest / h:.0%} of the page"


def qr_codes(image: Image.Image) -> list[str]:
    """The text of every QR code zxing-cpp finds in the picture."""
    return [b.text for b in zxingcpp.read_barcodes(image) if b.format == zxingcpp.BarcodeFormat.QRCode]


def at_every_bound(letter: str, word_len: int) -> CertificateView:
    """Every string field at its bound in words of ``letter`` (the worst case for the page),
    the view URL kept (so its QR code can be checked)."""
    word = letter * word_len + " "
    filled = {
        name: word * (bound // len(word) + 2) for name, bound in MAX_CHARS.items() if name != "view_url"
    }
    serials = (word * (SERIAL_MAX_CHARS // len(word) + 2),) * (MAX_SERIALS + 3)
    return view(chain_id=10**40, registry_serials=serials, **filled)


@pytest.mark.parametrize(
    "certificate",
    [
        pytest.param(view(), id="latin"),
        pytest.param(view(beneficiary_name=MULTI_SCRIPT, message=RTL_MESSAGE), id="every-script"),
        pytest.param(view(beneficiary_name="", retiring_name="", message="", project_name=""), id="sparse"),
        pytest.param(at_every_bound("W", 7), id="every-field-at-its-bound"),
    ],
)
def test_pdf_page_is_filled_and_its_qr_code_opens_the_verification_page(
    certificate: CertificateView, tmp_path: Path
) -> None:
    pdf = tmp_path / "certificate.pdf"
    pdf.write_bytes(certificate_pdf(certificate))
    assert len(PdfReader(pdf).pages) == 1
    image = picture(pdf)
    assert (round(image.width / 10), image.height) == (124, 1754)  # A4 at 150 dpi
    assert_filled(image)
    assert qr_codes(image) == [VIEW_URL]
    text = text_of(pdf)
    assert "CERTIFICATE OF CARBON RETIREMENT" in text and "VERIFY THIS CERTIFICATE" in text
    if certificate == view():
        for line in (
            "1.5 tonnes CO₂e retired",
            "for the benefit of Alice Müller",
            "Wednesday, 1 May 2024 at 12:00:00 UTC",
            "Mashonaland West, Zimbabwe",
            "Issued by Carbon Relay Ltd",
        ):
            assert line in text, line


@pytest.fixture
async def served_pages() -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A loopback server of HTML pages (path to page) and its base URL."""
    pages: dict[str, str] = {}
    async with served(pages_app(pages)) as base:
        yield base, pages


@pytest.mark.parametrize(
    "certificate",
    [
        pytest.param(view(), id="latin"),
        pytest.param(view(beneficiary_name=MULTI_SCRIPT, message=RTL_MESSAGE), id="every-script"),
    ],
)
async def test_html_page_prints_on_one_filled_a4_page_with_a_readable_qr_code(
    certificate: CertificateView, served_pages: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    require_chromium()
    base, pages = served_pages
    pages["/certificate.html"] = certificate_html(certificate)
    pdf = tmp_path / "printed.pdf"
    data = await asyncio.to_thread(print_to_pdf, base + "/certificate.html", pdf, 60)
    reader = PdfReader(io.BytesIO(data))
    assert len(reader.pages) == 1
    box = reader.pages[0].mediabox
    assert (round(float(box.width)), round(float(box.height))) == (595, 842)  # A4 in points
    image = picture(pdf)
    rows = inked_rows(image)
    assert rows.index(True) < image.height * 0.10
    assert image.height - rows[::-1].index(True) > image.height * 0.70  # printed: the foot ends the text
    assert qr_codes(image) == [VIEW_URL]
    text = text_of(pdf)
    assert "Wednesday, 1 May 2024 at 12:00:00 UTC" in text
    assert f"https://sepolia.basescan.org/tx/{TX[:20]}" in text
    assert (certificate.beneficiary_name or "not given") in text


def test_the_docs_pictures_render_and_their_qr_codes_read(tmp_path: Path) -> None:
    """``make pictures`` (relayer_dev/pictures.py): both pictures made, each a filled A4
    page whose QR code opens the sample's verification page."""
    chromium = require_chromium()
    require_poppler()
    made = render(tmp_path, chromium=chromium, dpi=DPI)
    assert [p.name for p in made] == ["certificate-pdf.png", "certificate-html.png"]
    for path in made:
        with Image.open(path) as image:
            grey = image.convert("L")
        assert qr_codes(grey) == [SAMPLE.view_url], path.name
        rows = inked_rows(grey)
        assert (
            rows.index(True) < grey.height * 0.10 and grey.height - rows[::-1].index(True) > grey.height * 0.7
        )
