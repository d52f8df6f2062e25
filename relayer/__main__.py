"""The product's command line: ``relayer serve | work | all | migrate``, and for the operator
``config check``, ``status``, ``ledger``, ``catalogue load``, ``apikey create|list|revoke|rotate``.
Each command checks the settings it needs before it connects anywhere; a missing or malformed
one stops it with exit code 2 and one line naming the environment variable (never its value)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Final, NoReturn

import click

from relayer.config import ConfigError, Settings, load_settings
from relayer.domain.errors import RelayerError
from relayer.line_progress import LineProgress
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


def _run(coro: Coroutine[Any, Any, None], event_loop: str = "asyncio") -> None:
    """Run until SIGTERM/SIGINT on ``event_loop`` ("uvloop" or "asyncio", the daemon's
    ``RELAYER_EVENT_LOOP``); a failure to start (an upstream down, an unusable deployment)
    is one line on stderr, not a traceback."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if event_loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    try:
        with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=factory) as runner:
            runner.run(coro)
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
    _run(serve(settings, workers=workers, http=http), settings.event_loop)


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
    their gas allowances were worth; and per x402 payment, USDC the treasury received and paid
    out. Needs RELAYER_DATABASE_URL (and RELAYER_CHAIN_ID; RELAYER_DEPLOYMENT_FILE and
    RELAYER_TREASURY_PRIVATE_KEY for the payments)."""
    from relayer.ops import ledger_summary

    settings = _settings("database_url")
    try:
        summary = asyncio.run(ledger_summary(settings))
    except RelayerError as exc:
        _fail(exc)
    click.echo(json.dumps(summary, indent=2))


@main.group()
def config() -> None:
    """The daemon's configuration."""


@config.command("check")
@click.option(
    "--connect",
    is_flag=True,
    help="Also check that the database answers and is migrated to this version's head, and that "
    "each RPC URL answers with its configured chain id.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the table.")
def config_check(connect: bool, as_json: bool) -> None:
    """Print the effective configuration (every setting, its value with secrets redacted, and
    where it came from) and what would stop `relayer all` from starting. Offline unless
    --connect. Exit 0: it would start; 2: a setting to fix, or (with --connect) the database
    or a chain node that cannot be used: one line each on stderr, naming the variable, its
    value (redacted), the cause and the remedy, the same lines a daemon's start prints."""
    from pydantic import ValidationError

    from relayer.config import setting_origins, validation_problems
    from relayer.ops import configuration, connected_findings, offline_problems, render_configuration

    rows: list[dict[str, str]] = []
    unreachable: list[str] = []
    connected = False
    try:
        settings = Settings()
    except ValidationError as exc:
        problems = validation_problems(exc)
    except ConfigError as exc:
        problems = [exc.message]
    else:
        setup_logging(settings.log_level)
        rows = configuration(settings, setting_origins())
        problems = offline_problems(settings, DAEMON_SETTINGS)
        if connect and not problems:
            try:
                found = asyncio.run(connected_findings(settings))
            except RelayerError as exc:
                _fail(exc)
            problems, unreachable, connected = found.problems, found.unreachable, True
    if as_json:
        # connected: with --connect, the database and every chain node answered as configured
        report = {
            "settings": rows,
            "problems": problems,
            "unreachable": unreachable,
            "connected": connected and not unreachable,
        }
        click.echo(json.dumps(report, indent=2))
    else:
        if rows:
            click.echo(render_configuration(rows))
        for line in problems + unreachable:
            click.echo(f"relayer: {line}", err=True)
        if connect and not connected:
            click.echo("relayer: not connected: fix the settings first", err=True)
        if not problems and not unreachable:
            checked = (
                "the settings, the database and every chain node"
                if connected
                else "the settings, offline (--connect also tries the database and the chain nodes)"
            )
            click.echo(f"configuration ok: {checked}")
    if problems or unreachable:
        sys.exit(EXIT_CONFIG)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the tables.")
def status(as_json: bool) -> None:
    """Jobs by state (with the oldest open one's age), executor keys (lane nonce against the
    chain's, balance, lease held or free) and indexer lag per chain. Needs RELAYER_DATABASE_URL;
    with RELAYER_RPC_URL (and RELAYER_INDEX_CHAINS) also the chains' figures."""
    from relayer.ops import render_status, status_report

    settings = _settings("database_url")
    try:
        report = asyncio.run(status_report(settings))
    except RelayerError as exc:
        _fail(exc)
    click.echo(json.dumps(report, indent=2) if as_json else render_status(report))


@contextlib.contextmanager
def _progress(total: int, label: str) -> Iterator[Callable[[int], None]]:
    """Progress on stderr, taking counts done: a bar on a terminal; plain lines
    (:class:`relayer.line_progress.LineProgress`) otherwise, e.g. in a Kubernetes Job."""
    if sys.stderr.isatty():
        with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
            yield bar.update
    else:
        with LineProgress(total, label, sys.stderr, unit="projects") as lines:
            yield lines.update


@main.group()
def catalogue() -> None:
    """The marketplace's carbon project catalogue."""


@catalogue.command("load")
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A carbon-projects.json-shaped file (default: the packaged data set of 648 real projects).",
)
def catalogue_load(path: Path | None) -> None:
    """Insert or update the catalogue's projects (idempotent). Needs RELAYER_DATABASE_URL."""
    from relayer.admin import load_catalogue
    from relayer.package_data import projects_json
    from relayer.service.catalogue_load import parse_catalogue

    settings = _settings("database_url")
    _migrate(settings)
    try:
        records = parse_catalogue(projects_json() if path is None else path.read_bytes())
    except ConfigError as exc:
        _fail(exc)
    with _progress(len(records), "loading projects") as update:
        try:
            changed = asyncio.run(load_catalogue(settings, records, update))
        except RelayerError as exc:
            _fail(exc)
    click.echo(f"catalogue: {len(records)} projects read, {changed} inserted or changed")


@main.group()
def apikey() -> None:
    """Bearer API keys of the marketplace's quotes and orders and the x402 facilitator."""


@apikey.command("create")
@click.option("--name", required=True, help="Who the key is for (shown in logs, at most 100 characters).")
@click.option(
    "--scope",
    "scopes",
    type=click.Choice(["marketplace", "facilitator"]),
    multiple=True,
    help="What the key may call (repeatable): marketplace (quotes, orders; the default) or "
    "facilitator (/facilitator/verify and /settle).",
)
@click.option(
    "--rate",
    default=None,
    help="The key's facilitator request limit per process, e.g. 50/second "
    "(default RELAYER_FACILITATOR_DEFAULT_RATE_LIMIT).",
)
@click.option(
    "--gas-budget-wei",
    type=click.IntRange(min=0),
    default=None,
    help="Gas (wei) the key's settles may cost per UTC day "
    "(default RELAYER_FACILITATOR_DEFAULT_GAS_BUDGET_WEI_PER_DAY).",
)
def apikey_create(name: str, scopes: tuple[str, ...], rate: str | None, gas_budget_wei: int | None) -> None:
    """Create a key and print it once (only its SHA-256 is stored). Needs RELAYER_DATABASE_URL."""
    from relayer.admin import create_api_key

    settings = _settings("database_url")
    _migrate(settings)
    try:
        token = asyncio.run(create_api_key(settings, name, scopes or ("marketplace",), rate, gas_budget_wei))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    except RelayerError as exc:
        _fail(exc)
    click.echo(token)


def _key_row(k: Any) -> dict[str, Any]:
    """An API key as ``relayer apikey list --json`` shows it (never its hash or secret)."""
    return {
        "id": k.id,
        "prefix": k.prefix,
        "name": k.name,
        "scopes": list(k.scopes),
        "rateLimit": k.rate_limit,
        "gasBudgetWeiPerDay": None if k.gas_budget_wei_per_day is None else str(k.gas_budget_wei_per_day),
        "createdAt": k.created_at.isoformat(timespec="seconds"),
        "lastUsedAt": None if k.last_used_at is None else k.last_used_at.isoformat(timespec="seconds"),
        "revokedAt": None if k.revoked_at is None else k.revoked_at.isoformat(timespec="seconds"),
    }


@apikey.command("list")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of the table.")
def apikey_list(as_json: bool) -> None:
    """Every key, oldest first: id, prefix (the token's public part), name, scopes, rate limit,
    gas budget, created, last used (written at most once a minute), revoked. Never a secret.
    Needs RELAYER_DATABASE_URL."""
    from relayer.admin import list_api_keys
    from relayer.ops import table

    settings = _settings("database_url")
    _migrate(settings)
    try:
        keys = [_key_row(k) for k in asyncio.run(list_api_keys(settings))]
    except RelayerError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(keys, indent=2))
        return
    headers = [
        "id",
        "prefix",
        "name",
        "scopes",
        "rate",
        "gas budget (wei/day)",
        "created",
        "last used",
        "revoked",
    ]
    rows = [
        [
            str(k["id"]),
            k["prefix"],
            k["name"],
            ",".join(k["scopes"]),
            k["rateLimit"] or "default",
            k["gasBudgetWeiPerDay"] or "default",
            k["createdAt"],
            k["lastUsedAt"] or "never",
            k["revokedAt"] or "-",
        ]
        for k in keys
    ]
    click.echo(table(headers, rows, right=(0,)) if rows else "no API keys (relayer apikey create)")


@apikey.command("revoke")
@click.argument("key_id", type=click.IntRange(min=1))
def apikey_revoke(key_id: int) -> None:
    """Revoke key KEY_ID (its id in `relayer apikey list`) at once: every process looks keys
    up on each request, so its next request is refused (401). Needs RELAYER_DATABASE_URL."""
    from relayer.admin import revoke_api_key

    settings = _settings("database_url")
    _migrate(settings)
    try:
        key = asyncio.run(revoke_api_key(settings, key_id))
    except RelayerError as exc:
        _fail(exc)
    if key is None:
        raise click.BadParameter(f"no API key {key_id} (see relayer apikey list)", param_hint="KEY_ID")
    click.echo(
        f"API key {key.id} ({key.name}, mk_{key.prefix}_...) revoked at {key.revoked_at:%Y-%m-%d %H:%M:%S %Z}"
    )


@apikey.command("rotate")
@click.argument("key_id", type=click.IntRange(min=1))
def apikey_rotate(key_id: int) -> None:
    """Replace key KEY_ID by a new one with the same name, scopes, rate limit and gas budget,
    and revoke the old one at once; prints the new key once. Needs RELAYER_DATABASE_URL."""
    from relayer.admin import rotate_api_key

    settings = _settings("database_url")
    _migrate(settings)
    try:
        _key, token = asyncio.run(rotate_api_key(settings, key_id))
    except LookupError as exc:
        raise click.BadParameter(str(exc), param_hint="KEY_ID") from None
    except RelayerError as exc:
        _fail(exc)
    click.echo(token)


if __name__ == "__main__":
    main()
