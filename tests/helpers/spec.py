"""The x402 retirement endpoint's spec (docs/spec/x402-retirement-endpoint.md, vendored from
the shared folder) as data: its sections, its Markdown tables, and its Errors table by code."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
SPEC: Final = ROOT / "docs" / "spec" / "x402-retirement-endpoint.md"
"""The vendored spec, so a clone alone can run the suite."""

_CODE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class SpecRow:
    """One row of the spec's Errors table: the code, its HTTP status, its group and whether a
    client may retry it."""

    code: str
    http_status: int
    group: str
    retryable: bool


def section(text: str, title: str) -> str:
    """The ``## title`` section of the Markdown ``text``, its heading included, up to the next
    ``## `` heading (or the end)."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def table_rows(section: str) -> list[list[str]]:
    """The rows of the Markdown tables in ``section``, each as its stripped cells (the
    separator rows left out)."""
    rows = []
    for line in section.splitlines():
        line = line.strip()
        if line.startswith("|") and line.endswith("|") and not set(line) <= set("|- "):
            rows.append([cell.strip() for cell in line[1:-1].split("|")])
    return rows


def spec_errors() -> dict[str, SpecRow]:
    """The spec's Errors table by code, in the table's order (asserts no code twice and
    ``yes``/``no`` for retryable)."""
    rows = table_rows(section(SPEC.read_text(encoding="utf-8"), "Errors"))
    out: dict[str, SpecRow] = {}
    for cells in rows:
        if len(cells) != 5 or not _CODE.match(cells[0]) or cells[1] == "HTTP":
            continue
        code, status, group, retryable, _meaning = cells
        assert retryable in ("yes", "no"), cells
        assert code not in out, f"duplicate code in spec table: {code}"
        out[code] = SpecRow(code, int(status), group, retryable == "yes")
    return out


SPEC_ERRORS: Final = spec_errors()
"""The spec's Errors table by code (read once, at import)."""
