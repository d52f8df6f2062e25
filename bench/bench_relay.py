"""Relay throughput, latency and RPC calls per relayed retirement, against a private anvil and
a scratch Postgres database, with the daemon in-process over HTTP (loopback only).

Prints absolute figures and, because machines here are noisy, ratios against baselines taken
in the same run: a bare JSON-RPC round trip to the same anvil, and a bare HTTP round trip to
the same daemon (GET /healthz).

    .venv/bin/python bench/bench_relay.py --retirements 60 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from eth_account import Account
from eth_account.messages import encode_typed_data

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import counting_proxy, free_port  # noqa: E402
from relayer.app import make_web_app, open_runtime  # noqa: E402
from relayer.config import Settings  # noqa: E402
from relayer.store.migrations import migrate  # noqa: E402
from relayer_dev import devdb, devnet  # noqa: E402
from relayer_dev.deploy import deploy_and_seed  # noqa: E402


async def round_trips(session: aiohttp.ClientSession, n: int, call: Any) -> float:
    started = time.perf_counter()
    for _ in range(n):
        await call(session)
    return n / (time.perf_counter() - started)


async def main(n: int, concurrency: int, block_time: float | None) -> None:
    admin = devdb.ensure_database_url(os.environ.get("RELAYER_DATABASE_URL"), ROOT / ".devdata")
    dsn = devdb.create_scratch_database(admin, prefix="relayer_bench")
    migrate(dsn)
    state = Path(tempfile.mkdtemp(prefix="relayer-bench-"))
    anvil_port, http_port = free_port(), free_port()
    proc = devnet.start_anvil(state, anvil_port, 84532, block_time)
    try:
        info = deploy_and_seed(devnet.rpc_url(anvil_port), 84532, devnet.DEFAULT_PROJECTS_FILE)
        (state / "devnet.json").write_text(json.dumps(info))
        base = f"http://127.0.0.1:{http_port}"
        calls: dict[str, int] = {}
        proxy_port = free_port()
        proxy = await counting_proxy(proxy_port, info["rpcUrl"], calls)
        settings = Settings(
            database_url=dsn,
            executor_private_key=info["executor"]["privateKey"],
            rpc_url=f"http://127.0.0.1:{proxy_port}",
            chain_id=84532,
            deployment_file=state / "devnet.json",
            http_port=http_port,
            public_base_url=base,
            settle_wait_s=60,
        )
        async with open_runtime(settings, workers=True) as rt:
            runner = web.AppRunner(make_web_app(rt), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", http_port).start()
            async with aiohttp.ClientSession() as session:
                bodies = []
                for i in range(n):
                    payer = info["payers"][i % len(info["payers"])]
                    req = {
                        "action": "actions/retire",
                        "carbonClass": "RE",
                        "amount": "0.1",
                        "inputToken": "USDC",
                        "from": payer["address"],
                        "details": {"beneficiaryIsPayer": True},
                    }
                    async with session.post(f"{base}/api", json=req) as r:
                        ch = await r.json()
                    body = copy.deepcopy(ch["actionsRetireRequest"])
                    sig = Account.sign_message(
                        encode_typed_data(full_message=ch["typedData"]), payer["privateKey"]
                    )
                    body["authPayload"]["signature"] = "0x" + bytes(sig.signature).hex()
                    bodies.append(body)
                await asyncio.sleep(0.5)
                calls.clear()
                latencies: list[float] = []
                statuses: dict[str, int] = {}
                sem = asyncio.Semaphore(concurrency)

                async def relay(body: dict[str, Any]) -> None:
                    async with sem:
                        t0 = time.perf_counter()
                        async with session.post(f"{base}/api", json=body) as r:
                            out = await r.json()
                        latencies.append(time.perf_counter() - t0)
                        key = out.get("status") or out.get("error")
                        statuses[key] = statuses.get(key, 0) + 1

                started = time.perf_counter()
                await asyncio.gather(*(relay(b) for b in bodies))
                elapsed = time.perf_counter() - started
                relay_calls = dict(calls)

                async def rpc(s: aiohttp.ClientSession) -> None:
                    async with s.post(
                        info["rpcUrl"],
                        json={"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []},
                    ) as r:
                        await r.read()

                async def health(s: aiohttp.ClientSession) -> None:
                    async with s.get(f"{base}/healthz") as r:
                        await r.read()

                rpc_rate = await round_trips(session, 300, rpc)
                http_rate = await round_trips(session, 300, health)
            await runner.cleanup()
        await proxy.cleanup()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        devdb.drop_database(admin, dsn.rsplit("/", 1)[1])

    total_calls = sum(relay_calls.values())
    rate = n / elapsed
    lat = sorted(latencies)
    mining = f"{block_time} s blocks" if block_time else "automine (one block per transaction)"
    print(f"relayed retirements: {n} at concurrency {concurrency}, anvil {mining}: {statuses}")
    print(f"throughput: {rate:.1f} settled retirements/s (wall {elapsed:.2f} s)")
    print(
        f"latency (post signed request -> settled): p50 {statistics.median(lat) * 1000:.0f} ms, "
        f"p95 {lat[int(0.95 * (len(lat) - 1))] * 1000:.0f} ms"
    )
    print(f"RPC calls per retirement: {total_calls / n:.2f} (all workers included)")
    for method, count in sorted(relay_calls.items(), key=lambda kv: -kv[1]):
        print(f"  {method:28s} {count:5d}  ({count / n:.2f} per retirement)")
    print(f"baseline: bare eth_blockNumber round trips {rpc_rate:.0f}/s; bare GET /healthz {http_rate:.0f}/s")
    print(
        f"ratio: one settled retirement costs {rpc_rate / rate:.1f} bare RPC round trips "
        f"and {http_rate / rate:.1f} bare HTTP round trips of wall time"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--retirements", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--block-time", type=float, default=None, help="anvil block time (default automine)")
    args = parser.parse_args()
    asyncio.run(main(args.retirements, args.concurrency, args.block_time))
