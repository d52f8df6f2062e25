"""The chain follower under busy 200 ms blocks (issue 20, item 3): its lag behind the head
and its CPU per block, with background traffic of other senders.

A Base-like anvil (a block every ``--block-time`` s) with ``python -m relayer_dev traffic``
at ``--background-tps``; the follower runs alone in this process (its CPU is this process's,
less the sampler's) with ``--in-flight`` transactions of ours always pending (hashes never
mined: every block is searched for them, the follower's costliest steady case). Lag is
sampled every 50 ms as the node's head minus the last block the follower read.

    python bench/follower_lag.py --seconds 30 --block-time 0.2 --background-tps 150

Prints one JSON line last: ``blocks``, ``blockTimeSeconds``, ``backgroundTps``,
``lagBlocksMax``, ``lagBlocksP95``, ``followerCpuMsPerBlock``, ``pollIntervalSeconds``,
``rpcCallsPerBlock``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.background import Background, start_background  # noqa: E402
from relayer.app import open_runtime  # noqa: E402
from relayer.config import Settings  # noqa: E402
from relayer.store.executor_lane import ExecutorLane, PendingTx  # noqa: E402
from relayer.store.migrations import migrate  # noqa: E402
from relayer.workers.follower import ChainFollower  # noqa: E402
from relayer_dev import devdb, devnet  # noqa: E402
from relayer_dev.deploy import deploy_and_seed  # noqa: E402
from relayer_dev.ports import free_port  # noqa: E402


class InFlight(ExecutorLane):
    """The real lane, with ``extra`` hashes of ours always pending (never mined)."""

    def __init__(self, db: Any, chain_id: int, extra: dict[bytes, PendingTx]) -> None:
        super().__init__(db, chain_id)
        self.extra = extra

    async def pending(self) -> dict[bytes, PendingTx]:
        return {**await super().pending(), **self.extra}


async def measure(rt: Any, args: argparse.Namespace) -> dict[str, Any]:
    extra = {os.urandom(32): PendingTx(None, "noop") for _ in range(args.in_flight)}
    lane = InFlight(rt.db, rt.settings.chain_id, extra)
    policy = rt.settings.confirmation_policy() if hasattr(rt.settings, "confirmation_policy") else 1
    poll = rt.settings.poll_interval_s() if hasattr(rt.settings, "poll_interval_s") else 0.25
    calls: dict[str, int] = {}
    request, batch = rt.node.request, rt.node.batch

    async def counted_request(method: str, params: Any) -> Any:
        calls[method] = calls.get(method, 0) + 1
        return await request(method, params)

    async def counted_batch(items: Any) -> Any:
        for method, _ in items:
            calls[method] = calls.get(method, 0) + 1
        return await batch(items)

    rt.node.request, rt.node.batch = counted_request, counted_batch
    head = await rt.blocks.head()
    follower = ChainFollower(
        rt.blocks, rt.reads, rt.jobs, lane, rt.retirements, rt.metrics, policy, head, poll
    )
    stop = asyncio.Event()
    task = asyncio.create_task(follower.run(stop))
    await asyncio.sleep(2)  # caught up
    calls.clear()
    lags: list[int] = []
    start_head, cpu0, t0 = await rt.blocks.head(), time.process_time(), time.monotonic()
    while time.monotonic() - t0 < args.seconds:
        node_head = await request("eth_blockNumber", [])
        if follower._scanned is not None:
            lags.append(int(node_head, 16) - follower._scanned)
        await asyncio.sleep(0.05)
    cpu, end_head = time.process_time() - cpu0, await rt.blocks.head()
    stop.set()
    await task
    blocks = max(1, end_head - start_head)
    lags.sort()
    return {
        "blocks": blocks,
        "lagBlocksMax": lags[-1] if lags else None,
        "lagBlocksP95": lags[int(0.95 * (len(lags) - 1))] if lags else None,
        "followerCpuMsPerBlock": round(1000 * cpu / blocks, 3),
        "pollIntervalSeconds": poll,
        "rpcCallsPerBlock": round(sum(calls.values()) / blocks, 2),
        "rpcCalls": calls,
    }


async def main(args: argparse.Namespace) -> None:
    admin = devdb.ensure_database_url(os.environ.get("RELAYER_DATABASE_URL"), ROOT / ".devdata")
    dsn = devdb.create_scratch_database(admin, prefix="relayer_bench")
    migrate(dsn)
    state = Path(tempfile.mkdtemp(prefix="relayer-follower-"))
    port = free_port()
    anvil = devnet.start_anvil(state, port, 84532, args.block_time)
    background: Background | None = None
    try:
        info = deploy_and_seed(devnet.rpc_url(port), 84532, devnet.DEFAULT_PROJECTS_FILE)
        (state / "devnet.json").write_text(json.dumps(info))
        if args.background_tps:
            background = start_background(args.background_tps, info["rpcUrl"], state / "devnet.json", state)
        settings = Settings(
            database_url=dsn,
            rpc_url=info["rpcUrl"],
            chain_id=84532,
            deployment_file=state / "devnet.json",
            executor_private_key=info["executor"]["privateKey"],
            confirmations=1,
        )
        async with open_runtime(settings, workers=False) as rt:
            result = await measure(rt, args)
        traffic = background.stop() if background is not None else {}
        background = None
        result |= {"blockTimeSeconds": args.block_time, "backgroundTps": traffic.get("achievedTps", 0.0)}
        print(json.dumps(result), flush=True)
    finally:
        if background is not None:
            background.stop()
        anvil.terminate()
        anvil.wait(timeout=10)
        devdb.drop_database(admin, dsn.rsplit("/", 1)[1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--block-time", type=float, default=0.2)
    parser.add_argument("--background-tps", type=float, default=150.0)
    parser.add_argument("--in-flight", type=int, default=20, help="hashes of ours always pending")
    asyncio.run(main(parser.parse_args()))
