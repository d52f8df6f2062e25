"""HTML for people, JSON for machines (relayer/api/pages.py): the Accept negotiation by
q-values, the page frame's CSP and escaping, and the guides' Markdown as sanitised HTML."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from relayer.api import pages

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


@pytest.mark.parametrize(
    ("accept", "html"),
    [
        (None, False),  # no Accept: a machine
        ("", False),
        ("*/*", False),  # curl: both equal, JSON wins the tie
        ("application/json", False),
        ("application/json, text/html", False),  # equal q: JSON
        ("text/html;q=0.5, application/json", False),
        ("text/html;q=0", False),
        ("text/*;q=0.9, application/json;q=0.8", True),
        ("text/html", True),
        (BROWSER, True),  # Chromium / Firefox navigation
        ("text/html, application/json;q=0.9", True),
        ("application/json;q=0.1, */*", True),  # text/html gets 1 through */*
        ("text/html;q=bogus", False),
        ("TEXT/HTML", True),
        ("text/html;q=2", False),  # out of range counts 0
    ],
)
def test_wants_html_by_q_values(accept: str | None, html: bool) -> None:
    headers = {} if accept is None else {"Accept": accept}
    assert pages.wants_html(make_mocked_request("GET", "/", headers=headers)) is html


@pytest.mark.parametrize(
    ("accept", "media", "q"),
    [
        ("text/html;q=0.3, text/*;q=0.6, */*;q=0.9", "text/html", 0.3),  # most specific wins
        ("text/*;q=0.6, */*;q=0.9", "text/html", 0.6),
        ("*/*;q=0.9", "application/json", 0.9),
        ("image/png", "text/html", 0.0),
    ],
)
def test_quality_takes_the_most_specific_range(accept: str, media: str, q: float) -> None:
    assert pages.quality(accept, media) == q


def test_markdown_is_rendered_and_raw_html_escaped() -> None:
    out = pages.markdown_html(
        "# Title\n\nSome `code` and a [link](https://example.org).\n\n"
        "<script>alert(1)</script>\n\n[bad](javascript:alert(1))\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    )
    assert "<h1>Title</h1>" in out and "<code>code</code>" in out
    assert '<a href="https://example.org">link</a>' in out
    assert "<script>" not in out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert 'href="javascript' not in out
    assert "<table>" in out and "<td>1</td>" in out


def test_page_frame_escapes_title_and_nav_and_forbids_scripts() -> None:
    text = pages.page('<b>"x"</b>', "<h1>body</h1>", [("/?a=1&b=2", "<i>nav</i>")])
    assert "<title>&lt;b&gt;&quot;x&quot;&lt;/b&gt;</title>" in text
    assert '<a href="/?a=1&amp;b=2">&lt;i&gt;nav&lt;/i&gt;</a>' in text
    assert f'<meta http-equiv="Content-Security-Policy" content="{pages.CSP}">' in text
    assert "script-src" not in pages.CSP and "default-src 'none'" in pages.CSP
    response = pages.html_response(text)
    assert response.headers["Content-Security-Policy"] == pages.CSP
    assert response.headers["Vary"] == "Accept"
    assert response.content_type == "text/html" and response.charset == "utf-8"
