"""The product installs as a wheel and runs with no source tree: the wheel is built from a
clean copy of the tree (offline), installed into a fresh virtual environment outside the
checkout, and its ``relayer`` command migrates a new database and serves against the test
chain. Its commands refuse to start without their settings, naming them, and never echo a
malformed key."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relayer_dev import devdb
from tests.conftest import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TREE = ("pyproject.toml", "README.md", "relayer", "contracts_abi", "migrations", "data")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with only the built wheel installed (its dependencies are
    borrowed read-only from the dev environment through a .pth file: no network)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in TREE:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    run = {"check": True, "timeout": 300, "capture_output": True}
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(src)], **run
    )
    (wheel,) = (work / "dist").glob("relayer-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], **run)
    python = work / "venv" / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True, **run
    ).stdout.strip()
    # .pth files inside the directory added here are not processed: the dev tree's editable
    # `relayer` stays invisible, only third-party packages are borrowed.
    (Path(site) / "_borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", str(wheel)], **run)
    return work / "venv"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working directory with no source tree in it or above it."""
    assert ROOT not in tmp_path.parents
    return tmp_path


def _env(**settings: str) -> dict[str, str]:
    """A clean environment: no PYTHONPATH, no RELAYER_* but the given settings."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8", **settings}


def _relayer(venv: Path, cwd: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "relayer"), *args],
        cwd=cwd,
        env=_env(**settings),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def scratch_database(admin_database_url: str) -> Iterator[str]:
    dsn = devdb.create_scratch_database(admin_database_url, prefix="relayer_wheel")
    yield dsn
    devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])


def test_the_wheel_holds_the_product_and_its_data_only(venv: Path, outside: Path) -> None:
    probe = """
import importlib.metadata as m, importlib.util, json, relayer
from packaging.requirements import Requirement
from relayer import package_data
unmet = []
for text in m.requires("relayer"):
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if not req.specifier.contains(m.version(req.name), prereleases=True):
        unmet.append(text)
print(json.dumps({
    "file": relayer.__file__,
    "dev": importlib.util.find_spec("relayer_dev") is not None,
    "unmet": unmet,
    "migrations": sorted(p.name for p in package_data.migrations_dir().glob("*.sql")),
    "abi": package_data.abi_artifact("RetirementSettlement")["contractName"],
    "projects": len(json.loads(package_data.projects_json())),
}))
"""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], cwd=outside, env=_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    facts: dict[str, Any] = json.loads(done.stdout)
    assert Path(facts["file"]).is_relative_to(venv), facts["file"]
    assert facts["dev"] is False and facts["unmet"] == []
    assert facts["migrations"] == sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
    assert (facts["abi"], facts["projects"]) == ("RetirementSettlement", 648)
    assert not (Path(facts["file"]).parent / "migrations").is_symlink()
    usage = _relayer(venv, outside, "--help").stdout
    assert {"serve", "work", "all", "migrate"} <= set(usage.split()) and "devnet" not in usage


def test_the_wheel_archive_holds_relayer_only_with_real_data_files(venv: Path) -> None:
    (wheel,) = (venv.parent / "dist").glob("relayer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        entries = archive.infolist()
    names = {e.filename for e in entries}
    assert {n.split("/", 1)[0] for n in names} == {"relayer", "relayer-0.1.0.dist-info"}
    assert not any(stat.S_ISLNK(e.external_attr >> 16) for e in entries)
    expected = {
        f"relayer/{p.relative_to(ROOT)}"
        for pattern in ("contracts_abi/*.json", "migrations/*.sql", "data/*.json")
        for p in ROOT.glob(pattern)
    }
    assert expected <= names and "relayer/py.typed" in names
    sizes = {e.filename: e.file_size for e in entries}
    assert all(sizes[n] == (ROOT / n.removeprefix("relayer/")).stat().st_size for n in expected)


def test_installed_wheel_migrates_and_serves(
    venv: Path, outside: Path, scratch_database: str, chain: dict[str, Any]
) -> None:
    done = _relayer(venv, outside, "migrate", RELAYER_DATABASE_URL=scratch_database)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"migrations applied: {len(list((ROOT / 'migrations').glob('*.sql')))}")
    port = free_port()
    settings = {
        "RELAYER_DATABASE_URL": scratch_database,
        "RELAYER_RPC_URL": chain["rpcUrl"],
        "RELAYER_CHAIN_ID": str(chain["chainId"]),
        "RELAYER_DEPLOYMENT_FILE": chain["deploymentFile"],
        "RELAYER_EXECUTOR_PRIVATE_KEY": chain["executor"]["privateKey"],
        "RELAYER_HTTP_PORT": str(port),
    }
    proc = subprocess.Popen(
        [str(venv / "bin" / "relayer"), "serve"],
        cwd=outside,
        env=_env(**settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert _get(port, "/healthz", proc) == 200
        assert _get(port, "/readyz", proc) == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/discover", timeout=10) as r:
            assert len(json.loads(r.read())["carbonClasses"]) >= 3
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert chain["executor"]["privateKey"][2:] not in output


def _get(port: int, path: str, proc: subprocess.Popen[str], timeout_s: float = 30.0) -> int:
    """Status of GET ``path`` once the daemon answers (bounded wait)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"relayer serve exited {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return int(r.status)
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"no answer on {path} within {timeout_s} s")


@pytest.mark.parametrize(
    ("command", "missing"),
    [
        ("migrate", "RELAYER_DATABASE_URL"),
        ("serve", "RELAYER_RPC_URL"),
        ("work", "RELAYER_EXECUTOR_PRIVATE_KEY"),
        ("all", "RELAYER_DEPLOYMENT_FILE"),
    ],
)
def test_a_command_without_a_setting_stops_at_once_naming_it(
    venv: Path, outside: Path, command: str, missing: str
) -> None:
    settings = {
        "RELAYER_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        "RELAYER_RPC_URL": "http://127.0.0.1:1",
        "RELAYER_DEPLOYMENT_FILE": "/nonexistent/devnet.json",
        "RELAYER_EXECUTOR_PRIVATE_KEY": "0x" + "11" * 32,
    }
    del settings[missing]
    started = time.monotonic()
    done = _relayer(venv, outside, command, **settings)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert missing in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 20
    assert not (outside / ".devdata").exists()  # no private database started, nothing written


@pytest.mark.parametrize("blank", ["", "  "], ids=["empty", "spaces"])
def test_a_blank_setting_counts_as_missing(venv: Path, outside: Path, blank: str) -> None:
    done = _relayer(venv, outside, "migrate", RELAYER_DATABASE_URL=blank)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr == "relayer: missing setting RELAYER_DATABASE_URL (Postgres DSN)\n"


@pytest.mark.parametrize(
    "key",
    ["0x" + "ab" * 31 + "c", "ab" * 31 + "cde", "0x" + "00" * 32, "0x" + "ff" * 32, "0x" + "zz" * 32],
    ids=["63-digits", "65-digits", "zero", "above-order", "not-hex"],
)
def test_a_malformed_executor_key_stops_the_start_and_is_not_echoed(
    venv: Path, outside: Path, key: str
) -> None:
    done = _relayer(venv, outside, "serve", RELAYER_EXECUTOR_PRIVATE_KEY=key)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "RELAYER_EXECUTOR_PRIVATE_KEY" in done.stderr and "32 bytes" in done.stderr
    digits = key.removeprefix("0x")
    assert digits not in done.stderr and digits not in done.stdout
    assert digits[:16] not in done.stderr


def test_a_start_that_cannot_work_says_why_in_one_line(
    venv: Path, outside: Path, scratch_database: str, chain: dict[str, Any]
) -> None:
    settings = {
        "RELAYER_DATABASE_URL": scratch_database,
        "RELAYER_RPC_URL": chain["rpcUrl"],
        "RELAYER_DEPLOYMENT_FILE": chain["deploymentFile"],
        "RELAYER_EXECUTOR_PRIVATE_KEY": chain["executor"]["privateKey"],
    }
    wrong_chain = _relayer(venv, outside, "serve", **settings, RELAYER_CHAIN_ID="8453")
    assert wrong_chain.returncode == 2, wrong_chain.stderr
    assert "the deployment of chain 84532, not 8453 (RELAYER_CHAIN_ID)" in wrong_chain.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = _relayer(venv, outside, "serve", **settings, RELAYER_HTTP_PORT=str(taken.getsockname()[1]))
    assert busy.returncode == 2, busy.stderr
    assert "cannot listen on 127.0.0.1:" in busy.stderr
    for done in (wrong_chain, busy):  # logs (JSON lines) before it, then the one line of the failure
        assert done.stderr.splitlines()[-1].startswith("relayer: ") and "Traceback" not in done.stderr
