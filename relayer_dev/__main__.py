"""The dev command line, run from the repository root: ``python -m relayer_dev devnet up|down``,
``demo`` and ``env``. It supplies the product's settings (see :mod:`relayer_dev.settings`)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any, NoReturn
from urllib.parse import urlsplit

import click

from relayer.config import ConfigError, Settings, load_settings
from relayer.domain.errors import RelayerError
from relayer.store.migrations import migrate
from relayer_dev import devdb, devnet
from relayer_dev.facilitator import record_facilitator_key
from relayer_dev.settings import (
    DEFAULT_RPC_PORT,
    DEVNET_FILE,
    REPO_ROOT,
    STATE_DIR,
    dev_settings,
    env_lines,
    write_env_file,
)


def _fail(error: RelayerError) -> NoReturn:
    click.echo(f"relayer_dev: {error.message}", err=True)
    sys.exit(2 if isinstance(error, ConfigError) else 1)


def _environment() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        _fail(exc)


def _up(settings: Settings) -> dict[str, Any]:
    port = urlsplit(settings.rpc_url).port if settings.rpc_url else None
    info = devnet.up(
        REPO_ROOT,
        port=port or DEFAULT_RPC_PORT,
        chain_id=settings.chain_id,
        x402_base_url=settings.x402_base_url,
        marketplace_base_url=settings.public_base_url,
    )
    return {**info, "deploymentFile": str(DEVNET_FILE)}


@click.group()
def main() -> None:
    """Dev tooling for the relayer: local chain, private database, demo."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)


@main.group("devnet")
def devnet_group() -> None:
    """Local chains: two anvils (Base Sepolia 84532 on :8545, Polygon 137 on :8546) with the
    reference protocol deployed and seeded."""


@devnet_group.command("up")
def devnet_up() -> None:
    """Start both anvils, deploy, seed; write .devdata/devnet.json (with the facilitator's URL
    and a dev API key for it), devnet-137.json and relayer.env."""
    try:
        info = _up(_environment())
        settings = dev_settings(info, _environment())
        env_file = write_env_file(settings)
        record_facilitator_key(DEVNET_FILE, settings)
    except RelayerError as exc:
        _fail(exc)
    chains = ", ".join(f"{c['name']} ({c['chainId']}) {c['rpcUrl']}" for c in info["chains"])
    click.echo(
        f"devnet up: {chains}; settlement {info['contracts']['settlement']} on chain {info['chainId']}; "
        f"product settings in {env_file}"
    )


@devnet_group.command("down")
def devnet_down() -> None:
    """Stop exactly the anvils that `devnet up` started, and the private dev database cluster
    under .devdata/ if the dev tooling started one (a server given by URL is never touched)."""
    click.echo("devnet stopped" if devnet.down(REPO_ROOT) else "devnet was not running")
    devdb.stop_private_cluster(STATE_DIR)  # logs what it stopped


@main.command()
def env() -> None:
    """Print the product settings of the running devnet as RELAYER_…=value lines."""
    if not DEVNET_FILE.is_file():
        _fail(ConfigError(message=f"{DEVNET_FILE} not found: run `python -m relayer_dev devnet up`"))
    info = {**json.loads(DEVNET_FILE.read_text()), "deploymentFile": str(DEVNET_FILE)}
    try:
        lines = env_lines(dev_settings(info, _environment()))
    except RelayerError as exc:
        _fail(exc)
    click.echo("\n".join(lines))


@main.command()
@click.option("--amount", default="1", show_default=True, help="Tonnes to retire.")
@click.option("--carbon-class", default=None, help="Carbon class symbol (default: the first discovered).")
def demo(amount: str, carbon_class: str | None) -> None:
    """A full gasless retirement on the local chain, over HTTP only, as a client does it."""
    from relayer_dev.demo import run_demo

    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("relayer_dev.devnet").setLevel(logging.INFO)
    try:
        info = _up(_environment())
        settings = dev_settings(info, _environment())
        assert settings.database_url is not None
        migrate(settings.database_url.get_secret_value())
        result = asyncio.run(run_demo(settings, info, amount=amount, carbon_class=carbon_class))
    except RelayerError as exc:
        _fail(exc)
    click.echo(json.dumps(result))
    if result.get("status") != "settled":
        sys.exit(1)


if __name__ == "__main__":
    main()
