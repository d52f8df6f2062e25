"""The local devnet's processes: starts and stops its anvils, and records the deployments.

Three local chains carry the same reference protocol: the daemon's own chain (Base Sepolia,
84532, on 127.0.0.1:8545, or Base, 8453), the other Base network (8453 or 84532, on
127.0.0.1:8547; each Base chain with its own USDC domain name, ``USD Coin`` on 8453 and
``USDC`` on 84532) and a stand-in for Polygon (137, on 127.0.0.1:8546). The daemon indexes the
other two for the marketplace catalogue. Owns, under ``.devdata/``: ``anvil.pid``,
``anvil.log`` and ``devnet.json`` (the daemon's deployment file, which also lists every
chain) for the first, ``anvil-<id>.pid``, ``anvil-<id>.log`` and ``devnet-<id>.json`` for
the others. Policy: ``up`` is idempotent (a live, described chain is reused, never redeployed);
``down`` stops exactly the processes named in the pid files and nothing else. Deployment
itself lives in :mod:`relayer_dev.deploy`; this module never imports web3.

The Base-like profile: ``DEVNET_BLOCK_TIME`` (seconds, e.g. ``0.2``, Base's block time since
Denim) makes both Base chains mine a block on that interval instead of one per
transaction (anvil's ``--block-time``, which takes fractions); ``devnet.json`` records it as
``blockTime`` (``null``: a block per transaction). The Polygon stand-in keeps mining a block
per transaction. :mod:`relayer_dev.traffic` fills the blocks with other senders' transfers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from relayer.domain.chains import BASE, BASE_SEPOLIA, POLYGON, facts
from relayer_dev import DevError
from relayer_dev.deploy import deploy_and_seed

log = logging.getLogger("relayer_dev.devnet")

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
ANVIL: Final = REPO_ROOT / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
DEFAULT_PROJECTS_FILE: Final = REPO_ROOT / "data" / "carbon-projects.json"

HOST: Final = "127.0.0.1"
BLOCK_TIME_ENV: Final = "DEVNET_BLOCK_TIME"
MIN_BLOCK_TIME_S: Final = 0.01
MAX_BLOCK_TIME_S: Final = 3600.0
BASE_FEE_WEI: Final = 10_000_000
START_TIMEOUT_S: Final = 15.0
STOP_TIMEOUT_S: Final = 5.0
RPC_PROBE_TIMEOUT_S: Final = 1.0

DEVDATA: Final = ".devdata"
PID_FILE: Final = "anvil.pid"
LOG_FILE: Final = "anvil.log"
DEVNET_FILE: Final = "devnet.json"

POLYGON_CHAIN_ID: Final = POLYGON.chain_id
DEFAULT_INDEX_PORT: Final = 8546
INDEX_PID_FILE: Final = f"anvil-{POLYGON_CHAIN_ID}.pid"
INDEX_LOG_FILE: Final = f"anvil-{POLYGON_CHAIN_ID}.log"
INDEX_DEVNET_FILE: Final = f"devnet-{POLYGON_CHAIN_ID}.json"
DEFAULT_OTHER_BASE_PORT: Final = 8547
"""The other Base network's port: 8453 beside a devnet of 84532, and 84532 beside one of 8453."""
BASE_PAIR: Final = (BASE.chain_id, BASE_SEPOLIA.chain_id)


def other_base(chain_id: int) -> int | None:
    """The other Base network of ``chain_id`` (8453 for 84532, 84532 for 8453), or ``None``
    when ``chain_id`` is not a Base network."""
    if chain_id not in BASE_PAIR:
        return None
    return BASE_PAIR[1] if chain_id == BASE_PAIR[0] else BASE_PAIR[0]


def _chain_files(chain_id: int) -> tuple[str, str, str]:
    """The pid, log and description files of a devnet chain other than the daemon's own."""
    return f"anvil-{chain_id}.pid", f"anvil-{chain_id}.log", f"devnet-{chain_id}.json"


CHAIN_FILES: Final = (
    (PID_FILE, DEVNET_FILE),
    *((_chain_files(c)[0], _chain_files(c)[2]) for c in (*BASE_PAIR, POLYGON_CHAIN_ID)),
)
"""Every (pid file, description file) a devnet may own, the daemon's chain first."""


def chain_name(chain_id: int) -> str:
    """A devnet chain's name as written in ``devnet.json``'s ``chains``: the x402 network slug
    of the chain table (``"base-sepolia"``, ``"polygon"``), or the id for a chain not in it."""
    known = facts(chain_id)
    return str(chain_id) if known is None else known.network


CURRENT_KEYS: Final = ("genesisHash", "treasury", "seededRetirements")
"""Keys a description of today's seeding has: a chain described without them was deployed by
an older release of this tool and is replaced rather than reused."""


class DevnetError(DevError):
    """anvil could not be started, answered wrongly, or the devnet files are inconsistent."""


def block_time_setting(environ: Mapping[str, str]) -> float | None:
    """The devnet's block time from ``DEVNET_BLOCK_TIME`` in ``environ``: seconds between
    blocks (fractions allowed: ``"0.2"`` is Base's 200 ms), or ``None`` when unset or empty
    (one block per transaction, the devnet's behaviour without it).

    Raises:
        DevnetError: the value is not a number of seconds from 0.01 to 3600.
    """
    raw = environ.get(BLOCK_TIME_ENV, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not MIN_BLOCK_TIME_S <= seconds <= MAX_BLOCK_TIME_S:  # also false for nan
        raise DevnetError(
            f"{BLOCK_TIME_ENV}={raw!r}: expected seconds between blocks, "
            f"from {MIN_BLOCK_TIME_S} to {MAX_BLOCK_TIME_S:.0f} (e.g. 0.2)"
        )
    return seconds


@dataclass(frozen=True)
class LocalChain:
    """One anvil of the devnet and the files under ``.devdata/`` that belong to it.

    Attributes:
        chain_id: the chain id anvil reports.
        name: the chain's name in ``devnet.json``'s ``chains`` (``"base-sepolia"``, ...).
        port: anvil's TCP port on 127.0.0.1.
        pid_file: file holding anvil's pid.
        log_file: anvil's output.
        description_file: the deployment's description (JSON).
        block_time: seconds between blocks, or ``None`` for a block per transaction.
    """

    chain_id: int
    name: str
    port: int
    pid_file: str
    log_file: str
    description_file: str
    block_time: float | None = None

    @property
    def rpc_url(self) -> str:
        """The chain's JSON-RPC URL."""
        return rpc_url(self.port)


def devnet_chains(
    port: int,
    chain_id: int,
    index_port: int,
    block_time: float | None = None,
    other_base_port: int = DEFAULT_OTHER_BASE_PORT,
) -> tuple[LocalChain, ...]:
    """The devnet's chains: the daemon's own (``chain_id`` on ``port``, described in
    ``devnet.json``, a block every ``block_time`` seconds or one per transaction); when it is
    a Base network, the other Base network (on ``other_base_port``, ``devnet-<id>.json``,
    the same blocks: both are Base-like); and the Polygon stand-in (137 on ``index_port``,
    ``devnet-137.json``, a block per transaction)."""
    chains = [LocalChain(chain_id, chain_name(chain_id), port, PID_FILE, LOG_FILE, DEVNET_FILE, block_time)]
    other = other_base(chain_id)
    if other is not None:
        chains.append(LocalChain(other, chain_name(other), other_base_port, *_chain_files(other), block_time))
    chains.append(
        LocalChain(
            POLYGON_CHAIN_ID,
            chain_name(POLYGON_CHAIN_ID),
            index_port,
            INDEX_PID_FILE,
            INDEX_LOG_FILE,
            INDEX_DEVNET_FILE,
        )
    )
    return tuple(chains)


def rpc_url(port: int) -> str:
    """HTTP JSON-RPC URL of a local anvil on ``port``."""
    return f"http://{HOST}:{port}"


def probe_chain_id(url: str, timeout_s: float = RPC_PROBE_TIMEOUT_S) -> int | None:
    """Ask ``url`` for ``eth_chainId`` over HTTP.

    Args:
        url: JSON-RPC endpoint.
        timeout_s: socket timeout, seconds.

    Returns:
        The chain id, or ``None`` when nothing usable answers.
    """
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            result = json.loads(response.read())["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return int(result, 16) if isinstance(result, str) else None


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((HOST, port)) == 0


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_anvil(
    state_dir: Path,
    port: int,
    chain_id: int = 84532,
    block_time: float | None = None,
    gas_limit: int | None = None,
    *,
    log_name: str = LOG_FILE,
) -> subprocess.Popen[bytes]:
    """Start anvil on ``127.0.0.1:port`` and wait until it answers ``eth_chainId``.

    anvil runs in its own session (it outlives the caller and ignores the caller's Ctrl-C);
    the caller owns the returned process and stops it by its pid. Its output goes to
    ``state_dir/log_name``.

    Args:
        state_dir: directory for the log file (created if missing).
        port: TCP port; must be free.
        chain_id: chain id to report (84532 Base Sepolia, 8453 Base, 137 Polygon).
        block_time: seconds between blocks (fractions allowed, e.g. 0.2); ``None`` mines
            one block per transaction.
        gas_limit: the block gas limit (anvil's default: 30M).
        log_name: the log file's name in ``state_dir`` (appended to).

    Returns:
        The running anvil process.

    Raises:
        DevnetError: the binary is missing, the port is taken, anvil exited, or it did not
            answer within 15 s (the log's tail is in the message).
    """
    if not ANVIL.is_file():
        raise DevnetError(f"anvil binary not found at {ANVIL}; run `npm install` in {REPO_ROOT}")
    if _port_in_use(port):
        raise DevnetError(f"port {port} on {HOST} is already in use")
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / log_name
    cmd = [
        str(ANVIL),
        "--host",
        HOST,
        "--port",
        str(port),
        "--chain-id",
        str(chain_id),
        "--base-fee",
        str(BASE_FEE_WEI),
    ]
    if block_time is not None:
        cmd += ["--block-time", f"{block_time:g}"]
    if gas_limit is not None:
        cmd += ["--gas-limit", str(gas_limit)]
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = rpc_url(port)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise DevnetError(f"anvil exited with code {proc.returncode}:\n{_log_tail(log_path)}")
        answered = probe_chain_id(url, timeout_s=0.5)
        if answered == chain_id:
            break
        if answered is not None or time.monotonic() > deadline:
            _terminate(proc.pid)
            proc.wait(timeout=STOP_TIMEOUT_S)
            why = f"reports chain {answered}" if answered is not None else "did not answer in time"
            raise DevnetError(f"anvil on {url} {why}:\n{_log_tail(log_path)}")
        time.sleep(0.05)
    log.info("devnet: anvil up on %s:%d (chain %d, pid %d)", HOST, port, chain_id, proc.pid)
    return proc


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process; reaps it if it is our child."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _is_anvil(pid: int) -> bool:
    """Whether ``pid`` runs the anvil binary (guards against a recycled pid)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return False
    return Path(argv0).name == "anvil"


def _terminate(pid: int) -> None:
    """SIGTERM ``pid``, wait up to 5 s, then SIGKILL it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    kill_deadline = time.monotonic() + STOP_TIMEOUT_S
    while _pid_alive(pid) and time.monotonic() < kill_deadline:
        time.sleep(0.05)


def _read_pid(pid_path: Path) -> int | None:
    try:
        return int(pid_path.read_text().strip())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def up(
    root: Path,
    *,
    port: int = 8545,
    chain_id: int = 84532,
    x402_base_url: str,
    marketplace_base_url: str | None = None,
    projects_file: Path = DEFAULT_PROJECTS_FILE,
    index_port: int = DEFAULT_INDEX_PORT,
    block_time: float | None = None,
    other_base_port: int = DEFAULT_OTHER_BASE_PORT,
) -> dict[str, Any]:
    """Start the devnet's anvils (:func:`devnet_chains`: the daemon's chain, the other Base
    network and the Polygon stand-in), deploy and seed the protocol on each, and write
    ``.devdata/devnet.json``, ``.devdata/devnet-<other Base id>.json`` and
    ``.devdata/devnet-137.json``.

    Idempotent per chain: when a chain's pid file names a live anvil that answers on its port
    with its chain id and its description file describes it (with today's seeding), that
    chain is reused as it is; when both are, ``devnet.json`` is returned unchanged. A stale
    pid file or description (anvil gone, or deployed by an older release) is replaced by a
    fresh chain.

    Args:
        root: project directory holding ``.devdata/``.
        port: the first anvil's TCP port on 127.0.0.1.
        chain_id: the first chain: 84532 (Base Sepolia, USDC domain "USDC") or 8453
            (domain "USD Coin").
        x402_base_url: the daemon's x402 base URL, recorded as ``x402BaseUrl``.
        marketplace_base_url: the daemon's public base URL (the marketplace routes
            ``/categories``, ``/carbonProjects``, ``/retirements/...`` are at its root),
            recorded as ``marketplaceBaseUrl``; default: ``x402_base_url`` without ``/api``.
            ``facilitatorUrl`` (the standard x402 facilitator) is this base + ``/facilitator``.
        projects_file: ``carbon-projects.json`` the credits are taken from.
        index_port: the Polygon stand-in's (chain 137) TCP port on 127.0.0.1.
        block_time: seconds between the Base chains' blocks (``DEVNET_BLOCK_TIME``, see
            :func:`block_time_setting`); ``None``: a block per transaction.
        other_base_port: the other Base network's TCP port on 127.0.0.1.

    Returns:
        The first chain's description (see :func:`relayer_dev.deploy.deploy_and_seed`) plus
        ``blockTime`` (``block_time``; each description file records its chain's),
        ``x402BaseUrl``, ``marketplaceBaseUrl``, ``facilitatorUrl``, ``usdc`` (for a standard
        client's spend controls) and ``chains``: one entry per local chain,
        ``{"chainId", "name", "rpcUrl", "deploymentFile"}`` (absolute path of its
        description file), the first chain first.

    Raises:
        DevnetError: a chain of this root's devnet is running on another port, chain id or
            block time, or anvil failed to start.
        relayer_dev.deploy.DeployError: deployment or seeding failed (the anvils this call
            started are stopped).
    """
    devdata = root / DEVDATA
    chains = devnet_chains(port, chain_id, index_port, block_time, other_base_port)
    reused = [_reusable(devdata, chain) for chain in chains]
    fresh = [chain for chain, existing in zip(chains, reused, strict=True) if existing is None]
    deployed = _bring_up(devdata, fresh, projects_file) if fresh else {}
    primary, *_, index = (
        existing if existing is not None else deployed[chain.chain_id]
        for chain, existing in zip(chains, reused, strict=True)
    )
    for chain in chains[1:]:
        if chain.chain_id in deployed:
            _write_json(devdata / chain.description_file, deployed[chain.chain_id])
    described = _described(devdata, chains, x402_base_url, marketplace_base_url)
    described["usdc"] = primary["contracts"]["usdc"]
    if reused[0] is not None:  # keep what it records, add what an older `up` did not
        missing = {k: v for k, v in described.items() if k not in primary}
        if not missing:
            return primary
        primary.update(missing)
    else:
        primary.update(described)
    _write_json(devdata / chains[0].description_file, primary)
    _log_up(devdata, chains, primary, index)
    return primary


def _log_up(
    devdata: Path, chains: Sequence[LocalChain], primary: dict[str, Any], index: dict[str, Any]
) -> None:
    """Say which chains run where and what was seeded on them."""
    for chain in chains:
        log.info("devnet: %s (chain %d) on %s", chain.name, chain.chain_id, chain.rpc_url)
    log.info(
        "devnet: %d contracts, %d classes, %d listings, %d payers, %d seeded retirements on each chain",
        len(primary["contracts"]),
        len(primary["carbonClasses"]),
        len(primary["listings"]),
        len(primary["payers"]),
        len(index["seededRetirements"]),
    )
    log.info("devnet: wrote %s", devdata / chains[0].description_file)


def _described(
    devdata: Path, chains: Sequence[LocalChain], x402_base_url: str, marketplace_base_url: str | None
) -> dict[str, Any]:
    """What ``devnet.json`` records beside the first chain's description: its block time, the
    daemon's base URLs (x402, marketplace, facilitator) and one entry per local chain (see
    :func:`up`)."""
    public = marketplace_base_url or x402_base_url.rstrip("/").removesuffix("/api")
    return {
        "blockTime": chains[0].block_time,
        "x402BaseUrl": x402_base_url,
        "marketplaceBaseUrl": public,
        "facilitatorUrl": f"{public.rstrip('/')}/facilitator",
        "chains": [
            {
                "chainId": chain.chain_id,
                "name": chain.name,
                "rpcUrl": chain.rpc_url,
                "deploymentFile": str((devdata / chain.description_file).resolve()),
            }
            for chain in chains
        ],
    }


def _reusable(devdata: Path, chain: LocalChain) -> dict[str, Any] | None:
    """``chain``'s description when its anvil is live, answers and is described with today's
    seeding; else ``None``, after stopping an undescribed or unresponsive anvil of its pid
    file and removing the chain's stale pid and description files.

    Raises:
        DevnetError: the pid file's anvil is described as another port or chain.
    """
    pid_path, description_path = devdata / chain.pid_file, devdata / chain.description_file
    pid = _read_pid(pid_path)
    if pid is not None and _pid_alive(pid) and _is_anvil(pid):
        existing = _load_devnet(description_path)
        url = chain.rpc_url
        if (
            existing is not None
            and existing.get("rpcUrl") == url
            and existing.get("chainId") == chain.chain_id
            and existing.get("blockTime") == chain.block_time  # absent: an older `up`, a block a tx
        ):
            if probe_chain_id(url) == chain.chain_id and all(k in existing for k in CURRENT_KEYS):
                log.info("devnet: already up on %s (chain %d, pid %d)", url, chain.chain_id, pid)
                return existing
        elif existing is not None:
            raise DevnetError(
                f"a devnet is already running (pid {pid}, {existing.get('rpcUrl')}, chain "
                f"{existing.get('chainId')}, {_blocks(existing.get('blockTime'))}; asked for "
                f"{chain.rpc_url}, chain {chain.chain_id}, {_blocks(chain.block_time)}); "
                "run `python -m relayer_dev devnet down` first"
            )
        log.info("devnet: stopping an unresponsive, undescribed or outdated anvil (pid %d)", pid)
        _terminate(pid)
    pid_path.unlink(missing_ok=True)
    description_path.unlink(missing_ok=True)
    return None


def _blocks(block_time: float | None) -> str:
    """How a chain mines, for messages: ``"a block every 0.2 s"`` or ``"a block per transaction"``."""
    return "a block per transaction" if block_time is None else f"a block every {block_time:g} s"


def _bring_up(devdata: Path, chains: list[LocalChain], projects_file: Path) -> dict[int, dict[str, Any]]:
    """Start an anvil for each of ``chains`` (pid files written), then deploy and seed the
    protocol on each in turn. Returns chain id -> description. On any failure every anvil
    started here is stopped, its pid file removed, and the error raised.

    One chain after the other: seeding a chain is bound by Python's own CPU (web3's encoding
    and signing take about 0.5 s of its 0.6 s), so deploying the two in threads saved
    nothing measurable, nor did processes on a 2-core machine (about 1.3 s either way)."""
    devdata.mkdir(parents=True, exist_ok=True)
    started: list[tuple[LocalChain, subprocess.Popen[bytes]]] = []
    deployed: dict[int, dict[str, Any]] = {}
    try:
        for chain in chains:
            proc = start_anvil(devdata, chain.port, chain.chain_id, chain.block_time, log_name=chain.log_file)
            started.append((chain, proc))
            (devdata / chain.pid_file).write_text(f"{proc.pid}\n")
        for chain in chains:
            description = deploy_and_seed(chain.rpc_url, chain.chain_id, projects_file)
            deployed[chain.chain_id] = {**description, "blockTime": chain.block_time}
    except BaseException:
        for chain, proc in started:
            _terminate(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_TIMEOUT_S)
            (devdata / chain.pid_file).unlink(missing_ok=True)
        raise
    # anvil is meant to outlive this process: drop the handles without the ResourceWarning
    # that Popen.__del__ gives for a child still running.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        started.clear()
        del proc
    return deployed


def _load_devnet(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def running(root: Path) -> list[tuple[int, str, int]]:
    """The devnet's anvils that run now, as ``(pid, rpcUrl, chainId)`` from their pid and
    description files (a pid that no longer runs anvil is left out; ``rpcUrl`` ``?`` and
    ``chainId`` 0 when its description is missing)."""
    devdata = root / DEVDATA
    found = []
    for pid_file, description_file in CHAIN_FILES:
        pid = _read_pid(devdata / pid_file)
        if pid is None or not _pid_alive(pid) or not _is_anvil(pid):
            continue
        described = _load_devnet(devdata / description_file) or {}
        found.append((pid, str(described.get("rpcUrl", "?")), int(described.get("chainId", 0))))
    return found


def down(root: Path) -> bool:
    """Stop the devnet's anvils and remove their pid files and descriptions (``devnet.json``,
    ``devnet-<id>.json``: :data:`CHAIN_FILES`).

    Only the pids in the pid files (``anvil.pid``, ``anvil-<id>.pid``) are signalled
    (SIGTERM, up to 5 s, then SIGKILL), and only if such a pid still runs anvil; other
    anvils are left alone. The log files are kept.

    Args:
        root: project directory holding ``.devdata/``.

    Returns:
        Whether a running anvil was stopped.
    """
    devdata = root / DEVDATA
    stopped = False
    for pid_file, description_file in CHAIN_FILES:
        pid_path = devdata / pid_file
        pid = _read_pid(pid_path)
        if pid is not None and _pid_alive(pid) and _is_anvil(pid):
            _terminate(pid)
            stopped = True
            log.info("devnet: stopped anvil (pid %d, %s)", pid, pid_file)
        elif pid is not None:
            log.info("devnet: pid %d from %s is not a running anvil; nothing to stop", pid, pid_path)
        pid_path.unlink(missing_ok=True)
        (devdata / description_file).unlink(missing_ok=True)
    return stopped
