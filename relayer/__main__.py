"""The product's command line: ``relayer serve | work | all | migrate``. Each command checks
the settings it needs before it connects anywhere; a missing or malformed one stops it with
exit code 2 and one line naming the environment variable (never its value)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Coroutine
from typing import Any, Final, NoReturn

import click

from relayer.config import ConfigError, Settings, load_settings
from relayer.domain.errors import RelayerError
from relayer.logs import setup_logging

DAEMON_SETTINGS: Final = ("database_url", "rpc_url", "deployment_file", "executor_private_key")
EXIT_CONFIG: Final = 2
EXIT_UNAVAILABLE: Final = 1


def _fail(error: RelayerError) -> NoReturn:
    """One line on stderr; exit 2 for a setting, 1 for anything else (e.g. an upstream down)."""
    click.echo(f"relayer: {error.message}", err=True)
    sys.exit(EXIT_CONFIG if isinstance(error, ConfigError) else EXIT_UNAVAILABLE)


def _settings(*required: str) -> Settings:
    """Load the settings and insist on ``required``; exits 2 on any problem."""
    try:
        settings = load_settings()
        settings.require(*required)
    except ConfigError as exc:
        _fail(exc)
    setup_logging(settings.log_level)
    return settings


def _migrate(settings: Settings) -> list[str]:
    from relayer.store.migrations import migrate

    assert settings.database_url is not None
    try:
        return migrate(settings.database_url.get_secret_value())
    except RelayerError as exc:
        _fail(exc)


def _run(coro: Coroutine[Any, Any, None]) -> None:
    """Run until SIGTERM/SIGINT; a failure to start (an upstream down, an unusable
    deployment) is one line on stderr, not a traceback."""
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(coro)
    except RelayerError as exc:
        _fail(exc)


@click.group()
def main() -> None:
    """Gasless relay executor for carbon retirement on Base."""


@main.command()
def migrate() -> None:
    """Apply pending database migrations (safe to run concurrently). Needs RELAYER_DATABASE_URL."""
    applied = _migrate(_settings("database_url"))
    click.echo(f"migrations applied: {len(applied)}" + (f" ({', '.join(applied)})" if applied else ""))


def _daemon(workers: bool, http: bool) -> None:
    from relayer.app import serve

    settings = _settings(*DAEMON_SETTINGS)
    _migrate(settings)
    _run(serve(settings, workers=workers, http=http))


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
    """HTTP API and workers in one process."""
    _daemon(workers=True, http=True)


@main.command()
def ledger() -> None:
    """The executor's solvency ledger as JSON: wei paid for mined transactions against what
    their gas allowances were worth. Needs RELAYER_DATABASE_URL (and RELAYER_CHAIN_ID)."""
    import json

    from relayer.app import ledger_summary

    settings = _settings("database_url")
    try:
        summary = asyncio.run(ledger_summary(settings))
    except RelayerError as exc:
        _fail(exc)
    click.echo(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
