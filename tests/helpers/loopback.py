"""An aiohttp application served on a free loopback port for the length of a block: the
pages a browser test loads, with no daemon behind them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 (a port the system picks); yields its base URL
    (``http://127.0.0.1:<port>``) and cleans the runner up on the way out."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def pages_app(pages: dict[str, str], requested: list[str] | None = None) -> web.Application:
    """An application answering each path of ``pages`` with its HTML (404 otherwise),
    noting every path and query asked for in ``requested``."""

    async def handle(request: web.Request) -> web.Response:
        if requested is not None:
            requested.append(request.path_qs)
        page = pages.get(request.path)
        if page is None:
            return web.Response(status=404, text="not found")
        return web.Response(text=page, content_type="text/html", charset="utf-8")

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    return app
