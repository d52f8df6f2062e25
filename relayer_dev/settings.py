"""The product settings the dev tooling supplies: the database (``RELAYER_DATABASE_URL``
when set, else a database per devnet instance on the private cluster under ``.devdata/``),
the local chain's RPC URL, chain id and deployment file, its executor key (a public anvil
key), the other Base network it also relays on (``RELAYER_RELAY_CHAINS``), the other local
chains the daemon indexes for the marketplace (``RELAYER_INDEX_CHAINS``: the Polygon
stand-in) and the treasury key that pays marketplace orders
(``RELAYER_TREASURY_PRIVATE_KEY``). Settings given in the environment win; only the missing
ones are filled in. Also writes them as an env file so ``make devnet`` runs the real product
command with them."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path
from typing import Any, Final

from pydantic import SecretStr

from relayer.config import IndexChain, RelayChain, Settings, env_name, load_settings
from relayer.domain.chains import relay_supported
from relayer_dev import devdb

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
STATE_DIR: Final = REPO_ROOT / ".devdata"
DEVNET_FILE: Final = STATE_DIR / "devnet.json"
ENV_FILE: Final = STATE_DIR / "relayer.env"
DEFAULT_RPC_PORT: Final = 8545
DEV_CONFIRMATIONS: Final = 1
"""anvil mines a block per transaction: no deeper block may come."""


def database_url(
    given: SecretStr | None = None, state_dir: Path = STATE_DIR, database: str = devdb.DATABASE_NAME
) -> str:
    """The DSN to use: ``given`` (from RELAYER_DATABASE_URL) or ``database`` on the private
    dev cluster.

    Raises:
        DevDbError: the private cluster could not be started.
    """
    return devdb.ensure_database_url(given.get_secret_value() if given else None, state_dir, database)


def chain_database(devnet: dict[str, Any]) -> str:
    """The private cluster's database for one devnet instance: named after its genesis hash,
    so a new chain (``make devnet-down && make devnet``) starts from a fresh database."""
    return f"relayer_{devnet['genesisHash'][2:18].lower()}"


def relay_chains(devnet: dict[str, Any]) -> list[RelayChain]:
    """The devnet's other Base network (its ``chains`` that the relay runs on, without the
    daemon's first), as ``RELAYER_RELAY_CHAINS`` lists them, at the dev confirmation depth."""
    return [
        RelayChain(
            chain_id=chain["chainId"],
            rpc_url=chain["rpcUrl"],
            deployment_file=Path(chain["deploymentFile"]),
            confirmations=DEV_CONFIRMATIONS,
        )
        for chain in devnet.get("chains", ())
        if chain["chainId"] != devnet["chainId"] and relay_supported(chain["chainId"])
    ]


def index_chains(devnet: dict[str, Any]) -> list[IndexChain]:
    """The devnet's chains the relay does not run on (the Polygon stand-in), as
    ``RELAYER_INDEX_CHAINS`` lists them: chain id, RPC URL, deployment file and the dev
    confirmation depth (1: anvil mines a block per transaction, so a chain's default depth,
    64 blocks on Polygon, would never be reached)."""
    return [
        IndexChain(
            chain_id=chain["chainId"],
            rpc_url=chain["rpcUrl"],
            deployment_file=Path(chain["deploymentFile"]),
            confirmations=DEV_CONFIRMATIONS,
        )
        for chain in devnet.get("chains", ())
        if chain["chainId"] != devnet["chainId"] and not relay_supported(chain["chainId"])
    ]


def dev_settings(devnet: dict[str, Any], base: Settings | None = None) -> Settings:
    """``base`` (default: the environment) with every missing daemon setting supplied for
    the devnet described by ``devnet`` (as ``relayer_dev devnet up`` writes it)."""
    base = base or load_settings()
    supplied: dict[str, Any] = {
        "database_url": SecretStr(database_url(base.database_url, database=chain_database(devnet))),
        "rpc_url": devnet["rpcUrl"],
        "deployment_file": Path(devnet.get("deploymentFile", DEVNET_FILE)),
        "executor_private_key": SecretStr(devnet["executor"]["privateKey"]),
        "confirmations": DEV_CONFIRMATIONS,
    }
    if "treasury" in devnet:
        supplied["treasury_private_key"] = SecretStr(devnet["treasury"]["privateKey"])
        supplied["x402_quote_secret"] = SecretStr(dev_quote_secret(devnet["treasury"]["privateKey"]))
    updates = {k: v for k, v in supplied.items() if getattr(base, k) is None}
    if "index_chains" not in base.model_fields_set:  # RELAYER_INDEX_CHAINS='[]' indexes none
        updates["index_chains"] = index_chains(devnet)
    if "relay_chains" not in base.model_fields_set:  # RELAYER_RELAY_CHAINS='[]' relays on one
        updates["relay_chains"] = relay_chains(devnet)
    updates["chain_id"] = devnet["chainId"]
    return base.model_copy(update=updates)


def dev_quote_secret(treasury_key: str) -> str:
    """The devnet's ``RELAYER_X402_QUOTE_SECRET``: derived from its (public, throwaway) treasury
    key, so every dev process of one devnet agrees on it. Dev only: an operator sets its own."""
    return hashlib.sha256(b"relayer-devnet x402 quote secret" + treasury_key.encode()).hexdigest()


def env_lines(settings: Settings) -> list[str]:
    """The daemon settings the dev tooling supplies, as ``RELAYER_…=value`` lines
    (values shell-quoted, secrets included: for a file of mode 0600 or a terminal)."""
    values = {
        "database_url": settings.database_url,
        "rpc_url": settings.rpc_url,
        "chain_id": settings.chain_id,
        "deployment_file": settings.deployment_file,
        "executor_private_key": settings.executor_private_key,
        "confirmations": settings.confirmations,
        "index_chains": _chains_json(settings.index_chains) if settings.index_chains else None,
        "relay_chains": _chains_json(settings.relay_chains) if settings.relay_chains else None,
        "treasury_private_key": settings.treasury_private_key,
        "x402_quote_secret": settings.x402_quote_secret,
    }
    return [
        f"{env_name(k)}={shlex.quote(v.get_secret_value() if isinstance(v, SecretStr) else str(v))}"
        for k, v in values.items()
        if v is not None
    ]


def _chains_json(chains: list[IndexChain] | list[RelayChain]) -> str:
    """``RELAYER_INDEX_CHAINS``'s or ``RELAYER_RELAY_CHAINS``'s value: a compact JSON list of
    ``{"chainId", "rpcUrl", "deploymentFile", "confirmations"}`` (optional keys only when set)."""
    return json.dumps(
        [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in chains], separators=(",", ":")
    )


def write_env_file(settings: Settings, path: Path = ENV_FILE) -> Path:
    """Write :func:`env_lines` to ``path`` (mode 0600, also when it existed with another)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("# Written by `python -m relayer_dev devnet up`: the dev settings of `relayer all`.\n")
        fh.write("\n".join(env_lines(settings)) + "\n")
    return path


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it, else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
