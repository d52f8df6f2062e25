"""Composition root: the only place that wires concrete classes together. Each resource
(chain node, database pool, LISTEN connection, worker tasks) is entered on one
``AsyncExitStack`` and unwound in reverse order; nothing on the way out is swallowed."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web

from relayer.api.connections import BoundedSite, fitted_cap, quiet_accept_errors, runner_options
from relayer.api.facilitator import KeyLimits, add_facilitator_routes
from relayer.api.http import build_app
from relayer.api.kernel import (
    METRICS,
    READY,
    READY_CHAINS,
    RateLimit,
    healthz,
    metrics_view,
    readyz,
    request_context,
)
from relayer.api.marketplace import add_routes
from relayer.api.version_hosts import version_hosts, x402_info
from relayer.api.x402_resource import add_resource_routes
from relayer.api.x402_routes import AppServices
from relayer.chain.blocks import BlockReader
from relayer.chain.catalogue import CatalogueChain
from relayer.chain.costs import BaseCosts
from relayer.chain.deployment import ExtraChain, extra_chains, load_deployment
from relayer.chain.errors import ChainUnavailable
from relayer.chain.executor import ExecutorChain
from relayer.chain.node import ChainNode
from relayer.chain.reads import ChainReads
from relayer.chain.signer import ExecutorSigner, TreasurySigner
from relayer.chain.types import Contracts
from relayer.config import ConfigError, Settings
from relayer.domain.chains import caip2, usdc_domain_name
from relayer.domain.confirmation import differs_much
from relayer.domain.head_clock import HeadClock
from relayer.domain.verify import TokenDomain
from relayer.metrics import Metrics
from relayer.service.catalogue_load import seed_catalogue
from relayer.service.certificate import Certificates
from relayer.service.discover import Discover
from relayer.service.gas import GasPricer
from relayer.service.market.marketplace import Marketplace
from relayer.service.market.snapshot import IndexedChain
from relayer.service.outcome import Outcomes
from relayer.service.payments.facilitator import Facilitator
from relayer.service.payments.resource import Payments
from relayer.service.prepare import Prepare
from relayer.service.project_records import ProjectRecords
from relayer.service.readiness import Readiness
from relayer.service.relay import Relay
from relayer.service.simulate import Simulator
from relayer.service.startup import (
    check_contracts,
    check_node,
    index_chain_id_setting,
    index_chain_setting,
    open_database,
    relay_chain_setting,
)
from relayer.service.supply import Supply
from relayer.store.catalogue import CatalogueStore
from relayer.store.executor_lane import ExecutorLane
from relayer.store.identity import ChainIdentity
from relayer.store.lease import ExecutorLease
from relayer.store.notify import JobNotifications
from relayer.store.orders import Orders
from relayer.store.payment_ids import PaymentIds
from relayer.store.pool import Database
from relayer.store.relay_jobs import RelayJobs
from relayer.store.retirements import RetirementStore
from relayer.store.x402_payments import X402Payments
from relayer.workers import sleep_or_stop
from relayer.workers.broadcaster import Broadcaster, LaneBoard
from relayer.workers.catalogue_indexer import CatalogueIndexer
from relayer.workers.chain_guard import ChainGuard
from relayer.workers.follower import ChainFollower
from relayer.workers.gauges import Gauges
from relayer.workers.keeper import ORDER_KEEPER_EVERY_S, PAYMENT_KEEPER_EVERY_S, Keeper
from relayer.workers.lane_keeper import LaneKeeper
from relayer.workers.reorg import Confirmed
from relayer.workers.sweeper import Sweeper

log = logging.getLogger(__name__)

STOP_GRACE_S: Final = 5.0
"""How long workers get, from the moment they are told to stop (on SIGTERM, at once), to
finish the step in progress and hand back their leases before they are cancelled."""


@dataclass
class Runtime:
    """Everything the daemon runs, built by :func:`open_runtime`."""

    settings: Settings
    dsn: str = field(repr=False)  # a DSN may carry a password: never in a repr or a log
    db: Database
    node: ChainNode
    reads: ChainReads
    executor: ExecutorChain
    blocks: BlockReader
    jobs: RelayJobs
    lane: ExecutorLane
    retirements: RetirementStore
    notifications: JobNotifications
    metrics: Metrics
    signer: ExecutorSigner  # the first key: simulations are run as it
    services: AppServices
    deploy_block: int
    simulator: Simulator
    catalogue: CatalogueStore
    marketplace: Marketplace
    facilitator: Facilitator
    extra_chains: list[ExtraChain] = field(default_factory=list)
    payments: Payments | None = None  # the standard x402 retirement resource (set by _wire)
    extra_nodes: list[ChainNode] = field(default_factory=list)
    others: list[Runtime] = field(default_factory=list)
    """The other chains this daemon relays on (``RELAYER_RELAY_CHAINS``), each wired as this
    one from its own settings (:meth:`Settings.chain_settings`) and sharing this one's
    database, notifications, metrics, tasks and stop."""
    signers: list[ExecutorSigner] = field(default_factory=list)  # every executor key, first first
    lease: ExecutorLease | None = None  # this process's lease of the first key (workers only)
    leases: list[ExecutorLease] = field(default_factory=list)  # one per key (workers only)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stop_deadline: float | None = None  # event-loop time by which the tasks must have stopped

    def ask_stop(self) -> None:
        """Tell every task to stop now: the workers start no new step and end the one in
        progress (a signing batch is signed, journaled and sent), hand back what they took
        and did not act on (orphans taken by the sweeper) and their executor leases; the
        follower and the indexers stop between steps. :meth:`stop_tasks` gives them
        :data:`STOP_GRACE_S` from the first ask."""
        if self.stop_deadline is None:
            self.stop_deadline = asyncio.get_running_loop().time() + STOP_GRACE_S
        self.stop.set()

    async def stop_tasks(self) -> None:
        """Ask every task to stop (:meth:`ask_stop`), give them until :data:`STOP_GRACE_S`
        after the first ask, cancel the rest, and re-raise the first failure of a task that
        did not end cleanly."""
        self.ask_stop()
        if not self.tasks:
            return
        assert self.stop_deadline is not None
        left = max(0.0, self.stop_deadline - asyncio.get_running_loop().time())
        _, pending = await asyncio.wait(self.tasks, timeout=left)
        for task in pending:
            log.warning("task did not stop in time; cancelling", extra={"task": task.get_name()})
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        failures = [t.exception() for t in self.tasks if not t.cancelled() and t.exception() is not None]
        if failures:
            raise failures[0]  # type: ignore[misc]


@contextlib.asynccontextmanager
async def open_runtime(settings: Settings, *, workers: bool) -> AsyncIterator[Runtime]:
    """Open the chain node, the pool and the LISTEN connection, wire the services, and start
    the workers when asked; on exit stop them and close everything in reverse order.

    Raises:
        ConfigError: a setting the daemon needs is missing, or the deployment is unusable; a
            chain node or the database cannot be used at start, or a contract of the
            deployment file holds no code (one line naming the setting: service.startup).
    """
    settings.require("database_url", "rpc_url", "deployment_file", "executor_private_key")
    assert settings.database_url and settings.rpc_url and settings.deployment_file
    assert settings.executor_private_key is not None
    dsn = settings.database_url.get_secret_value()
    chains = settings.chain_settings()
    deployments = [_deployment(c, index) for index, c in enumerate(chains)]
    extras = extra_chains(settings)
    keys = settings.executor_keys()
    async with contextlib.AsyncExitStack() as stack:
        nodes: list[tuple[ChainNode, bytes]] = []
        for index, (chain, (contracts, _)) in enumerate(zip(chains, deployments, strict=True)):
            nodes.append(await _open_node(stack, chain, contracts, index))
        db = await open_database(dsn, settings.db_pool_min, settings.db_pool_max)
        stack.push_async_callback(db.close)
        for chain, (_, genesis) in zip(chains, nodes, strict=True):
            await _check_identity(db, chain.chain_id, genesis)
        await seed_catalogue(CatalogueStore(db), settings)
        notifications = JobNotifications()
        stack.push_async_callback(notifications.stop)  # before start: it may fail half-way
        await notifications.start(dsn)
        relayed = [
            IndexedChain(c.chain_id, contracts) for c, (contracts, _) in zip(chains, deployments, strict=True)
        ]
        metrics = Metrics()
        wired = [
            _wire(
                chain,
                dsn,
                db,
                node,
                notifications,
                [ExecutorSigner(key, chain.chain_id) for key in keys],
                deploy_block,
                extras if index == 0 else [],
                metrics,
                relayed[1:] if index == 0 else [],
            )
            for index, (chain, (node, _), (_, deploy_block)) in enumerate(
                zip(chains, nodes, deployments, strict=True)
            )
        ]
        rt = wired[0]
        for other in wired[1:]:
            other.tasks, other.stop = rt.tasks, rt.stop  # one process: one task list, one stop
            rt.others.append(other)
        rt.marketplace.order_on([o.marketplace.desk for o in rt.others])
        if workers:  # only the workers read the other chains
            for extra in extras:
                extra_node = ChainNode(
                    extra.config.rpc_url,
                    extra.config.chain_id,
                    extra.contracts,
                    head_every_s=extra.config.confirmation_policy().poll_interval_s(),
                )
                stack.push_async_callback(extra_node.close)
                chain_id = extra.config.chain_id
                genesis = await check_node(
                    extra_node, index_chain_setting(chain_id), index_chain_id_setting(chain_id)
                )
                await _check_identity(db, extra.config.chain_id, genesis)
                rt.extra_nodes.append(extra_node)
        stack.push_async_callback(rt.stop_tasks)
        rt.tasks.append(asyncio.create_task(_supervised("listener", notifications.run, rt), name="listener"))
        if workers:
            await _measure_block_time(rt)
            start_workers(rt)
        rt.tasks.append(asyncio.create_task(_supervised("gauges", _gauges(rt).run, rt), name="gauges"))
        yield rt


def _deployment(chain: Settings, index: int) -> tuple[Contracts, int]:
    """The contracts and deploy block of a relayed chain's deployment file (``index`` 0:
    ``RELAYER_CHAIN_ID``'s; else one of ``RELAYER_RELAY_CHAINS``).

    Raises:
        ConfigError: the file is unusable or of another chain (naming the setting).
    """
    assert chain.deployment_file is not None
    if index == 0:
        return load_deployment(chain.deployment_file, chain_id=chain.chain_id)
    setting = relay_chain_setting(chain.chain_id)
    return load_deployment(chain.deployment_file, setting, chain.chain_id, f"{setting}'s chainId")


async def _open_node(
    stack: contextlib.AsyncExitStack, chain: Settings, contracts: Contracts, index: int
) -> tuple[ChainNode, bytes]:
    """Open a relayed chain's node (closed with ``stack``), check it serves the chain and the
    deployment holds code: the node and the chain's genesis hash.

    Raises:
        ConfigError: the node fails, serves another chain, or a contract holds no code
            (one line naming the setting: service.startup).
    """
    assert chain.rpc_url is not None and chain.deployment_file is not None
    # one head read per poll cadence serves the whole process (see ChainNode.recent)
    node = ChainNode(chain.rpc_url, chain.chain_id, contracts, head_every_s=chain.poll_interval_s())
    stack.push_async_callback(node.close)
    if index == 0:
        genesis = await check_node(node)
        await check_contracts(node, chain.deployment_file, contracts.named())
    else:
        setting = relay_chain_setting(chain.chain_id)
        genesis = await check_node(node, setting, f"{setting}'s chainId")
        await check_contracts(node, chain.deployment_file, contracts.named(), setting)
    return node, genesis


def _head_clock(settings: Settings) -> HeadClock | None:
    """The follower's clock at the policy's block time, its slow cadence the poll interval;
    None (a fixed cadence) when ``RELAYER_BLOCK_POLL_INTERVAL_S`` sets one."""
    if settings.block_poll_interval_s is not None:
        return None
    return HeadClock(settings.confirmation_policy().block_time_ms / 1000, settings.poll_interval_s())


async def _measure_block_time(rt: Runtime) -> None:
    """Measure the chain's block interval from its newest headers (one bounded batch), log it
    and expose it (``relayer_chain_block_time_measured_seconds``); warn when it is more than
    1.5 times off the block time the policy uses (``RELAYER_BLOCK_TIME_MS`` or the chain
    table's). The policy keeps that block time: a devnet that mines a block per transaction
    has no steady interval to measure. A node failure here is logged, never fatal."""
    policy = rt.settings.confirmation_policy()
    try:
        measured = await rt.blocks.block_time_ms()
    except ChainUnavailable as exc:
        log.warning("block time not measured: the node failed", extra={"error": exc.detail})
        return
    if measured is None:
        log.info("block time not measured: too few blocks or no time between them")
        return
    rt.metrics.block_time_measured.labels(str(rt.settings.chain_id)).set(measured / 1000)
    extra = {"measured_ms": measured, "policy_block_time_ms": policy.block_time_ms}
    if differs_much(measured, policy.block_time_ms):
        log.warning("the chain's measured block time differs from the one the policy uses", extra=extra)
    else:
        log.info("the chain's block time, measured from its newest headers", extra=extra)


async def _check_identity(db: Database, chain_id: int, genesis: bytes) -> None:
    """Refuse to run a database's jobs, nonces and index against another chain.

    Raises:
        ConfigError: the database belongs to a chain with another genesis block.
    """
    recorded = await ChainIdentity(db).record(chain_id, genesis)
    if recorded != genesis:
        raise ConfigError(
            message=(
                f"RELAYER_DATABASE_URL holds chain {chain_id} with genesis 0x{recorded.hex()}, but "
                f"RELAYER_RPC_URL serves genesis 0x{genesis.hex()}: the chain was reset or is another "
                "one. Give this chain a fresh database (point RELAYER_DATABASE_URL at a new one; on a "
                "devnet `make devnet` makes one per chain)."
            )
        )


def _facilitator(
    settings: Settings, relay: Relay, node: ChainNode, signers: list[ExecutorSigner]
) -> Facilitator:
    """The x402 facilitator: ``exact`` payments in this chain's USDC, settled by the relay."""
    domain = TokenDomain(settings.chain_id, node.contracts.usdc, usdc_domain_name(settings.chain_id), "2")
    return Facilitator(
        relay,
        domain,
        [s.address for s in signers],
        settings.facilitator_settle_wait_s,
        settings.facilitator_expiry_margin_s,
        PaymentIds(relay.jobs.db),
        own_accounts=_own_accounts(settings, node),
        served_networks=[caip2(c) for c in settings.served_chain_ids()],
    )


def _own_accounts(settings: Settings, node: ChainNode) -> list[str]:
    """The operator's accounts and the protocol's contracts, besides the executors: never a
    facilitator payment's ``payTo`` (it would only cost the executor gas)."""
    c = node.contracts
    accounts = [c.kvcm, c.carbon_credits, c.carbon_classes, c.pool, c.marketplace, c.settlement]
    treasury = settings.treasury_private_key
    if treasury is not None:
        accounts.append(TreasurySigner(treasury.get_secret_value()).address)
    return accounts


def _payments(
    settings: Settings, relay: Relay, gas: GasPricer, db: Database, facilitator: Facilitator
) -> Payments:
    """The standard x402 retirement resource: paid to the treasury, retired from it (offered
    when a treasury key and ``x402_quote_secret`` are set)."""
    treasury, secret = settings.treasury_private_key, settings.x402_quote_secret
    if treasury is not None and secret is None:
        log.warning("RELAYER_X402_QUOTE_SECRET is not set: actions/retire sends no PAYMENT-REQUIRED header")
    return Payments(
        relay,
        relay.prepare,
        gas,
        X402Payments(db),
        facilitator,
        relay.outcomes.proofs,
        None if treasury is None else TreasurySigner(treasury.get_secret_value()),
        None if secret is None else secret.get_secret_value().encode(),
        settings.x402_quote_lifetime_s,
        settings.settle_wait_s,
    )


def _marketplace(
    settings: Settings,
    db: Database,
    node: ChainNode,
    indexed: list[IndexedChain],
    parts: tuple[CatalogueStore, RetirementStore, Supply, Prepare, Relay, ProjectRecords],
) -> Marketplace:
    """The marketplace over every indexed chain (this one, the other relayed ones and the
    extra ones), quoting with the treasury key when one is set."""
    catalogue, retirements, supply, prepare, relay, project_records = parts
    treasury = settings.treasury_private_key
    return Marketplace(
        catalogue,
        retirements,
        Orders(db),
        supply,
        prepare,
        relay,
        [IndexedChain(settings.chain_id, node.contracts), *indexed],
        settings.public_base_url,
        settings.quote_lifetime_s,
        None if treasury is None else TreasurySigner(treasury.get_secret_value()),
        project_records=project_records,
        order_grace_s=settings.order_grace_s,
        issuer=settings.issuer(),
    )


def _wire(
    settings: Settings,
    dsn: str,
    db: Database,
    node: ChainNode,
    notifications: JobNotifications,
    signers: list[ExecutorSigner],
    deploy_block: int,
    extra_chains: list[ExtraChain],
    metrics: Metrics | None = None,
    also_indexed: list[IndexedChain] | None = None,
) -> Runtime:
    """One relayed chain's services over the shared database and notifications;
    ``also_indexed``: the other relayed chains, whose listings the marketplace shows too."""
    signer = signers[0]
    reads, executor = ChainReads(node), ExecutorChain(node)
    jobs, retirements = RelayJobs(db), RetirementStore(db)
    catalogue = CatalogueStore(db)
    project_records = ProjectRecords(catalogue)  # discover's project filters and the marketplace
    supply = Supply(reads, settings, project_records)
    gas = GasPricer(executor, reads, BaseCosts(node, node.contracts.eth_usd_feed), settings)
    certificates = Certificates(retirements, supply, settings.public_base_url)
    # A front-runner's transfer is confirmed as the follower confirms ours: by the policy's
    # depth, or at the node's safe/finalized block under a tag.
    confirmed = Confirmed(BlockReader(node), settings.confirmation_policy())
    outcomes = Outcomes(
        jobs, retirements, reads, certificates, settings.settle_wait_s, notifications.watch, confirmed.through
    )
    prepare = Prepare(supply, reads, gas, settings)
    simulator = Simulator(
        executor,
        gas,
        jobs,
        signer.address,
        node.contracts.usdc,
        notifications.wake_broadcasters,
        reads,
        settings.chain_id,
    )
    relay = Relay(
        supply,
        prepare,
        simulator,
        jobs,
        outcomes,
        settings.min_executor_balance_wei,
        [s.address for s in signers],
    )
    indexed = [IndexedChain(e.config.chain_id, e.contracts) for e in extra_chains] + (also_indexed or [])
    marketplace = _marketplace(
        settings, db, node, indexed, (catalogue, retirements, supply, prepare, relay, project_records)
    )
    facilitator = _facilitator(settings, relay, node, signers)
    return Runtime(
        settings=settings,
        dsn=dsn,
        db=db,
        node=node,
        reads=reads,
        executor=executor,
        blocks=BlockReader(node),
        jobs=jobs,
        lane=ExecutorLane(db, settings.chain_id),
        retirements=retirements,
        notifications=notifications,
        metrics=metrics or Metrics(),
        signer=signer,
        signers=signers,
        services=AppServices(supply, Discover(supply), prepare, relay, certificates),
        simulator=simulator,
        deploy_block=deploy_block,
        catalogue=catalogue,
        marketplace=marketplace,
        facilitator=facilitator,
        extra_chains=extra_chains,
        payments=_payments(settings, relay, gas, db, facilitator),
    )


def start_workers(rt: Runtime) -> None:
    """Start each relayed chain's relay workers (:func:`_start_relay_workers`), the catalogue
    indexers of the extra chains and the order and payment keepers, supervised."""
    _start_relay_workers(rt)
    for other in rt.others:
        _start_relay_workers(other, f"@{other.settings.chain_id}")
    _start_indexers(rt)
    keepers = []
    for chain in (rt, *rt.others):
        keepers.append(
            Keeper(
                "order keeper" + ("" if chain is rt else f"@{chain.settings.chain_id}"),
                chain.marketplace.desk.resume,
                ORDER_KEEPER_EVERY_S,
                "attempted pending orders again",
            )
        )
        if chain.payments is not None and chain.payments.enabled:
            keepers.append(
                Keeper(
                    "payment keeper" + ("" if chain is rt else f"@{chain.settings.chain_id}"),
                    chain.payments.resume,
                    PAYMENT_KEEPER_EVERY_S,
                    "advanced open x402 payments",
                    logging.DEBUG,
                )
            )
    for one in keepers:
        task = one.name.replace(" ", "-")
        rt.tasks.append(asyncio.create_task(_supervised(task, one.run, rt), name=task))


def _start_relay_workers(rt: Runtime, suffix: str = "") -> None:
    """Start one relayed chain's workers: one broadcaster per executor key (each behind its
    own lease, with its own nonce lane), the chain follower, the sweeper of orphaned jobs and
    the chain's catalogue indexer, supervised; all behind one chain guard (the chain's
    identity as a running check), so a node swapped or gone stops this chain's work alone.
    ``suffix`` tells the task names of another chain from the first's (``@8453``)."""
    board = LaneBoard()
    guard = ChainGuard(rt.node, ChainIdentity(rt.db), rt.metrics)
    for index, signer in enumerate(rt.signers):
        lease = ExecutorLease(rt.dsn, rt.settings.chain_id, signer.address)
        rt.leases.append(lease)
        keeper = LaneKeeper(
            rt.executor,
            rt.simulator.gas,
            rt.lane,
            signer,
            rt.metrics,
            rt.settings.lane_policy(),
            rt.node.contracts.usdc,
            index,
            guard,
        )
        broadcaster = Broadcaster(
            rt.executor,
            rt.lane,
            keeper,
            signer,
            lease,
            rt.notifications,
            rt.metrics,
            rt.simulator,
            board,
            rt.reads.eth_balance,
            rt.settings.min_executor_balance_wei,
            index,
            guard,
        )
        name = ("broadcaster" if index == 0 else f"broadcaster-{index}") + suffix
        rt.tasks.append(asyncio.create_task(_supervised(name, broadcaster.run, rt), name=name))
    rt.lease = rt.leases[0]
    follower = ChainFollower(
        rt.blocks,
        rt.reads,
        rt.jobs,
        rt.lane,
        rt.retirements,
        rt.metrics,
        rt.settings.confirmation_policy(),
        rt.deploy_block,
        rt.settings.poll_interval_s(),
        guard,
        _head_clock(rt.settings),
    )
    indexer = CatalogueIndexer(
        CatalogueChain(rt.node, settlement=False),
        rt.reads,
        rt.catalogue,
        rt.metrics,
        rt.settings.confirmation_policy(),
        rt.deploy_block,
        rt.settings.poll_interval_s(),
        retirements=False,  # the chain follower indexes this chain's retirements
        guard=guard,
    )
    sweeper = Sweeper(rt.simulator, rt.jobs, rt.settings.rejected_retention_s)
    for name, run in (
        ("follower" + suffix, follower.run),
        (f"catalogue-{indexer.chain_id}", indexer.run),
        ("sweeper" + suffix, sweeper.run),
    ):
        rt.tasks.append(asyncio.create_task(_supervised(name, run, rt), name=name))


def _start_indexers(rt: Runtime) -> None:
    """Start the catalogue indexer of each extra chain (behind a guard of its own), supervised."""
    for extra, extra_node in zip(rt.extra_chains, rt.extra_nodes, strict=True):
        indexer = CatalogueIndexer(
            CatalogueChain(extra_node, settlement=True),
            ChainReads(extra_node),
            rt.catalogue,
            rt.metrics,
            extra.config.confirmation_policy(),
            extra.deploy_block,
            extra.config.confirmation_policy().poll_interval_s(),
            retirements=True,
            guard=ChainGuard(extra_node, ChainIdentity(rt.db), rt.metrics),
        )
        name = f"catalogue-{indexer.chain_id}"
        rt.tasks.append(asyncio.create_task(_supervised(name, indexer.run, rt), name=name))


async def _supervised(name: str, run: Callable[[asyncio.Event], Awaitable[None]], rt: Runtime) -> None:
    """Run a worker until stop; if it returns or dies early, log it and start it again."""
    while not rt.stop.is_set():
        try:
            await run(rt.stop)
        except Exception:
            log.exception("worker died; restarting", extra={"worker": name})
            rt.metrics.worker_restarts.labels(name).inc()
        await sleep_or_stop(rt.stop, 1.0)


def _gauges(rt: Runtime) -> Gauges:
    """This process's operator gauges (a worker's include the executor keys' balances)."""
    return Gauges(
        rt.db,
        rt.jobs,
        rt.metrics,
        rt.node,
        rt.reads,
        rt.blocks,
        rt.extra_nodes,
        [s.address for s in rt.signers],
        balances=bool(rt.leases),
        gas_budget_class=rt.settings.gas_budget_class,
    )


def _readiness(rt: Runtime) -> Readiness:
    """This process's readiness (:class:`Readiness`) over every relayed chain: in a worker,
    every executor key's lease on a chain must be held for that chain to be ready."""
    leased = [s.address for s in rt.signers] if rt.leases else []
    return Readiness(rt.db, rt.jobs, rt.node, rt.tasks, leased, [o.node for o in rt.others])


def _with_chain_states(app: web.Application, readiness: Readiness) -> web.Application:
    """``app``'s ``/readyz`` naming each relayed chain's state (``readiness`` answers READY)."""

    def chains() -> Mapping[int, bool]:
        return readiness.chains

    app[READY_CHAINS] = chains
    return app


def _mount(app: web.Application, rt: Runtime) -> None:
    """The surfaces beside the x402 endpoint: the marketplace API and the x402 facilitator
    (which authenticates with API keys of scope ``facilitator``, each with a request limit and
    a daily gas budget)."""
    add_routes(app, rt.marketplace)
    limits = KeyLimits(
        rt.settings.facilitator_default_rate_limit, rt.settings.facilitator_default_gas_budget_wei_per_day
    )
    add_facilitator_routes(
        app, rt.facilitator, rt.marketplace.keys, limits, [o.facilitator for o in rt.others]
    )
    if rt.payments is not None:
        others = [o.payments for o in rt.others if o.payments is not None]
        add_resource_routes(app, rt.payments, f"{rt.settings.x402_base_url}/actions/retire", others)


def make_web_app(rt: Runtime) -> web.Application:
    """The HTTP application over this runtime's services."""
    readiness = _readiness(rt)
    app = build_app(
        rt.services,
        rt.metrics,
        readiness,
        rt.settings.max_body_bytes,
        lambda app: _mount(app, rt),
        version_hosts(rt.settings),
        x402_info(rt.settings, rt.services.supply, [o.services.supply for o in rt.others]),
        rate_limit_of(rt.settings),
        rt.settings.request_timeout_s,
        {r.settings.chain_id: r.services for r in (rt, *rt.others)} if rt.others else None,
    )
    return _with_chain_states(app, readiness)


def rate_limit_of(settings: Settings) -> RateLimit:
    """The per-client request limit of both APIs as ``settings`` configure it: the limit, and
    the client keyed on the peer address or (``RELAYER_RATE_LIMIT_FORWARDED_FOR``) the
    ``X-Forwarded-For`` entry ``RELAYER_RATE_LIMIT_PROXY_HOPS`` trusted proxies added."""
    return RateLimit(
        settings.rate_limit,
        settings.rate_limit_forwarded_for,
        settings.rate_limit_proxy_hops,
        settings.rate_limit_max_clients,
    )


MAX_REQUEST_LINE: Final = 64 * 1024
"""The longest request line (method, path and query) the HTTP server reads: past it aiohttp's
parser refuses the request before any route (a bare 400); below it an over-long query reaches
the routes and gets the spec's envelope (``schema_validation``). Headers are bounded apart
(:data:`relayer.api.connections.MAX_FIELD_SIZE` and ``MAX_HEADERS``)."""


def web_runner(rt: Runtime) -> web.AppRunner:
    """The HTTP server of this runtime's application, with the bounds of
    :func:`runner_options` (idle timeout, header limits, the access log)."""
    return web.AppRunner(
        make_web_app(rt), **runner_options(rt.settings.http_idle_timeout_s, MAX_REQUEST_LINE)
    )


def ops_web_app(rt: Runtime) -> web.Application:
    """What a worker process without the API (``relayer work``) serves on
    ``RELAYER_OPS_PORT``: ``/metrics``, ``/healthz`` and ``/readyz`` only, answered as the API
    answers them (the same handlers and the same readiness)."""
    app = web.Application(middlewares=[request_context])
    app[METRICS] = rt.metrics
    readiness = _readiness(rt)  # the one readiness definition
    ready: Callable[[], Awaitable[bool]] = readiness
    app[READY] = ready
    _with_chain_states(app, readiness)
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def _listen(
    stack: contextlib.AsyncExitStack, runner: web.AppRunner, rt: Runtime, host: str, port: int
) -> None:
    """Set ``runner`` up (cleaned up by ``stack``) and listen on ``host:port``, holding at
    most ``RELAYER_HTTP_MAX_CONNECTIONS`` connections (:class:`BoundedSite`).

    Raises:
        ConfigError: the address cannot be listened on (in use, say).
    """
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    cap = fitted_cap(rt.settings.http_max_connections)
    try:
        await BoundedSite(
            runner, host, port, cap, rt.metrics.connections_refused, evicted=rt.metrics.connections_evicted
        ).start()
    except OSError as exc:
        raise ConfigError(message=f"cannot listen on {host}:{port}: {exc.strerror}") from None


GC_YOUNG_THRESHOLD: Final = 20_000
"""Allocations (net of deallocations) between two collections of the youngest generation."""


async def serve(settings: Settings, *, workers: bool, http: bool = True) -> None:
    """Run the daemon until SIGTERM/SIGINT (or cancellation). With ``http`` the API listens
    on ``RELAYER_HTTP_PORT`` (with /metrics, /healthz, /readyz); a worker process without it
    (``relayer work``) serves only those three on ``RELAYER_OPS_PORT``.

    On SIGTERM: listening stops at once; the workers are told to stop (see
    :meth:`Runtime.ask_stop`); requests in flight get ``RELAYER_SHUTDOWN_GRACE_S`` to finish
    (a relay waiting for its outcome answers at once with its job's status, 202 while on its
    way) and what is left after it is cancelled; then every resource is closed and the
    process exits 0. Jobs are durable in Postgres: the next process resumes them.

    Raises:
        ConfigError, Unavailable: as :func:`open_runtime`; ConfigError also when a port
            cannot be listened on.
    """
    async with open_runtime(settings, workers=workers) as rt, contextlib.AsyncExitStack() as stack:
        runners: list[web.AppRunner] = []
        quiet_accept_errors(asyncio.get_running_loop())
        if http:
            runners.append(web_runner(rt))
            await _listen(stack, runners[-1], rt, settings.http_host, settings.http_port)
            log.info("listening", extra={"host": settings.http_host, "port": settings.http_port})
        elif workers:
            options = runner_options(settings.http_idle_timeout_s, MAX_REQUEST_LINE)
            runners.append(web.AppRunner(ops_web_app(rt), **options))
            await _listen(stack, runners[-1], rt, settings.http_host, settings.ops_port)
            log.info(
                "serving /metrics, /healthz and /readyz",
                extra={"host": settings.http_host, "port": settings.ops_port},
            )
        # Everything loaded so far (modules, ABIs, web3's and pydantic's machinery: some
        # 100k objects) lives as long as the process: out of the collector's sight, a full
        # collection scans only what requests create (each one paused every request in
        # flight for about 25 ms before).
        gc.collect()
        gc.freeze()
        # A young-generation collection every GC_YOUNG_THRESHOLD allocations net, not 700: a
        # retirement allocates thousands of short-lived objects, so the default collected about
        # 650 times in 1,000 retirements (0.24 s of the daemon's CPU with the middle
        # generation's), where this collects 15 times (0.08 s) (issue 20).
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stopping.set)
        await stopping.wait()
        started = loop.time()
        await _shut_down(rt, runners, settings.shutdown_grace_s)
    log.info("stopped", extra={"seconds": round(loop.time() - started, 3)})


async def _shut_down(rt: Runtime, runners: list[web.AppRunner], grace_s: float) -> None:
    """Stop listening, tell the workers to stop, and give the requests in flight ``grace_s``
    seconds (the rest is cancelled); the caller's exit stacks then clean up the servers,
    wait for the workers (:meth:`Runtime.stop_tasks`) and close every resource."""
    for runner in runners:
        for site in list(runner.sites):
            await site.stop()  # the listening socket is closed: new connections are refused
    servers = [runner.server for runner in runners if runner.server is not None]
    busy = sum(len(server.connections) for server in servers)
    log.info(
        "stopping: listening stopped; finishing requests in flight, workers stop after their step",
        extra={"connections": busy, "grace_s": grace_s},
    )
    rt.ask_stop()
    rt.services.relay.outcomes.drain()  # relays waiting for an outcome answer now
    for server in servers:
        server.pre_shutdown()  # idle keep-alive connections close now, busy ones after their answer
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(*(server.shutdown(grace_s) for server in servers))
    log.info("requests in flight finished", extra={"seconds": round(loop.time() - started, 3)})
