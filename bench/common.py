"""What the benchmarks share: a free loopback port and a JSON-RPC pass-through that counts
every call it forwards (batch elements too) and every HTTP round trip (a batch is one)."""

from __future__ import annotations

import json
import socket

import aiohttp
from aiohttp import web

ROUND_TRIPS = "(round trips)"
NONCE_REFUSALS = "(sends refused for their nonce)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def counting_proxy(port: int, upstream: str, counts: dict[str, int]) -> web.AppRunner:
    """Forward JSON-RPC from ``127.0.0.1:port`` to ``upstream``, counting calls per method
    into ``counts``, HTTP round trips (a batch is one) under :data:`ROUND_TRIPS` and
    broadcasts the node refused for their nonce under :data:`NONCE_REFUSALS`; the caller
    cleans the returned runner up."""
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        payload = json.loads(body)
        counts[ROUND_TRIPS] = counts.get(ROUND_TRIPS, 0) + 1
        for item in payload if isinstance(payload, list) else [payload]:
            counts[item["method"]] = counts.get(item["method"], 0) + 1
        async with session.post(upstream, data=body, headers={"content-type": "application/json"}) as r:
            answer = await r.read()
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
