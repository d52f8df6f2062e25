"""Composition root: the only place that wires concrete classes together. Resources are
opened and closed with aiohttp ``cleanup_ctx`` (pool, chain session, LISTEN connection,
workers)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from relayer.api.http import CATALOG, METRICS, READY, RELAY, build_app
from relayer.chain.client import ChainClient, ChainError
from relayer.chain.signer import ExecutorSigner
from relayer.config import Settings
from relayer.jobs import sleep_or_stop
from relayer.jobs.broadcaster import Broadcaster
from relayer.jobs.follower import ChainFollower
from relayer.metrics import Metrics
from relayer.service.catalog import Catalog, project_facts
from relayer.service.relay import Relay
from relayer.store.db import create_pool
from relayer.store.jobs import JobStore
from relayer.store.lease import ExecutorLease
from relayer.store.notify import JobNotifications
from relayer.store.retirements import RetirementStore

log = logging.getLogger(__name__)


def load_deployment(path: Path) -> dict[str, Any]:
    """The deployment description (``contracts``, ``deployBlock``, ...).

    Raises:
        FileNotFoundError: with advice to run ``relayer devnet up``.
    """
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `relayer devnet up` or set RELAYER_DEPLOYMENT_FILE")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@dataclass
class Runtime:
    """Everything the daemon runs, built by :func:`open_runtime`."""

    settings: Settings
    dsn: str
    chain: ChainClient
    jobs: JobStore
    retirements: RetirementStore
    notifications: JobNotifications
    metrics: Metrics
    signer: ExecutorSigner
    catalog: Catalog
    relay: Relay
    deploy_block: int
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def open_runtime(settings: Settings, dsn: str, *, workers: bool) -> AsyncIterator[Runtime]:
    """Open pool, chain session and LISTEN connection; start the workers when asked."""
    deployment = load_deployment(settings.deployment_file)
    key = settings.executor_private_key.get_secret_value() if settings.executor_private_key else None
    if key is None:
        key = deployment.get("executor", {}).get("privateKey")
    if not key:
        raise RuntimeError("no executor key: set RELAYER_EXECUTOR_PRIVATE_KEY")
    chain = ChainClient(settings.rpc_url, settings.chain_id, deployment["contracts"])
    await chain.check()
    pool = await create_pool(dsn, settings.db_pool_min, settings.db_pool_max)
    notifications = JobNotifications()
    await notifications.start(dsn)
    metrics = Metrics()
    jobs = JobStore(pool)
    retirements = RetirementStore(pool)
    signer = ExecutorSigner(key, settings.chain_id)
    catalog = Catalog(chain, settings, project_facts(json.loads(settings.projects_file.read_text())))
    relay = Relay(
        settings,
        chain,
        catalog,
        jobs,
        retirements,
        signer.address,
        notifications.wait,
        notifications.any_change.set,
    )
    rt = Runtime(
        settings,
        dsn,
        chain,
        jobs,
        retirements,
        notifications,
        metrics,
        signer,
        catalog,
        relay,
        int(deployment.get("deployBlock", 0)),
    )
    try:
        if workers:
            start_workers(rt)
        rt.tasks.append(asyncio.create_task(_refresh_gauges(rt), name="gauges"))
        yield rt
    finally:
        rt.stop.set()
        for task in rt.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 5)
        await notifications.stop()
        await pool.close()
        await chain.close()


def start_workers(rt: Runtime) -> None:
    broadcaster = Broadcaster(
        rt.chain,
        rt.jobs,
        rt.signer,
        ExecutorLease(rt.dsn, rt.settings.chain_id, rt.signer.address),
        rt.notifications,
        rt.metrics,
    )
    follower = ChainFollower(
        rt.chain,
        rt.jobs,
        rt.retirements,
        rt.metrics,
        rt.settings.confirmations,
        rt.deploy_block,
        rt.settings.block_poll_interval_s,
    )
    rt.tasks.append(asyncio.create_task(_supervised("broadcaster", broadcaster.run, rt), name="broadcaster"))
    rt.tasks.append(asyncio.create_task(_supervised("follower", follower.run, rt), name="follower"))


async def _supervised(name: str, run: Callable[[asyncio.Event], Awaitable[None]], rt: Runtime) -> None:
    """Run a worker until stop; if it returns or dies early, log it and start it again."""
    while not rt.stop.is_set():
        try:
            await run(rt.stop)
        except Exception:
            log.exception("worker died; restarting", extra={"worker": name})
            rt.metrics.worker_restarts.labels(name).inc()
        await sleep_or_stop(rt.stop, 1.0)


async def _refresh_gauges(rt: Runtime) -> None:
    while not rt.stop.is_set():
        with contextlib.suppress(Exception):
            counts = await rt.jobs.count_by_state()
            for state in rt.metrics.jobs_by_state._metrics:
                rt.metrics.jobs_by_state.labels(*state).set(counts.get(state[0], 0))
        await sleep_or_stop(rt.stop, 5)


def make_web_app(rt: Runtime) -> web.Application:
    app = build_app(rt.settings.max_body_bytes)
    app[CATALOG] = rt.catalog
    app[RELAY] = rt.relay
    app[METRICS] = rt.metrics

    async def ready() -> bool:
        if any(task.done() for task in rt.tasks):
            return False
        try:
            await rt.chain.head()
            await rt.jobs.count_by_state()
        except (ChainError, OSError, Exception):
            return False
        return True

    app[READY] = ready
    return app


async def serve(settings: Settings, dsn: str, *, workers: bool, http: bool = True) -> None:
    """Run the daemon until SIGTERM/SIGINT (or cancellation); then stop accepting requests,
    stop the workers and close every resource. Jobs are durable in Postgres, so an
    interrupted relay resumes on the next start."""
    async with open_runtime(settings, dsn, workers=workers) as rt:
        runner: web.AppRunner | None = None
        if http:
            runner = web.AppRunner(make_web_app(rt), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, settings.http_host, settings.http_port).start()
            log.info("listening", extra={"host": settings.http_host, "port": settings.http_port})
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stopping.set)
        try:
            await stopping.wait()
            log.info("stopping: finishing in-flight work")
        finally:
            if runner is not None:
                await runner.cleanup()
