"""``relayer catalogue load``'s progress on stderr: plain lines when stderr is no terminal
(a Kubernetes Job, a pipe), the redrawn bar on a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from relayer_dev import devdb

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def _load(dsn: str, path: Path, stderr: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RELAYER_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT), "TERM": "xterm"}
    return subprocess.Popen(
        [sys.executable, "-m", "relayer", "catalogue", "load", "--file", str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
    )


@pytest.fixture
def projects_file(tmp_path: Path) -> Path:
    records = json.loads((ROOT / "data" / "carbon-projects.json").read_text())[:120]
    path = tmp_path / "projects.json"
    path.write_text(json.dumps(records))
    return path


@pytest.fixture
def dsn(admin_database_url: str) -> Iterator[str]:
    dsn = devdb.create_scratch_database(admin_database_url, prefix="relayer_progress")
    yield dsn
    devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])


def test_without_a_terminal_progress_is_plain_lines(dsn: str, projects_file: Path) -> None:
    proc = _load(dsn, projects_file, subprocess.PIPE)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    lines = err.decode().splitlines()
    assert "loading projects: 0/120 (0 %)" in lines
    assert any(line.startswith("loading projects: 120/120 (100 %)") for line in lines), lines
    assert "\r" not in err.decode() and "[#" not in err.decode()  # no bar redrawn into a log
    assert b"120 projects read" in out


def test_on_a_terminal_the_bar_is_kept(dsn: str, projects_file: Path) -> None:
    master, slave = pty.openpty()
    proc = _load(dsn, projects_file, slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, seen
    text = seen.decode(errors="replace")
    assert "loading projects" in text and "100%" in text, text  # click's bar
    assert "120/120 (100 %)" not in text
    assert b"120 projects read" in out
