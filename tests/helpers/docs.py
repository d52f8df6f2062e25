"""What tests read from the documentation: the heading anchors of a Markdown text (as
GitHub makes them) and the Python examples of docs/x402.md's "With the official SDKs"."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
FENCE: Final = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
"""A fenced code block of Markdown (its text is not prose: no links, no headings)."""
HEADING: Final = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
"""An ATX heading of Markdown; group 1 its text."""


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (word
    characters, hyphens and spaces kept), spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown text (a repeated one as ``x``, ``x-1``, …)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def x402_sdk_examples() -> tuple[str, str, str]:
    """The three Python examples of docs/x402.md, "With the official SDKs" (their source
    text): server, client, and the client paying the retirement endpoint (run by
    test_x402_sdk.py and test_x402_sdk_retire.py)."""
    text = (ROOT / "docs" / "x402.md").read_text()
    section = text.split("\n## With the official SDKs\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 3, blocks
    return blocks[0], blocks[1], blocks[2]
