"""Relay throughput against the chain's own limit (issue 8), everything on loopback.

One run:
1. a private anvil (``--block-time``, ``--gas-limit`` high enough that the chain is not the
   ceiling), the reference protocol, and N distinct payers funded with USDC;
2. the baseline: N identical settlement transactions (``retireWithAuthorization`` of signed
   authorizations, built by the daemon's own code) signed and sent directly from the
   executor key, pipelined over one keep-alive session, no daemon: sent to all mined;
3. the daemon as deployed (``relayer all``, or ``relayer serve`` + ``relayer work`` with
   ``--split``) in processes of its own, its JSON-RPC through a counting proxy; this process
   is the client: it posts N other signed retirements at ``--concurrency`` and waits for each
   answer.

Prints the figures, then one JSON line: settledPerSecond, baselinePerSecond, ratio, p50Seconds,
p95Seconds, failures, nonceErrors, rpcCallsPerRetirement, daemonCpuMsPerRetirement, and beside
them rpcMethodCallsPerRetirement and steadySettledPerSecond. rpcCallsPerRetirement counts HTTP
round trips to the node (a JSON-RPC batch is one); rpcMethodCallsPerRetirement counts the calls
they carry (what a metered provider bills). nonceErrors are broadcasts the node refused for
their nonce, seen by the counting proxy. steadySettledPerSecond is the rate between the 10th
and the 90th percentile of answers (without the first block's ramp and the last confirmations).

On the Base-like profile (issue 20): ``--block-time 0.2`` (Base's 200 ms blocks) and
``--background-tps 150`` (``python -m relayer_dev traffic`` against the bench's anvil for the
whole run, from after the payers are funded: other senders' token transfers, some on the
devnet's USDC and kVCM); the JSON line then adds blockTimeSeconds, backgroundTps (what the
generator achieved), backgroundErrors and anvilBackgroundCpuMsPerSecond (anvil's CPU without the
relay: its blocks and the traffic, measured for 3 s before the baselines and the daemon's load).

The fair physical baseline (issue 20, item 5): in the same run, a minimal relay sends a third
set of the same settlements: for each one ``eth_estimateGas`` (the spec's simulation), sign,
send, pipelined over one WebSocket connection to the node, no database and no HTTP server. The
JSON line adds minimalRelayPerSecond and ratioToMinimalRelay (the daemon's settled/s over it,
target >= 0.8, beside ``ratio``, the one to the direct send); minimalRelayNodeCpuMsPerRetirement
(anvil's CPU over the minimal relay's run less its rate without the relay, a retirement: the
node's floor for one estimate and one send); nodeCpuMsPerRetirement (anvil's CPU
over the daemon's load less its rate without the relay, a retirement); and, from the jobs'
stamps in Postgres, acceptedToSubmittedP50Seconds and confirmationSeconds (median mined ->
confirmed: the follower's receipt to the daemon's confirmation policy deeming it final; the
daemon runs at ``--confirmations`` 1 unless told, 0 leaving it its policy for the chain).
postgresCpuMsPerRetirement is the CPU the Postgres server's processes spent over the daemon's
load, a retirement (null when the server does not run on this machine): the machine's two
cores serve it too.

    .venv/bin/python bench/relay_throughput.py --retirements 1000 --concurrency 500
    .venv/bin/python bench/relay_throughput.py --retirements 300 --concurrency 50 \
        --block-time 0.2 --background-tps 150
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils.crypto import keccak
from web3 import Web3
from web3.exceptions import TransactionNotFound

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.background import Background, start_background  # noqa: E402
from bench.common import (  # noqa: E402
    NONCE_REFUSALS,
    ROUND_TRIPS,
    counting_proxy,
    cpu_seconds,
    free_port,
    fund,
    postgres_server_pid,
    server_cpu,
    server_cpu_between,
    start_daemon,
    stop_processes,
    wait_ready,
)
from relayer.app import open_runtime  # noqa: E402
from relayer.chain import calls  # noqa: E402
from relayer.config import Settings  # noqa: E402
from relayer.domain.eip712 import Signature  # noqa: E402
from relayer.domain.schemas import parse_request  # noqa: E402
from relayer.domain.verify import VerifiedAuthorization, verify_authorization  # noqa: E402
from relayer.service.terms import resolve  # noqa: E402
from relayer.store.migrations import migrate  # noqa: E402
from relayer_dev import devdb, devnet  # noqa: E402
from relayer_dev.deploy import deploy_and_seed  # noqa: E402

DEFAULT_BLOCK_GAS: int = 30_000_000
ANVIL_IDLE_S = 3.0  # how long anvil's CPU without the relay is measured before the load
AMOUNT = "0.01"  # tonnes of class RE per retirement


def bench_key(index: int) -> str:
    return "0x" + keccak(text=f"relayer-bench payer {index}").hex()


async def signed_requests(rt: Any, payers: list[str], now: int) -> list[dict[str, Any]]:
    """One signed actions/retire body per payer, from the daemon's own prepare-auth."""
    bodies = []
    for key in payers:
        address = Account.from_key(key).address
        request = parse_request(
            {
                "action": "actions/retire",
                "from": address,
                "carbonClass": "RE",
                "amount": AMOUNT,
                "inputToken": "USDC",
                "details": {"beneficiaryIsPayer": True, "beneficiaryString": "bench"},
            }
        )
        ch = await rt.services.prepare.prepare_auth(request, now)
        body = copy.deepcopy(ch["actionsRetireRequest"])
        sig = Account.sign_message(encode_typed_data(full_message=ch["typedData"]), key)
        body["authPayload"]["signature"] = "0x" + bytes(sig.signature).hex()
        bodies.append(body)
    return bodies


async def call_data(rt: Any, body: dict[str, Any], now: int) -> bytes:
    """The settlement call the daemon would send for ``body`` (verified by its own code)."""
    request = parse_request(body)
    resolved = await resolve(rt.services.supply, request, now)
    relay = rt.services.relay
    terms = resolved.terms(relay.chain_id, relay.settlement, int(request.gasAllowance or 0))
    verified = verify_authorization(request, terms, now)
    assert isinstance(verified, VerifiedAuthorization), verified
    sig = verified.signature
    assert isinstance(sig, Signature)
    return calls.retire_with_authorization(
        verified.retirement,
        verified.salt,
        verified.payer,
        verified.value,
        verified.valid_after,
        verified.valid_before,
        sig,
    )


async def baseline(info: dict[str, Any], datas: list[bytes]) -> dict[str, Any]:
    """Sign the settlement calls from the executor key and send them pipelined; per second
    from the first send to the last mined."""
    w3 = Web3(Web3.HTTPProvider(info["rpcUrl"], request_kwargs={"timeout": 60}))
    executor = Account.from_key(info["executor"]["privateKey"])
    settlement = info["contracts"]["settlement"]
    gas = int(w3.eth.estimate_gas({"from": executor.address, "to": settlement, "data": datas[0]}) * 12 // 10)
    nonce = w3.eth.get_transaction_count(executor.address, "pending")
    fee = 4 * int(w3.eth.get_block("latest")["baseFeePerGas"]) + 10**6
    started = time.perf_counter()
    raws = []
    for i, data in enumerate(datas):
        tx = {
            "type": 2,
            "chainId": info["chainId"],
            "nonce": nonce + i,
            "to": settlement,
            "data": data,
            "value": 0,
            "gas": gas,
            "maxFeePerGas": fee,
            "maxPriorityFeePerGas": 10**6,
        }
        raws.append("0x" + bytes(executor.sign_transaction(tx).raw_transaction).hex())
    signed_in = time.perf_counter() - started
    errors = 0
    async with aiohttp.ClientSession() as session:
        sem = asyncio.Semaphore(64)

        async def send(i: int, raw: str) -> None:
            nonlocal errors
            async with sem:
                payload = {"jsonrpc": "2.0", "id": i, "method": "eth_sendRawTransaction", "params": [raw]}
                async with session.post(info["rpcUrl"], json=payload) as r:
                    if "error" in await r.json():
                        errors += 1

        await asyncio.gather(*(send(i, raw) for i, raw in enumerate(raws)))
        target = nonce + len(raws)
        deadline = time.monotonic() + 300
        while w3.eth.get_transaction_count(executor.address, "latest") < target:
            assert time.monotonic() < deadline, "baseline transactions not mined"
            await asyncio.sleep(0.02)
    elapsed = time.perf_counter() - started
    # ours, not the background's; anvil may count a nonce taken by the block it is still
    # mining before it serves that block's receipts (see relayer.workers.nonces)
    last = None
    while last is None:
        assert time.monotonic() < deadline, "baseline receipt not served"
        last = _receipt(w3, raws[-1])
        if last is None:
            await asyncio.sleep(0.02)
    return {
        "perSecond": len(datas) / elapsed,
        "seconds": elapsed,
        "signSeconds": signed_in,
        "sendErrors": errors,
        "gasPerRetirement": int(last["gasUsed"]),
    }


async def minimal_relay(info: dict[str, Any], datas: list[bytes], in_flight: int = 64) -> dict[str, Any]:
    """The physical floor of a relay (issue 20): for each settlement call one ``eth_estimateGas``
    (the spec's simulation before broadcast), sign (gas limit from the estimate), send, all
    pipelined over one WebSocket connection to the node (at most ``in_flight`` calls
    outstanding), no database and no HTTP server; a nonce is taken only once the estimate
    passed (a refused simulation leaves no hole). Per second from the first estimate to the last
    transaction mined; ``errors`` counts refused estimates and sends."""
    executor = Account.from_key(info["executor"]["privateKey"])
    settlement = info["contracts"]["settlement"]
    ws_url = "ws" + info["rpcUrl"].removeprefix("http")
    ids = itertools.count()
    waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
    errors = 0
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:

        async def read() -> None:
            async for msg in ws:
                reply = json.loads(msg.data)
                future = waiting.pop(reply["id"], None)
                if future is not None and not future.done():
                    future.set_result(reply)

        reader = asyncio.create_task(read())

        async def call(method: str, params: list[Any]) -> dict[str, Any]:
            request_id = next(ids)
            future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            waiting[request_id] = future
            request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            await ws.send_str(json.dumps(request))
            return await asyncio.wait_for(future, 120)

        first = int((await call("eth_getTransactionCount", [executor.address, "pending"]))["result"], 16)
        latest = await call("eth_getBlockByNumber", ["latest", False])
        fee = 4 * int(latest["result"]["baseFeePerGas"], 16) + 10**6
        taken = itertools.count(first)
        sem = asyncio.Semaphore(in_flight)
        started = time.perf_counter()

        async def relay(data: bytes) -> None:
            nonlocal errors
            async with sem:
                tx = {"from": executor.address, "to": settlement, "data": "0x" + data.hex()}
                # At the latest block, as the daemon simulates (at its head): anvil's own
                # default is "pending", which executes every transaction in its pool first
                # (at 1,000 pending transfers an estimate costs 13 times one at "latest").
                estimate = await call("eth_estimateGas", [tx, "latest"])
                if "error" in estimate:
                    errors += 1
                    return
                signed = executor.sign_transaction(
                    {
                        "type": 2,
                        "chainId": info["chainId"],
                        "nonce": next(taken),
                        "to": settlement,
                        "data": data,
                        "value": 0,
                        "gas": int(estimate["result"], 16) * 12 // 10,
                        "maxFeePerGas": fee,
                        "maxPriorityFeePerGas": 10**6,
                    }
                )
                sent = await call("eth_sendRawTransaction", ["0x" + bytes(signed.raw_transaction).hex()])
                if "error" in sent:
                    errors += 1

        await asyncio.gather(*(relay(d) for d in datas))
        target = next(taken)  # one past the last nonce taken
        deadline = time.monotonic() + 300

        async def mined_nonce() -> int:
            return int((await call("eth_getTransactionCount", [executor.address, "latest"]))["result"], 16)

        while await mined_nonce() < target:
            assert time.monotonic() < deadline, "minimal relay's transactions not mined"
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
        reader.cancel()
    mined = target - first
    return {"perSecond": mined / elapsed, "seconds": elapsed, "errors": errors, "mined": mined}


async def load(base: str, bodies: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    outcomes: dict[str, int] = {}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        sem = asyncio.Semaphore(concurrency)

        async def post(body: dict[str, Any]) -> None:
            async with sem:
                t0 = time.perf_counter()
                async with session.post(f"{base}/api", json=body) as r:
                    out = await r.json(content_type=None)
                key = out.get("status") or out.get("error") or str(r.status)
                outcomes[key] = outcomes.get(key, 0) + 1
                if key == "settled":
                    done = time.perf_counter()
                    latencies.append(done - t0)
                    finished.append(done)

        finished: list[float] = []
        started = time.perf_counter()
        await asyncio.gather(*(post(b) for b in bodies))
        elapsed = time.perf_counter() - started
    latencies.sort()
    # The rate between the 10th and the 90th percentile of answers: the steady state, without
    # the ramp-up (the first block) and the tail (the last jobs' confirmations).
    lo, hi = int(0.1 * len(finished)), int(0.9 * len(finished)) - 1
    steady = (hi - lo) / (finished[hi] - finished[lo]) if hi > lo and finished[hi] > finished[lo] else 0.0

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else float("nan")

    return {
        "seconds": elapsed,
        "steadyPerSecond": steady,
        "outcomes": outcomes,
        "p50": pct(0.5),
        "p95": pct(0.95),
        "p99": pct(0.99),
        "max": latencies[-1] if latencies else float("nan"),
        "settled": len(latencies),
    }


async def stage_means(base: str) -> dict[str, float]:
    """Mean seconds a job spent per stage (``relayer_relay_stage_duration_seconds``), from
    the daemon's /metrics: where a relayed retirement's latency goes."""
    async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as r:
        text = await r.text()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for suffix, into in (("_sum{", sums), ("_count{", counts)):
            if line.startswith("relayer_relay_stage_duration_seconds" + suffix):
                stage = line.split('stage="', 1)[1].split('"', 1)[0]
                into[stage] = float(line.rsplit(" ", 1)[1])
    return {stage: sums[stage] / counts[stage] for stage in sums if counts.get(stage)}


async def stamp_means(dsn: str) -> str:
    """Mean seconds between the state stamps of the indexed jobs (accepted -> simulated ->
    signed -> submitted -> mined -> indexed), from Postgres."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            """
            SELECT avg(extract(epoch FROM simulated_at - accepted_at)) AS accepted_simulated,
                   avg(extract(epoch FROM signed_at - simulated_at)) AS simulated_signed,
                   avg(extract(epoch FROM submitted_at - signed_at)) AS signed_submitted,
                   avg(extract(epoch FROM mined_at - submitted_at)) AS submitted_mined,
                   avg(extract(epoch FROM indexed_at - mined_at)) AS mined_indexed
            FROM relay_jobs WHERE state = 'indexed'
            """
        )
        slowest = await conn.fetch(
            """
            SELECT extract(epoch FROM simulated_at - accepted_at) AS a,
                   extract(epoch FROM signed_at - simulated_at) AS b,
                   extract(epoch FROM submitted_at - signed_at) AS c,
                   extract(epoch FROM mined_at - submitted_at) AS d,
                   extract(epoch FROM indexed_at - mined_at) AS e
            FROM relay_jobs WHERE state = 'indexed' ORDER BY indexed_at - accepted_at DESC LIMIT 5
            """
        )
    finally:
        await conn.close()
    assert row is not None
    means = ", ".join(f"{k.replace('_', ' -> ')} {float(v or 0):.2f}" for k, v in row.items())
    tails = "; ".join(" / ".join(f"{float(r[k] or 0):.2f}" for k in "abcde") for r in slowest)
    return f"{means}\nthe 5 slowest jobs, the same stamps: {tails}"


async def stamp_medians(dsn: str) -> dict[str, float]:
    """Medians over the settled (indexed) jobs, seconds, from their stamps in Postgres:
    ``acceptedToSubmitted`` (accepted -> submitted) and ``confirmation`` (mined -> confirmed: the
    follower's receipt to the daemon's confirmation policy deeming it final)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            """
            SELECT percentile_cont(0.5) WITHIN GROUP
                       (ORDER BY extract(epoch FROM submitted_at - accepted_at)) AS accepted_submitted,
                   percentile_cont(0.5) WITHIN GROUP
                       (ORDER BY extract(epoch FROM confirmed_at - mined_at)) AS mined_confirmed
            FROM relay_jobs WHERE state = 'indexed'
            """
        )
    finally:
        await conn.close()
    assert row is not None
    return {
        "acceptedToSubmitted": float(row["accepted_submitted"] or 0.0),
        "confirmation": float(row["mined_confirmed"] or 0.0),
    }


def _receipt(w3: Web3, raw: str) -> Any:
    """The receipt of the transaction ``raw`` (0x hex), or None while the node serves none."""
    try:
        return w3.eth.get_transaction_receipt(keccak(hexstr=raw))
    except TransactionNotFound:
        return None


def _p90(values: list[float]) -> float:
    """The 90th percentile of ``values`` (nearest rank below)."""
    return sorted(values)[int(0.9 * (len(values) - 1))]


async def main(args: argparse.Namespace) -> None:
    n = args.retirements
    admin = devdb.ensure_database_url(os.environ.get("RELAYER_DATABASE_URL"), ROOT / ".devdata")
    dsn = devdb.create_scratch_database(admin, prefix="relayer_bench")
    migrate(dsn)
    state = Path(tempfile.mkdtemp(prefix="relayer-throughput-"))
    log = state / "daemon.log"
    anvil_port = free_port()
    anvil = devnet.start_anvil(state, anvil_port, 84532, args.block_time, args.gas_limit)
    procs: list[subprocess.Popen[bytes]] = []
    background: Background | None = None
    traffic: dict[str, Any] = {}
    try:
        info = deploy_and_seed(devnet.rpc_url(anvil_port), 84532, devnet.DEFAULT_PROJECTS_FILE)
        (state / "devnet.json").write_text(json.dumps(info))
        payers = [bench_key(i) for i in range(n)]
        t0 = time.perf_counter()
        fund(info, [Account.from_key(k).address for k in payers], 10 * 10**6)
        print(f"funded {n} payers in {time.perf_counter() - t0:.1f} s", flush=True)
        if args.background_tps:
            background = start_background(args.background_tps, info["rpcUrl"], state / "devnet.json", state)
        # anvil's CPU without us: mining its blocks and the background traffic, if any (what
        # nodeCpuMsPerRetirement takes away from its CPU under the daemon's load)
        before = cpu_seconds(anvil.pid)
        await asyncio.sleep(ANVIL_IDLE_S)
        traffic["anvilCpuMsPerSecond"] = 1000 * (cpu_seconds(anvil.pid) - before) / ANVIL_IDLE_S
        print(
            f"background traffic at {args.background_tps:g}/s"
            + (f" (log {background.log})" if background else "")
            + f"; anvil CPU without the relay: {traffic['anvilCpuMsPerSecond']:.0f} ms/s",
            flush=True,
        )
        settings = Settings(
            database_url=dsn,
            rpc_url=info["rpcUrl"],
            chain_id=84532,
            deployment_file=state / "devnet.json",
            executor_private_key=info["executor"]["privateKey"],
            confirmations=args.confirmations or None,
        )
        now = int(time.time())
        t0 = time.perf_counter()
        async with open_runtime(settings, workers=False) as rt:
            base_bodies = await signed_requests(rt, payers, now)
            datas = [await call_data(rt, b, now) for b in base_bodies]
            minimal_datas = [await call_data(rt, b, now) for b in await signed_requests(rt, payers, now)]
            daemon_bodies = await signed_requests(rt, payers, now)
        print(f"signed {3 * n} authorizations in {time.perf_counter() - t0:.1f} s", flush=True)
        base = await baseline(info, datas)
        print(
            f"baseline: {n} direct sends mined in {base['seconds']:.2f} s = {base['perSecond']:.1f}/s "
            f"(signing {base['signSeconds']:.2f} s, send errors {base['sendErrors']}); "
            f"{base['gasPerRetirement']} gas a retirement: "
            f"{DEFAULT_BLOCK_GAS // base['gasPerRetirement']} fit in a {DEFAULT_BLOCK_GAS:,}-gas block",
            flush=True,
        )
        minimal_cpu = cpu_seconds(anvil.pid)
        minimal = await minimal_relay(info, minimal_datas)
        idle_cpu = traffic["anvilCpuMsPerSecond"] / 1000 * minimal["seconds"]
        minimal_cpu = cpu_seconds(anvil.pid) - minimal_cpu - idle_cpu
        minimal["nodeCpuMs"] = 1000 * minimal_cpu / n  # the floor: one estimate and one send each
        print(
            f"minimal relay (estimateGas, sign, send over one WebSocket): {minimal['mined']}/{n} mined in "
            f"{minimal['seconds']:.2f} s = {minimal['perSecond']:.1f}/s (errors {minimal['errors']})",
            flush=True,
        )
        counts: dict[str, int] = {}
        latencies: dict[str, list[float]] = {}
        proxy_port, http_port = free_port(), free_port()
        proxy = await counting_proxy(proxy_port, info["rpcUrl"], counts, latencies)
        base_url = f"http://127.0.0.1:{http_port}"
        env = {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/tmp"),
            "RELAYER_DATABASE_URL": dsn,
            "RELAYER_RPC_URL": f"http://127.0.0.1:{proxy_port}",
            "RELAYER_CHAIN_ID": "84532",
            "RELAYER_DEPLOYMENT_FILE": str(state / "devnet.json"),
            "RELAYER_EXECUTOR_PRIVATE_KEY": info["executor"]["privateKey"],
            "RELAYER_SETTLE_WAIT_S": "300",
            "RELAYER_HTTP_PORT": str(http_port),
            "RELAYER_PUBLIC_BASE_URL": base_url,
            "RELAYER_LOG_LEVEL": "WARNING",
            "RELAYER_RATE_LIMIT": "off",  # the load comes from one client
        }
        if args.confirmations:
            env["RELAYER_CONFIRMATIONS"] = str(args.confirmations)
        for setting in args.daemon_setting:  # e.g. RELAYER_DB_POOL_MAX=30
            name, _, value = setting.partition("=")
            env[name] = value
        commands = ["serve", "work"] if args.split else ["all"]
        procs = [
            start_daemon(c, env, log, Path(f"{args.profile}.{c}") if args.profile else None) for c in commands
        ]
        await wait_ready(f"{base_url}/readyz", procs, log)
        await asyncio.sleep(1)
        counts.clear()
        server = await postgres_server_pid(dsn)
        cpu_before = [cpu_seconds(p.pid) for p in procs]
        server_before = server_cpu(server)
        anvil_before, client_before = cpu_seconds(anvil.pid), time.process_time()
        result = await load(base_url, daemon_bodies, args.concurrency)
        cpu = sum(cpu_seconds(p.pid) - b for p, b in zip(procs, cpu_before, strict=True))
        postgres_ms = 1000 * server_cpu_between(server_before, server_cpu(server)) / n if server else None
        anvil_cpu, client_cpu = cpu_seconds(anvil.pid) - anvil_before, time.process_time() - client_before
        nonce_errors = counts.pop(NONCE_REFUSALS, 0)
        round_trips = counts.pop(ROUND_TRIPS, 0)
        rpc_calls = sum(counts.values())
        settled = result["settled"]
        per_second = settled / result["seconds"]
        failures = n - settled
        stages = await stage_means(base_url) if not args.split else {}
        print(
            f"daemon ({' + '.join('relayer ' + c for c in commands)}): {settled}/{n} settled in "
            f"{result['seconds']:.2f} s = {per_second:.1f}/s at concurrency {args.concurrency}; "
            f"p50 {result['p50']:.2f} s, p95 {result['p95']:.2f} s, p99 {result['p99']:.2f} s, "
            f"max {result['max']:.2f} s; outcomes {result['outcomes']}; "
            f"steady rate (10th to 90th percentile of answers) {result['steadyPerSecond']:.1f}/s",
            flush=True,
        )
        print(
            "the node's time a round trip, median / p90 ms (count): "
            + ", ".join(
                f"{k} {1000 * statistics.median(v):.1f} / {1000 * _p90(v):.1f} ({len(v)})"
                for k, v in sorted(latencies.items(), key=lambda kv: -len(kv[1]))[:8]
            ),
            flush=True,
        )
        print(
            f"JSON-RPC: {round_trips} HTTP round trips ({round_trips / n:.2f} a retirement) carrying "
            f"{rpc_calls} calls ({rpc_calls / n:.2f} a retirement): "
            + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])),
            flush=True,
        )
        postgres = "not measured (not on this machine)" if postgres_ms is None else f"{postgres_ms:.1f} ms"
        print(
            f"CPU a retirement: daemon {1000 * cpu / n:.1f} ms, anvil {1000 * anvil_cpu / n:.1f} ms, "
            f"Postgres {postgres}, this client {1000 * client_cpu / n:.1f} ms "
            f"(the machine has {os.cpu_count()} cores for all of them)",
            flush=True,
        )
        if stages:
            print("mean seconds a stage: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()), flush=True)
        print("mean seconds between a job's stamps: " + await stamp_means(dsn), flush=True)
        medians = await stamp_medians(dsn)
        node_ms = 1000 * (anvil_cpu - traffic["anvilCpuMsPerSecond"] / 1000 * result["seconds"]) / n
        print(
            f"anvil CPU for our calls {node_ms:.1f} ms a retirement (its {1000 * anvil_cpu / n:.1f} ms less "
            f"{traffic['anvilCpuMsPerSecond']:.0f} ms/s without the relay); medians: accepted -> submitted "
            f"{medians['acceptedToSubmitted']:.3f} s, mined -> confirmed {medians['confirmation']:.3f} s",
            flush=True,
        )
        print(
            f"anvil CPU for the minimal relay's calls (its floor: one estimate, one send and the mining "
            f"of each): {minimal['nodeCpuMs']:.1f} ms a retirement",
            flush=True,
        )
        print(
            f"daemon CPU {cpu:.2f} s = {1000 * cpu / n:.1f} ms a retirement; broadcasts the node refused for "
            f"their nonce: {nonce_errors}"
        )
        await proxy.cleanup()
        if background is not None:
            traffic |= background.stop()
            background = None
            print(f"background traffic: {json.dumps(traffic)}", flush=True)
        print(
            json.dumps(
                {
                    "settledPerSecond": round(per_second, 2),
                    "baselinePerSecond": round(base["perSecond"], 2),
                    "ratio": round(per_second / base["perSecond"], 3),
                    "p50Seconds": round(result["p50"], 3),
                    "p95Seconds": round(result["p95"], 3),
                    "failures": failures,
                    "nonceErrors": nonce_errors,
                    "rpcCallsPerRetirement": round(round_trips / n, 2),
                    "daemonCpuMsPerRetirement": round(1000 * cpu / n, 1),
                    "postgresCpuMsPerRetirement": None if postgres_ms is None else round(postgres_ms, 1),
                    "rpcMethodCallsPerRetirement": round(rpc_calls / n, 2),
                    "steadySettledPerSecond": round(result["steadyPerSecond"], 2),
                    "blockTimeSeconds": args.block_time,
                    "backgroundTps": traffic.get("achievedTps", 0.0),
                    "backgroundErrors": traffic.get("errors", 0),
                    "anvilBackgroundCpuMsPerSecond": round(traffic.get("anvilCpuMsPerSecond", 0.0), 1),
                    "minimalRelayPerSecond": round(minimal["perSecond"], 2),
                    "ratioToMinimalRelay": round(per_second / minimal["perSecond"], 3),
                    "nodeCpuMsPerRetirement": round(node_ms, 2),
                    "minimalRelayNodeCpuMsPerRetirement": round(minimal["nodeCpuMs"], 2),
                    "acceptedToSubmittedP50Seconds": round(medians["acceptedToSubmitted"], 3),
                    "confirmationSeconds": round(medians["confirmation"], 3),
                }
            )
        )
    finally:
        stop_processes(procs)
        if background is not None:
            background.stop()
        stop_processes([anvil], 10)
        devdb.drop_database(admin, dsn.rsplit("/", 1)[1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--retirements", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--block-time", type=float, default=1.0)
    parser.add_argument("--gas-limit", type=int, default=1_000_000_000)
    parser.add_argument(
        "--background-tps",
        type=float,
        default=0.0,
        help="other senders' token transfers a second on the chain during the run (0: none)",
    )
    parser.add_argument(
        "--confirmations",
        type=int,
        default=1,
        help="RELAYER_CONFIRMATIONS for the daemon (default 1; 0: the daemon's own policy for the chain)",
    )
    parser.add_argument(
        "--split", action="store_true", help="relayer serve + relayer work instead of relayer all"
    )
    parser.add_argument(
        "--daemon-setting",
        action="append",
        default=[],
        metavar="RELAYER_NAME=VALUE",
        help="a setting of the daemon's environment (repeatable), e.g. RELAYER_DB_POOL_MAX=30",
    )
    parser.add_argument(
        "--profile", help="run the daemon under cProfile, writing PROFILE.<command> when it stops"
    )
    asyncio.run(main(parser.parse_args()))
