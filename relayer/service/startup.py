"""Start-up checks with one line each that names the setting, its value and the remedy (issue 37,
item 2). `serve`, `work`, `all`, `migrate`, `status`, `ledger`, `apikey` and `config check
--connect` use the same words, and every such failure exits 2:

    RELAYER_RPC_URL http://127.0.0.1:9999: connection refused; is the node running, and
        listening on that port?
    RELAYER_INDEX_CHAINS (chain 137) http://127.0.0.1:8546: serves chain 84532, not 137; give
        a node of chain 137
    RELAYER_DATABASE_URL postgresql://relayer@db:5432/relayer: no such database; create it
        (createdb), or fix the database name
    RELAYER_DEPLOYMENT_FILE /etc/relayer/deployment.json: usdc 0x5FbD… holds no code on chain
        84532; give the deployment file of this chain's contracts

(each one line; wrapped here).
Values are redacted: a URL keeps scheme, user, host and port (never a password, an API-key path
or a query), a DSN loses its password.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from relayer.chain.errors import ChainUnavailable
from relayer.chain.node import ChainNode, WrongChain
from relayer.config import ConfigError
from relayer.domain.urls import redact_url
from relayer.store.pool import Database, StoreUnavailable, database_line

RPC_SETTING = "RELAYER_RPC_URL"
CHAIN_SETTING = "RELAYER_CHAIN_ID"


def index_chain_setting(chain_id: int) -> str:
    """How a line names an entry of ``RELAYER_INDEX_CHAINS``."""
    return f"RELAYER_INDEX_CHAINS (chain {chain_id})"


def relay_chain_setting(chain_id: int) -> str:
    """How a line names an entry of ``RELAYER_RELAY_CHAINS``."""
    return f"RELAYER_RELAY_CHAINS (chain {chain_id})"


def index_chain_id_setting(chain_id: int) -> str:
    """How a line names the chain id an entry of ``RELAYER_INDEX_CHAINS`` configures."""
    return f"{index_chain_setting(chain_id)}'s chainId"


def node_line(setting: str, url: str, exc: ChainUnavailable) -> str:
    """``<setting> <url, redacted>: <cause>; <remedy>`` for a node that failed."""
    what, remedy = exc.cause
    return f"{setting} {redact_url(url)}: {what}; {remedy}"


def wrong_chain_line(setting: str, url: str, exc: WrongChain, chain_setting: str) -> str:
    """The line for a node that serves another chain than the one configured (by ``chain_setting``)."""
    return (
        f"{setting} {redact_url(url)}: serves chain {exc.served}, not {exc.expected} ({chain_setting}); "
        f"give a node of chain {exc.expected}"
    )


async def check_node(
    node: ChainNode, setting: str = RPC_SETTING, chain_setting: str = CHAIN_SETTING
) -> bytes:
    """:meth:`ChainNode.check` at the start: the chain's genesis hash.

    Raises:
        ConfigError: the node fails or serves another chain (one line, see the module).
    """
    try:
        return await node.check()
    except WrongChain as exc:
        raise ConfigError(message=wrong_chain_line(setting, node.rpc_url, exc, chain_setting)) from None
    except ChainUnavailable as exc:
        raise ConfigError(message=node_line(setting, node.rpc_url, exc)) from None


async def open_database(dsn: str, min_size: int = 1, max_size: int = 1) -> Database:
    """:meth:`Database.connect` at the start.

    Raises:
        ConfigError: the database cannot be used: refused, no such host, authentication, no
            such database, no answer in time (one line, see the module).
    """
    try:
        return await Database.connect(dsn, min_size, max_size)
    except StoreUnavailable as exc:
        raise ConfigError(message=database_line(dsn, exc.cause)) from None


async def check_contracts(
    node: ChainNode,
    deployment_file: Path,
    named: Sequence[tuple[str, str]],
    setting: str = "RELAYER_DEPLOYMENT_FILE",
) -> None:
    """Each contract the deployment file names holds code on the node's chain (one batch);
    ``setting`` names the file in the line.

    Raises:
        ConfigError: a named address holds no code (the file is of another deployment or
            chain): one line naming the file, the contract and its address.
        ChainUnavailable: the node failed.
    """
    answers = await node.batch([("eth_getCode", [address, "latest"]) for _name, address in named])
    empty = [
        f"{name} {address}"
        for (name, address), answer in zip(named, answers, strict=True)
        if answer.get("result") in ("0x", "0x0")  # an error answer is the node's, not the file's
    ]
    if empty:
        raise ConfigError(
            message=f"{setting} {deployment_file}: {', '.join(empty)} "
            f"{'holds' if len(empty) == 1 else 'hold'} no code on chain {node.chain_id}; "
            "give the deployment file of this chain's contracts"
        )
