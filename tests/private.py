"""A daemon of its own for fault tests: its own anvil (whose mining, fees and pool the test
drives), its own scratch database, and settings the test chooses; everything else as the
session daemon (the same code paths, over HTTP)."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from relayer.app import make_web_app, open_runtime
from relayer.config import RelayChain, Settings
from relayer_dev import devdb
from tests.chain_helpers import write_deployment_file
from tests.conftest import Daemon, assert_solvent, free_port
from tests.helpers import stacks

BASE_CHAINS = (84532, 8453)
"""The two Base networks one daemon relays on in the two-chain tests (issue 39), first first."""


class Anvil:
    """JSON-RPC to the private anvil, for what only a test does to a chain."""

    def __init__(self, url: str) -> None:
        self.url = url

    def rpc(self, method: str, *params: Any) -> Any:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read())
        assert "error" not in answer, answer
        return answer.get("result")

    def automine(self, on: bool) -> None:
        self.rpc("evm_setAutomine", on)

    def mine(self, base_fee: int | None = None) -> None:
        """Mine one block (with ``base_fee`` wei per gas, when given)."""
        if base_fee is not None:
            self.rpc("anvil_setNextBlockBaseFeePerGas", hex(base_fee))
        self.rpc("evm_mine")

    def pool(self) -> set[str]:
        """Hashes of the pending transactions."""
        content = self.rpc("txpool_content")
        return {tx["hash"] for txs in content["pending"].values() for tx in txs.values()}


@contextlib.asynccontextmanager
async def private_chain(state: Path, admin_database_url: str) -> AsyncIterator[tuple[dict[str, Any], str]]:
    """Start anvil holding the run's deployed and seeded protocol and make a scratch database
    copied from the run's template (migrated, catalogue loaded): yields the devnet
    description (with ``deploymentFile``) and the database URL (see
    :mod:`tests.helpers.stacks`)."""
    proc, info = stacks.start_chain(state)
    dsn: str | None = None
    try:  # the node is stopped whatever fails after it started (a copy of the template too)
        dsn = stacks.scratch_database(admin_database_url, prefix="relayer_fault")
        info["deploymentFile"] = str(state / "devnet.json")
        (state / "devnet.json").write_text(json.dumps(info))
        yield info, dsn
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if dsn is not None:
            devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])


def daemon_settings(info: dict[str, Any], dsn: str, http_port: int, **overrides: Any) -> Settings:
    """The settings of a daemon on a private chain (one block per transaction: depth 1)."""
    fields: dict[str, Any] = {
        "database_url": dsn,
        "rpc_url": info["rpcUrl"],
        "chain_id": 84532,
        "deployment_file": Path(info["deploymentFile"]),
        "executor_private_key": info["executor"]["privateKey"],
        "http_port": http_port,
        "public_base_url": f"http://127.0.0.1:{http_port}",
        "settle_wait_s": 30,
        "block_poll_interval_s": 0.05,
        "confirmations": 1,
        "rate_limit": "off",  # tests post loads from one client; test_rate_limit turns it on
    }
    return Settings(**{**fields, **overrides})


@contextlib.asynccontextmanager
async def serving(settings: Settings, info: dict[str, Any], *, workers: bool = True) -> AsyncIterator[Daemon]:
    """Run a daemon in this process over HTTP on ``settings.http_port``."""
    async with open_runtime(settings, workers=workers) as rt:
        runner = web.AppRunner(make_web_app(rt), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", settings.http_port).start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
                base = settings.public_base_url
                daemon = Daemon(base, f"{base}/api", rt, info, session)
                yield daemon
        finally:
            await runner.cleanup()
        await assert_solvent(daemon, f"daemon on port {settings.http_port}")


@contextlib.asynccontextmanager
async def private_daemon(
    state: Path, admin_database_url: str, **overrides: Any
) -> AsyncIterator[tuple[Daemon, Anvil]]:
    """A private chain and database with a daemon on them (settings ``overrides``)."""
    async with (
        private_chain(state, admin_database_url) as (info, dsn),
        serving(daemon_settings(info, dsn, free_port(), **overrides), info) as daemon,
    ):
        yield daemon, Anvil(info["rpcUrl"])


@contextlib.contextmanager
def base_chains(state: Path) -> Iterator[dict[int, dict[str, Any]]]:
    """Two anvils holding the run's deployed and seeded protocol of 84532 and of 8453 (the
    same contracts at the same addresses, USDC under each chain's own domain name): each
    chain's devnet description with its ``deploymentFile``, by chain id."""
    procs, chains = [], {}
    try:
        for chain_id in BASE_CHAINS:
            directory = state / f"anvil-{chain_id}"
            directory.mkdir(parents=True)
            proc, info = stacks.start_chain(directory, chain_id)
            procs.append(proc)
            info["deploymentFile"] = str(write_deployment_file(info, directory / "devnet.json"))
            chains[chain_id] = info
        yield chains
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


def relay_chain(info: dict[str, Any], rpc_url: str | None = None) -> RelayChain:
    """``RELAYER_RELAY_CHAINS``'s entry of a private chain (its node, or ``rpc_url`` in front
    of it; depth 1: a block per transaction)."""
    return RelayChain(
        chain_id=info["chainId"],
        rpc_url=rpc_url or info["rpcUrl"],
        deployment_file=Path(info["deploymentFile"]),
        confirmations=1,
    )
