"""The CPU floor of a relayed retirement in the daemon's stack (issue 20, item 4's daemon
target of 2.0 ms a retirement): what the libraries the design card names cost for the least
a retirement needs of them, before any of the relay's own logic, on uvloop as the daemon runs.

Each part is measured on its own, on loopback, several in flight as under the relay benchmark's
load:
1. **HTTP**: the CPU of an aiohttp server (its own process, uvloop) for one POST of a
   retirement-sized JSON body, decoded, answered with a settled-sized JSON body. The relay
   benchmark posts each retirement once.
2. **Statements**: the client CPU of one asyncpg statement through a pool (8 parameters in,
   one row of 8 columns out), at 50 statements in flight.
3. **Notifications**: the client CPU of one Postgres notification received on a LISTEN
   connection (the jobs' trigger notifies the state moves the daemon waits on).
4. **JSON-RPC round trips**: the client CPU of one ``eth_blockNumber`` to anvil over an
   aiohttp keep-alive session, 10 in flight.
5. **Crypto**: the daemon's own EIP-712 recovery of a USDC ``ReceiveWithAuthorization``
   (:func:`relayer.domain.eip712.recover_signer`) and its executor transaction signing
   (:class:`relayer.chain.signer.ExecutorSigner`).

The floor a retirement is one POST, ``--statements`` statements, ``--notifications``
notifications and ``--round-trips`` round trips (defaults: what the relay benchmark's run of
600 at concurrency 50, 200 ms blocks and 150 tx/s of background traffic counted at d222a25,
statements and notifications by wrapping asyncpg, round trips by its counting proxy), one
recovery and one signature. The event loop's own work (uvloop's callbacks and task steps,
about a sixth of the daemon's samples under load) is not in it.

Prints the figures, then one JSON line: httpPostMs, statementMs, notificationMs,
rpcRoundTripMs, recoverMs, signMs, floorMsPerRetirement and the counts used.

    .venv/bin/python bench/cpu_floor.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import aiohttp
import asyncpg
import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import cpu_seconds, free_port, stop_processes, wait_ready  # noqa: E402

WARM = 200
RETIRE_BODY: dict[str, Any] = {
    "action": "actions/retire",
    "inputToken": "USDC",
    "classId": "0x" + "11" * 32,
    "tonnes": "0.010",
    "beneficiaryAddress": "0x" + "22" * 20,
    "beneficiaryName": "A beneficiary",
    "retirementMessage": "m" * 120,
    "authPayload": {
        "from": "0x" + "33" * 20,
        "to": "0x" + "44" * 20,
        "value": "1234567",
        "validAfter": "0",
        "validBefore": "99999999999",
        "nonce": "0x" + "55" * 32,
        "salt": "0x" + "66" * 32,
        "signature": "0x" + "77" * 65,
        "gasAllowance": "40000",
    },
    "details": {"project": "VCS-191", "vintage": "2020", "note": "d" * 400},
}
SETTLED_BODY = json.dumps(
    {
        "status": "settled",
        "transactionHash": "0x" + "ab" * 32,
        "blockNumber": 123456,
        "retirements": [
            {
                "retirementIndex": 7,
                "tonnes": "0.010",
                "certificateUrl": "http://127.0.0.1/v1/certificates/84532/7",
                "provenance": {"project": "VCS-191", "vintage": 2020, "source": "p" * 300},
            }
        ],
    }
).encode()


def serve(port: int) -> None:
    """The HTTP part's server: one POST route that decodes the body and answers the settled
    body (run as this script's child: ``--serve PORT``)."""
    from aiohttp import web

    async def retire(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        if body.get("action") != "actions/retire":
            raise web.HTTPBadRequest()
        return web.Response(body=SETTLED_BODY, content_type="application/json")

    async def ready(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def run() -> None:
        app = web.Application()
        app.router.add_post("/api", retire)
        app.router.add_get("/ready", ready)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()  # until terminated

    uvloop.run(run())


async def in_flight(n: int, width: int, one: Any) -> None:
    """``one()`` ``n`` times, ``width`` at a time."""
    gate = asyncio.Semaphore(width)

    async def gated() -> None:
        async with gate:
            await one()

    await asyncio.gather(*(gated() for _ in range(n)))


MIN_CPU_S: Final = 0.2
"""The least server CPU the HTTP figure is measured over (20 clock ticks): fewer posts than
that round to 0 or to one tick."""


async def http_post_ms(state: Path, n: int) -> float:
    port, log = free_port(), state / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], stdout=out, stderr=out)
    try:
        await wait_ready(f"http://127.0.0.1:{port}/ready", [server], log, 30)
        body = json.dumps(RETIRE_BODY).encode()
        async with aiohttp.ClientSession() as session:

            async def post() -> None:
                async with session.post(
                    f"http://127.0.0.1:{port}/api", data=body, headers={"Content-Type": "application/json"}
                ) as answer:
                    await answer.read()

            await in_flight(WARM, 50, post)
            before, done = cpu_seconds(server.pid), 0
            # /proc counts CPU in clock ticks (10 ms): go on until enough of them are counted
            # for the figure to mean something (a few hundred posts can fit in one tick)
            while done < n or (cpu_seconds(server.pid) - before < MIN_CPU_S and done < 50 * n):
                await in_flight(n, 50, post)
                done += n
            return 1000 * (cpu_seconds(server.pid) - before) / done
    finally:
        stop_processes([server], 10)


STATEMENT = (
    "SELECT $1::bigint AS id, $2::text AS chain, $3::bytea AS salt, $4::numeric AS value, "
    "$5::text AS payer, $6::bigint AS gas, $7::bytea AS data, $8::boolean AS fresh"
)


async def statement_ms(dsn: str, n: int) -> float:
    pool = await asyncpg.create_pool(dsn, min_size=10, max_size=10)
    assert pool is not None
    try:
        data = bytes(420)

        async def one() -> None:
            await pool.fetchrow(
                STATEMENT, 1, "84532", b"s" * 32, 1234567, "0x" + "33" * 20, 300000, data, True
            )

        await in_flight(WARM, 50, one)
        before = time.process_time()
        await in_flight(n, 50, one)
        return 1000 * (time.process_time() - before) / n
    finally:
        await pool.close()


async def notification_ms(dsn: str, n: int) -> float:
    listener = await asyncpg.connect(dsn)
    sender = await asyncpg.connect(dsn)
    try:
        got = 0
        done = asyncio.Event()

        def heard(_conn: object, _pid: int, _channel: str, _payload: object) -> None:
            nonlocal got
            got += 1
            if got == n:
                done.set()

        await listener.add_listener("floor", heard)
        # one statement sends them all: the sender's cost is one round trip
        notify = (
            "SELECT pg_notify('floor', '{\"id\": ' || i || ', \"state\": \"indexed\"}')"
            " FROM generate_series(1, $1) i"
        )
        before = time.process_time()
        await sender.execute(notify, n)
        await asyncio.wait_for(done.wait(), 60)
        return 1000 * (time.process_time() - before) / n
    finally:
        await listener.close()
        await sender.close()


async def rpc_round_trip_ms(url: str, n: int) -> float:
    request = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}).encode()
    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            async with session.post(
                url, data=request, headers={"Content-Type": "application/json"}
            ) as answer:
                if "result" not in json.loads(await answer.read()):
                    raise RuntimeError("eth_blockNumber answered no result")

        await in_flight(WARM, 10, one)
        before = time.process_time()
        await in_flight(n, 10, one)
        return 1000 * (time.process_time() - before) / n


def crypto_ms(n: int) -> tuple[float, float]:
    """(EIP-712 recovery, executor signature), CPU ms each."""
    from eth_account import Account

    from relayer.chain.signer import ExecutorSigner
    from relayer.domain.eip712 import parse_signature, receive_with_authorization, recover_signer

    payer = Account.create()
    typed = receive_with_authorization(
        chain_id=84532,
        usdc="0x" + "44" * 20,
        payer=payer.address,
        settlement="0x" + "55" * 20,
        value=1234567,
        valid_after=0,
        valid_before=99999999999,
        nonce=os.urandom(32),
    )
    signature = parse_signature(bytes(Account.sign_typed_data(payer.key, full_message=typed).signature))
    if recover_signer(typed, signature) != payer.address:
        raise RuntimeError("the recovery found another signer")
    before = time.process_time()
    for _ in range(n):
        recover_signer(typed, signature)
    recover = 1000 * (time.process_time() - before) / n
    signer = ExecutorSigner("0x" + os.urandom(32).hex(), 84532)
    data = os.urandom(900)
    before = time.process_time()
    for nonce in range(n):
        signer.sign(
            to="0x" + "55" * 20,
            data=data,
            nonce=nonce,
            gas=300000,
            max_fee_per_gas=10**9,
            max_priority_fee_per_gas=10**6,
        )
    return recover, 1000 * (time.process_time() - before) / n


LABELS = {
    "httpPostMs": "HTTP: aiohttp server CPU a POST (retirement-sized body in, settled body out)",
    "statementMs": "Postgres: asyncpg client CPU a statement (8 parameters, one row of 8 columns)",
    "notificationMs": "Postgres: client CPU a notification received on LISTEN",
    "rpcRoundTripMs": "JSON-RPC: aiohttp client CPU a round trip (eth_blockNumber to anvil)",
    "recoverMs": "crypto: the EIP-712 recovery of a ReceiveWithAuthorization",
    "signMs": "crypto: the executor transaction's signature",
}


async def main(args: argparse.Namespace) -> None:
    from relayer_dev import devdb, devnet

    dsn = devdb.ensure_database_url(os.environ.get("RELAYER_DATABASE_URL"), ROOT / ".devdata")
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="relayer-floor-") as state:
        figures["httpPostMs"] = await http_post_ms(Path(state), args.n)
        figures["statementMs"] = await statement_ms(dsn, args.n)
        figures["notificationMs"] = await notification_ms(dsn, args.n)
        port = free_port()
        anvil = devnet.start_anvil(Path(state), port)
        try:
            figures["rpcRoundTripMs"] = await rpc_round_trip_ms(devnet.rpc_url(port), args.n)
        finally:
            stop_processes([anvil], 10)
    figures["recoverMs"], figures["signMs"] = crypto_ms(args.n)
    for key, label in LABELS.items():
        print(f"{label}: {figures[key]:.3f} ms")
    floor = (
        figures["httpPostMs"]
        + args.statements * figures["statementMs"]
        + args.notifications * figures["notificationMs"]
        + args.round_trips * figures["rpcRoundTripMs"]
        + figures["recoverMs"]
        + figures["signMs"]
    )
    print(
        f"floor a retirement: 1 POST + {args.statements} statements + {args.notifications} notifications"
        f" + {args.round_trips} round trips + 1 recovery + 1 signature = {floor:.2f} ms"
        " (before any relay logic and the event loop's own work)"
    )
    line = {k: round(v, 4) for k, v in figures.items()}
    line |= {
        "floorMsPerRetirement": round(floor, 3),
        "statements": args.statements,
        "notifications": args.notifications,
        "roundTrips": args.round_trips,
    }
    print(json.dumps(line))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
        sys.exit(0)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=4000, help="operations measured a part")
    parser.add_argument("--statements", type=float, default=2.2, help="statements a retirement")
    parser.add_argument("--notifications", type=float, default=2.0, help="notifications a retirement")
    parser.add_argument("--round-trips", type=float, default=0.7, help="JSON-RPC round trips a retirement")
    uvloop.run(main(parser.parse_args()))
