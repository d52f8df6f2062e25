"""The files the product ships inside its package, found with ``importlib.resources`` so an
installed wheel needs no source tree: the compiled contract ABIs (``contracts_abi/``), the
forward-only SQL migrations (``migrations/``), the carbon project facts (``data/``) and the
x402 endpoint's guide documents (``guides/``, Markdown). In a checkout the first three are
symlinks to the repository's top-level directories; ``guides/`` lives in the package."""

from __future__ import annotations

import json
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

_PACKAGE = "relayer"


def _resource(*parts: str) -> Traversable:
    return files(_PACKAGE).joinpath(*parts)


def abi_artifact(name: str) -> dict[str, Any]:
    """``{contractName, abi, bytecode}`` of the compiled contract ``name`` (``UsdcEip3009``).

    Raises:
        FileNotFoundError: no such artifact is packaged.
    """
    data: dict[str, Any] = json.loads(_resource("contracts_abi", f"{name}.json").read_text("utf-8"))
    return data


def migrations_dir() -> Path:
    """The directory of the numbered ``*.sql`` migrations, as a filesystem path (yoyo reads
    a directory).

    Raises:
        RuntimeError: the package is not installed as plain files (e.g. inside a zip).
    """
    resource = _resource("migrations")
    if not isinstance(resource, Path):
        raise RuntimeError("relayer must be installed as files (not zipped) to read its migrations")
    return resource


def projects_json() -> bytes:
    """``carbon-projects.json``: the 648 carbon projects (see the data set's README)."""
    return _resource("data", "carbon-projects.json").read_bytes()


def guide(name: str) -> str:
    """The Markdown text of the guide document ``guides/<name>.md`` (``quick-start``).

    Raises:
        FileNotFoundError: no such guide is packaged.
    """
    return _resource("guides", f"{name}.md").read_text("utf-8")
