"""The ``relayer`` command line: serve, work, all, migrate, devnet up|down, demo."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from pathlib import Path
from urllib.parse import urlsplit

import click

from relayer.config import Settings
from relayer.logs import setup_logging

ROOT = Path(__file__).resolve().parents[1]
STATE_DIR = ROOT / ".devdata"
log = logging.getLogger("relayer")


def _settings() -> Settings:
    return Settings()


def database_url(settings: Settings) -> str:
    """RELAYER_DATABASE_URL, or a private throwaway cluster under .devdata/ (dev tooling)."""
    from relayer.devdb import ensure_database_url

    given = settings.database_url.get_secret_value() if settings.database_url else None
    return ensure_database_url(given, STATE_DIR)


def _migrate(dsn: str) -> list[str]:
    from relayer.store.db import migrate

    return migrate(dsn)


def _run(coro_factory: object) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(coro_factory)  # type: ignore[arg-type]


@click.group()
def main() -> None:
    """Gasless relay executor for carbon retirement on Base."""


@main.command()
def migrate() -> None:
    """Apply pending database migrations (safe to run concurrently)."""
    settings = _settings()
    setup_logging(settings.log_level)
    applied = _migrate(database_url(settings))
    click.echo(f"migrations applied: {len(applied)}" + (f" ({', '.join(applied)})" if applied else ""))


def _daemon(workers: bool, http: bool) -> None:
    from relayer.app import serve

    settings = _settings()
    setup_logging(settings.log_level)
    dsn = database_url(settings)
    _migrate(dsn)
    _run(serve(settings, dsn, workers=workers, http=http))


@main.command("serve")
def serve_cmd() -> None:
    """HTTP API only (many replicas)."""
    _daemon(workers=False, http=True)


@main.command()
def work() -> None:
    """Workers only: broadcaster (executor lease) and chain follower."""
    _daemon(workers=True, http=False)


@main.command("all")
def all_cmd() -> None:
    """HTTP API and workers in one process (the local default)."""
    _daemon(workers=True, http=True)


@main.group()
def devnet() -> None:
    """Local chain: anvil with the reference protocol deployed and seeded."""


def _anvil_port(settings: Settings) -> int:
    return urlsplit(settings.rpc_url).port or 8545


@devnet.command("up")
def devnet_up() -> None:
    """Start anvil, deploy, seed, and write .devdata/devnet.json."""
    from relayer import devnet as dn

    settings = _settings()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    info = dn.up(
        ROOT, port=_anvil_port(settings), chain_id=settings.chain_id, x402_base_url=settings.x402_base_url
    )
    click.echo(
        f"devnet up: {info['rpcUrl']} chain {info['chainId']}, settlement {info['contracts']['settlement']}"
    )


@devnet.command("down")
def devnet_down() -> None:
    """Stop exactly the anvil that `devnet up` started, and the private dev database cluster
    under .devdata/ if the dev tooling started one (a server given by URL is never touched)."""
    from relayer import devnet as dn
    from relayer.devdb import stop_private_cluster

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    click.echo("devnet stopped" if dn.down(ROOT) else "devnet was not running")
    stop_private_cluster(STATE_DIR)  # logs what it stopped


@main.command()
@click.option("--amount", default="1", show_default=True, help="Tonnes to retire.")
@click.option("--carbon-class", default=None, help="Carbon class symbol (default: the first discovered).")
def demo(amount: str, carbon_class: str | None) -> None:
    """A full gasless retirement on the local chain, over HTTP only, as a client does it."""
    from relayer import devnet as dn
    from relayer.demo import run_demo

    settings = _settings()
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("relayer.devnet").setLevel(logging.INFO)
    info = dn.up(
        ROOT, port=_anvil_port(settings), chain_id=settings.chain_id, x402_base_url=settings.x402_base_url
    )
    dsn = database_url(settings)
    _migrate(dsn)
    result = asyncio.run(run_demo(settings, dsn, info, amount=amount, carbon_class=carbon_class))
    click.echo(json.dumps(result))
    if result.get("status") != "settled":
        sys.exit(1)


if __name__ == "__main__":
    main()
