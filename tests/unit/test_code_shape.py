"""The shape of the product's code (issue 17, "Rooms"): no function or method in
``relayer/`` or ``relayer_dev/`` is longer than :data:`MAX_FUNCTION_LINES` lines (from its ``def`` line to its
last line; decorators not counted)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]
ROOTS: Final = (REPO / "relayer", REPO / "relayer_dev")
MAX_FUNCTION_LINES: Final = 80


def long_functions(root: Path) -> list[str]:
    """Every function or method under ``root`` longer than :data:`MAX_FUNCTION_LINES`, as
    ``path:line name (n lines)``."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{relative}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_80_lines() -> None:
    assert [f for root in ROOTS for f in long_functions(root)] == []
