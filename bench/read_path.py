"""The read path (``discover`` and ``quote``, by GET and by POST) against a bare aiohttp JSON
endpoint, in the same run (issue 8), everything on loopback.

One run:
1. a private anvil (one block per transaction), the reference protocol deployed and seeded,
   a scratch database, and the daemon as deployed (``relayer serve``) in a process of its own;
2. a bare aiohttp server in another process of its own, answering GET and POST on one path
   with a small fixed JSON body (``web.json_response``): the ceiling of what aiohttp itself
   does on this machine;
3. this process is the client: one request of each kind is checked first (200 and the
   expected body, else the run stops saying which), then a closed loop of ``--concurrency``
   requests in flight over one keep-alive connector, for a warm-up of ``--warmup`` seconds
   (not counted) and ``--seconds`` seconds measured, against each target in turn: bare GET,
   bare POST, ``GET /api/discover``, ``POST /api`` discover, ``GET /api/quote``, ``POST /api``
   quote.

Prints, per target, answers per second, p50 and p99 latency, errors (any answer but 200, and
requests that failed), the server process's CPU per request and this client's; each daemon
target's rate against the bare endpoint's (GET against bare GET, POST against bare POST) and
whether the target (ratio >= 0.40) is met; and a warning naming any target during which other
processes kept the machine busy (``/proc/stat``: its figures are then not quiet ones). Then
one JSON line: ``bare``, ``discover`` and
``quote``, each with ``get`` and ``post`` holding ``rps``, ``p50Ms``, ``p99Ms``, ``errors``,
``cpuMsPerRequest`` (the serving process) and, for the daemon's, ``ratio``; beside them
``minRatio``, ``targetMet`` and ``errors`` (the total).

    .venv/bin/python bench/read_path.py            # defaults: --concurrency 50 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
from yarl import URL

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    cpu_seconds,
    daemon_env,
    free_port,
    in_scratch_database,
    start_daemon,
    stop_processes,
    wait_ready,
)
from relayer_dev import devnet  # noqa: E402
from relayer_dev.deploy import deploy_and_seed  # noqa: E402

CHAIN_ID: Final = 84532
TARGET_RATIO: Final = 0.40
REQUEST_TIMEOUT_S: Final = 10.0
READY_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 30.0
# CPU the rest of the machine may use in a window (cores) before its figures are flagged
OTHERS_WARN_CORES: Final = 0.25

# A discover with the filters a client would use (the chain, a category, a price ceiling) and
# a realistic quote: half a tonne of the renewable-energy class paid in USDC.
DISCOVER: Final[dict[str, str]] = {
    "chainId": str(CHAIN_ID),
    "category": "Renewable Energy",
    "maxUsdcPricePerTonne": "100",
}
QUOTE: Final[dict[str, str]] = {
    "chainId": str(CHAIN_ID),
    "carbonClass": "RE",
    "amount": "0.5",
    "inputToken": "USDC",
}

# The bare endpoint: one path, GET and POST, a small fixed JSON body, no access log (as the
# daemon runs). The POST handler reads the body it is sent, as the daemon does.
BARE_PATH: Final = "/bare"
BARE_SERVER: Final = """
import sys
from aiohttp import web

BODY = {"status": "ok", "chainId": 84532, "x402FacilitatorVersion": 2}


async def answer(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response(BODY)


app = web.Application()
app.router.add_get(sys.argv[1], answer)
app.router.add_post(sys.argv[1], answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), access_log=None, print=None)
"""


@dataclass(frozen=True)
class Target:
    """One kind of request: against which server, which method, its URL and body."""

    server: str  # "bare" or "daemon"
    name: str  # "bare", "discover", "quote"
    method: str  # "get" or "post"
    url: URL
    body: bytes | None = None
    expect: str | None = None  # a key the JSON answer must hold

    @property
    def label(self) -> str:
        return f"{self.name} {self.method.upper()}"


@dataclass
class Result:
    """What a target's measured window gave."""

    seconds: float = 0.0
    ok: int = 0
    errors: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    machine_cpu: float = 0.0  # every process's CPU over the window, seconds

    @property
    def others_cores(self) -> float:
        """Cores the rest of the machine (neither the server nor this client) kept busy."""
        if self.seconds <= 0:
            return 0.0
        return max(0.0, self.machine_cpu - self.server_cpu - self.client_cpu) / self.seconds

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def pct_ms(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def per_request_ms(self, cpu: float) -> float:
        return 1000 * cpu / self.ok if self.ok else float("nan")


def machine_cpu_seconds() -> float:
    """CPU seconds every process of the machine spent so far (``/proc/stat``, not idle)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def targets(bare: str, daemon: str) -> list[Target]:
    """The six targets, in the order they run (the bare endpoint gets the quote's query and
    body, so the client does the same work for it)."""

    def body(payload: dict[str, str]) -> bytes:
        return json.dumps(payload).encode()

    def url(base: str, path: str, query: dict[str, str]) -> URL:
        return URL(f"{base}{path}?{urlencode(query)}", encoded=True)

    return [
        Target("bare", "bare", "get", url(bare, BARE_PATH, QUOTE), expect="status"),
        Target("bare", "bare", "post", URL(f"{bare}{BARE_PATH}"), body(QUOTE), expect="status"),
        Target("daemon", "discover", "get", url(daemon, "/api/discover", DISCOVER), expect="carbonClasses"),
        Target(
            "daemon",
            "discover",
            "post",
            URL(f"{daemon}/api"),
            body({"action": "discover", **DISCOVER}),
            expect="carbonClasses",
        ),
        Target("daemon", "quote", "get", url(daemon, "/api/quote", QUOTE), expect="quote"),
        Target("daemon", "quote", "post", URL(f"{daemon}/api"), body({"action": "quote", **QUOTE}), "quote"),
    ]


HEADERS: Final = {"content-type": "application/json"}


async def check(session: aiohttp.ClientSession, target: Target) -> str:
    """One request of ``target``: a one-line summary of its answer.

    Raises:
        SystemExit: the answer is not 200 or not the JSON object expected.
    """
    async with session.request(
        target.method, target.url, data=target.body, headers=HEADERS if target.body else None
    ) as r:
        text = await r.text()
        status = r.status
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if status != 200 or not isinstance(answer, dict) or (target.expect and target.expect not in answer):
        raise SystemExit(f"{target.label} {target.url} answered {status}: {text[:2000]}")
    if target.name == "discover":
        classes, listings = answer["carbonClasses"], answer["marketplaceListings"]
        if not classes and not listings:
            raise SystemExit(f"{target.label} {target.url} lists nothing; the filters are too narrow")
        return f"{len(classes)} classes, {len(listings)} listings, {len(text)} bytes"
    if target.name == "quote":
        return f"total {answer['totalFormatted']} {answer['inputToken']['symbol']}, {len(text)} bytes"
    return f"{len(text)} bytes"


async def measure(target: Target, pid: int, concurrency: int, warmup: float, seconds: float) -> Result:
    """A closed loop of ``concurrency`` requests in flight; what completes in the window
    after ``warmup`` counts, with the server ``pid``'s CPU and this process's over it."""
    result = Result()
    measuring = False
    stop = False
    headers = HEADERS if target.body else None
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            while not stop:
                t0 = time.perf_counter()
                try:
                    async with session.request(
                        target.method, target.url, data=target.body, headers=headers
                    ) as r:
                        await r.read()
                        status = str(r.status)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    status = type(exc).__name__
                if not measuring:
                    continue
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if status == "200":
                    result.ok += 1
                    result.latencies.append(time.perf_counter() - t0)
                else:
                    result.errors += 1

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        try:
            await asyncio.sleep(warmup)
            cpu0, client0, machine0 = cpu_seconds(pid), time.process_time(), machine_cpu_seconds()
            t0 = time.perf_counter()
            measuring = True
            await asyncio.sleep(seconds)
            measuring = False
            result.seconds = time.perf_counter() - t0
            result.server_cpu = cpu_seconds(pid) - cpu0
            result.client_cpu = time.process_time() - client0
            result.machine_cpu = machine_cpu_seconds() - machine0
            stop = True
            await asyncio.wait_for(asyncio.gather(*workers), REQUEST_TIMEOUT_S + 5)
        finally:
            for w in workers:
                w.cancel()
    return result


def start_bare(port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", BARE_SERVER, BARE_PATH, str(port)], stdout=out, stderr=subprocess.STDOUT
        )


def figures(result: Result, ratio: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rps": round(result.rps, 1),
        "p50Ms": round(result.pct_ms(0.5), 2),
        "p99Ms": round(result.pct_ms(0.99), 2),
        "errors": result.errors,
        "cpuMsPerRequest": round(result.per_request_ms(result.server_cpu), 3),
    }
    if ratio is not None:
        out["ratio"] = round(ratio, 3)
    return out


async def run(args: argparse.Namespace, state: Path, dsn: str) -> None:
    log = state / "daemon.log"
    bare_log = state / "bare.log"
    anvil_port = free_port()
    anvil = devnet.start_anvil(state, anvil_port, CHAIN_ID)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        t0 = time.perf_counter()
        info = deploy_and_seed(devnet.rpc_url(anvil_port), CHAIN_ID, devnet.DEFAULT_PROJECTS_FILE)
        (state / "devnet.json").write_text(json.dumps(info))
        print(f"devnet deployed and seeded in {time.perf_counter() - t0:.1f} s", flush=True)
        http_port, bare_port = free_port(), free_port()
        daemon_url, bare_url = f"http://127.0.0.1:{http_port}", f"http://127.0.0.1:{bare_port}"
        env = daemon_env(dsn, info, state / "devnet.json", http_port)
        daemon = start_daemon("serve", env, log, Path(args.profile) if args.profile else None)
        procs.append(daemon)
        bare = start_bare(bare_port, bare_log)
        procs.append(bare)
        await wait_ready(f"{daemon_url}/readyz", [daemon], log, READY_TIMEOUT_S + 30)
        await wait_ready(f"{bare_url}{BARE_PATH}", [bare], bare_log, READY_TIMEOUT_S)

        plan = targets(bare_url, daemon_url)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for target in plan:
                print(f"check {target.label}: {await check(session, target)}", flush=True)

        pids = {"bare": bare.pid, "daemon": daemon.pid}
        results: dict[tuple[str, str], Result] = {}
        for target in plan:
            result = await measure(target, pids[target.server], args.concurrency, args.warmup, args.seconds)
            results[(target.name, target.method)] = result
            print(
                f"{target.label:13} {result.rps:8.1f} req/s  p50 {result.pct_ms(0.5):6.2f} ms  "
                f"p99 {result.pct_ms(0.99):6.2f} ms  errors {result.errors}"
                + (f" {result.statuses}" if result.errors else "")
                + f"  CPU a request: server {result.per_request_ms(result.server_cpu):.3f} ms, "
                f"client {result.per_request_ms(result.client_cpu):.3f} ms "
                f"(client busy {100 * result.client_cpu / result.seconds:.0f} %, "
                f"other processes {result.others_cores:.2f} cores)",
                flush=True,
            )

        summary: dict[str, Any] = {"bare": {}, "discover": {}, "quote": {}}
        ratios: list[float] = []
        for (name, method), result in results.items():
            ratio = None
            if name != "bare":
                bare_rps = results[("bare", method)].rps
                ratio = result.rps / bare_rps if bare_rps else 0.0
                ratios.append(ratio)
                print(
                    f"{name} {method.upper()}: {result.rps:.1f} / {bare_rps:.1f} req/s = {ratio:.2f} of the "
                    f"bare endpoint ({'meets' if ratio >= TARGET_RATIO else 'misses'} the "
                    f"{TARGET_RATIO:.2f} target); p99 {result.pct_ms(0.99):.2f} ms",
                    flush=True,
                )
            summary[name][method] = figures(result, ratio)
        min_ratio = min(ratios)
        errors = sum(r.errors for r in results.values())
        print(
            f"target (every daemon target >= {TARGET_RATIO:.2f} of the bare endpoint's req/s): "
            f"{'met' if min_ratio >= TARGET_RATIO else 'NOT met'}, lowest ratio {min_ratio:.2f}; "
            f"errors {errors}; concurrency {args.concurrency}, {args.seconds:g} s a target; "
            f"the machine has {os.cpu_count()} cores for the client, both servers, anvil and Postgres",
            flush=True,
        )
        busy = {f"{n} {m.upper()}": r.others_cores for (n, m), r in results.items()}
        busy = {k: v for k, v in busy.items() if v > OTHERS_WARN_CORES}
        if busy:
            print(
                "WARNING: other processes kept "
                + ", ".join(f"{v:.2f} cores busy during {k}" for k, v in busy.items())
                + ": those figures are not this machine's quiet figures; run again on a quiet machine",
                flush=True,
            )
        summary.update(
            {"minRatio": round(min_ratio, 3), "targetMet": min_ratio >= TARGET_RATIO, "errors": errors}
        )
        print(json.dumps(summary))
    finally:
        stop_processes(procs, STOP_TIMEOUT_S)
        stop_processes([anvil], 10)


async def main(args: argparse.Namespace) -> None:
    await in_scratch_database(
        ROOT,
        "relayer-read-path-",
        "logs (anvil, daemon, bare server)",
        lambda state, dsn: run(args, state, dsn),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds a target")
    parser.add_argument("--warmup", type=float, default=0.5, help="uncounted seconds before each target")
    parser.add_argument("--profile", help="run relayer serve under cProfile, writing PROFILE when it stops")
    asyncio.run(main(parser.parse_args()))
