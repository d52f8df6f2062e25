"""Daemons as the operator runs them, for fault tests: ``relayer serve|work|all`` processes
(which a test may SIGKILL and start again), and a JSON-RPC proxy that holds the calls of
chosen methods so a test can stop a daemon at a chosen stage of a relay."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.conftest import free_port

RELAYER = Path(sys.executable).with_name("relayer")


def daemon_env(info: dict[str, Any], dsn: str, rpc_url: str | None = None, **settings: Any) -> dict[str, str]:
    """The environment of a daemon on a private chain (depth 1 unless set)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "RELAYER_DATABASE_URL": dsn,
        "RELAYER_RPC_URL": rpc_url or info["rpcUrl"],
        "RELAYER_CHAIN_ID": "84532",
        "RELAYER_DEPLOYMENT_FILE": info["deploymentFile"],
        "RELAYER_EXECUTOR_PRIVATE_KEY": info["executor"]["privateKey"],
        "RELAYER_CONFIRMATIONS": "1",
        "RELAYER_RATE_LIMIT": "off",  # the loads come from one client
        "RELAYER_BLOCK_POLL_INTERVAL_S": "0.05",
        "RELAYER_SETTLE_WAIT_S": "60",
    }
    env.update({f"RELAYER_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def log_lines(log: Path) -> list[dict[str, Any]]:
    """A daemon's log as the JSON objects of its lines (a line that is not one JSON object
    fails the test: the daemon writes nothing else)."""
    lines = []
    for line in log.read_text().splitlines():
        if line.strip():
            parsed = json.loads(line)
            assert isinstance(parsed, dict), line
            lines.append(parsed)
    return lines


class DaemonProcess:
    """One ``relayer <command>`` process, its output in ``log``."""

    def __init__(self, command: str, env: dict[str, str], log: Path) -> None:
        self.command = command
        self.port = free_port()
        self.ops_port = free_port()  # `relayer work` serves /metrics, /healthz, /readyz there
        self.env = {
            **env,
            "RELAYER_HTTP_PORT": str(self.port),
            "RELAYER_OPS_PORT": str(self.ops_port),
            "RELAYER_PUBLIC_BASE_URL": self.base,
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ops_base(self) -> str:
        return f"http://127.0.0.1:{self.ops_port}"

    async def start(self) -> DaemonProcess:
        """Start it; for a command that serves HTTP, wait (bounded) until it is healthy."""
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(RELAYER), self.command], env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        if self.command == "work":
            return self
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, self.log.read_text()[-3000:]
                try:
                    async with session.get(
                        f"{self.base}/healthz", timeout=aiohttp.ClientTimeout(total=1)
                    ) as r:
                        if r.status == 200:
                            return self
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError(f"relayer {self.command} did not come up: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no cleanup (a crash)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)


def simulation_of_jobs(executor: str) -> Callable[[dict[str, Any]], bool]:
    """Whether a JSON-RPC call is a simulation of relay jobs: a job's own ``eth_estimateGas``
    or a batch prober ``eth_call`` (sent to ``executor``'s address, where its state override
    places the prober's code; the pre-signing re-check is one too)."""

    def simulates(call: dict[str, Any]) -> bool:
        method, params = call.get("method"), call.get("params") or [{}]
        sent_to = str(params[0].get("to", "")) if isinstance(params[0], dict) else ""
        return method == "eth_estimateGas" or (method == "eth_call" and sent_to.lower() == executor.lower())

    return simulates


class RpcProxy:
    """A JSON-RPC pass-through that holds the calls of the methods in ``held``, and the calls
    ``holds`` is true of, until they are released (the caller may die meanwhile: that is the
    point), and records each call it
    forwards in ``calls`` as (method, its params as JSON text), the first ``MAX_RECORDED``,
    and the methods of each HTTP request (a batch's together) in ``requests``. A call for
    which ``refuse`` (given the call's JSON-RPC object) gives a JSON-RPC ``error``, or of a
    method in ``refused`` (its error object), is answered that error by the proxy (recorded
    too, never forwarded; the others of its batch forwarded): a node that refuses what the
    test chooses."""

    MAX_RECORDED = 100_000

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.calls: list[tuple[str, str]] = []
        self.requests: list[list[str]] = []
        self.refused: dict[str, dict[str, Any]] = {}
        self.held: set[str] = set()
        self.holds: Callable[[dict[str, Any]], bool] = lambda _call: False
        self.refuse: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda _call: None
        self.waiting: dict[str, int] = {}
        self._released = asyncio.Event()
        self.port = free_port()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> RpcProxy:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_post("/", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.release()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def hold(self, method: str) -> None:
        self.held.add(method)
        self._released.clear()

    def hold_calls(self, holds: Callable[[dict[str, Any]], bool]) -> None:
        """Hold the calls ``holds`` (given the call's JSON-RPC object) is true of, counted in
        ``waiting`` under "calls"."""
        self.holds = holds
        self._released.clear()

    def release(self) -> None:
        self.held.clear()
        self.holds = lambda _call: False
        self._released.set()

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        calls = json.loads(body)
        batch = calls if isinstance(calls, list) else [calls]
        self.calls += [(c["method"], json.dumps(c.get("params"))) for c in batch][
            : max(0, self.MAX_RECORDED - len(self.calls))
        ]
        if len(self.requests) < self.MAX_RECORDED:
            self.requests.append([c["method"] for c in batch])
        methods = {c["method"] for c in batch}
        for method in methods & self.held:
            self.waiting[method] = self.waiting.get(method, 0) + 1
            await self._released.wait()
        if any(self.holds(c) for c in batch):
            self.waiting["calls"] = self.waiting.get("calls", 0) + 1
            await self._released.wait()
        refused = {i: e for i, c in enumerate(batch) if (e := self._refusal(c)) is not None}
        if not refused:
            return web.Response(body=await self._upstream(body), content_type="application/json")
        answers = {i: {"jsonrpc": "2.0", "id": batch[i].get("id"), "error": e} for i, e in refused.items()}
        forward = [i for i in range(len(batch)) if i not in refused]
        if forward:
            upstream = json.loads(await self._upstream(json.dumps([batch[i] for i in forward]).encode()))
            by_id = {a.get("id"): a for a in upstream}
            answers.update({i: by_id[batch[i].get("id")] for i in forward})
        answered = [answers[i] for i in range(len(batch))]
        return web.json_response(answered if isinstance(calls, list) else answered[0])

    def _refusal(self, call: dict[str, Any]) -> dict[str, Any] | None:
        """The error the proxy answers ``call`` with itself (None: forwarded)."""
        return self.refused.get(call.get("method", "")) or self.refuse(call)

    async def _upstream(self, body: bytes) -> bytes:
        assert self._session is not None
        async with self._session.post(
            self.upstream, data=body, headers={"content-type": "application/json"}
        ) as r:
            return await r.read()
