"""What a person sees (issue 21 item 4): ``/``, ``/api/docs`` and a guide from the running
daemon (real Postgres and anvil) and a certificate with a multi-script name, as HTML and as
PDF, each loaded in headless Chromium (the PDF drawn by poppler's ``pdftoppm``) and saved as a
PNG under pytest's tmp dir (printed with -s; never committed). Checks: the pages' titles and
headings in the DOM Chromium built, JSON still for machines, the PDF's text read back exactly
(pypdf and poppler's ``pdftotext``), its fonts embedded, and no glyph missing (fpdf2 logs one).

Without Chromium or poppler-utils the tests are skipped, or fail when ``CI`` is set."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import subprocess
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from pypdf import PdfReader

from relayer.api.x402_versions import GUIDE_IDS
from relayer.service.documents import certificate_html, certificate_pdf
from tests.browser import dump_dom, read_dom, require_chromium, require_poppler, screenshot
from tests.conftest import Daemon
from tests.helpers.certificates import view
from tests.helpers.loopback import served

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NAME = "Café Zürich — 北京 Ёж Ελλάδα 서울"
EMOJI = "🌳"
MESSAGE = "שלום עולם · مرحبا بالعالم"


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("screenshots")
    print(f"\nscreenshots in {path}")
    return path


def assert_picture(png: bytes, width: int, height: int) -> None:
    """A PNG of that size that is not one flat colour (a blank or failed render)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (width, height)
    idat, at = b"", 8
    while at < len(png):  # chunks: length, type, data, CRC
        length = int.from_bytes(png[at : at + 4], "big")
        if png[at + 4 : at + 8] == b"IDAT":
            idat += png[at + 8 : at + 8 + length]
        at += 12 + length
    assert len(set(zlib.decompress(idat))) > 40, "the picture is (nearly) one colour"


async def shot(url: str, png: Path) -> bytes:
    data = await asyncio.to_thread(screenshot, url, png, 1000, 1400)
    assert_picture(data, 1000, 1400)
    return data


def heading(dom: str) -> str:
    found = re.search(r"<h1[^>]*>(.*?)</h1>", dom, re.S)
    assert found, dom[:500]
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


def title(dom: str) -> str:
    found = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert found
    return found.group(1)


async def test_root_docs_and_a_guide_in_a_browser(daemon: Daemon, shots: Path) -> None:
    require_chromium()
    base = daemon.base_url
    for path, h1 in (
        ("/", "x402 carbon retirement endpoint"),
        ("/api/docs", "Guides"),
        ("/api/docs?id=quick-start", "Quick start"),
    ):
        dom = await asyncio.to_thread(dump_dom, base + path, 30)
        assert heading(dom) == h1, path
        assert "{" not in title(dom), path  # a page, not JSON shown as text
        assert "<pre" not in dom.split("<main>", 1)[0], path
        await shot(
            base + path, shots / f"{path.strip('/').replace('/', '_').replace('?', '_') or 'root'}.png"
        )
    dom = await asyncio.to_thread(dump_dom, base + "/api/docs", 30)
    assert all(f'href="?id={gid}"' in dom for gid in GUIDE_IDS)
    # machines still get JSON: no Accept, */* and application/json
    for accept in (None, "*/*", "application/json"):
        headers = {} if accept is None else {"Accept": accept}
        for path in ("/", "/api/docs"):
            async with daemon.session.get(base + path, headers=headers) as r:
                assert (r.status, r.content_type, r.headers["Vary"]) == (200, "application/json", "Accept")
                await r.json()


@pytest.fixture
async def certificate_site() -> AsyncIterator[str]:
    """A loopback server of one certificate (the multi-script one) as HTML and PDF."""
    certificate = view(beneficiary_name=f"{NAME} {EMOJI}", message=MESSAGE, amount_tonnes="1")
    pdf = await asyncio.to_thread(certificate_pdf, certificate)

    async def html(_request: web.Request) -> web.Response:
        return web.Response(text=certificate_html(certificate), content_type="text/html", charset="utf-8")

    async def pdf_file(_request: web.Request) -> web.Response:
        return web.Response(body=pdf, content_type="application/pdf")

    app = web.Application()
    app.router.add_get("/certificate.html", html)
    app.router.add_get("/certificate.pdf", pdf_file)
    async with served(app) as base:
        yield base


async def test_multi_script_certificate_as_html_and_pdf(
    certificate_site: str, shots: Path, caplog: pytest.LogCaptureFixture
) -> None:
    require_chromium()
    require_poppler()
    url = certificate_site + "/certificate.html"
    dom = read_dom(await asyncio.to_thread(dump_dom, url, 30))
    assert dom.text("beneficiary_name") == f"{NAME} {EMOJI}"
    assert dom.text("message") == MESSAGE
    assert dom.text("amount_tonnes") == "1"
    await shot(url, shots / "certificate-html.png")

    caplog.set_level(logging.WARNING, logger="fpdf")
    certificate_pdf.cache_clear()
    async with aiohttp.ClientSession() as session, session.get(certificate_site + "/certificate.pdf") as r:
        data = await r.read()
    fresh = certificate_pdf(view(beneficiary_name=f"{NAME} {EMOJI}", message=MESSAGE, amount_tonnes="1"))
    assert fresh == data  # deterministic, and rendered here under caplog
    assert not [rec for rec in caplog.records if "missing" in rec.getMessage()], "a glyph is missing (tofu)"
    pdf_path = shots / "certificate.pdf"
    pdf_path.write_bytes(data)
    poppler = subprocess.run(["pdftotext", "-layout", str(pdf_path), "-"], capture_output=True, check=True)
    text = poppler.stdout.decode("utf-8")
    assert f"{NAME} [deciduous tree]" in text
    assert "1 tonne CO₂e retired" in text
    (page,) = PdfReader(io.BytesIO(data)).pages
    assert f"{NAME} [deciduous tree]" in page.extract_text().replace("\x00", "")
    fonts = subprocess.run(["pdffonts", str(pdf_path)], capture_output=True, check=True).stdout.decode()
    rows = fonts.splitlines()[2:]
    assert len(rows) == 4 and all(" yes yes yes " in row for row in rows), (
        fonts
    )  # embedded, subset, ToUnicode
    subprocess.run(
        ["pdftoppm", "-png", "-r", "80", "-singlefile", str(pdf_path), str(shots / "certificate-pdf")],
        check=True,
    )
    png = (shots / "certificate-pdf.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
