"""Daemons in this process on a private chain of their own, for the tests that count or
steer what the daemon asks its node: the chain, a JSON-RPC proxy in front of it, the daemon."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.conftest import Daemon, free_port
from tests.private import daemon_settings, private_chain, serving
from tests.processes import RpcProxy


@asynccontextmanager
async def behind_proxy(
    tmp_path: Path, admin_database_url: str, workers: bool, **overrides: Any
) -> AsyncIterator[tuple[dict[str, Any], RpcProxy, Daemon]]:
    """A private chain, a JSON-RPC proxy counting the calls to it, and a daemon in this
    process reading the chain through the proxy (its workers only when ``workers``; its
    settings with ``overrides``): yields (the devnet description, the proxy, the daemon)."""
    async with (
        private_chain(tmp_path, admin_database_url) as (info, dsn),
        RpcProxy(info["rpcUrl"]) as proxy,
        serving(
            daemon_settings(info, dsn, free_port(), rpc_url=proxy.url, **overrides), info, workers=workers
        ) as d,
    ):
        yield info, proxy, d
