"""What the benchmarks share: a free loopback port, a JSON-RPC pass-through that counts
every call it forwards (batch elements too) and every HTTP round trip (a batch is one), and
the life of the processes they measure (start the daemon, wait until a URL answers, read a
process's CPU and the whole machine's, stop them)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from relayer_dev.ports import free_port as free_port  # the benchmarks' ports (a block per test worker)

RELAYER = Path(sys.executable).with_name("relayer")

ROUND_TRIPS = "(round trips)"
NONCE_REFUSALS = "(sends refused for their nonce)"


async def counting_proxy(
    port: int, upstream: str, counts: dict[str, int], latencies: dict[str, list[float]] | None = None
) -> web.AppRunner:
    """Forward JSON-RPC from ``127.0.0.1:port`` to ``upstream``, counting calls per method
    into ``counts``, HTTP round trips (a batch is one) under :data:`ROUND_TRIPS` and
    broadcasts the node refused for their nonce under :data:`NONCE_REFUSALS`; with
    ``latencies``, each round trip's time at the node (seconds) under its method (a batch:
    its methods joined by ``+``). The caller cleans the returned runner up."""
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        payload = json.loads(body)
        counts[ROUND_TRIPS] = counts.get(ROUND_TRIPS, 0) + 1
        for item in payload if isinstance(payload, list) else [payload]:
            counts[item["method"]] = counts.get(item["method"], 0) + 1
        started = time.perf_counter()
        async with session.post(upstream, data=body, headers={"content-type": "application/json"}) as r:
            answer = await r.read()
        if latencies is not None:
            items = payload if isinstance(payload, list) else [payload]
            key = "+".join(sorted({str(item.get("method")) for item in items}))
            latencies.setdefault(key, []).append(time.perf_counter() - started)
        calls = payload if isinstance(payload, list) else [payload]
        if any(c.get("method") == "eth_sendRawTransaction" for c in calls):
            sends = {c.get("id") for c in calls if c.get("method") == "eth_sendRawTransaction"}
            replies = json.loads(answer)
            for reply in replies if isinstance(replies, list) else [replies]:
                error = reply.get("error") if isinstance(reply, dict) else None
                if reply.get("id") in sends and error and "nonce" in str(error.get("message", "")).lower():
                    counts[NONCE_REFUSALS] = counts.get(NONCE_REFUSALS, 0) + 1
        return web.Response(body=answer, content_type="application/json")

    async def close(_app: web.Application) -> None:
        await session.close()

    app = web.Application()
    app.router.add_post("/", forward)
    app.on_cleanup.append(close)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its reaped children, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(v) for v in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


async def postgres_server_pid(dsn: str) -> int | None:
    """The process id of the Postgres server behind ``dsn`` when it runs on this machine (the
    parent of its checkpointer, read from ``/proc``), else None (a remote server, or a role
    that may not see the server's processes)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        pid = await conn.fetchval("SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'")
    finally:
        await conn.close()
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) if pid else None
    except OSError:
        return None


def server_cpu(server_pid: int | None) -> dict[int, float]:
    """User + system CPU seconds of each process the Postgres server ``server_pid`` started
    (its backends and helpers), by process id; empty for None. The CPU of a span is
    :func:`server_cpu_between` two of these."""
    if server_pid is None:
        return {}
    tick, found = os.sysconf("SC_CLK_TCK"), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if fields[1] == str(server_pid):
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def server_cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the server's processes spent between two :func:`server_cpu` snapshots: a
    process started meanwhile counts whole; one that ended meanwhile is missed (the daemon's
    pooled connections live through a run)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def machine_cpu_seconds() -> float:
    """CPU seconds every process of the machine spent so far (``/proc/stat``, not idle)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def start_daemon(
    command: str, env: dict[str, str], log: Path, profile: Path | None = None
) -> subprocess.Popen[bytes]:
    """``relayer <command>``; under cProfile (written to ``profile`` when it stops) if asked."""
    argv = [str(RELAYER), command]
    if profile is not None:
        argv = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "relayer", command]
    with log.open("ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


async def wait_ready(
    url: str, procs: list[subprocess.Popen[bytes]], log: Path, timeout_s: float = 60
) -> None:
    """Until GET ``url`` answers 200 (bounded by ``timeout_s``); fails with the tail of
    ``log`` when one of ``procs`` exits first or the time runs out."""
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a process exited before {url} answered: {log.read_text()[-3000:]}")
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} not ready in {timeout_s:.0f} s: {log.read_text()[-3000:]}")


def stop_processes(procs: list[subprocess.Popen[bytes]], timeout_s: float = 60) -> None:
    """SIGTERM every process, then wait for each (bounded); one that ignores it is killed."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"pid {p.pid} ignored SIGTERM for {timeout_s:.0f} s; killed", file=sys.stderr)
            p.kill()
            p.wait(timeout=10)


async def in_scratch_database(
    root: Path, state_prefix: str, kept: str, run: Callable[[Path, str], Awaitable[None]]
) -> None:
    """``run(state directory, DSN)`` on a fresh, migrated scratch database (on
    RELAYER_DATABASE_URL, else the private dev cluster under ``root/.devdata``), dropped after;
    the temporary state directory is removed after a success and kept (and named on stderr,
    with ``kept`` saying what it holds) after a failure."""
    import shutil
    import tempfile

    from relayer.store.migrations import migrate
    from relayer_dev import devdb

    admin = devdb.ensure_database_url(os.environ.get("RELAYER_DATABASE_URL"), root / ".devdata")
    dsn = devdb.create_scratch_database(admin, prefix="relayer_bench")
    state = Path(tempfile.mkdtemp(prefix=state_prefix))
    try:
        migrate(dsn)
        await run(state, dsn)
    except BaseException:
        print(f"{kept} kept in {state}", file=sys.stderr)
        raise
    else:
        shutil.rmtree(state, ignore_errors=True)
    finally:
        devdb.drop_database(admin, dsn.rsplit("/", 1)[1])


def daemon_env(dsn: str, devnet: dict[str, Any], deployment_file: Path, http_port: int) -> dict[str, str]:
    """The environment of a benchmarked daemon on a devnet (``devnet``: its description) and a
    scratch database: nothing inherited but PATH and HOME, warnings-only logs, depth 1."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "RELAYER_DATABASE_URL": dsn,
        "RELAYER_RPC_URL": devnet["rpcUrl"],
        "RELAYER_CHAIN_ID": str(devnet["chainId"]),
        "RELAYER_DEPLOYMENT_FILE": str(deployment_file),
        "RELAYER_EXECUTOR_PRIVATE_KEY": devnet["executor"]["privateKey"],
        "RELAYER_CONFIRMATIONS": "1",
        "RELAYER_HTTP_PORT": str(http_port),
        "RELAYER_PUBLIC_BASE_URL": f"http://127.0.0.1:{http_port}",
        "RELAYER_LOG_LEVEL": "WARNING",
        "RELAYER_RATE_LIMIT": "off",  # the load comes from one client
    }


def fund(info: dict[str, Any], payers: list[str], each: int) -> None:
    """Mint ``each`` USDC atomic units to every payer, pipelined from the deployer."""
    from eth_account import Account
    from web3 import Web3

    from relayer.chain.abi import abi

    w3 = Web3(Web3.HTTPProvider(info["rpcUrl"], request_kwargs={"timeout": 60}))
    owner = Account.from_key(info["deployer"]["privateKey"])
    usdc = w3.eth.contract(address=info["contracts"]["usdc"], abi=abi("UsdcEip3009"))
    nonce = w3.eth.get_transaction_count(owner.address, "pending")
    fee = 2 * int(w3.eth.get_block("latest")["baseFeePerGas"]) + 1
    hashes = []
    for i, payer in enumerate(payers):
        tx = usdc.functions.mint(payer, each).build_transaction(
            {
                "from": owner.address,
                "nonce": nonce + i,
                "gas": 100_000,
                "maxFeePerGas": fee,
                "maxPriorityFeePerGas": 0,
                "chainId": info["chainId"],
            }
        )
        hashes.append(w3.eth.send_raw_transaction(owner.sign_transaction(tx).raw_transaction))
    for tx_hash in hashes[-1:]:
        assert w3.eth.wait_for_transaction_receipt(tx_hash, timeout=120)["status"] == 1
