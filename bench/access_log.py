"""What the request logs cost per request, in this process, through the daemon's own handler
(JSON formatter and request-id filter) writing to /dev/null: the access line
(:class:`relayer.api.access.AccessLog`), a refusal line (:func:`relayer.api.errors.error_response`
with logging on and off) and the request-id middleware's context variable. Then the same
small app served over loopback with and without the access log (keep-alive GETs from one
client: the end-to-end cost, noisier). Prints one JSON object a line.

    .venv/bin/python bench/access_log.py
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import free_port  # noqa: E402
from relayer.api.access import ACCESS_LOGGER, AccessLog  # noqa: E402
from relayer.api.connections import runner_options  # noqa: E402
from relayer.api.errors import error_response  # noqa: E402
from relayer.api.kernel import REQUEST_ID, request_context  # noqa: E402
from relayer.domain.errors import Rejection  # noqa: E402
from relayer.logs import request_scope, setup_logging  # noqa: E402

N = 20_000


def _per_call_us(fn: Any, n: int = N) -> float:
    """CPU microseconds per call (process time: on a shared machine, waiting for a core is
    not counted)."""
    for _ in range(n // 10):
        fn()
    started = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - started) / n * 1e6


def _python_calls(fn: Any) -> int:
    """Python and C function calls one call of ``fn`` makes (a count, not a timing)."""
    count = 0

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


async def _matched_request() -> web.Request:
    app = web.Application()
    app.router.add_get("/retirements/{id}", _ok)
    request = make_mocked_request("GET", "/retirements/12", app=app, headers={"X-Request-ID": "bench-1"})
    match = await app.router.resolve(request)
    match.add_app(app)
    request._match_info = match  # as aiohttp's handler sets it
    request[REQUEST_ID] = "bench-1"
    return request


async def _ok(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def micro() -> None:
    request = asyncio.run(_matched_request())
    response = web.Response(text="x" * 100)
    access = AccessLog(ACCESS_LOGGER, "")
    line = lambda: access.log(request, response, 0.0012)  # noqa: E731
    rows = {"access_line_us": _per_call_us(line)}
    counts = {"access_line_calls": _python_calls(line)}
    refusal = Rejection("invalid_auth_payload", "bad signature")
    rows["refusal_answer_logged_us"] = _per_call_us(lambda: error_response(refusal, "x402"))
    logging.getLogger("relayer.api.errors").setLevel(logging.WARNING)
    rows["refusal_answer_unlogged_us"] = _per_call_us(lambda: error_response(refusal, "x402"))
    logging.getLogger("relayer.api.errors").setLevel(logging.NOTSET)

    def scope() -> None:
        with request_scope("bench-1"):
            pass

    rows["request_scope_us"] = _per_call_us(scope)
    counts["request_scope_calls"] = _python_calls(scope)
    print(json.dumps({"cpu": {k: round(v, 2) for k, v in rows.items()}, **counts, "repeats": N}))


async def _served(access_log: bool, requests: int) -> float:
    """CPU microseconds per request of this process (server and client both)."""
    app = web.Application(middlewares=[request_context])
    app.router.add_get("/retirements/{id}", _ok)
    options = runner_options(5.0, 8190)
    if not access_log:
        options["access_log"] = None
    runner = web.AppRunner(app, **options)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/retirements/12"
            for _ in range(200):
                async with session.get(url) as r:
                    await r.read()
            started = time.process_time()
            for _ in range(requests):
                async with session.get(url) as r:
                    await r.read()
            return (time.process_time() - started) / requests * 1e6
    finally:
        await runner.cleanup()


def served(requests: int = 3_000, rounds: int = 5) -> None:
    times: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(rounds):  # interleaved: the machine's noise hits both alike
        times["without"].append(asyncio.run(_served(False, requests)))
        times["with"].append(asyncio.run(_served(True, requests)))
    best = {k: round(min(v), 1) for k, v in times.items()}
    print(
        json.dumps(
            {
                "served_cpu_us_per_request_best_of": rounds,
                "requests": requests,
                **best,
                "access_log_cost_us": round(best["with"] - best["without"], 1),
            }
        )
    )


if __name__ == "__main__":
    setup_logging("INFO")
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    with open(os.devnull, "w") as null:
        handler.setStream(null)
        micro()
        served()
