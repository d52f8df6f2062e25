"""The certificate's HTML page as a browser gets it: served over HTTP on loopback by a tiny
aiohttp server, loaded in headless Chromium, and read back from the DOM Chromium rendered.
Needs Chromium only (no Postgres, no anvil): skipped without it, failed without it in CI."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from relayer.service.documents import CertificateView, certificate_html
from tests.browser import dump_dom, read_dom, require_chromium
from tests.helpers.certificates import EXPECTED_FIELDS, HOSTILE_IMG, view
from tests.helpers.loopback import pages_app, served

pytestmark = pytest.mark.timeout(90)

# Would leave a trace in the DOM (or a request to /x, /pwned) if any of it ran or loaded.
HOSTILE_SCRIPT = "<script>document.title='pwned';document.body.dataset.pwned='1'</script>"
HOSTILE_STYLE = "</span><style>@import url(/pwned.css)</style><link rel=stylesheet href=/pwned2.css>"


@dataclass
class Site:
    """Pages served at ``base_url + path``, and every path the browser asked for."""

    base_url: str
    pages: dict[str, str]
    requested: list[str] = field(default_factory=list)


@pytest.fixture
def chromium() -> str:
    return require_chromium()


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    pages: dict[str, str] = {}
    requested: list[str] = []
    async with served(pages_app(pages, requested)) as base:
        yield Site(base, pages, requested)


async def render(site: Site, path: str, certificate: CertificateView) -> str:
    """Serve the certificate at ``path`` and return the DOM Chromium made of it."""
    site.pages[path] = certificate_html(certificate)
    return await asyncio.to_thread(dump_dom, site.base_url + path, 30)


async def test_browser_shows_every_field(chromium: str, site: Site) -> None:
    dom = read_dom(await render(site, "/certificate", view()))
    for name, expected in EXPECTED_FIELDS.items():
        assert dom.text(name) == expected, name
    assert set(dom.fields) == set(EXPECTED_FIELDS)
    assert site.requested == ["/certificate"]  # no stylesheet, font, image or favicon


async def test_browser_shows_hostile_text_as_text(chromium: str, site: Site) -> None:
    certificate = view(
        beneficiary_name=HOSTILE_IMG,
        message=HOSTILE_SCRIPT,
        retiring_name=HOSTILE_STYLE,
        project_name="\u202eevil\u202c 中文 😀",
    )
    rendered = await render(site, "/hostile", certificate)
    dom = read_dom(rendered)
    assert dom.text("beneficiary_name") == HOSTILE_IMG
    assert dom.text("message") == HOSTILE_SCRIPT
    assert dom.text("retiring_name") == HOSTILE_STYLE
    assert dom.text("project_name") == "evil 中文 😀"
    assert not {"img", "script", "link"} & set(dom.tags)
    assert dom.tags.count("style") == 1  # the page's own
    assert "pwned" not in rendered.split("<body", 1)[0]  # the title is untouched
    assert 'data-pwned="1"' not in rendered
    assert site.requested == ["/hostile"]  # nothing fetched /x or /pwned*.css
    for name, expected in EXPECTED_FIELDS.items():
        if name not in {"beneficiary_name", "message", "retiring_name", "project_name", "project"}:
            assert dom.text(name) == expected, name
