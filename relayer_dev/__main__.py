"""The dev command line, run from the repository root: ``python -m relayer_dev devnet up|down``,
``demo``, ``env``, ``traffic``, ``pictures`` and ``config-doc``. It supplies the product's settings (see
:mod:`relayer_dev.settings`)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import NoReturn

import click

from relayer.config import ConfigError, Settings, load_settings
from relayer.domain.errors import RelayerError
from relayer.store.migrations import migrate
from relayer_dev import devdb, devnet
from relayer_dev.settings import (
    DEFAULT_RPC_PORT,
    DEVNET_FILE,
    REPO_ROOT,
    STATE_DIR,
    dev_settings,
    env_lines,
)
from relayer_dev.workspace import closing_lines, prepare


def _fail(error: RelayerError) -> NoReturn:
    click.echo(f"relayer_dev: {error.message}", err=True)
    sys.exit(2 if isinstance(error, ConfigError) else 1)


def _environment() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        _fail(exc)


@click.group()
def main() -> None:
    """Dev tooling for the relayer: local chain, private database, demo."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)


@main.group("devnet")
def devnet_group() -> None:
    """Local chains: three anvils (Base Sepolia 84532 on :8545, Base 8453 on :8547, Polygon 137
    on :8546) with the reference protocol deployed and seeded. DEVNET_BLOCK_TIME=0.2 (seconds)
    mines both Base chains' blocks on that interval (Base's 200 ms) instead of one per
    transaction."""


@devnet_group.command("up")
def devnet_up() -> None:
    """Start the anvils, deploy, seed; write .devdata/devnet.json (with the facilitator's URL
    and a dev API key for it), devnet-8453.json, devnet-137.json and relayer.env."""
    try:
        prepared = prepare(_environment())
    except RelayerError as exc:
        _fail(exc)
    info, env_file = prepared.devnet, prepared.env_file
    chains = ", ".join(f"{c['name']} ({c['chainId']}) {c['rpcUrl']}" for c in info["chains"])
    blocks = (
        "a block per transaction"
        if info.get("blockTime") is None
        else f"a block every {info['blockTime']:g} s"
    )
    click.echo(
        f"devnet up: {chains} ({blocks}); settlement {info['contracts']['settlement']} on chain "
        f"{info['chainId']}; product settings in {env_file}"
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
    """A full gasless retirement on the local chain, over HTTP only, as a client does it.
    Writes .devdata/relayer.env, saves the certificates under .devdata/certificates, and ends
    by naming what it leaves running (the anvils, the private database) and the command that
    stops it (make devnet-down). Refuses an address another service holds."""
    from relayer_dev.demo import refuse_foreign, run_demo, step

    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("relayer_dev.devnet").setLevel(logging.INFO)
    environment = _environment()
    try:
        asyncio.run(refuse_foreign(environment))  # before anything is started
        prepared = prepare(environment)
        settings = prepared.settings
        assert settings.database_url is not None
        migrate(settings.database_url.get_secret_value())
        result = asyncio.run(run_demo(settings, prepared.devnet, amount=amount, carbon_class=carbon_class))
    except RelayerError as exc:
        _fail(exc)
    for line in closing_lines(prepared.env_file, result):
        step(line)
    click.echo(json.dumps(result))
    if result.get("status") != "settled":
        sys.exit(1)


@main.command()
@click.option(
    "--tps",
    type=click.FloatRange(0, min_open=True),
    default=150.0,
    show_default=True,
    help="Transfers a second.",
)
@click.option(
    "--rpc", default=None, help="The node's JSON-RPC URL (default: the devnet's, else http://127.0.0.1:8545)."
)
@click.option(
    "--accounts", type=click.IntRange(1, 10_000), default=100, show_default=True, help="Sender accounts."
)
@click.option(
    "--seconds",
    type=click.FloatRange(0, min_open=True),
    default=None,
    help="Stop after this long (default: at Ctrl-C or SIGTERM).",
)
@click.option(
    "--deployment-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The devnet description whose USDC and kVCM to move (default: .devdata/devnet.json if present).",
)
@click.option(
    "--ours-share",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="Share of transfers moving the devnet's USDC or kVCM; the rest move a token of the traffic's own.",
)
@click.option(
    "--report-every",
    type=click.FloatRange(0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds between progress lines on stderr.",
)
def traffic(
    tps: float,
    rpc: str | None,
    accounts: int,
    seconds: float | None,
    deployment_file: Path | None,
    ours_share: float,
    report_every: float,
) -> None:
    """Background traffic: other senders' ERC-20 transfers (each a Transfer log) at a steady
    rate, pipelined, so blocks look like Base's. Prints a JSON summary (achievedTps, errors,
    CPU) when it stops."""
    from relayer_dev.traffic import TrafficOptions, load_deployment, run_traffic

    try:
        if deployment_file is None and DEVNET_FILE.is_file():
            deployment_file = DEVNET_FILE
        deployment = load_deployment(deployment_file) if deployment_file is not None else None
        if deployment is None:
            logging.getLogger("relayer_dev").warning("no devnet description: the traffic's own token only")
        url = rpc or (deployment or {}).get("rpcUrl") or f"http://127.0.0.1:{DEFAULT_RPC_PORT}"
        options = TrafficOptions(url, tps, accounts, seconds, deployment, ours_share, report_every)
        summary = asyncio.run(run_traffic(options))
    except RelayerError as exc:
        _fail(exc)
    click.echo(json.dumps(summary))


@main.command()
def pictures() -> None:
    """Render the certificate's pictures in docs/images (the PDF, and the HTML page as printed)."""
    from relayer_dev.pictures import render

    for path in render(REPO_ROOT / "docs" / "images"):
        click.echo(f"wrote {path.relative_to(REPO_ROOT)}")


@main.command("config-doc")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when the committed reference is stale.")
def config_doc(check: bool) -> None:
    """Generate the settings reference of docs/configuration.md from relayer/config.py
    (between its markers; `make docs` runs this)."""
    from relayer_dev import config_doc as doc

    try:
        if check:
            if doc.stale():
                click.echo(f"{doc.DOC_FILE}: the settings reference is stale: run {doc.REGENERATE}", err=True)
                sys.exit(1)
            click.echo(f"{doc.DOC_FILE}: the settings reference is current")
            return
        changed = doc.write()
    except doc.DocError as exc:
        click.echo(f"relayer_dev: {exc}", err=True)
        sys.exit(2)
    click.echo(f"{doc.DOC_FILE}: settings reference {'rewritten' if changed else 'already current'}")


if __name__ == "__main__":
    main()
