"""Project files for the marketplace catalogue (relayer/service/catalogue_load.py): checked
strictly before anything is written, and an unusable RELAYER_PROJECTS_FILE named as such by
the daemon's seed and by ``relayer config check``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from relayer.config import ConfigError, Settings
from relayer.ops import offline_problems
from relayer.package_data import projects_json
from relayer.service.catalogue_load import parse_catalogue, projects_file_records


@pytest.fixture(autouse=True)
def _no_relayer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test process's own RELAYER_ variables (the suite's database URL) stay out."""
    for name in list(os.environ):
        if name.startswith("RELAYER_"):
            monkeypatch.delenv(name)


def _record() -> dict[str, Any]:
    first: dict[str, Any] = json.loads(projects_json())[0]
    return first


def test_the_packaged_data_set_parses() -> None:
    records = parse_catalogue(projects_json())
    assert len(records) == 648 and len({r["key"] for r in records}) == 648
    assert projects_file_records(Settings()) == records


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{", "the catalogue file is not JSON"),
        (b"{}", "must hold a JSON array"),
        (json.dumps([_record(), _record()]).encode(), "catalogue record 1: key"),
        (json.dumps([{**_record(), "unknown": 1}]).encode(), "catalogue record 0:"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_record(data: bytes, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_catalogue(data)


def test_an_unusable_projects_file_names_the_setting(tmp_path: Path) -> None:
    bad = tmp_path / "projects.json"
    bad.write_text(json.dumps([_record(), _record()]))
    with pytest.raises(ConfigError, match="RELAYER_PROJECTS_FILE is not usable: catalogue record 1"):
        projects_file_records(Settings(projects_file=bad))
    assert [p for p in offline_problems(Settings(projects_file=bad), ()) if "PROJECTS" in p] == [
        f"RELAYER_PROJECTS_FILE is not usable: catalogue record 1: key {_record()['key']} appears twice"
    ]
    bad.unlink()
    with pytest.raises(ConfigError, match=r"RELAYER_PROJECTS_FILE is not usable: FileNotFoundError$"):
        projects_file_records(Settings(projects_file=bad))
