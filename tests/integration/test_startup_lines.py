"""Each misconfiguration an operator met on a first hour (issue 37, item 2) stops the start with
one line that names the setting, its value (redacted) and the remedy, and exit 2; the same
line from every command that needs that part (``all``, ``serve``, ``work``, ``migrate``,
``status``, ``ledger``, ``apikey list``, ``config check --connect``). Before: every node
failure read ``The chain node is unavailable; nothing was attempted. Retry with backoff.``, a
wrong index chain blamed RELAYER_CHAIN_ID, the database said ``OperationalError`` for a refused
connection and a missing database alike, and a deployment file whose addresses hold no code
was accepted (the lane retried for ever)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from eth_account import Account

from relayer.chain.types import Contracts
from tests.conftest import free_port
from tests.processes import daemon_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

RELAYER = str(Path(sys.executable).with_name("relayer"))
CHECK = ("config", "check", "--connect")
# Every command that needs the part, for the first case of each part; the others by the two
# ways in: a daemon's start and the check (and, for the database, both drivers: `migrate` and
# `all` on psycopg, `serve` and `status` on asyncpg).
NODE = (("all",), ("serve",), ("work",), CHECK)
DATABASE = (*NODE, ("migrate",), ("status",), ("ledger",), ("apikey", "list"))
START = (("all",), CHECK)
DB_START = (("all",), ("serve",), ("status",), CHECK)


async def _relayer(env: dict[str, str], *argv: str) -> tuple[int, list[str]]:
    """Run ``relayer argv``; its exit code and the ``relayer:`` lines of its stderr."""
    proc = await asyncio.create_subprocess_exec(
        RELAYER, *argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        _out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"relayer {' '.join(argv)} did not stop within 90 s") from None
    lines = [line for line in err.decode().splitlines() if line.startswith("relayer: ")]
    return int(proc.returncode or 0), lines


@pytest.fixture(scope="module")
async def not_a_node() -> AsyncIterator[str]:
    """An HTTP server that is not a JSON-RPC node (every POST: 404)."""
    port = free_port()
    runner = web.AppRunner(web.Application())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _deployment(tmp_path: Path, info: dict[str, Any], name: str, **changes: Any) -> Path:
    data = json.loads(Path(info["deploymentFile"]).read_text())
    data.update(changes)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def _cases(
    info: dict[str, Any], dsn: str, tmp_path: Path, not_a_node: str
) -> list[tuple[str, dict[str, str], tuple[tuple[str, ...], ...], str]]:
    """(what, environment changes, commands, the expected line after ``relayer: ``)."""
    rpc, host_port = info["rpcUrl"], info["rpcUrl"].removeprefix("http://")
    closed = free_port()
    server, database = dsn.rsplit("/", 1)
    named = json.loads(Path(info["deploymentFile"]).read_text())["contracts"]
    no_code = {k: Account.create().address for k in named}
    listed = ", ".join(f"{k} {a}" for k, a in Contracts.from_deployment(no_code).named())
    on_8453 = _deployment(tmp_path, info, "on-8453", chainId=8453)
    of_137 = _deployment(tmp_path, info, "of-137", chainId=137)
    empty = _deployment(tmp_path, info, "no-code", contracts=no_code)
    return [
        (
            "node: nothing listens on the port",
            {"RELAYER_RPC_URL": f"http://127.0.0.1:{closed}"},
            NODE,
            f"RELAYER_RPC_URL http://127.0.0.1:{closed}: connection refused; "
            "is the node running, and listening on that port?",
        ),
        (
            "node: no such host",
            {"RELAYER_RPC_URL": "http://no-such-host.invalid:8545"},
            START,
            "RELAYER_RPC_URL http://no-such-host.invalid:8545: no such host; check the host name",
        ),
        (
            "node: https to an http port",
            {"RELAYER_RPC_URL": f"https://{host_port}"},
            START,
            f"RELAYER_RPC_URL https://{host_port}: the TLS handshake failed; "
            "use http:// for a node that does not serve TLS",
        ),
        (
            "node: an HTTP server that is not a node",
            {"RELAYER_RPC_URL": not_a_node},
            START,
            f"RELAYER_RPC_URL {not_a_node}: it answers HTTP 404, not JSON-RPC; give the node's JSON-RPC URL",
        ),
        (
            "node: another chain than RELAYER_CHAIN_ID",
            {"RELAYER_CHAIN_ID": "8453", "RELAYER_DEPLOYMENT_FILE": str(on_8453)},
            START,
            f"RELAYER_RPC_URL {rpc}: serves chain 84532, not 8453 (RELAYER_CHAIN_ID); "
            "give a node of chain 8453",
        ),
        (
            "index chain: its entry's node serves another chain",
            {
                "RELAYER_INDEX_CHAINS": json.dumps(
                    [{"chainId": 137, "rpcUrl": rpc, "deploymentFile": str(of_137)}]
                )
            },
            (("work",), CHECK),
            f"RELAYER_INDEX_CHAINS (chain 137) {rpc}: serves chain 84532, not 137 "
            "(RELAYER_INDEX_CHAINS (chain 137)'s chainId); give a node of chain 137",
        ),
        (
            "deployment file: addresses that hold no code",
            {"RELAYER_DEPLOYMENT_FILE": str(empty)},
            (("serve",), CHECK),
            f"RELAYER_DEPLOYMENT_FILE {empty}: "
            + listed
            + " hold no code on chain 84532; give the deployment file of this chain's contracts",
        ),
        (
            "deployment file: of another chain",
            {"RELAYER_DEPLOYMENT_FILE": str(of_137)},
            (("all",), ("config", "check")),
            f"RELAYER_DEPLOYMENT_FILE {of_137}: the deployment of chain 137, not 84532 (RELAYER_CHAIN_ID); "
            "give this chain's deployment file",
        ),
        (
            "database: nothing listens on the port",
            {"RELAYER_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{closed}/relayer"},
            DATABASE,
            f"RELAYER_DATABASE_URL postgresql://postgres@127.0.0.1:{closed}/relayer: connection refused; "
            "is Postgres running, and listening on that port?",
        ),
        (
            "database: no such database",
            {"RELAYER_DATABASE_URL": f"{server}/no_such_database"},
            DB_START,
            f"RELAYER_DATABASE_URL {server}/no_such_database: no such database; "
            "create it (createdb), or fix the database name",
        ),
        (
            "database: a role the server does not know",
            {"RELAYER_DATABASE_URL": server.replace("://postgres@", "://no_such_role@") + f"/{database}"},
            DB_START,
            f"RELAYER_DATABASE_URL {server.replace('://postgres@', '://no_such_role@')}/{database}: "
            "authentication failed; check its user and password",
        ),
    ]


async def test_each_misconfiguration_stops_every_command_with_one_line_naming_the_setting(
    chain_and_db: tuple[dict[str, Any], str], tmp_path: Path, not_a_node: str
) -> None:
    info, dsn = chain_and_db
    assert "://postgres@" in dsn and ":" not in dsn.split("://", 1)[1].split("@", 1)[0], (
        "a DSN without password"
    )
    base = daemon_env(info, dsn, http_port=free_port())
    runs = [
        (what, argv, expected, {**base, **changes})
        for what, changes, commands, expected in _cases(info, dsn, tmp_path, not_a_node)
        for argv in commands
    ]
    two = asyncio.Semaphore(2)  # each run starts a Python process: two at a time on two cores

    async def one(what: str, argv: tuple[str, ...], expected: str, env: dict[str, str]) -> str | None:
        async with two:
            code, lines = await _relayer(env, *argv)
        if (code, lines) == (2, [f"relayer: {expected}"]):
            return None
        return f"{what}: relayer {' '.join(argv)}: exit {code}, {lines}"

    wrong = [w for w in await asyncio.gather(*(one(*run) for run in runs)) if w is not None]
    assert len(runs) == 34 and wrong == [], "\n".join(wrong)
