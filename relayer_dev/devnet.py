"""The local devnet's processes: starts and stops anvil, and records the deployment.

Owns ``.devdata/anvil.pid``, ``.devdata/anvil.log`` and ``.devdata/devnet.json``. Policy:
``up`` is idempotent (a live devnet is reused, never redeployed); ``down`` stops exactly
the process named in the pid file and nothing else. Deployment itself lives in
:mod:`relayer_dev.deploy`; this module never imports web3.
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
from pathlib import Path
from typing import Any, Final

from relayer_dev import DevError
from relayer_dev.deploy import deploy_and_seed

log = logging.getLogger("relayer_dev.devnet")

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
ANVIL: Final = REPO_ROOT / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
DEFAULT_PROJECTS_FILE: Final = REPO_ROOT / "data" / "carbon-projects.json"

HOST: Final = "127.0.0.1"
BASE_FEE_WEI: Final = 10_000_000
START_TIMEOUT_S: Final = 15.0
STOP_TIMEOUT_S: Final = 5.0
RPC_PROBE_TIMEOUT_S: Final = 1.0

DEVDATA: Final = ".devdata"
PID_FILE: Final = "anvil.pid"
LOG_FILE: Final = "anvil.log"
DEVNET_FILE: Final = "devnet.json"


class DevnetError(DevError):
    """anvil could not be started, answered wrongly, or the devnet files are inconsistent."""


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


def probe_genesis_hash(url: str, timeout_s: float = RPC_PROBE_TIMEOUT_S) -> str:
    """The 0x hash of block 0 at ``url`` (a chain's identity across resets).

    Raises:
        DevnetError: nothing usable answers.
    """
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber", "params": ["0x0", False]}
    ).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return str(json.loads(response.read())["result"]["hash"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DevnetError(f"no genesis block at {url}: {type(exc).__name__}") from None


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
) -> subprocess.Popen[bytes]:
    """Start anvil on ``127.0.0.1:port`` and wait until it answers ``eth_chainId``.

    anvil runs in its own session (it outlives the caller and ignores the caller's Ctrl-C);
    the caller owns the returned process and stops it by its pid. Its output goes to
    ``state_dir/anvil.log``.

    Args:
        state_dir: directory for the log file (created if missing).
        port: TCP port; must be free.
        chain_id: chain id to report (84532 Base Sepolia, 8453 Base).
        block_time: seconds between blocks; ``None`` mines one block per transaction.
        gas_limit: the block gas limit (anvil's default: 30M).

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
    log_path = state_dir / LOG_FILE
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
        cmd += ["--block-time", str(block_time)]
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
    projects_file: Path = DEFAULT_PROJECTS_FILE,
) -> dict[str, Any]:
    """Start anvil, deploy and seed the protocol, and write ``.devdata/devnet.json``.

    Idempotent: when ``.devdata/anvil.pid`` names a live anvil that answers on ``port`` with
    ``chain_id`` and ``devnet.json`` describes it, that description is returned unchanged.
    A stale pid file or description (anvil gone) is replaced by a fresh devnet.

    Args:
        root: project directory holding ``.devdata/``.
        port: anvil's TCP port on 127.0.0.1.
        chain_id: 84532 (Base Sepolia, USDC domain "USDC") or 8453 (domain "USD Coin").
        x402_base_url: the daemon's x402 base URL, recorded as ``x402BaseUrl``.
        projects_file: ``carbon-projects.json`` the credits are taken from.

    Returns:
        The devnet description (see :func:`relayer_dev.deploy.deploy_and_seed`) plus
        ``x402BaseUrl``.

    Raises:
        DevnetError: a devnet from this root is running on another port or chain, or anvil
            failed to start.
        relayer_dev.deploy.DeployError: deployment or seeding failed (anvil is stopped).
    """
    devdata = root / DEVDATA
    pid_path, devnet_path = devdata / PID_FILE, devdata / DEVNET_FILE
    pid = _read_pid(pid_path)
    if pid is not None and _pid_alive(pid) and _is_anvil(pid):
        existing = _load_devnet(devnet_path)
        url = rpc_url(port)
        if existing is not None and existing.get("rpcUrl") == url and existing.get("chainId") == chain_id:
            if probe_chain_id(url) == chain_id:
                log.info("devnet: already up on %s (chain %d, pid %d)", url, chain_id, pid)
                if "genesisHash" not in existing:  # described before genesis hashes were recorded
                    existing["genesisHash"] = probe_genesis_hash(url)
                    _write_json(devnet_path, existing)
                return existing
        elif existing is not None:
            raise DevnetError(
                f"a devnet is already running (pid {pid}, {existing.get('rpcUrl')}, chain "
                f"{existing.get('chainId')}); run `python -m relayer_dev devnet down` first"
            )
        log.info("devnet: stopping unresponsive or undescribed anvil (pid %d)", pid)
        _terminate(pid)
    pid_path.unlink(missing_ok=True)
    devnet_path.unlink(missing_ok=True)

    proc = start_anvil(devdata, port, chain_id)
    pid_path.write_text(f"{proc.pid}\n")
    try:
        devnet = deploy_and_seed(rpc_url(port), chain_id, projects_file)
    except BaseException:
        _terminate(proc.pid)
        proc.wait(timeout=STOP_TIMEOUT_S)
        pid_path.unlink(missing_ok=True)
        raise
    # anvil is meant to outlive this process: drop the handle without the ResourceWarning
    # that Popen.__del__ gives for a child still running.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del proc
    devnet["x402BaseUrl"] = x402_base_url
    _write_json(devnet_path, devnet)
    log.info("devnet: deployed %d contracts", len(devnet["contracts"]))
    log.info(
        "devnet: seeded %d classes, %d listings, %d payers",
        len(devnet["carbonClasses"]),
        len(devnet["listings"]),
        len(devnet["payers"]),
    )
    log.info("devnet: wrote %s", devnet_path)
    return devnet


def _load_devnet(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def down(root: Path) -> bool:
    """Stop the devnet's anvil and remove ``.devdata/anvil.pid`` and ``devnet.json``.

    Only the pid in the pid file is signalled (SIGTERM, up to 5 s, then SIGKILL), and only
    if that pid still runs anvil; other anvils are left alone. The log file is kept.

    Args:
        root: project directory holding ``.devdata/``.

    Returns:
        Whether a running anvil was stopped.
    """
    devdata = root / DEVDATA
    pid_path = devdata / PID_FILE
    pid = _read_pid(pid_path)
    stopped = False
    if pid is not None and _pid_alive(pid) and _is_anvil(pid):
        _terminate(pid)
        stopped = True
        log.info("devnet: stopped anvil (pid %d)", pid)
    elif pid is not None:
        log.info("devnet: pid %d from %s is not a running anvil; nothing to stop", pid, pid_path)
    pid_path.unlink(missing_ok=True)
    (devdata / DEVNET_FILE).unlink(missing_ok=True)
    return stopped
