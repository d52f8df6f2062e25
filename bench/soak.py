"""A soak on the Base-like devnet (issue 20, item 6): ``--minutes`` (default 10) at
``--block-time`` 0.2 s blocks with ``--background-tps`` (default 150) other senders' token
transfers, and ``--rate`` (default 20) signed retirements a second posted to the daemon's
``POST /api`` (``relayer all`` in a process of its own), each waiting for its answer.

One run, everything on loopback:
1. a private anvil, the reference protocol, a pool of ``--payers`` payers funded with USDC (a
   payer signs again every ``payers / rate`` seconds), and ``rate x duration`` authorizations
   signed ahead through the daemon's own prepare-auth (before the clock starts, so that the
   client's signing does not take the cores the daemon runs on);
2. the background traffic (``python -m relayer_dev traffic``, bench/background.py), then the
   daemon; the clock starts once its follower has caught up with the blocks mined since the
   deployment (lag <= 2 blocks, at most 120 s: followerCatchUpSeconds, null if it did not);
3. the load, open loop: the i-th retirement is posted at ``i / rate`` seconds whatever the
   earlier ones do. Every ``--sample-interval`` seconds a sampler reads the chain's head
   (``eth_blockNumber`` from anvil) then the last block the follower indexed (the daemon's
   ``relayer_indexer_block`` gauge) and the daemon's RSS (``/proc/<pid>/status``).

Follower lag (blocks) = head - (depth - 1) - cursor, floored at 0: how far the follower is
behind the newest block it may index at its confirmation depth (``--confirmations``, default 1,
so the head itself). It is computed from outside the daemon (its ``relayer_indexer_lag_blocks``
gauge is refreshed by the gauges worker at its own cadence, not every block).

rssStartBytes is the daemon's RSS once ``--warmup-seconds`` of load have passed (default 10 %
of the run, at most 60 s: pools, caches and the interpreter's arenas fill in the first
seconds; what grows after is what a leak would be); rssReadyBytes, beside it, is the RSS when
the daemon first answered. daemonCpuMsPerRetirement is the daemon's CPU over the load (from the
first post to the last answer) over the retirements settled. A failure is a retirement whose
answer is not ``settled`` (an error, a timeout, another status).

Prints progress every 30 s and the figures, then one JSON line: settled, failures,
followerLagBlocksMax, followerLagBlocksP95, rssStartBytes, rssEndBytes,
daemonCpuMsPerRetirement, and beside them posted, outcomes, p50Seconds, p95Seconds,
rssReadyBytes, rssGrowth, lagSamples, followerCatchUpSeconds, seconds, ratePerSecond, blockTimeSeconds,
backgroundTps, backgroundErrors, loadAverage (the 1-minute load average at the start and the
end: the machine may be shared). Targets: 0 failures, lag <= 2 blocks, RSS growth <= 10 %.

    .venv/bin/python bench/soak.py               # 10 minutes
    .venv/bin/python bench/soak.py --minutes 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from eth_account import Account

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.background import Background, start_background  # noqa: E402
from bench.common import (  # noqa: E402
    cpu_seconds,
    daemon_env,
    free_port,
    in_scratch_database,
    machine_cpu_seconds,
    start_daemon,
    stop_processes,
    wait_ready,
)
from bench.relay_throughput import bench_key, fund, signed_requests  # noqa: E402
from relayer.app import open_runtime  # noqa: E402
from relayer.config import Settings  # noqa: E402
from relayer_dev import devnet  # noqa: E402
from relayer_dev.deploy import deploy_and_seed  # noqa: E402

CHAIN_ID = 84532
INDEXED_GAUGE = "relayer_indexer_block"  # the last block the follower indexed (relayer.metrics)
PAYER_USDC = 1_000 * 10**6  # atomic units minted to each payer of the pool
SIGN_BATCH = 50  # authorizations prepared concurrently while signing ahead
POST_TIMEOUT_S = 120.0
CAUGHT_UP_BLOCKS = 2  # the follower's lag at which the load starts ...
CATCH_UP_TIMEOUT_S = 120.0  # ... or after this long (reported as followerCatchUpSeconds null)
PROGRESS_EVERY_S = 30.0


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (``VmRSS`` of ``/proc/<pid>/status``), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; 0.0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def sign_ahead(settings: Settings, payers: list[str], n: int) -> list[dict[str, Any]]:
    """``n`` signed actions/retire bodies, the pool's payers in turn, from the daemon's own
    prepare-auth, :data:`SIGN_BATCH` at a time."""
    now = int(time.time())
    bodies: list[dict[str, Any]] = []
    async with open_runtime(settings, workers=False) as rt:
        for start in range(0, n, SIGN_BATCH):
            keys = [payers[i % len(payers)] for i in range(start, min(n, start + SIGN_BATCH))]
            batches = await asyncio.gather(*(signed_requests(rt, [k], now) for k in keys))
            bodies += [b for batch in batches for b in batch]
    return bodies


def log_kinds(log: Path) -> dict[str, int]:
    """The daemon's log lines at WARNING and above counted by level and message (its JSON
    lines; another line counts as ``not JSON``), most frequent first."""
    counts: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
            level = entry.get("level", entry.get("levelname"))  # relayer.logs names it "level"
            if level in ("DEBUG", "INFO"):
                continue
            key = f"{level} {str(entry.get('message'))[:100]}"
        except (ValueError, AttributeError):
            key = "not JSON"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


async def indexed_block(session: aiohttp.ClientSession, metrics_url: str) -> int | None:
    """The last block the daemon's follower indexed (its ``relayer_indexer_block`` gauge; the
    cursor row in Postgres is written at most once a second while blocks hold nothing of
    ours); None before it indexed one."""
    async with session.get(metrics_url) as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith(INDEXED_GAUGE + "{"):  # {chain_id="…"}: the one relayed chain
            value = int(float(line.split()[1]))
            return value if value > 0 else None
    return None


class Sampler:
    """Every ``interval`` seconds: the chain's head, the follower's cursor and the daemon's RSS."""

    def __init__(
        self, rpc_url: str, dsn: str, pid: int, depth: int, interval: float, metrics_url: str
    ) -> None:
        self.rpc_url, self.dsn, self.pid, self.depth, self.interval = rpc_url, dsn, pid, depth, interval
        self.metrics_url = metrics_url
        self.lags: list[int] = []
        self.rss: list[tuple[float, int]] = []  # (monotonic seconds, bytes)
        self.missing_cursor = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            async with aiohttp.ClientSession() as session:
                while not self._stop.is_set():
                    await self._sample(session, conn)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), self.interval)
        finally:
            await conn.close()

    async def _sample(self, session: aiohttp.ClientSession, conn: Any) -> None:
        payload = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}
        async with session.post(self.rpc_url, json=payload) as r:
            head = int((await r.json())["result"], 16)
        cursor = await indexed_block(session, self.metrics_url)
        if cursor is None:
            self.missing_cursor += 1
        else:
            self.lags.append(max(0, head - (self.depth - 1) - int(cursor)))
        self.rss.append((time.monotonic(), rss_bytes(self.pid)))

    async def caught_up(self, within: int, timeout_s: float) -> float | None:
        """Seconds until the follower's lag is at most ``within`` blocks (sampled every 0.2 s),
        or None when ``timeout_s`` passed first; the samples are not kept."""
        import asyncpg

        started = time.monotonic()
        conn = await asyncpg.connect(self.dsn)
        try:
            async with aiohttp.ClientSession() as session:
                while time.monotonic() - started < timeout_s:
                    await self._sample(session, conn)
                    lag = self.lags[-1] if self.lags else None
                    self.lags.clear()
                    self.rss.clear()
                    if lag is not None and lag <= within:
                        return time.monotonic() - started
                    await asyncio.sleep(0.2)
        finally:
            await conn.close()
        return None

    def stop(self) -> None:
        self._stop.set()


def outcome_key(status: int, text: str) -> str:
    """How an answer is counted: ``settled`` (or another job status), else the error code with
    its HTTP status and what failed (``upstream``, ``cause``, a revert's ``decoded.errorName``),
    e.g. ``gas_estimate_unavailable 503 (upstream chain node)``; a body that is not JSON is
    counted by its status and first characters."""
    try:
        out = json.loads(text)
    except ValueError:
        return f"HTTP {status}, not JSON: {text[:60]!r}"
    if not isinstance(out, dict):
        return f"HTTP {status}, not an object"
    if out.get("status"):
        return str(out["status"])
    decoded = out.get("decoded") if isinstance(out.get("decoded"), dict) else {}
    why = [f"{k} {out[k]}" for k in ("upstream", "cause") if out.get(k)]
    if decoded.get("errorName"):
        why.append(f"errorName {decoded['errorName']}")
    return f"{out.get('error') or 'no error code'} {status}" + (f" ({', '.join(why)})" if why else "")


async def post_all(base: str, bodies: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    """Post ``bodies`` open loop, the i-th at ``i / rate`` seconds; outcomes and latencies."""
    outcomes: dict[str, int] = {}
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def post(body: dict[str, Any]) -> None:
            t0 = time.perf_counter()
            try:
                async with session.post(f"{base}/api", json=body) as r:
                    text = await r.text()
                key = outcome_key(r.status, text)
            except (aiohttp.ClientError, TimeoutError) as exc:
                key = f"client error {type(exc).__name__}"
            outcomes[key] = outcomes.get(key, 0) + 1
            if key == "settled":
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        tasks = []
        next_report = started + PROGRESS_EVERY_S
        for i, body in enumerate(bodies):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(post(body)))
            if time.perf_counter() >= next_report:
                next_report += PROGRESS_EVERY_S
                print(
                    f"  {time.perf_counter() - started:.0f} s: posted {i + 1}, answers {outcomes}, "
                    f"load average {load_average():.2f}",
                    flush=True,
                )
        await asyncio.gather(*tasks)
        seconds = time.perf_counter() - started
    return {"outcomes": outcomes, "latencies": latencies, "seconds": seconds}


async def soak(args: argparse.Namespace, state: Path, dsn: str) -> dict[str, Any]:
    duration = args.seconds if args.seconds is not None else 60 * args.minutes
    n = max(1, round(duration * args.rate))
    warmup = args.warmup_seconds if args.warmup_seconds is not None else min(60.0, 0.1 * duration)
    load_start = load_average()
    anvil_port = free_port()
    anvil = devnet.start_anvil(state, anvil_port, CHAIN_ID, args.block_time, args.gas_limit)
    procs: list[subprocess.Popen[bytes]] = []
    background: Background | None = None
    try:
        info = deploy_and_seed(devnet.rpc_url(anvil_port), CHAIN_ID, devnet.DEFAULT_PROJECTS_FILE)
        (state / "devnet.json").write_text(json.dumps(info))
        payers = [bench_key(i) for i in range(min(args.payers, n))]
        fund(info, [Account.from_key(k).address for k in payers], PAYER_USDC)
        t0 = time.perf_counter()
        settings = Settings(
            database_url=dsn,
            rpc_url=info["rpcUrl"],
            chain_id=CHAIN_ID,
            deployment_file=state / "devnet.json",
            executor_private_key=info["executor"]["privateKey"],
            confirmations=args.confirmations,
        )
        bodies = await sign_ahead(settings, payers, n)
        print(
            f"funded {len(payers)} payers; signed {n} authorizations in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        traffic: dict[str, Any] = {}
        if args.background_tps:
            background = start_background(args.background_tps, info["rpcUrl"], state / "devnet.json", state)
        http_port = free_port()
        base_url = f"http://127.0.0.1:{http_port}"
        env = daemon_env(dsn, info, state / "devnet.json", http_port)
        env["RELAYER_CONFIRMATIONS"] = str(args.confirmations)
        for setting in args.daemon_setting:  # e.g. RELAYER_EVENT_LOOP=asyncio
            name, _, value = setting.partition("=")
            env[name] = value
        log = state / "daemon.log"
        procs.append(start_daemon("all", env, log))
        daemon = procs[0]
        await wait_ready(f"{base_url}/readyz", procs, log)
        rss_ready = rss_bytes(daemon.pid)
        await asyncio.sleep(1)
        sampler = Sampler(
            info["rpcUrl"], dsn, daemon.pid, args.confirmations, args.sample_interval, f"{base_url}/metrics"
        )
        # the load starts once the follower has caught up with the blocks mined since the deployment
        catch_up = await sampler.caught_up(CAUGHT_UP_BLOCKS, CATCH_UP_TIMEOUT_S)
        sampler.missing_cursor = 0
        print(
            "follower "
            + (
                f"caught up in {catch_up:.1f} s"
                if catch_up is not None
                else f"not caught up in {CATCH_UP_TIMEOUT_S:g} s"
            ),
            flush=True,
        )
        sampling = asyncio.create_task(sampler.run())
        print(
            f"soak: {n} retirements at {args.rate:g}/s for {duration:.0f} s, {args.block_time:g} s blocks, "
            f"background {args.background_tps:g}/s; load average {load_average():.2f}",
            flush=True,
        )
        pids = {"daemon": daemon.pid, "anvil": anvil.pid, "soakClient": os.getpid()}
        if background is not None:
            pids["traffic"] = background.proc.pid
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        machine_before, started = machine_cpu_seconds(), time.monotonic()
        result = await post_all(base_url, bodies, args.rate)
        wall = time.monotonic() - started
        # each process's share of one core over the load, and the whole machine's (every core)
        cores = {name: round((cpu_seconds(pid) - cpu_before[name]) / wall, 3) for name, pid in pids.items()}
        cores["machine"] = round((machine_cpu_seconds() - machine_before) / wall, 3)
        cpu = cores["daemon"] * wall
        sampler.stop()
        await sampling
        if daemon.poll() is not None:
            raise RuntimeError(f"the daemon exited during the soak: {log.read_text()[-3000:]}")
        if background is not None:
            traffic = background.stop()
            background = None
        after_warmup = [b for t, b in sampler.rss if t >= started + warmup]
        rss_start = after_warmup[0] if after_warmup else sampler.rss[0][1]
        rss_end = sampler.rss[-1][1]
        settled = result["outcomes"].get("settled", 0)
        kinds = log_kinds(log)
        if settled < n:  # the daemon's own account of the failures (the state directory goes)
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            print("the daemon's last log lines:\n" + "\n".join(ln[:400] for ln in lines[-15:]), flush=True)
        return {
            "settled": settled,
            "failures": n - settled,
            "followerLagBlocksMax": max(sampler.lags, default=0),
            "followerLagBlocksP95": percentile([float(v) for v in sampler.lags], 0.95),
            "rssStartBytes": rss_start,
            "rssEndBytes": rss_end,
            "daemonCpuMsPerRetirement": round(1000 * cpu / max(1, settled), 2),
            "posted": n,
            "outcomes": result["outcomes"],
            "p50Seconds": round(percentile(result["latencies"], 0.5), 3),
            "p95Seconds": round(percentile(result["latencies"], 0.95), 3),
            "rssReadyBytes": rss_ready,
            "rssGrowth": round(rss_end / rss_start - 1, 4),
            "lagSamples": len(sampler.lags),
            "followerCatchUpSeconds": None if catch_up is None else round(catch_up, 1),
            "lagSamplesWithoutCursor": sampler.missing_cursor,
            "seconds": round(result["seconds"], 1),
            "ratePerSecond": args.rate,
            "blockTimeSeconds": args.block_time,
            "confirmations": args.confirmations,
            "backgroundTps": traffic.get("achievedTps", 0.0),
            "backgroundErrors": traffic.get("errors", 0),
            "loadAverage": [load_start, load_average()],
            "daemonLogKinds": kinds,
            "coresUsed": cores,
        }
    finally:
        stop_processes(procs)
        if background is not None:
            background.stop()
        stop_processes([anvil], 10)


async def main(args: argparse.Namespace) -> None:
    report: dict[str, Any] = {}

    async def run(state: Path, dsn: str) -> None:
        report.update(await soak(args, state, dsn))

    await in_scratch_database(ROOT, "relayer-soak-", "the daemon's and the traffic's logs", run)
    r = report
    print(
        f"{r['settled']}/{r['posted']} settled in {r['seconds']} s, failures {r['failures']} "
        f"{r['outcomes']}; "
        f"p50 {r['p50Seconds']} s, p95 {r['p95Seconds']} s; follower lag max {r['followerLagBlocksMax']}, "
        f"p95 {r['followerLagBlocksP95']:g} blocks ({r['lagSamples']} samples); daemon RSS "
        f"{r['rssStartBytes'] / 2**20:.1f} MiB after the warm-up -> {r['rssEndBytes'] / 2**20:.1f} MiB "
        f"({100 * r['rssGrowth']:+.1f} %); daemon CPU {r['daemonCpuMsPerRetirement']} ms a retirement; "
        f"load average {r['loadAverage']}",
        flush=True,
    )
    print(f"  cores used over the load (1.0 = one core busy): {r['coresUsed']}", flush=True)
    for kind, count in r["outcomes"].items():
        print(f"  answer {kind}: {count}", flush=True)
    for kind, count in r["daemonLogKinds"].items():
        print(f"  daemon log {kind}: {count}", flush=True)
    print(json.dumps(report))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--minutes", type=float, default=10.0, help="how long the load runs (default 10)")
    add("--seconds", type=float, help="how long the load runs, seconds (instead of --minutes)")
    add("--rate", type=float, default=20.0, help="retirements posted a second (default 20)")
    add("--block-time", type=float, default=0.2, help="anvil's block time, seconds (default 0.2)")
    add("--background-tps", type=float, default=150.0, help="other senders' transfers a second (default 150)")
    add("--gas-limit", type=int, default=1_000_000_000, help="anvil's block gas limit")
    add("--payers", type=int, default=400, help="the payer pool the retirements cycle through (default 400)")
    add("--confirmations", type=int, default=1, help="RELAYER_CONFIRMATIONS, blocks >= 1 (default 1)")
    add("--sample-interval", type=float, default=0.5, help="seconds between lag and RSS samples")
    add("--warmup-seconds", type=float, help="load before rssStartBytes (default 10 %% of the run, <= 60 s)")
    add(
        "--daemon-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a variable of the daemon's environment (repeatable), e.g. RELAYER_EVENT_LOOP=asyncio",
    )
    args = parser.parse_args(argv)
    if args.confirmations < 1:
        parser.error("--confirmations must be at least 1")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
