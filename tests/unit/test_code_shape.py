"""The shape of the product's code (issue 17, "Rooms"): no function or method in
``relayer/`` or ``relayer_dev/`` is longer than :data:`MAX_FUNCTION_LINES` lines (from its ``def`` line to its
last line; decorators not counted). And of the tests' (issue 36, item 4): no module under ``tests/``
imports a test module; what test files share lives in ``tests/helpers/``."""

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


# --- the tests' own imports (issue 36, item 4) ----------------------------------------------

TESTS: Final = REPO / "tests"


def _test_module(dotted: str) -> bool:
    """Whether ``dotted`` names a test file under ``tests/`` (``tests.<...>.test_<...>``)."""
    parts = dotted.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:])


def imported_test_modules(root: Path = TESTS) -> list[str]:
    """Every import of a test module (``tests.<...>.test_<...>``) by a module under ``root``
    (``import``, ``from ... import`` of a name in it or of the module itself, absolute or
    relative, at any depth), as ``importer imports tests.<...>.test_<...>``; helpers live in
    ``tests/helpers/`` and the like, never in a test file."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent)
        package = list(relative.parent.parts)  # the importer's package, for relative imports
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
            else:
                continue
            imported = next((t for t in targets if _test_module(t)), None)
            if imported is not None:
                found.append(f"{relative.as_posix()}:{node.lineno} imports {imported}")
    return found


def test_no_test_module_imports_another() -> None:
    """What several test files share is in a helper module (``tests/helpers/``), not in
    one test file another imports: a test file is collected, not a library."""
    found = imported_test_modules()
    assert found == [], "move what these share to tests/helpers/:\n" + "\n".join(found)


def test_imports_of_test_modules_are_found(tmp_path: Path) -> None:
    """The checker sees every form of import of a test module (a walk that matched nothing
    would pass the suite), and not the imports of helpers."""
    tests = tmp_path / "tests"
    (tests / "integration").mkdir(parents=True)
    (tests / "integration" / "test_b.py").write_text(
        "import tests.integration.test_a\n"
        "from tests.integration.test_a import helper\n"
        "from tests.integration import test_a\n"
        "from .test_a import helper\n"
        "from . import test_a as a\n"
        "def f():\n    from tests.unit.test_c import x\n"
        "from tests.helpers.relay import challenge\n"
        "from tests.integration import helpers\n"
        "import tests.conftest\n",
        encoding="utf-8",
    )
    assert imported_test_modules(tests) == [
        "tests/integration/test_b.py:1 imports tests.integration.test_a",
        "tests/integration/test_b.py:2 imports tests.integration.test_a",
        "tests/integration/test_b.py:3 imports tests.integration.test_a",
        "tests/integration/test_b.py:4 imports tests.integration.test_a",
        "tests/integration/test_b.py:5 imports tests.integration.test_a",
        "tests/integration/test_b.py:7 imports tests.unit.test_c",
    ]
