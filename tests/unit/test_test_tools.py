"""The system tools some tests need (chromium, promtool, poppler-utils' pdftoppm): ``make
install`` installs them when it can and ``make test`` ends by naming each missing one with the
command that installs it, through one script that ``.ci/run`` calls too (issue 21: on a fresh
machine those tests were skipped without a word)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test-tools"


def _run(mode: str, path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": str(path), "CHROMIUM": str(path / "no-such-chromium")}
    return subprocess.run(
        ["/bin/bash", str(SCRIPT), mode], env=env, capture_output=True, text=True, timeout=30, check=False
    )


@pytest.mark.parametrize("mode", ["check", "install"])
def test_a_missing_tool_is_named_with_the_command_that_installs_it(tmp_path: Path, mode: str) -> None:
    # An empty PATH: no chromium, no promtool, and (for install) no apt-get to install them with.
    done = _run(mode, tmp_path)
    assert done.returncode == 0, done
    said = done.stderr.splitlines()
    assert any("chromium" in line and "apt-get install chromium" in line for line in said), done.stderr
    assert any("promtool" in line and "apt-get install prometheus" in line for line in said), done.stderr
    assert any("pdftoppm" in line and "apt-get install poppler-utils" in line for line in said), done.stderr


def test_nothing_is_said_when_the_tools_are_there(tmp_path: Path) -> None:
    for tool in ("chromium", "promtool", "pdftoppm"):
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
    done = _run("check", tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_make_install_and_make_test_and_ci_use_the_one_script() -> None:
    dry = {
        target: subprocess.run(
            ["make", "-n", "-W", "pyproject.toml", target],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for target in ("install", "test")
    }
    assert "scripts/test-tools install" in dry["install"]
    assert "scripts/test-tools check" in dry["test"].split("pytest", 1)[1]  # after the tests, last
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test-tools install" in ci
    assert "apt-get install" not in ci and "apt-get update" not in ci  # only the script installs
