"""HTML pages for people beside the JSON for machines: content negotiation on ``Accept``, one
page frame (inline CSS, no scripts, a strict Content-Security-Policy) and the guides'
Markdown rendered to HTML with markdown-it-py (CommonMark; raw HTML in the source is escaped,
``javascript:``-style links are refused).

A route answers HTML only when the client prefers it: the quality of ``text/html`` (or its
wildcards ``text/*``, ``*/*``, the most specific range deciding) is above zero and strictly
above that of ``application/json``. So a browser (``text/html,…,*/*;q=0.8``) gets HTML, while no
``Accept``, ``*/*``, ``application/json`` and ``text/html;q=0.5, application/json`` get JSON.
Each such answer carries ``Vary: Accept``.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Final

from aiohttp import web
from markdown_it import MarkdownIt

from relayer.service.styles import BASE_CSS, content_security_policy, html_document

CSP: Final = content_security_policy()
"""The pages' Content-Security-Policy (header and meta tag): inline CSS only, nothing loaded."""

_CSS: Final = (
    BASE_CSS
    + """
nav { font-size: .9rem; margin-bottom: 1rem; }
nav a { margin-right: 1rem; }
h1 { font-size: 1.8rem; margin: .25rem 0 1rem; }
h2 { font-size: 1.3rem; margin-top: 1.75rem; }
code { background: #f2f5f3; padding: 0 .2em; border-radius: 3px; }
pre { background: #f2f5f3; padding: .75rem 1rem; overflow-x: auto; border-radius: 4px; }
pre code { background: none; padding: 0; }
table { border-collapse: collapse; }
th, td { border: 1px solid #dde3df; padding: .3rem .6rem; text-align: left; vertical-align: top; }
dt { margin-top: .6rem; color: inherit; }
dd { margin: .1rem 0 0 0; }
.summary { color: #4a5650; }"""
)

_HTML: Final = "text/html"
_JSON: Final = "application/json"
_MARKDOWN: Final = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable(
    "table"
)


def _ranges(accept: str) -> Iterable[tuple[str, float]]:
    """``(media range, q)`` of each element of an ``Accept`` value (a bad ``q`` counts 0)."""
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if not media:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
                q = q if 0.0 <= q <= 1.0 else 0.0
        yield media.lower(), q


def quality(accept: str, media_type: str) -> float:
    """The q-value ``accept`` gives ``media_type`` (``type/subtype``): that of the most
    specific matching range (exact, then ``type/*``, then ``*/*``); 0 when none matches."""
    kind = media_type.split("/", 1)[0]
    best: tuple[int, float] = (-1, 0.0)
    for media, q in _ranges(accept):
        rank = 2 if media == media_type else 1 if media == f"{kind}/*" else 0 if media == "*/*" else -1
        if rank > best[0]:
            best = (rank, q)
    return best[1]


def wants_html(request: web.Request) -> bool:
    """True when the request's ``Accept`` prefers ``text/html`` over ``application/json``
    (strictly; see the module's rule). No ``Accept`` header: False."""
    accept = request.headers.get("Accept", "")
    html_q = quality(accept, _HTML)
    return html_q > 0 and html_q > quality(accept, _JSON)


def e(text: object) -> str:
    """``text`` escaped for HTML text and quoted attributes."""
    return html.escape(str(text), quote=True)


def markdown_html(markdown: str) -> str:
    """CommonMark (plus tables) to HTML; raw HTML in ``markdown`` is shown as text."""
    rendered: str = _MARKDOWN.render(markdown)
    return rendered


def page(title: str, body: str, nav: Iterable[tuple[str, str]] = ()) -> str:
    """A whole HTML5 page.

    Args:
        title: plain text (escaped here), the ``<title>`` and nothing else.
        body: HTML, already escaped by the caller (it holds the ``<h1>``).
        nav: ``(href, label)`` links above the body (escaped here).
    """
    links = "".join(f'<a href="{e(href)}">{e(label)}</a>' for href, label in nav)
    nav_html = f"<nav>{links}</nav>\n" if links else ""
    return html_document(e(title), CSP, _CSS, f"{nav_html}{body}")


def html_response(text: str) -> web.Response:
    """``text/html; charset=utf-8`` with the CSP header, ``nosniff`` and ``Vary: Accept``."""
    return web.Response(
        text=text,
        content_type=_HTML,
        charset="utf-8",
        headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Vary": "Accept"},
    )
