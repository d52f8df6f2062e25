"""The one stylesheet of every HTML page this daemon serves (the guides and documentation
pages, the retirement certificate): its palette, base rules and Content-Security-Policy, each
page adding only its own rules. Inline CSS only; nothing is ever loaded (no script, image,
frame or remote font)."""

from __future__ import annotations

from typing import Final

GREEN: Final = "#2f6b4f"
"""The accent (borders, headings, links)."""
INK: Final = "#1d2421"
MUTED: Final = "#4a5650"
RULE: Final = "#dde3df"

BASE_CSS: Final = f"""
:root {{ color-scheme: light; }}
* {{ box-sizing: border-box; }}
body {{ margin: 0; background: #eef1ee; color: {INK};
  font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", "Helvetica Neue",
  Arial, sans-serif; }}
main {{ max-width: 52rem; margin: 2rem auto; padding: 1.75rem 2.5rem 2rem; background: #fff;
  border: 1px solid #c9d3cc; border-top: 6px solid {GREEN}; border-radius: 4px; }}
a {{ color: {GREEN}; }}
code, pre {{ font: .84rem/1.45 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }}
code {{ overflow-wrap: anywhere; }}
h1 {{ line-height: 1.2; }}
dt {{ font-weight: 600; color: {MUTED}; }}
dd {{ margin: 0; min-width: 0; }}
@media (max-width: 36rem) {{ main {{ margin: 0; padding: 1.25rem; }} }}
""".strip()
"""The rules every page starts from (the body's font stack ends ``Arial, sans-serif;``: a page
may append families to it there)."""


def content_security_policy(*, fonts_inline: bool = False, framed: bool = False) -> str:
    """The pages' Content-Security-Policy (a constant without ``"`` or ``&``, so it goes into
    a meta tag's attribute as is): inline CSS only, nothing loaded; ``fonts_inline`` allows
    ``data:`` fonts (the certificate embeds font subsets), else none; ``framed`` False forbids
    every frame ancestor."""
    parts = [
        "default-src 'none'",
        "style-src 'unsafe-inline'",
        "img-src 'none'",
        "font-src data:" if fonts_inline else "font-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
    ]
    if not framed:
        parts.append("frame-ancestors 'none'")
    return "; ".join(parts)


def html_document(title_html: str, csp: str, css: str, main_html: str) -> str:
    """A whole HTML5 page: UTF-8, the Content-Security-Policy ``csp`` in a meta tag, no
    referrer, the mobile viewport, the ``<title>`` (``title_html``: already escaped), the
    page's stylesheet ``css`` inline and its content ``main_html`` (already escaped) in
    ``<main>``."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title_html}</title>
<style>
{css}
</style>
</head>
<body>
<main>
{main_html}
</main>
</body>
</html>
"""
