"""What the dev tooling brings up for ``devnet up`` and ``demo`` (the devnet, its database,
``.devdata/relayer.env``), and what of it runs now: the anvils, the private Postgres cluster
and the daemon ``make devnet`` started, so a command can say what it leaves running and how
to stop it (``make devnet-down`` stops exactly these)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from relayer.config import Settings
from relayer_dev import devdb, devnet
from relayer_dev.facilitator import record_facilitator_key
from relayer_dev.settings import DEFAULT_RPC_PORT, REPO_ROOT, dev_settings, shown, write_env_file

STOP_COMMAND: Final = "make devnet-down"
DAEMON_PID: Final = "daemon.pid"
"""``make devnet``'s daemon: its pid file under ``.devdata/`` (see the Makefile)."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A devnet brought up: its description (``devnet.json``), the daemon's settings for it
    and the env file holding them."""

    devnet: dict[str, Any]
    settings: Settings
    env_file: Path


def prepare(
    environment: Settings,
    root: Path = REPO_ROOT,
    index_port: int = devnet.DEFAULT_INDEX_PORT,
    other_base_port: int = devnet.DEFAULT_OTHER_BASE_PORT,
) -> Prepared:
    """Bring up (or reuse) the devnet of ``root`` for ``environment`` (its ``RELAYER_RPC_URL``
    port, chain id and base URLs), supply the missing daemon settings (database included) and
    write them to ``root/.devdata/relayer.env`` (mode 0600): the file ``make devnet`` and a
    command run by hand source. Records the devnet's facilitator key in ``devnet.json``.

    Raises:
        relayer_dev.devnet.DevnetError, relayer_dev.deploy.DeployError: the devnet failed.
        relayer_dev.devdb.DevDbError: the private database cluster failed.
        StoreUnavailable: the database failed.
    """
    port = urlsplit(environment.rpc_url).port if environment.rpc_url else None
    devnet_file = root / devnet.DEVDATA / devnet.DEVNET_FILE
    info = devnet.up(
        root,
        port=port or DEFAULT_RPC_PORT,
        chain_id=environment.chain_id,
        x402_base_url=environment.x402_base_url,
        marketplace_base_url=environment.public_base_url,
        index_port=index_port,
        block_time=devnet.block_time_setting(os.environ),
        other_base_port=other_base_port,
    )
    info = {**info, "deploymentFile": str(devnet_file)}
    settings = dev_settings(info, environment)
    env_file = write_env_file(settings, root / devnet.DEVDATA / "relayer.env")
    record_facilitator_key(devnet_file, settings)
    return Prepared(info, settings, env_file)


def left_running(root: Path = REPO_ROOT) -> list[str]:
    """One phrase per process of ``root``'s dev tooling that runs now: each anvil (RPC URL,
    chain, pid), the private Postgres cluster (port, pid, data directory) and ``make
    devnet``'s daemon (pid); empty when none runs."""
    state = root / devnet.DEVDATA
    found = [f"anvil {url} (chain {chain}, pid {pid})" for pid, url, chain in devnet.running(root)]
    cluster = devdb.running_private_cluster(state)
    if cluster is not None:
        port, pid, data_dir = cluster
        found.append(f"the private Postgres cluster on 127.0.0.1:{port} (pid {pid}, {shown(data_dir)})")
    daemon = _daemon_pid(state / DAEMON_PID)
    if daemon is not None:
        found.append(f"the daemon of `make devnet` (pid {daemon}, log {shown(state / 'daemon.log')})")
    return found


def closing_lines(env_file: Path, result: dict[str, Any], root: Path = REPO_ROOT) -> list[str]:
    """The demo's closing lines: what it leaves running (:func:`left_running`; and whether
    its daemon stopped) and the command that stops it, the certificates saved, and how to
    run a product command by hand with ``env_file``."""
    running = left_running(root)
    if not result.get("daemonLeftRunning"):
        running.append("the demo's in-process daemon has stopped")
    lines = [
        "left running: " + ("; ".join(running) if running else "nothing"),
        f"stop them with: {STOP_COMMAND}",
    ]
    if result.get("certificateFiles"):
        lines.append("certificates saved: " + " ".join(shown(Path(f)) for f in result["certificateFiles"]))
    lines.append(f"a product command by hand: set -a; . {shown(env_file)}; set +a; .venv/bin/relayer status")
    return lines


def _daemon_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` when it runs ``relayer all`` (judged by its command line, as
    the Makefile does, so a recycled pid is not named)."""
    try:
        pid = int(pid_file.read_text().strip())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return None
    return pid if "bin/relayer all" in command else None
