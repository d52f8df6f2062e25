"""Stacks built once per test run and reused by copy (issue 36).

- **The chain template**: an anvil with the reference protocol deployed and seeded
  (``deploy_and_seed``: contracts, credits, classes, listings, pool liquidity, funded payers,
  seeded retirements), dumped once with ``anvil_dumpState``. :func:`start_chain` starts a new
  anvil and loads that state (``anvil_loadState``: the same blocks, logs, receipts, genesis
  hash and accounts; new blocks take the wall clock's time), about 0.1 s instead of the 1.5 s
  of a deployment.
- **The database template**: a database migrated to head with the 648-project catalogue
  loaded (by ``relayer catalogue load``, the operator's own command), built once;
  :func:`scratch_database` is ``CREATE DATABASE … TEMPLATE`` of it. A daemon on such a copy
  finds its catalogue already loaded and does not seed it.

Both are built lazily by the first test that needs them, under a file lock in the directory
every pytest-xdist worker of the run shares (the parent of the workers' base temp), so a run
builds each once whatever its number of workers. The database template is dropped when the
run ends (:func:`drop_templates`, from the controller's ``pytest_sessionfinish``).

Tests that need a truly fresh chain (a chain reset or swap, whose point is a new genesis
hash; a chain whose block time is not automine's) still call ``devnet.start_anvil`` and
``deploy_and_seed`` themselves, and say why.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from relayer.store.migrations import migrate
from relayer_dev import devdb, devnet
from relayer_dev.deploy import deploy_and_seed
from relayer_dev.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PROJECTS = ROOT / "data" / "carbon-projects.json"
TEMPLATE_PREFIX = "relayer_tmpl"
_RECORD = "database-template-{server}.json"


_directory: list[Path] = []


def use(directory: Path) -> None:
    """Make ``directory`` (:func:`run_dir`) where this process builds and finds the stacks."""
    _directory[:] = [directory]


def _current() -> Path:
    assert _directory, "the stacks_dir fixture (tests/conftest.py) has not run"
    return _directory[0]


def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory every worker of this pytest run shares (its own base temp without
    xdist; the workers' common parent with it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory/stacks.lock`` (waits for the other workers)."""
    with (directory / "stacks.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _rpc(url: str, method: str, *params: Any) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}).encode()
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    if "error" in answer:
        raise RuntimeError(f"{method} on {url}: {answer['error']}")
    return answer.get("result")


def chain_template(chain_id: int = 84532) -> dict[str, Any]:
    """The deployed and seeded protocol of chain ``chain_id`` for this run, built on first
    use: ``{"info": <devnet description, rpcUrl of the builder>, "state": <anvil_dumpState
    hex>}``, cached as ``chain-<id>.json`` in the run's directory."""
    directory = _current()
    path = directory / f"chain-{chain_id}.json"
    with _locked(directory):
        if not path.exists():
            build = directory / f"chain-{chain_id}-build"
            port = free_port()
            proc = devnet.start_anvil(build, port, chain_id)
            try:
                url = devnet.rpc_url(port)
                info = deploy_and_seed(url, chain_id, PROJECTS)
                state = _rpc(url, "anvil_dumpState")
            finally:
                proc.terminate()
                proc.wait(timeout=10)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"info": info, "state": state}))
            tmp.rename(path)
    template: dict[str, Any] = json.loads(path.read_text())
    return template


def start_chain(
    state_dir: Path, chain_id: int = 84532, *, log_name: str = devnet.LOG_FILE
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start an anvil (automine, a free port, output in ``state_dir/log_name``) holding the
    run's deployed and seeded protocol of ``chain_id``: the process (the caller stops it) and
    its devnet description with this node's ``rpcUrl`` (no ``deploymentFile``)."""
    template = chain_template(chain_id)
    port = free_port()
    proc = devnet.start_anvil(state_dir, port, chain_id, log_name=log_name)
    try:
        url = devnet.rpc_url(port)
        _rpc(url, "anvil_loadState", template["state"])
    except BaseException:
        proc.terminate()
        proc.wait(timeout=10)
        raise
    return proc, {**template["info"], "rpcUrl": url}


def _record(directory: Path, admin_url: str) -> Path:
    """Where the template of the server behind ``admin_url`` is recorded: one per server, as
    a test with its own private cluster (a Postgres restart) needs its own template there."""
    server = hashlib.sha256(admin_url.encode()).hexdigest()[:16]
    return directory / _RECORD.format(server=server)


def database_template(admin_url: str, *, stale: str | None = None) -> str:
    """The name of this run's template database on the server of ``admin_url`` (migrated,
    catalogue loaded), built on first use and recorded in the run's directory for
    :func:`drop_templates`; built again when the recorded one is ``stale`` (not on that
    server)."""
    directory = _current()
    record = _record(directory, admin_url)
    with _locked(directory):
        if not record.exists() or json.loads(record.read_text())["name"] == stale:
            dsn = devdb.create_scratch_database(admin_url, prefix=TEMPLATE_PREFIX)
            name = dsn.rsplit("/", 1)[1]
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps({"admin": admin_url, "name": name}))
            tmp.rename(record)  # recorded first: a failed build is still dropped at the end
            migrate(dsn)
            env = {**os.environ, "RELAYER_DATABASE_URL": dsn}
            subprocess.run(
                [str(Path(sys.executable).with_name("relayer")), "catalogue", "load"],
                env=env,
                check=True,
                capture_output=True,
                timeout=120,
            )
    name: str = json.loads(record.read_text())["name"]
    return name


def scratch_database(admin_url: str, prefix: str = "relayer_test") -> str:
    """A new database copied from the run's template (migrated, catalogue loaded): its DSN.
    The caller drops it (``devdb.drop_database``)."""
    template = database_template(admin_url)
    try:
        return devdb.create_scratch_database(admin_url, prefix=prefix, template=template)
    except psycopg.errors.InvalidCatalogName:  # a later private cluster on a stopped one's port
        template = database_template(admin_url, stale=template)
        return devdb.create_scratch_database(admin_url, prefix=prefix, template=template)


def drop_templates(directory: Path) -> None:
    """Drop the run's template databases (at the end of the run). A template on a server
    that is gone (a test's private cluster, stopped and deleted) went with it."""
    for record in sorted(directory.glob(_RECORD.format(server="*"))):
        made = json.loads(record.read_text())
        with contextlib.suppress(psycopg.OperationalError):
            devdb.drop_database(made["admin"], made["name"])
        record.unlink()
