"""The x402 endpoint's guides (``GET /api/docs``): the packaged Markdown documents, with
this host's URLs and chain filled in, as JSON or as HTML pages."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from relayer import package_data
from relayer.api.x402_versions import GUIDE_IDS, X402Info, origin_of
from relayer.domain import views

# ---------------------------------------------------------------------------- guides


@dataclass(frozen=True, slots=True)
class Guide:
    """A guide document: its first line is ``# title``, its first paragraph the summary."""

    id: str
    title: str
    summary: str
    markdown: str = field(repr=False)

    @classmethod
    def parse(cls, guide_id: str, markdown: str) -> Guide:
        """Raises ValueError when the document does not open with ``# title`` and a paragraph."""
        lines = markdown.splitlines()
        if not lines or not lines[0].startswith("# "):
            raise ValueError(f"guide {guide_id} does not open with '# title'")
        paragraphs = "\n".join(lines[1:]).strip().split("\n\n")
        summary = " ".join(paragraphs[0].split())
        if not summary or summary.startswith("#"):
            raise ValueError(f"guide {guide_id} has no summary paragraph")
        return cls(guide_id, lines[0][2:].strip(), summary, markdown)


def load_guides() -> dict[str, Guide]:
    """Every packaged guide of :data:`GUIDE_IDS`, by id.

    Raises:
        FileNotFoundError: a guide is not packaged.
        ValueError: a guide has no title or summary.
    """
    return {gid: Guide.parse(gid, package_data.guide(gid)) for gid in GUIDE_IDS}


_PLACEHOLDER: Final = re.compile(
    r"\{(x402_base_url|x402_latest_base_url|x402_v1_base_url|x402_v0_base_url|"
    r"origin|chain_id)\}"
)


def render(markdown: str, info: X402Info) -> str:
    """A guide with this host's URLs and chain filled in (``{x402_base_url}``,
    ``{x402_latest_base_url}``, ``{x402_v1_base_url}``, ``{x402_v0_base_url}``,
    ``{origin}``, ``{chain_id}``)."""
    values = {
        "x402_base_url": info.base_url,
        "x402_latest_base_url": info.versioned_hosts.get("latest", info.base_url),
        "x402_v1_base_url": info.versioned_hosts.get("current", info.base_url),
        "x402_v0_base_url": info.versioned_hosts.get("v0", info.base_url),
        "origin": origin_of(info),
        "chain_id": str(info.chain_id),
    }
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], markdown)


def docs_index(info: X402Info, guides: Mapping[str, Guide]) -> views.GuideIndex:
    """``GET /api/docs``: ``{documents: [{id, title, summary, url}]}``."""
    return {
        "documents": [
            {
                "id": g.id,
                "title": render(g.title, info),
                "summary": render(g.summary, info),
                "url": f"{info.base_url}/docs?id={g.id}",
            }
            for g in guides.values()
        ]
    }


def guide_document(info: X402Info, guide: Guide) -> views.GuideDocument:
    """``GET /api/docs?id=<id>``: ``{id, title, format: "markdown", body}``."""
    return {
        "id": guide.id,
        "title": render(guide.title, info),
        "format": "markdown",
        "body": render(guide.markdown, info),
    }
