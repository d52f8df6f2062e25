"""Shared fixtures: a real Postgres (RELAYER_DATABASE_URL, else a private throwaway cluster)
with a scratch database per session, a real anvil with the reference protocol deployed (and a
second one, chain 137, standing in for Polygon), and the whole daemon served over HTTP on
loopback — the same code paths production uses."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from relayer.app import Runtime, open_runtime, web_runner
from relayer.chain.signer import TreasurySigner
from relayer.config import Settings
from relayer.service.payments.quotes import payment_ledger
from relayer.store.executor_lane import ExecutorLane
from relayer.store.pool import Database
from relayer.store.x402_payments import PaymentLedgerRow, X402Payments
from relayer_dev import devdb, devnet, ports
from tests.chain_helpers import write_deployment_file
from tests.helpers import stacks

pytest_plugins = ["tests.helpers.fixtures"]  # the fixtures several test modules share

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = ROOT / "data" / "carbon-projects.json"


def _name_each_transport_by_its_test() -> None:
    """An asyncio transport left unclosed is found by the garbage collector, often during a
    later test, which its ResourceWarning then fails (``filterwarnings = error``): the warning
    names the test that opened it (``PYTEST_CURRENT_TEST`` when it was made), so the leak is
    found where it is, not where it was collected."""
    from asyncio import selector_events

    cls: Any = selector_events._SelectorTransport
    init, shown = cls.__init__, cls.__repr__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._opened_in = os.environ.get("PYTEST_CURRENT_TEST", "no test")

    def __repr__(self: Any) -> str:
        return f"{shown(self)[:-1]} opened in {getattr(self, '_opened_in', 'no test')}>"

    cls.__init__, cls.__repr__ = __init__, __repr__


_name_each_transport_by_its_test()


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker (gw0 ... gw7; a run without xdist takes the block after them)
    finds its free ports in a block of its own below the kernel's ephemeral range
    (:mod:`relayer_dev.ports`), so that no worker starts a server on a port another worker has
    just found free; the processes a test starts inherit it. The controller of the workers sets
    nothing (they would inherit it), and a block set by hand is left as it is."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        worker = str(workerinput["workerid"])
        index = int(worker[2:]) if worker[:2] == "gw" and worker[2:].isdigit() else 9
    elif config.getoption("dist", "no") != "no" and config.getoption("tx", None):
        return
    else:
        index = 8
    if index <= 8:
        os.environ.setdefault(ports.BLOCK_ENV, f"{12_000 + 2_000 * index}:2000")


free_port = ports.free_port
"""A loopback port nothing listens on, from this worker's block (:mod:`relayer_dev.ports`)."""


# The modules that take longest (seconds summed over their tests, `--durations=0` on 4 workers:
# 87, 64, 47, 41, 41, 40, 39, 38, 36 and 25 for the two benchmark smoke runs), run first.
# `make test` distributes whole files in collection order (--dist loadfile
# --no-loadscope-reorder), so the workers' last minutes go to the many short unit files, not to
# one long module handed out last (xdist's own order, by number of tests, put these last).
SLOWEST_FIRST = (
    "tests/integration/test_property_bad_input.py",
    "tests/integration/test_payment_invariant.py",
    "tests/integration/test_payment_proofs.py",
    "tests/integration/test_bench_facilitator.py",
    "tests/integration/test_bench_soak.py",
    "tests/integration/test_reorg_fast.py",
    "tests/integration/test_operator_cli.py",
    "tests/integration/test_solvency.py",
    "tests/integration/test_orders.py",
    "tests/integration/test_http_limits.py",
    "tests/integration/test_wheel.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest modules first, then the other integration modules, then the rest. The sort
    is stable: each module's tests stay together and in their order (module fixtures)."""
    rank = {module: i for i, module in enumerate(SLOWEST_FIRST)}

    def key(item: pytest.Item) -> tuple[int, int]:
        module = item.nodeid.split("::", 1)[0]
        return rank.get(module, len(rank)), 0 if module.startswith("tests/integration/") else 1

    items.sort(key=key)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The run's template database goes when the run ends: by the controller, after every
    pytest-xdist worker (or by the one process without xdist)."""
    if not hasattr(session.config, "workerinput"):
        stacks.drop_templates(session.config._tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session", autouse=True)
def stacks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the run's workers share, where its template stacks are built once
    (:mod:`tests.helpers.stacks`)."""
    directory = stacks.run_dir(tmp_path_factory)
    stacks.use(directory)
    return directory


@pytest.fixture(scope="session")
def admin_database_url() -> str:
    """A Postgres server to make scratch databases on."""
    return devdb.ensure_database_url(os.environ.get("RELAYER_DATABASE_URL"), ROOT / ".devdata")


@pytest.fixture(scope="session")
def database_url(admin_database_url: str) -> Iterator[str]:
    """A scratch database for the session: a copy of the run's template (migrated, the
    catalogue loaded)."""
    dsn = stacks.scratch_database(admin_database_url)
    yield dsn
    devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])


@pytest.fixture(scope="session")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A private anvil with the protocol deployed and seeded (the devnet description): the
    run's chain template loaded into a new node."""
    state = tmp_path_factory.mktemp("anvil")
    proc, info = stacks.start_chain(state)
    try:
        (state / "devnet.json").write_text(json.dumps(info))
        info["deploymentFile"] = str(state / "devnet.json")
        yield info
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def polygon_chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A second private anvil, chain 137 (the Polygon stand-in whose listings and retirements
    the marketplace indexes), with the same protocol deployed and seeded: its devnet
    description (``rpcUrl``, ``contracts``, ``deployBlock``, ``listings``,
    ``seededRetirements``, ``treasury``, ...) plus ``deploymentFile``, a JSON file of it the
    daemon can read (see :func:`tests.chain_helpers.index_chain_setting`)."""
    state = tmp_path_factory.mktemp("anvil-137")
    proc, info = stacks.start_chain(state, devnet.POLYGON_CHAIN_ID, log_name=devnet.INDEX_LOG_FILE)
    try:
        info["deploymentFile"] = str(write_deployment_file(info, state / devnet.INDEX_DEVNET_FILE))
        yield info
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@dataclass
class Daemon:
    """The running daemon: its HTTP base, runtime objects and the devnet it drives.

    ``expected_internal_errors`` counts the 500s tests provoke on purpose; the session ends
    with a check that the suite produced no other.
    """

    base_url: str
    api: str
    runtime: Runtime
    chain: dict[str, Any]
    session: aiohttp.ClientSession
    expected_internal_errors: int = 0
    expected_reverts: int = 0

    def internal_errors(self) -> int:
        """Requests this daemon failed on an unexpected exception so far (its 500s that are
        bugs, not an outage answered as the retryable internal_error)."""
        return int(self.runtime.metrics.unhandled_errors._value.get())

    async def post(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        async with self.session.post(self.api, json=body) as r:
            return r.status, await r.json(content_type=None)

    async def get(self, path: str, **params: Any) -> tuple[int, dict[str, Any]]:
        async with self.session.get(f"{self.base_url}{path}", params=params) as r:
            return r.status, await r.json(content_type=None)


@pytest.fixture(scope="session")
async def daemon(chain: dict[str, Any], database_url: str) -> AsyncIterator[Daemon]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    settings = Settings(
        database_url=database_url,
        rpc_url=chain["rpcUrl"],
        chain_id=chain["chainId"],
        deployment_file=Path(chain["deploymentFile"]),
        executor_private_key=chain["executor"]["privateKey"],
        http_port=port,
        public_base_url=base,
        settle_wait_s=30,
        block_poll_interval_s=0.05,
        confirmations=1,  # anvil mines a block per transaction
        rate_limit="off",  # the suite posts from one client; test_rate_limit turns it on
    )
    async with open_runtime(settings, workers=True) as rt:
        runner = web_runner(rt)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            daemon = Daemon(base, f"{base}/api", rt, chain, session)
            yield daemon
        await runner.cleanup()
    # The only way to a 500 is an unexpected exception: the suite must have produced none
    # beyond those its tests provoke on purpose.
    assert daemon.internal_errors() == daemon.expected_internal_errors, "the suite produced a 500"
    await assert_solvent(daemon, "session daemon")


async def assert_solvent(daemon: Daemon, name: str) -> None:
    """The solvency ledger of a daemon's chain (issue 7): every successful relay paid at most
    what its signed gas allowance was worth, and no relay reverted beyond those a test
    provokes on purpose (``expected_reverts``); and per x402 payment (issue 35), the treasury
    paid out at most what the chain shows it received for it. Printed with -s."""
    settings = daemon.runtime.settings
    db = await Database.connect(daemon.runtime.dsn, 1, 1)
    try:
        rows = await ExecutorLane(db, settings.chain_id).ledger()
        payments: list[PaymentLedgerRow] = []
        if settings.treasury_private_key is not None:
            treasury = TreasurySigner(settings.treasury_private_key.get_secret_value()).address
            payments = await payment_ledger(
                X402Payments(db), settings.chain_id, daemon.chain["contracts"]["usdc"], treasury
            )
    finally:
        await db.close()
    # per x402 payment (issue 35): the treasury paid out at most what it received for it
    assert [p for p in payments if not p.agrees] == [], "payments whose ledger disagrees"
    by = {(r.kind, r.succeeded): r for r in rows}
    ok = by.get(("relay", True))
    reverted = by.get(("relay", False))
    assert ok is None or ok.at_a_loss == 0, f"{ok.at_a_loss} relays paid more than their allowance"
    assert (reverted.transactions if reverted else 0) == daemon.expected_reverts, reverted
    print(
        f"\nledger of the {name}: "
        + "; ".join(
            f"{r.kind} {'ok' if r.succeeded else 'reverted'}: {r.transactions} txs, paid {r.paid_wei} wei, "
            f"received {r.received_wei} wei, at a loss {r.at_a_loss}"
            for r in rows
        )
        + f"; x402 payments: {len(payments)}, received {sum(p.received for p in payments)}, "
        f"paid out {sum(p.paid_out for p in payments)} (USDC atomic)"
    )


@pytest.fixture
async def db_of() -> AsyncIterator[Any]:
    """Open a small pool on a daemon's database by its URL; all closed after the test."""
    opened: list[Database] = []

    async def connect(dsn: str) -> Database:
        opened.append(await Database.connect(dsn, 1, 4))
        return opened[-1]

    yield connect
    for db in opened:
        await db.close()
