"""What an operator relies on: the logs of a full end-to-end run never hold the executor key,
a signature's secret or the database password; every metric family the alerts and the
dashboard read has samples after real traffic; the per-client rate limit answers 429 in each
API's own error body; the readiness probe follows the database schema and the leases."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import pytest
from aiohttp import web

from relayer.api.http import build_app
from relayer.api.kernel import RateLimit
from relayer.workers.gauges import GAUGE_INTERVAL_S
from tests.conftest import Daemon, free_port
from tests.helpers.relay import ProcessClient, challenge, signed_request, signed_retirement
from tests.private import private_chain
from tests.processes import DaemonProcess, daemon_env, log_lines

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-Pa55word"


def _with_password(dsn: str) -> str:
    """The DSN with a password (trust auth ignores it; the logs must never show it)."""
    parts = urlsplit(dsn)
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user or 'postgres'}:{PASSWORD}@{host}"))


async def test_a_full_run_never_logs_the_key_or_the_dsn_password_and_each_request_can_be_followed(
    tmp_path: Path, admin_database_url: str
) -> None:
    """The daemon's own log (``relayer all``, stderr to a file): no secret in it, and each
    retirement followed by the X-Request-ID its client sent, from the access line to the
    settled line, every line naming the job and (once signed) its transaction hash; a
    refused request is one INFO line with its code."""
    async with (
        private_chain(tmp_path, admin_database_url) as (info, dsn),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
    ):
        log = tmp_path / "daemon.log"
        env = {**daemon_env(info, _with_password(dsn)), "RELAYER_LOG_LEVEL": "DEBUG"}
        daemon = await DaemonProcess("all", env, log).start()
        try:
            client = ProcessClient(session, daemon.base, info)
            bodies = [await signed_retirement(client, i) for i in range(3)]
            answers = await asyncio.gather(
                *(_post(session, daemon.base, b, f"client-req-{n}") for n, b in enumerate(bodies))
            )
            assert all((s, r["status"]) == (200, "settled") for s, r in answers), answers
            bad = dict(bodies[0], salt="0x" + "00" * 32)  # a refused one is logged too
            status, refusal = await _post(session, daemon.base, bad, "client-req-refused")
            assert status >= 400
        finally:
            assert daemon.stop() == 0
    text = log.read_text()
    key = info["executor"]["privateKey"].removeprefix("0x").lower()
    signatures = [b["authPayload"]["signature"].removeprefix("0x").lower() for b in bodies]
    lowered = text.lower()
    assert key not in lowered and PASSWORD.lower() not in lowered
    for signature in signatures:
        assert signature[:64] not in lowered and signature[64:128] not in lowered  # r and s
    for payer in info["payers"]:
        assert payer["privateKey"].removeprefix("0x").lower() not in lowered
    lines = log_lines(log)  # one JSON object a line, each stamped in RFC 3339 UTC
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"]) for line in lines)
    for n, (_, answer) in enumerate(answers):
        _follow(lines, f"client-req-{n}", answer["transactionHash"])
    refused = [line for line in lines if line.get("request_id") == "client-req-refused"]
    assert [
        (r["message"], r["level"], r["code"], r["status"]) for r in refused if r["message"] == "refused"
    ] == [("refused", "INFO", refusal["error"], status)], refused


async def _post(
    session: aiohttp.ClientSession, base: str, body: dict[str, Any], request_id: str
) -> tuple[int, dict[str, Any]]:
    async with session.post(f"{base}/api", json=body, headers={"X-Request-ID": request_id}) as r:
        assert r.headers["X-Request-ID"] == request_id
        return r.status, await r.json(content_type=None)


def _follow(lines: list[dict[str, Any]], request_id: str, tx_hash: str) -> None:
    """The lines of ``request_id``: its job's trail through the workers in order (every line
    naming the one job, and its transaction once signed) to the settled line, and the access
    line of its request."""
    mine = [line for line in lines if line.get("request_id") == request_id]
    jobs = [line for line in mine if "job_id" in line]
    trail = [line["message"] for line in jobs]
    # A transaction mined before its broadcast was recorded goes from signed to mined.
    expected = ["accepted", "signed", "mined", "confirmed", "indexed"]
    assert [m for m in trail if m != "submitted"] == expected and trail.count("submitted") <= 1, mine
    assert trail.index("submitted" if "submitted" in trail else "mined") == 2, trail
    assert len({line["job_id"] for line in jobs}) == 1, jobs
    assert "tx_hash" not in jobs[0] and {line["tx_hash"] for line in jobs[1:]} == {tx_hash}, jobs
    settled = [line for line in mine if line.get("settled") is True]
    assert [line["message"] for line in settled] == ["indexed"], mine
    [access] = [line for line in mine if line["message"] == "request"]
    assert (access["method"], access["route"], access["status"]) == ("POST", "/api", 200), access
    # That the answer waited for the settlement is its body's "settled" (the caller asserts it).
    # The two lines' order is not: the indexer logs "indexed" after its commit, and the request,
    # woken by the commit's notification, may write its access line first (5 > 6 was seen).


async def test_every_operator_metric_family_has_samples(daemon: Daemon) -> None:
    """After a 402 challenge and a settled relay (with whatever the session did before)."""
    payer = daemon.chain["payers"][1]
    ch = await challenge(daemon, payer, carbonClass="RE", amount="0.01", inputToken="USDC")
    status, settled = await daemon.post(signed_request(ch, payer["privateKey"]))
    assert (status, settled["status"]) == (200, "settled"), settled
    nonzero = [
        "relayer_http_server_requests_total",
        "relayer_http_server_request_duration_seconds_count",
        "relayer_http_error_responses_total",
        "relayer_x402_challenges_total",
        "relayer_relay_jobs",
        "relayer_db_pool_connections",
        "relayer_executor_balance_wei",
        "relayer_executor_covered_retirements",
    ]
    present = [
        "relayer_authorizations_total",
        "relayer_executor_nonce_lag",
        "relayer_indexer_lag_blocks",
        "relayer_relay_oldest_job_age_seconds",
        "relayer_http_unhandled_errors_total",
        "relayer_rate_limited_total",
    ]
    deadline = time.monotonic() + 2 * GAUGE_INTERVAL_S + 1  # until a refresh of the gauges shows it
    while True:
        async with daemon.session.get(f"{daemon.base_url}/metrics") as r:
            text = await r.text()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name = re.split(r"[{ ]", line, maxsplit=1)[0]
                samples[name] = max(samples.get(name, 0.0), float(line.rsplit(" ", 1)[1]))
        if all(samples.get(n, 0) > 0 for n in nonzero) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert [n for n in nonzero if samples.get(n, 0) <= 0] == [], {n: samples.get(n) for n in nonzero}
    assert [n for n in present if n not in samples] == []
    assert re.search(r'relayer_http_server_requests_total\{method="POST",route="/api",status="402"\}', text)
    assert re.search(r'relayer_indexer_lag_blocks\{chain_id="84532",indexer="retirements"\}', text)


async def test_the_rate_limit_answers_429_in_each_apis_body(daemon: Daemon) -> None:
    rt = daemon.runtime

    async def ready() -> bool:
        return True

    from relayer.api.marketplace import add_routes

    app = build_app(
        rt.services,
        rt.metrics,
        ready,
        rt.settings.max_body_bytes,
        lambda a: add_routes(a, rt.marketplace),
        rate_limit=RateLimit("3/minute"),
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}"
    try:
        statuses = []
        for _ in range(3):
            async with daemon.session.get(f"{base}/api/discover") as r:
                statuses.append(r.status)
        async with daemon.session.get(f"{base}/api/discover") as r:
            body: dict[str, Any] = await r.json()
            assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
        assert statuses == [200, 200, 200]
        assert body["error"] == "rate_limited" and body["x402FacilitatorVersion"] == 2
        assert body["retryAfterSeconds"] >= 1
        async with daemon.session.get(f"{base}/categories") as r:
            refused = await r.json()
            assert r.status == 429
        assert (refused["statusCode"], refused["code"]) == (429, "rate_limited")
        async with daemon.session.get(f"{base}/healthz") as r:
            assert r.status == 200  # probes are never limited
    finally:
        await runner.cleanup()


async def test_readiness_reads_the_schema_head_and_the_leases(daemon: Daemon) -> None:
    from relayer.store.status import StatusQueries

    async with daemon.session.get(f"{daemon.base_url}/readyz") as r:
        assert r.status == 200
    ops = StatusQueries(daemon.runtime.db)
    executor, nobody = daemon.chain["executor"]["address"], "0x" + "77" * 20
    assert await ops.leases_held(84532, [executor, nobody]) == {executor}
    assert await ops.leases_held(84532, [executor]) == {executor}  # asking takes nothing
    assert await ops.at_head()
    with pytest.raises(_RolledBack):
        async with daemon.runtime.db.transaction() as conn:
            await conn.execute("DELETE FROM _yoyo_migration WHERE migration_id = '0009_marketplace'")
            assert not await StatusQueries(_Single(conn)).at_head()  # type: ignore[arg-type]
            raise _RolledBack  # the deletion is never committed
    assert await ops.at_head()


class _RolledBack(Exception):
    pass


class _Single:
    """A connection standing in for the pool (the two query methods at_head uses)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def fetch(self, sql: str, *args: Any) -> Any:
        return await self.conn.fetch(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self.conn.fetchval(sql, *args)
