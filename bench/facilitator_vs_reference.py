"""Our x402 facilitator against the official Python one (issue 19; docs/design/x402-v2.md, C9).

One run, one private anvil (``--block-time`` 1 s by default), our deployment, and distinct
payers for each side, each funded with devnet USDC (one pipelined batch of mints). Every
payment is signed up front with the x402 SDK's own client scheme (``ExactEvmScheme`` over an
``EthAccountSigner``; ``payTo`` a merchant EOA per side), so both sides settle payloads of
the same shape:

(a) the reference: the SDK's ``x402FacilitatorSync`` with ``register_exact_evm_facilitator``
    and a ``FacilitatorWeb3Signer`` (its own executor key), ``settle`` called in process on a
    ``ThreadPoolExecutor(concurrency)`` as its examples run it (no HTTP: in its favour);
(b) ours: ``relayer all`` on the same anvil and a fresh database, ``POST /facilitator/settle``
    with a bench API key from an aiohttp client at ``concurrency``.

A ``settlement_pending`` answer is followed by the same request again (as a resource server
would) and the latency is counted to the final answer. Failures are non-success final answers
and exceptions; a stall is a request without a final answer ``--stall-seconds`` (120) after it
began, and when no final answer at all arrives for that long the requests still open (running
or queued) are counted as stalls and the side's run ends. Afterwards the chain is read: each
payer must have paid exactly once when its answer was a success, and not at all otherwise.

Scenarios (``--scenario``):
- ``default``;
- ``two-instances``: the reference as two facilitator objects with separate signers on one
  key (half the payments each); ours as two ``relayer all`` daemons on one executor key and
  one database (the client alternates between them);
- ``dropped``: a watcher removes each side's first broadcast from the node's pool
  (``anvil_dropTransaction``, found by polling ``txpool_content``), then 20 more payments are
  settled after the run; failures and stalls are reported for both phases.

Prints the figures, then one JSON line: oursPerSecond, referencePerSecond, ratio,
oursP50Seconds, oursP95Seconds, referenceP50Seconds, referenceP95Seconds, oursFailures,
referenceFailures, and beside them n, concurrency, scenario, stalls, failure reasons, on-chain
mismatches and (dropped) the after-drop figures.

    .venv/bin/python bench/facilitator_vs_reference.py --n 500 --concurrency 50 [--scenario dropped]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from eth_account import Account
from eth_utils.crypto import keccak
from x402 import x402FacilitatorSync
from x402.mechanisms.evm import EthAccountSigner, FacilitatorWeb3Signer
from x402.mechanisms.evm.exact import ExactEvmScheme, register_exact_evm_facilitator
from x402.schemas import PaymentPayload, PaymentRequirements, ResourceInfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    RELAYER,
    cpu_seconds,
    daemon_env,
    free_port,
    fund,
    in_scratch_database,
    start_daemon,
    stop_processes,
    wait_ready,
)
from relayer.domain.chains import usdc_domain_name  # noqa: E402
from relayer_dev import devnet  # noqa: E402
from relayer_dev.deploy import deploy_and_seed  # noqa: E402

CHAIN_ID = 84532
NETWORK = f"eip155:{CHAIN_ID}"
AMOUNT = 10_000  # atomic USDC a payment (0.01 USDC)
FUNDED = 1_000_000  # atomic USDC minted to each payer
AFTER_DROP = 20  # payments settled after the dropped scenario's run
PENDING = "settlement_pending"
REFERENCE_ETH_WEI = 1000 * 10**18


def derived_key(label: str) -> str:
    return "0x" + keccak(text=f"relayer-bench x402 {label}").hex()


@dataclass
class Tally:
    """One side's answers: latencies of the successes (seconds, request start to final
    answer), failure reasons, stalls, and the wall time from the first request to the last
    answer."""

    latencies: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    stalls: int = 0
    wall_s: float = 0.0
    successes: set[int] = field(default_factory=set)

    def record(self, index: int, outcome: str, detail: str, seconds: float) -> None:
        if outcome == "ok":
            self.latencies.append(seconds)
            self.successes.add(index)
        elif outcome == "stall":
            self.stalls += 1
        else:
            self.failures[f"{outcome}:{detail}"] += 1

    def pct(self, q: float) -> float | None:
        ordered = sorted(self.latencies)
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else None

    def per_second(self) -> float:
        """Successful settles a second over the wall time (``n`` of them when none failed)."""
        return len(self.latencies) / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self, n: int) -> str:
        return (
            f"{len(self.latencies)}/{n} settled in {self.wall_s:.2f} s = {self.per_second():.2f}/s; "
            f"p50 {self.pct(0.5)} s, p95 {self.pct(0.95)} s, max {self.pct(1.0)} s; "
            f"failures {sum(self.failures.values())} {dict(self.failures)}; stalls {self.stalls}"
        )


# --- the payments -------------------------------------------------------------------------


def requirements(info: dict[str, Any], pay_to: str) -> PaymentRequirements:
    return PaymentRequirements(
        scheme="exact",
        network=NETWORK,
        asset=info["contracts"]["usdc"],
        amount=str(AMOUNT),
        pay_to=pay_to,
        max_timeout_seconds=3600,
        extra={"name": usdc_domain_name(CHAIN_ID), "version": "2"},
    )


def signed_payloads(keys: list[str], req: PaymentRequirements) -> list[PaymentPayload]:
    """One payment per payer key, signed by the SDK's client scheme and wrapped as the SDK's
    ``x402Client`` wraps it (version, accepted requirements, resource)."""
    resource = ResourceInfo(url="http://127.0.0.1/bench/paid", mime_type="application/json")
    payloads = []
    for key in keys:
        inner = ExactEvmScheme(EthAccountSigner(Account.from_key(key))).create_payment_payload(req)
        payloads.append(PaymentPayload(x402_version=2, payload=inner, accepted=req, resource=resource))
    return payloads


def settle_body(payload: PaymentPayload, req: PaymentRequirements) -> dict[str, Any]:
    """A facilitator settle body as the SDK's ``HTTPFacilitatorClient`` sends it."""
    return {
        "x402Version": 2,
        "paymentPayload": payload.model_dump(by_alias=True, exclude_none=True),
        "paymentRequirements": req.model_dump(by_alias=True, exclude_none=True),
    }


# --- the reference: the SDK's facilitator on threads -----------------------------------------


def reference_facilitators(key: str, rpc_url: str, count: int) -> list[x402FacilitatorSync]:
    """``count`` SDK facilitators, each with its own ``FacilitatorWeb3Signer`` on ``key``."""
    out = []
    for _ in range(count):
        facilitator = x402FacilitatorSync()
        register_exact_evm_facilitator(facilitator, FacilitatorWeb3Signer(key, rpc_url), networks=NETWORK)
        out.append(facilitator)
    return out


def reference_reason(reason: str | None, message: str | None) -> str:
    """The SDK's reason, with the node's words when a send failed (its message is the
    node's JSON-RPC error, e.g. ``{'code': -32003, 'message': 'nonce too low'}``)."""
    said = str(message or "")
    node = said.split("'message': '", 1)[1].split("'", 1)[0] if "'message': '" in said else ""
    return f"{reason} ({node})" if node else str(reason)


def run_reference(
    facilitators: list[x402FacilitatorSync],
    payloads: list[PaymentPayload],
    req: PaymentRequirements,
    concurrency: int,
    stall_s: float,
) -> Tally:
    """Settle every payload on a thread pool (payload i on facilitator i mod count); pending
    answers are settled again until final or ``stall_s`` after the request began."""

    def one(i: int) -> tuple[str, str, float]:
        facilitator = facilitators[i % len(facilitators)]
        t0 = time.perf_counter()
        while True:
            try:
                answer = facilitator.settle(payloads[i], req)
            except Exception as exc:  # an exception is a failure we count
                return "exception", type(exc).__name__, time.perf_counter() - t0
            elapsed = time.perf_counter() - t0
            if answer.success:
                return "ok", "", elapsed
            if answer.error_reason != PENDING:
                return "failed", reference_reason(answer.error_reason, answer.error_message), elapsed
            if elapsed >= stall_s or abandoned.is_set():
                return "stall", PENDING, elapsed
            time.sleep(0.1)

    abandoned = threading.Event()
    tally = Tally()
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="reference-settle")
    started = time.perf_counter()
    futures: dict[Future[tuple[str, str, float]], int] = {
        pool.submit(one, i): i for i in range(len(payloads))
    }
    open_futures = set(futures)
    last_answer = last_final = time.perf_counter()
    while open_futures:
        done, open_futures = wait(open_futures, timeout=1.0, return_when=FIRST_COMPLETED)
        for f in done:
            outcome = f.result()
            tally.record(futures[f], *outcome)
            last_answer = time.perf_counter()
            last_final = last_answer if outcome[0] != "stall" else last_final
        if time.perf_counter() - last_final > stall_s:
            break  # no final answer for stall_s: what is still open (running or queued) stalls
    tally.wall_s = last_answer - started
    tally.stalls += len(open_futures)
    # Settles still running end within the SDK's receipt wait (120 s); they are waited for, so
    # that their receipt polling does not load the node and the CPU while the next phase runs.
    abandoned.set()
    pool.shutdown(wait=True, cancel_futures=True)
    return tally


# --- ours: POST /facilitator/settle ----------------------------------------------------------


async def run_ours(
    bases: list[str], key: str, bodies: list[dict[str, Any]], concurrency: int, stall_s: float
) -> Tally:
    """POST every body (body i to daemon i mod count) at ``concurrency``; a pending answer is
    posted again until final or ``stall_s`` after the request began."""
    tally = Tally()
    headers = {"Authorization": f"Bearer {key}"}
    sem = asyncio.Semaphore(concurrency)

    async def one(session: aiohttp.ClientSession, i: int) -> tuple[str, str, float]:
        url = f"{bases[i % len(bases)]}/facilitator/settle"
        async with sem:
            t0 = time.perf_counter()
            while True:
                left = stall_s - (time.perf_counter() - t0)
                if left <= 0:
                    return "stall", PENDING, time.perf_counter() - t0
                try:
                    timeout = aiohttp.ClientTimeout(total=left)
                    async with session.post(url, json=bodies[i], headers=headers, timeout=timeout) as r:
                        status, answer = r.status, await r.json(content_type=None)
                except TimeoutError:
                    return "stall", "no answer", time.perf_counter() - t0
                except aiohttp.ClientError as exc:
                    return "exception", type(exc).__name__, time.perf_counter() - t0
                elapsed = time.perf_counter() - t0
                if status == 200 and answer.get("success") is True:
                    return "ok", "", elapsed
                if status != 200 or answer.get("errorReason") != PENDING:
                    return "failed", str(answer.get("errorReason") or answer.get("error") or status), elapsed

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        tasks = {asyncio.ensure_future(one(session, i)): i for i in range(len(bodies))}
        open_tasks: set[asyncio.Future[tuple[str, str, float]]] = set(tasks)
        last_answer = last_final = time.perf_counter()
        while open_tasks:
            done, open_tasks = await asyncio.wait(
                open_tasks, timeout=1.0, return_when=asyncio.FIRST_COMPLETED
            )
            for t in done:
                outcome = t.result()
                tally.record(tasks[t], *outcome)
                last_answer = time.perf_counter()
                last_final = last_answer if outcome[0] != "stall" else last_final
            if time.perf_counter() - last_final > stall_s:
                break  # no final answer for stall_s: what is still open stalls
        tally.wall_s = last_answer - started
        tally.stalls += len(open_tasks)
        for t in open_tasks:
            t.cancel()
        await asyncio.gather(*open_tasks, return_exceptions=True)
    return tally


BENCH_KEY_LIMITS = ("--rate", "100000/second", "--gas-budget-wei", str(10**24))
"""The bench key's limits: far above anything one run spends, so that they never refuse."""


def bench_api_key(env: dict[str, str]) -> str:
    """A facilitator API key for the benchmark, created with ``relayer apikey create``: the
    facilitator scope, and a rate limit and a daily gas budget no run comes near."""
    argv = [str(RELAYER), "apikey", "create", "--name", "bench-facilitator", "--scope", "facilitator"]
    done = subprocess.run(
        [*argv, *BENCH_KEY_LIMITS], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip().splitlines()[-1]


# --- the chain: funding, the drop watcher, the exactly-once check ----------------------------


async def rpc(session: aiohttp.ClientSession, url: str, method: str, params: list[Any]) -> Any:
    async with session.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}) as r:
        reply = await r.json(content_type=None)
    if "error" in reply:
        raise RuntimeError(f"{method}: {reply['error']}")
    return reply["result"]


async def drop_first_broadcast(
    rpc_url: str, sender: str, stop: asyncio.Event, timeout_s: float = 120
) -> dict[str, Any]:
    """Poll the node's pool until ``sender`` has a transaction in it, then remove the one
    with the lowest nonce (``anvil_dropTransaction``); what was dropped, or why not."""
    want = sender.lower()
    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        while not stop.is_set() and time.perf_counter() - t0 < timeout_s:
            pool = await rpc(session, rpc_url, "txpool_content", [])
            txs = [
                tx
                for part in ("pending", "queued")
                for addr, by_nonce in (pool.get(part) or {}).items()
                if addr.lower() == want
                for tx in by_nonce.values()
            ]
            if txs:
                first = min(txs, key=lambda tx: int(tx["nonce"], 16))
                await rpc(session, rpc_url, "anvil_dropTransaction", [first["hash"]])
                return {
                    "hash": first["hash"],
                    "nonce": int(first["nonce"], 16),
                    "afterSeconds": round(time.perf_counter() - t0, 3),
                }
            await asyncio.sleep(0.02)
    return {"hash": None, "why": "no broadcast seen"}


async def paid(rpc_url: str, usdc: str, holders: list[str]) -> list[int]:
    """USDC balances of ``holders`` (one JSON-RPC batch)."""
    calls = [
        {
            "jsonrpc": "2.0",
            "id": i,
            "method": "eth_call",
            "params": [{"to": usdc, "data": "0x70a08231" + addr[2:].lower().rjust(64, "0")}, "latest"],
        }
        for i, addr in enumerate(holders)
    ]
    async with aiohttp.ClientSession() as session, session.post(rpc_url, json=calls) as r:
        replies = sorted(await r.json(content_type=None), key=lambda x: x["id"])
    return [int(x["result"], 16) for x in replies]


async def mismatches(rpc_url: str, usdc: str, keys: list[str], successes: set[int]) -> int:
    """Payers whose payment on chain disagrees with their answer: a success must have paid
    exactly AMOUNT once, anything else must have paid nothing."""
    balances = await paid(rpc_url, usdc, [Account.from_key(k).address for k in keys])
    return sum(1 for i, b in enumerate(balances) if FUNDED - b != (AMOUNT if i in successes else 0))


# --- the run -------------------------------------------------------------------------------


async def with_drop(
    rpc_url: str, sender: str, drop: bool, run: Callable[[], Awaitable[Tally]]
) -> tuple[Tally, dict[str, Any] | None]:
    """``run()``, with a watcher dropping ``sender``'s first broadcast when ``drop``."""
    if not drop:
        return await run(), None
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(drop_first_broadcast(rpc_url, sender, stop))
    try:
        tally = await run()
    finally:
        stop.set()
    return tally, await watcher


async def reference_side(
    args: argparse.Namespace,
    info: dict[str, Any],
    key: str,
    payloads: list[PaymentPayload],
    req: PaymentRequirements,
) -> dict[str, Any]:
    """The SDK facilitator(s) over ``payloads`` (then the after-drop ones, in ``dropped``)."""
    count = 2 if args.scenario == "two-instances" else 1
    facilitators = reference_facilitators(key, info["rpcUrl"], count)
    n = args.n

    def run(part: list[PaymentPayload]) -> Callable[[], Awaitable[Tally]]:
        return lambda: asyncio.to_thread(
            run_reference, facilitators, part, req, args.concurrency, args.stall_seconds
        )

    sender = Account.from_key(key).address
    cpu = time.process_time()
    tally, dropped = await with_drop(info["rpcUrl"], sender, args.scenario == "dropped", run(payloads[:n]))
    cpu = time.process_time() - cpu  # this process: the SDK's threads (and this client's loop)
    print(
        f"reference ({count} facilitator object(s), one key): {tally.summary(n)}; CPU {cpu:.2f} s", flush=True
    )
    out: dict[str, Any] = {"main": tally, "dropped": dropped, "cpuMsPerSettle": round(1000 * cpu / n, 1)}
    if args.scenario == "dropped":
        out["after"] = await run(payloads[n:])()
        print(
            f"reference, {AFTER_DROP} payments after the drop: {out['after'].summary(AFTER_DROP)}", flush=True
        )
    return out


async def stage_means(dsn: str) -> dict[str, Any]:
    """Mean seconds between the state stamps of our confirmed transfer jobs (accepted ->
    simulated -> signed -> submitted -> mined -> confirmed), and how many transactions a
    mined block carried: where a settle's latency goes inside the daemon."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            """
            SELECT avg(extract(epoch FROM simulated_at - accepted_at)) AS accepted_simulated,
                   avg(extract(epoch FROM signed_at - simulated_at)) AS simulated_signed,
                   avg(extract(epoch FROM submitted_at - signed_at)) AS signed_submitted,
                   avg(extract(epoch FROM mined_at - submitted_at)) AS submitted_mined,
                   avg(extract(epoch FROM confirmed_at - mined_at)) AS mined_confirmed,
                   count(DISTINCT date_trunc('second', mined_at)) AS mined_seconds,
                   count(*) AS jobs
            FROM relay_jobs WHERE state = 'confirmed'
            """
        )
    finally:
        await conn.close()
    assert row is not None
    return {
        k: (round(float(v), 3) if v is not None and not isinstance(v, int) else v) for k, v in row.items()
    }


async def our_side(
    args: argparse.Namespace, info: dict[str, Any], state: Path, dsn: str, bodies: list[dict[str, Any]]
) -> dict[str, Any]:
    """``relayer all`` (two of them on one executor key in ``two-instances``) over ``bodies``."""
    count = 2 if args.scenario == "two-instances" else 1
    log = state / "daemon.log"
    ports = [free_port() for _ in range(count)]
    envs = [daemon_env(dsn, info, state / "devnet.json", port) for port in ports]
    key = bench_api_key(envs[0])
    procs: list[subprocess.Popen[bytes]] = []
    try:
        profiles = [Path(f"{args.profile}.{i}") if args.profile else None for i in range(count)]
        procs = [start_daemon("all", env, log, profile) for env, profile in zip(envs, profiles, strict=True)]
        bases = [f"http://127.0.0.1:{port}" for port in ports]
        for base in bases:
            await wait_ready(f"{base}/readyz", procs, log)
        await asyncio.sleep(1)
        n = args.n

        def run(part: list[dict[str, Any]]) -> Callable[[], Awaitable[Tally]]:
            return lambda: run_ours(bases, key, part, args.concurrency, args.stall_seconds)

        sender = info["executor"]["address"]
        cpu_before = [cpu_seconds(p.pid) for p in procs]
        tally, dropped = await with_drop(info["rpcUrl"], sender, args.scenario == "dropped", run(bodies[:n]))
        cpu = sum(cpu_seconds(p.pid) - before for p, before in zip(procs, cpu_before, strict=True))
        print(
            f"ours ({count} x relayer all, one executor key): {tally.summary(n)}; daemon CPU {cpu:.2f} s",
            flush=True,
        )
        out: dict[str, Any] = {"main": tally, "dropped": dropped, "cpuMsPerSettle": round(1000 * cpu / n, 1)}
        if args.scenario == "dropped":
            out["after"] = await run(bodies[n:])()
            print(
                f"ours, {AFTER_DROP} payments after the drop: {out['after'].summary(AFTER_DROP)}", flush=True
            )
        out["stages"] = await stage_means(dsn)
        print(f"ours, mean seconds between a transfer job's stamps: {out['stages']}", flush=True)
        return out
    finally:
        stop_processes(procs)


def figures(
    args: argparse.Namespace, ref: dict[str, Any], ours: dict[str, Any], checks: dict[str, int]
) -> dict[str, Any]:
    """The JSON line."""
    n = args.n
    r, o = ref["main"], ours["main"]
    line: dict[str, Any] = {
        "oursPerSecond": round(o.per_second(), 2),
        "referencePerSecond": round(r.per_second(), 2),
        "ratio": round(o.per_second() / r.per_second(), 2) if r.per_second() else None,
        "oursP50Seconds": o.pct(0.5),
        "oursP95Seconds": o.pct(0.95),
        "referenceP50Seconds": r.pct(0.5),
        "referenceP95Seconds": r.pct(0.95),
        "oursFailures": sum(o.failures.values()),
        "referenceFailures": sum(r.failures.values()),
        "oursStalls": o.stalls,
        "referenceStalls": r.stalls,
        "oursFailureReasons": dict(o.failures),
        "referenceFailureReasons": dict(r.failures),
        "n": n,
        "concurrency": args.concurrency,
        "scenario": args.scenario,
        "oursDaemonCpuMsPerSettle": ours["cpuMsPerSettle"],
        "referenceCpuMsPerSettle": ref["cpuMsPerSettle"],
        "blockTimeSeconds": args.block_time,
        **checks,
    }
    if args.scenario == "dropped":
        for side, part in (("ours", ours), ("reference", ref)):
            after = part["after"]
            line[f"{side}Dropped"] = part["dropped"]
            line[f"{side}AfterDropFailures"] = sum(after.failures.values())
            line[f"{side}AfterDropStalls"] = after.stalls
    return line


async def run(args: argparse.Namespace, state: Path, dsn: str) -> None:
    extra = AFTER_DROP if args.scenario == "dropped" else 0
    total = args.n + extra
    port = free_port()
    anvil = devnet.start_anvil(state, port, CHAIN_ID, args.block_time, args.gas_limit)
    try:
        info = deploy_and_seed(devnet.rpc_url(port), CHAIN_ID, devnet.DEFAULT_PROJECTS_FILE)
        (state / "devnet.json").write_text(json.dumps(info))
        ref_keys = [derived_key(f"reference payer {i}") for i in range(total)]
        our_keys = [derived_key(f"our payer {i}") for i in range(total)]
        t0 = time.perf_counter()
        fund(info, [Account.from_key(k).address for k in ref_keys + our_keys], FUNDED)
        reference_key = derived_key("reference facilitator")
        async with aiohttp.ClientSession() as session:
            await rpc(
                session,
                info["rpcUrl"],
                "anvil_setBalance",
                [Account.from_key(reference_key).address, hex(REFERENCE_ETH_WEI)],
            )
        ref_req = requirements(info, Account.from_key(derived_key("reference merchant")).address)
        our_req = requirements(info, Account.from_key(derived_key("our merchant")).address)
        ref_payloads = signed_payloads(ref_keys, ref_req)
        our_bodies = [settle_body(p, our_req) for p in signed_payloads(our_keys, our_req)]
        print(f"funded and signed for {2 * total} payers in {time.perf_counter() - t0:.1f} s", flush=True)
        ref = await reference_side(args, info, reference_key, ref_payloads, ref_req)
        ours = await our_side(args, info, state, dsn, our_bodies)
        await asyncio.sleep(2 * args.block_time)  # the last answers' blocks are readable
        ref_ok = ref["main"].successes | {args.n + i for i in ref.get("after", Tally()).successes}
        our_ok = ours["main"].successes | {args.n + i for i in ours.get("after", Tally()).successes}
        usdc = info["contracts"]["usdc"]
        checks = {
            "oursOnChainMismatches": await mismatches(info["rpcUrl"], usdc, our_keys, our_ok),
            "referenceOnChainMismatches": await mismatches(info["rpcUrl"], usdc, ref_keys, ref_ok),
        }
        print(json.dumps(figures(args, ref, ours, checks)), flush=True)
    finally:
        stop_processes([anvil], 10)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=500, help="payments a side (default 500)")
    parser.add_argument("--concurrency", type=int, default=50, help="requests in flight a side (default 50)")
    parser.add_argument("--scenario", choices=("default", "two-instances", "dropped"), default="default")
    parser.add_argument("--block-time", type=float, default=1.0, help="anvil's block time, seconds")
    parser.add_argument("--gas-limit", type=int, default=1_000_000_000, help="anvil's block gas limit")
    parser.add_argument(
        "--profile", help="run our daemon(s) under cProfile, writing PROFILE.<i> when stopped"
    )
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=120.0,
        help="a request without a final answer this long is a stall",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    options = parse()
    # the SDK logs every failed send; the failures are counted and summed up in the figures
    logging.getLogger("x402").setLevel(logging.ERROR)
    asyncio.run(
        in_scratch_database(
            ROOT,
            "relayer-facilitator-bench-",
            "anvil and daemon logs",
            lambda state, dsn: run(options, state, dsn),
        )
    )
