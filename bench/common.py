"""What the benchmarks share: a free loopback port and a JSON-RPC pass-through that counts
every call it forwards (batch elements too)."""

from __future__ import annotations

import json
import socket

import aiohttp
from aiohttp import web


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def counting_proxy(port: int, upstream: str, counts: dict[str, int]) -> web.AppRunner:
    """Forward JSON-RPC from ``127.0.0.1:port`` to ``upstream``, counting calls per method
    into ``counts``; the caller cleans the returned runner up."""
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        payload = json.loads(body)
        for item in payload if isinstance(payload, list) else [payload]:
            counts[item["method"]] = counts.get(item["method"], 0) + 1
        async with session.post(upstream, data=body, headers={"content-type": "application/json"}) as r:
            return web.Response(body=await r.read(), content_type="application/json")

    async def close(_app: web.Application) -> None:
        await session.close()

    app = web.Application()
    app.router.add_post("/", forward)
    app.on_cleanup.append(close)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner
