"""The operator's reports: ``relayer config check`` (the effective configuration with every
secret redacted, and what would stop ``relayer all`` from starting), ``relayer status``
(jobs by state, executor lanes, balances and leases, indexer lag), as tables or one JSON
object, and ``relayer ledger`` (the executor's solvency ledger, JSON).

Policy: nothing here writes, locks or signs. A secret is never shown: the DSN without its
password, RPC URLs without path and query (providers put API keys there), keys as their
addresses, any other ``SecretStr`` as ``***``. Offline unless asked: ``config check``
connects only with ``--connect``; ``status`` reads the database, and the chains whose RPC
URL is configured (a chain that does not answer shows as unknown)."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import click
from eth_account import Account
from pydantic import SecretStr

from relayer.chain.deployment import extra_chains, load_deployment
from relayer.chain.errors import ChainUnavailable
from relayer.chain.node import ChainNode
from relayer.chain.signer import TreasurySigner
from relayer.chain.types import Contracts
from relayer.config import ConfigError, Settings, env_name
from relayer.domain.budget import utc_day
from relayer.domain.errors import Unavailable
from relayer.domain.states import JobState
from relayer.domain.urls import redact_url
from relayer.package_data import migrations_dir
from relayer.service.catalogue_load import projects_file_records
from relayer.service.payments.quotes import payment_ledger
from relayer.service.startup import (
    CHAIN_SETTING,
    RPC_SETTING,
    check_contracts,
    check_node,
    index_chain_id_setting,
    index_chain_setting,
    node_line,
    open_database,
    relay_chain_setting,
)
from relayer.store.executor_lane import ExecutorLane
from relayer.store.pool import StoreUnavailable, database_line, redact
from relayer.store.status import OPEN_STATES, Cursor, Lane, LeaseRow, StateCount, StatusQueries
from relayer.store.x402_payments import X402Payments

RPC_TIMEOUT_S: Final = 5.0
"""Longest a report waits for a chain node's answer, seconds."""
_ZERO: Final = "0x" + "00" * 20
NO_CONTRACTS: Final = Contracts(_ZERO, _ZERO, _ZERO, _ZERO, _ZERO, _ZERO, _ZERO)
"""The reports read no contract: only chain id, head, nonces and balances."""
UNKNOWN: Final = "-"
"""How a table shows a figure that is not known (no RPC URL, the node did not answer)."""


# --- shown values --------------------------------------------------------------------------


def key_address(key: str) -> str:
    """The checksummed address of a private key (hex)."""
    return str(Account.from_key(key).address)


def executor_addresses(settings: Settings) -> list[str]:
    """The addresses of the configured executor keys, the main one first (none without one)."""
    if settings.executor_private_key is None:
        return []
    return [key_address(k) for k in settings.executor_keys()]


def shown_value(settings: Settings, name: str) -> str:
    """How ``config check`` shows the setting ``name``: never a secret, and for an unset
    setting with a derived default, that default."""
    value = getattr(settings, name)
    if value is None or (name == "certificate_issuer" and not value.strip()):
        return _unset(settings, name)
    if name == "database_url":
        return redact(value.get_secret_value())
    if name in ("executor_private_key", "treasury_private_key"):
        return key_address(value.get_secret_value())
    if name == "executor_private_keys":
        return ", ".join(key_address(k) for k in value.get_secret_value().split())
    if isinstance(value, SecretStr):
        return "***"
    if name == "rpc_url":
        return redact_url(value)
    if name == "index_chains":
        return json.dumps(
            [{**ic.model_dump(mode="json", by_alias=True), "rpcUrl": redact_url(ic.rpc_url)} for ic in value]
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _unset(settings: Settings, name: str) -> str:
    derived = {
        "confirmations": f"chain {settings.chain_id}'s default: {settings.depth()}",
        "confirmation": f"chain {settings.chain_id}'s default: {settings.confirmation_policy().describe()}",
        "block_time_ms": f"chain {settings.chain_id}'s: {settings.confirmation_policy().block_time_ms}",
        "block_poll_interval_s": f"half a block: {settings.poll_interval_s():g}",
        "projects_file": "the packaged data set",
        "x402_v1_base_url": settings.x402_hosts()["v1"],
        "x402_v0_base_url": settings.x402_hosts()["v0"],
        "certificate_issuer": f"the public host: {settings.issuer()}",
    }
    return f"(unset: {derived[name]})" if name in derived else "(unset)"


def configuration(settings: Settings, origins: dict[str, str]) -> list[dict[str, str]]:
    """Every setting: ``{variable, value, source}`` (source: env, secret file, keystore or
    default), in the order of :class:`Settings`."""
    return [
        {
            "variable": env_name(name),
            "value": shown_value(settings, name),
            "source": origins.get(name, "default"),
        }
        for name in type(settings).model_fields
    ]


# --- config check -------------------------------------------------------------------------


@dataclass
class Findings:
    """What a check found: ``problems`` (a setting to change) and ``unreachable`` (the
    database or a chain node cannot be used: the start-up lines of service.startup); either
    exits 2. One line each, naming the variable, never a secret."""

    problems: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)


def offline_problems(settings: Settings, required: Sequence[str]) -> list[str]:
    """What would stop a daemon's start, found without connecting anywhere: a ``required``
    setting missing, a DSN or RPC URL of the wrong shape, an unusable deployment, index
    chain or projects file."""
    problems: list[str] = []
    for name in required:
        try:
            settings.require(name)
        except ConfigError as exc:
            problems.append(exc.message)
    dsn = _given(settings.database_url)
    if dsn is not None and urlsplit(dsn).scheme not in ("postgresql", "postgres"):
        problems.append(
            "RELAYER_DATABASE_URL is not a postgresql:// URL (a libpq key=value string is not enough)"
        )
    rpc_url = _given(settings.rpc_url)
    if rpc_url is not None and not _http_url(rpc_url):
        problems.append(f"RELAYER_RPC_URL is not an http(s):// URL: {redact_url(rpc_url)}")
    for ic in settings.index_chains:
        if not _http_url(ic.rpc_url):
            problems.append(f"RELAYER_INDEX_CHAINS (chain {ic.chain_id}): rpcUrl is not an http(s):// URL")
    for rc in settings.relay_chains:
        if not _http_url(rc.rpc_url):
            problems.append(f"{relay_chain_setting(rc.chain_id)}: rpcUrl is not an http(s):// URL")
    deployment = settings.deployment_file
    checks: list[Callable[[], object]] = [
        lambda: extra_chains(settings),  # their files; no chain twice
        settings.chain_settings,  # no relayed chain twice, none also indexed apart
    ]
    if deployment is not None:
        checks.append(lambda: load_deployment(deployment, chain_id=settings.chain_id))
    for rc in settings.relay_chains:
        setting = relay_chain_setting(rc.chain_id)
        checks.append(
            functools.partial(
                load_deployment, rc.deployment_file, setting, rc.chain_id, f"{setting}'s chainId"
            )
        )
    if settings.projects_file is not None:
        checks.append(lambda: projects_file_records(settings))
    for check in checks:
        try:
            check()
        except ConfigError as exc:
            problems.append(exc.message)
    return problems


def _given(value: str | SecretStr | None) -> str | None:
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    return text if text is not None and text.strip() else None


def _http_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def packaged_migrations() -> list[str]:
    """The ids of the migrations this version carries, in order."""
    return sorted(p.stem for p in migrations_dir().glob("*.sql"))


def _nodes(settings: Settings) -> tuple[dict[str, Path | None], list[tuple[str, str, int, str]]]:
    """What ``--connect`` checks of the chains: each relayed chain's deployment file by the
    setting naming its node, and every node as ``(setting, RPC URL, chain id, chain id's
    setting)``: this daemon's first, then the other relayed chains', then the index chains'."""
    assert settings.rpc_url is not None
    relayed = {RPC_SETTING: settings.deployment_file} | {
        relay_chain_setting(rc.chain_id): rc.deployment_file for rc in settings.relay_chains
    }
    nodes = (
        [(RPC_SETTING, settings.rpc_url, settings.chain_id, CHAIN_SETTING)]
        + [
            (
                relay_chain_setting(c.chain_id),
                c.rpc_url,
                c.chain_id,
                f"{relay_chain_setting(c.chain_id)}'s chainId",
            )
            for c in settings.relay_chains
        ]
        + [
            (
                index_chain_setting(ic.chain_id),
                ic.rpc_url,
                ic.chain_id,
                index_chain_id_setting(ic.chain_id),
            )
            for ic in settings.index_chains
        ]
    )
    return relayed, nodes


async def connected_findings(settings: Settings) -> Findings:
    """With ``--connect``: the database answers, is migrated to this version's head and
    belongs to the chain the RPC serves; each chain node (this daemon's, the other relayed
    chains' and the index chains') answers with its configured chain id, and each relayed
    chain's deployment holds code there. Call after :func:`offline_problems`
    found nothing."""
    found = Findings()
    assert settings.database_url is not None and settings.rpc_url is not None
    dsn = settings.database_url.get_secret_value()
    recorded: dict[int, bytes] = {}
    try:
        db = await open_database(dsn)
        try:
            queries = StatusQueries(db)
            applied, recorded = await queries.applied_migrations(), await queries.chains()
        finally:
            await db.close()
    except ConfigError as exc:
        found.unreachable.append(exc.message)
    except StoreUnavailable as exc:  # lost after it answered
        found.unreachable.append(database_line(dsn, exc.cause))
    else:
        packaged = packaged_migrations()
        pending = [m for m in packaged if m not in applied]
        unknown = [m for m in applied if m not in packaged]
        if pending:
            found.problems.append(
                f"RELAYER_DATABASE_URL {redact(dsn)} lacks {len(pending)} migration(s) "
                f"({', '.join(pending)}): run `relayer migrate` (a daemon's start applies them too)"
            )
        if unknown:
            found.problems.append(
                f"RELAYER_DATABASE_URL {redact(dsn)} has migrations this version does not know "
                f"({', '.join(unknown)}): a newer relayer migrated it"
            )
    relayed, nodes = _nodes(settings)
    for label, url, chain_id, chain_label in nodes:
        node = ChainNode(url, chain_id, NO_CONTRACTS, timeout_s=RPC_TIMEOUT_S)
        try:
            genesis = await check_node(node, label, chain_label)
            deployment = relayed.get(label)
            if deployment is not None:
                contracts, _block = load_deployment(deployment)
                file_setting = "RELAYER_DEPLOYMENT_FILE" if label == RPC_SETTING else label
                try:
                    await check_contracts(node, deployment, contracts.named(), file_setting)
                except ConfigError as exc:
                    found.problems.append(exc.message)
        except ConfigError as exc:
            found.unreachable.append(exc.message)
            continue
        except ChainUnavailable as exc:  # lost after it answered
            found.unreachable.append(node_line(label, url, exc))
            continue
        finally:
            await node.close()
        if chain_id in recorded and recorded[chain_id] != genesis:
            found.problems.append(
                f"{label} serves chain {chain_id} with genesis 0x{genesis.hex()}, but RELAYER_DATABASE_URL "
                f"holds that chain with genesis 0x{recorded[chain_id].hex()}: the chain was reset or is "
                "another one; give it a fresh database"
            )
    return found


# --- status ---------------------------------------------------------------------------------


@dataclass
class ChainView:
    """One chain as its node answered the report: head, and per address nonce and balance."""

    chain_id: int
    rpc_url: str
    head: int | None = None
    nonces: dict[str, int] = field(default_factory=dict)  # address (lower case) -> mined nonce
    balances: dict[str, int] = field(default_factory=dict)  # address (lower case) -> wei
    error: str | None = None


async def read_chain(rpc_url: str, chain_id: int, addresses: Sequence[str]) -> ChainView:
    """One JSON-RPC batch: the chain id (checked), the head, and each address's mined nonce
    (``latest``) and ETH balance. A node that fails, or serves another chain, leaves the
    figures unknown and says why in ``error``."""
    view = ChainView(chain_id, redact_url(rpc_url))
    calls: list[tuple[str, list[Any]]] = [("eth_chainId", []), ("eth_blockNumber", [])]
    for a in addresses:
        calls += [("eth_getTransactionCount", [a, "latest"]), ("eth_getBalance", [a, "latest"])]
    node = ChainNode(rpc_url, chain_id, NO_CONTRACTS, timeout_s=RPC_TIMEOUT_S)
    try:
        answers = await node.batch(calls)
    except Unavailable as exc:
        view.error = f"no answer ({exc.detail})"
        return view
    finally:
        await node.close()
    results = [_hex_int(a) for a in answers]
    if results[0] != chain_id:
        view.error = f"the node serves chain {results[0]}" if results[0] is not None else "no chain id"
        return view
    view.head = results[1]
    for i, a in enumerate(addresses):
        nonce, balance = results[2 + 2 * i], results[3 + 2 * i]
        if nonce is not None:
            view.nonces[a.lower()] = nonce
        if balance is not None:
            view.balances[a.lower()] = balance
    return view


def _hex_int(answer: dict[str, Any]) -> int | None:
    try:
        return int(answer["result"], 16)
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Recorded:
    """What the database knows, read in one go for one report."""

    keys: list[tuple[int, str]]  # (chain id, address): the configured keys, then other lanes and leases
    states: list[StateCount]
    lanes: list[Lane]
    leases: list[LeaseRow]
    holders: dict[tuple[int, str], int]  # (chain id, address in lower case) -> holder's pid
    in_flight: dict[tuple[int, str], int]
    cursors: list[Cursor]
    chains: dict[int, bytes]
    applied: list[str]
    payments: dict[str, int] = field(default_factory=dict)  # x402 resource payments by state


async def _recorded(dsn: str, chain_id: int, configured: Sequence[str]) -> Recorded:
    """Every database figure of the report, for the ``configured`` executor addresses on
    ``chain_id`` and every other lane or lease the database holds.

    Raises:
        ConfigError: the database is not migrated to this version's head.
        StoreUnavailable: the database failed.
    """
    db = await open_database(dsn)
    try:
        q = StatusQueries(db)
        applied = await q.applied_migrations()
        pending = [m for m in packaged_migrations() if m not in applied]
        if pending:  # a table read below may not exist yet
            raise ConfigError(
                message=f"RELAYER_DATABASE_URL {redact(dsn)} lacks {len(pending)} migration(s) "
                f"({', '.join(pending)}): run `relayer migrate`"
            )
        lanes, leases = await q.lanes(), await q.lease_rows()
        keys = _executor_keys(chain_id, configured, [*lanes, *leases])
        return Recorded(
            keys=keys,
            states=await q.jobs_by_state(),
            lanes=lanes,
            leases=leases,
            holders=await q.lease_holders(keys),
            in_flight=await q.in_flight(),
            cursors=await q.cursors(),
            chains=await q.chains(),
            applied=applied,
            payments=await X402Payments(db).count_by_state(chain_id),
        )
    finally:
        await db.close()


async def status_report(settings: Settings) -> dict[str, Any]:
    """What ``relayer status`` shows, as one JSON-able object: ``database`` (URL, chains
    recorded, migrations), ``chains`` (each node asked: head or why unknown), ``jobs`` (per
    state: count, and the oldest job's age in the open states), ``executors`` (per
    configured key, then any other lane or lease in the database: the lane's next nonce, the
    chain's mined nonce and the lag between them, transactions in flight, balance, lease) and
    ``indexers`` (per cursor: block, head, lag, depth). Ages in seconds, wei as strings.

    A lease is held when its Postgres advisory lock is granted to a session now (read from
    ``pg_locks``: nothing is locked to find out); ``epoch`` and ``holder`` are those of its
    last taking (``executor_leases``).

    Raises:
        StoreUnavailable: the database failed.
        ConfigError: the database refused the DSN, or is not migrated to this version's head.
    """
    assert settings.database_url is not None
    dsn = settings.database_url.get_secret_value()
    configured = executor_addresses(settings)
    recorded = await _recorded(dsn, settings.chain_id, configured)
    keys = recorded.keys
    views: dict[int, ChainView] = {}
    if _given(settings.rpc_url) is not None:
        assert settings.rpc_url is not None
        mine = [a for c, a in keys if c == settings.chain_id]
        views[settings.chain_id] = await read_chain(settings.rpc_url, settings.chain_id, mine)
    for ic in settings.index_chains:
        if ic.chain_id not in views:
            views[ic.chain_id] = await read_chain(ic.rpc_url, ic.chain_id, [])
    depths = {settings.chain_id: settings.depth()} | {ic.chain_id: ic.depth() for ic in settings.index_chains}
    packaged = packaged_migrations()
    return {
        "chainId": settings.chain_id,
        "database": {
            "url": redact(dsn),
            "chains": {str(c): "0x" + g.hex() for c, g in recorded.chains.items()},
            "migrations": {
                "applied": len(set(packaged) & set(recorded.applied)),
                "packaged": len(packaged),
                "pending": [m for m in packaged if m not in recorded.applied],
            },
        },
        "chains": [
            {"chainId": v.chain_id, "rpcUrl": v.rpc_url, "head": v.head, "error": v.error}
            for v in views.values()
        ],
        "jobs": _job_rows(recorded.states),
        "x402Payments": recorded.payments,
        "executors": [
            _executor_row(settings, chain_id, address, address in configured, recorded, views.get(chain_id))
            for chain_id, address in keys
        ],
        "indexers": [
            _indexer_row(c, views.get(c.chain_id), depths.get(c.chain_id)) for c in recorded.cursors
        ],
    }


def _job_rows(states: list[StateCount]) -> list[dict[str, Any]]:
    """Every state of the machine in its order (then any other the database holds), with
    its jobs and, in an open state, the oldest one's age."""
    by_state = {s.state: s for s in states}
    known = [s.value for s in JobState]
    rows = []
    for state in [*known, *(s.state for s in states if s.state not in known)]:
        found = by_state.get(state)
        rows.append(
            {
                "state": state,
                "jobs": found.jobs if found else 0,
                "oldestAgeS": (
                    round(found.oldest_s, 1)
                    if found and found.oldest_s is not None and state in OPEN_STATES
                    else None
                ),
            }
        )
    return rows


def _executor_row(
    settings: Settings,
    chain_id: int,
    address: str,
    configured: bool,
    recorded: Recorded,
    view: ChainView | None,
) -> dict[str, Any]:
    key = (chain_id, address.lower())
    lane_next = next(
        (lane.next_nonce for lane in recorded.lanes if (lane.chain_id, lane.executor.lower()) == key), None
    )
    lease = next((r for r in recorded.leases if (r.chain_id, r.executor.lower()) == key), None)
    mined = view.nonces.get(key[1]) if view else None
    balance = view.balances.get(key[1]) if view else None
    return {
        "chainId": chain_id,
        "address": address,
        "configured": configured and chain_id == settings.chain_id,
        "laneNextNonce": lane_next,
        "chainNonce": mined,
        "nonceLag": None if lane_next is None or mined is None else lane_next - mined,
        "inFlight": recorded.in_flight.get(key, 0),
        "balanceWei": None if balance is None else str(balance),
        "belowFloor": None if balance is None else balance < settings.min_executor_balance_wei,
        "lease": {
            "held": key in recorded.holders,
            "pid": recorded.holders.get(key),
            "epoch": lease.epoch if lease else None,
            "holder": lease.holder if lease else None,
            "takenAgeS": round(lease.taken_s, 1) if lease else None,
        },
    }


def _indexer_row(cursor: Cursor, view: ChainView | None, depth: int | None) -> dict[str, Any]:
    head = view.head if view else None
    return {
        "chainId": cursor.chain_id,
        "name": cursor.name,
        "block": cursor.block_number,
        "head": head,
        "lag": None if head is None else max(head - cursor.block_number, 0),
        "depth": depth,
        "updatedAgeS": round(cursor.updated_s, 1),
    }


def _executor_keys(
    chain_id: int, configured: Sequence[str], recorded: Sequence[Lane | LeaseRow]
) -> list[tuple[int, str]]:
    """(chain id, address) of every configured key on ``chain_id``, then of every other lane
    or lease the database holds (a key no longer configured, or another chain's)."""
    keys = [(chain_id, a) for a in configured]
    seen = {(c, a.lower()) for c, a in keys}
    for item in recorded:
        if (item.chain_id, item.executor.lower()) not in seen:
            seen.add((item.chain_id, item.executor.lower()))
            keys.append((item.chain_id, item.executor))
    return keys


# --- ledger ---------------------------------------------------------------------------------


async def ledger_summary(settings: Settings) -> dict[str, Any]:
    """The executor's solvency ledger on ``settings.chain_id`` (``relayer ledger``): per kind
    (relay, noop, transfer: sponsored, never counted at a loss) and outcome, mined
    transactions, wei paid, wei the successful relays' allowances were worth, and how many
    paid more than they received; plus the totals, and ``x402Refunds`` (refunds of the standard
    x402 retirement resource: count, USDC refunded, wei their transactions paid).
    ``facilitator``: per API key whose settles the executor paid gas for (design:
    docs/design/x402-v2.md, C3), ``{apiKey (its name), settles, paidWei, reservedWei}`` in
    total and ``today`` (the current UTC day, the one its daily budget counts).
    ``x402Payments``: per payment of the standard resource, USDC the treasury received for it
    (the proven transfer) and paid out on its behalf (the settled retirement's value less its
    refund, and the mined refund), with ``agrees`` (paid out at most what arrived; a refund is
    all of it and nothing else) and the ids of those that disagree (issue 35).

    Raises:
        StoreUnavailable: the database failed.
        ConfigError: the database refused the DSN, or the deployment file is unreadable.
    """
    assert settings.database_url is not None
    db = await open_database(settings.database_url.get_secret_value())
    try:
        lane = ExecutorLane(db, settings.chain_id)
        rows = await lane.ledger()
        keys = await lane.key_ledger(utc_day(int(time.time())))
        refunds = await X402Payments(db).refunds(settings.chain_id)
        payments = await _payments_ledger(settings, X402Payments(db))
    finally:
        await db.close()
    paid = sum(r.paid_wei for r in rows)
    received = sum(r.received_wei for r in rows)
    return {
        "chainId": settings.chain_id,
        "rows": [
            {
                "kind": r.kind,
                "outcome": "success" if r.succeeded else "reverted",
                "transactions": r.transactions,
                "paidWei": str(r.paid_wei),
                "receivedWei": str(r.received_wei),
                "atALoss": r.at_a_loss,
            }
            for r in rows
        ],
        "paidWei": str(paid),
        "receivedWei": str(received),
        "netWei": str(received - paid),
        "x402Refunds": refunds,
        "x402Payments": payments,
        "facilitator": [
            {
                "apiKey": k.name,
                "settles": k.settles,
                "paidWei": str(k.paid_wei),
                "reservedWei": str(k.reserved_wei),
                "today": {
                    "settles": k.settles_today,
                    "paidWei": str(k.paid_today_wei),
                    "reservedWei": str(k.reserved_today_wei),
                },
            }
            for k in keys
        ],
    }


async def _payments_ledger(settings: Settings, store: X402Payments) -> dict[str, Any]:
    """Per payment of the standard x402 resource, USDC received and paid out (atomic units,
    decimal strings), and the ids of those that disagree (paid out more than received, or a
    refund that is not all of it). Empty without a treasury key or a deployment file (no
    resource: no payments)."""
    treasury, deployment = settings.treasury_private_key, settings.deployment_file
    if treasury is None or deployment is None:
        return {"payments": 0, "receivedUsdc": "0", "paidOutUsdc": "0", "disagreeing": [], "rows": []}
    contracts, _ = load_deployment(deployment)
    signer = TreasurySigner(treasury.get_secret_value())
    rows = await payment_ledger(store, settings.chain_id, contracts.usdc, signer.address)
    return {
        "payments": len(rows),
        "receivedUsdc": str(sum(r.received for r in rows)),
        "paidOutUsdc": str(sum(r.paid_out for r in rows)),
        "disagreeing": [str(r.id) for r in rows if not r.agrees],
        "rows": [
            {
                "id": str(r.id),
                "state": r.state,
                "amountUsdc": str(r.amount),
                "receivedUsdc": str(r.received),
                "paymentTx": None if r.payment_tx is None else "0x" + r.payment_tx.hex(),
                "retiredUsdc": str(r.retired_out),
                "refundedUsdc": str(r.refunded_out),
                "paidOutUsdc": str(r.paid_out),
                "agrees": r.agrees,
            }
            for r in rows
        ],
    }


# --- rendering -------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A plain text table: a header, a rule, the rows; the columns ``right`` right-aligned."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  " + "  ".join(padded).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def age(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``5 h``, ``3 d`` (``-`` when unknown)."""
    if seconds is None:
        return UNKNOWN
    for unit, size, limit in (("s", 1, 120), ("min", 60, 120 * 60), ("h", 3600, 48 * 3600)):
        if seconds < limit:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds // 86400)} d"


def eth(wei: int) -> str:
    """Wei as ETH with 6 decimals, rounded down (exact integer arithmetic)."""
    return f"{wei // 10**18}.{wei % 10**18 // 10**12:06d} ETH"


def _cell(value: object) -> str:
    return UNKNOWN if value is None else str(value)


def render_status(report: dict[str, Any]) -> str:
    """The report as titled tables (click styles the titles on a terminal only)."""
    db = report["database"]
    migrations = db["migrations"]
    out = [
        click.style("database", bold=True),
        f"  {db['url']}: migrations {migrations['applied']}/{migrations['packaged']}"
        + (f" (pending: {', '.join(migrations['pending'])})" if migrations["pending"] else "")
        + "; chains recorded: "
        + (", ".join(db["chains"]) or "none"),
    ]
    for chain in report["chains"]:
        where = f"head {chain['head']}" if chain["head"] is not None else f"unknown: {chain['error']}"
        out.append(f"  chain {chain['chainId']} at {chain['rpcUrl']}: {where}")
    if not report["chains"]:
        out.append(f"  no RPC URL: chain figures unknown (set {env_name('rpc_url')})")

    out += ["", click.style("relay jobs", bold=True)]
    rows = [
        [j["state"], str(j["jobs"]), age(j["oldestAgeS"]) if j["oldestAgeS"] is not None else ""]
        for j in report["jobs"]
    ]
    out.append(table(["state", "jobs", "oldest"], rows, right=(1, 2)))

    out += ["", click.style("executors", bold=True)]
    if report["executors"]:
        rows = []
        for e in report["executors"]:
            lease = e["lease"]
            if lease["held"]:
                held = f"held (pid {lease['pid']}, epoch {lease['epoch']}, {age(lease['takenAgeS'])})"
            else:
                held = "free" + (f" (last epoch {lease['epoch']})" if lease["epoch"] is not None else "")
            balance = UNKNOWN if e["balanceWei"] is None else eth(int(e["balanceWei"]))
            rows.append(
                [
                    str(e["chainId"]),
                    e["address"] + ("" if e["configured"] else " (not configured)"),
                    _cell(e["laneNextNonce"]),
                    _cell(e["chainNonce"]),
                    _cell(e["nonceLag"]),
                    str(e["inFlight"]),
                    balance + (" (below floor)" if e["belowFloor"] else ""),
                    held,
                ]
            )
        headers = ["chain", "address", "lane next", "chain nonce", "lag", "in flight", "balance", "lease"]
        out.append(table(headers, rows, right=(2, 3, 4, 5, 6)))
    else:
        out.append("  none: no executor key configured and no lane in the database")

    out += ["", click.style("indexers", bold=True)]
    if report["indexers"]:
        rows = [
            [
                str(i["chainId"]),
                i["name"],
                str(i["block"]),
                _cell(i["head"]),
                _cell(i["lag"]),
                _cell(i["depth"]),
                age(i["updatedAgeS"]),
            ]
            for i in report["indexers"]
        ]
        out.append(
            table(["chain", "cursor", "block", "head", "lag", "depth", "moved"], rows, right=(2, 3, 4, 5, 6))
        )
    else:
        out.append("  no cursor yet (no worker has run on this database)")
    return "\n".join(out)


def render_configuration(rows: Sequence[dict[str, str]]) -> str:
    """The configuration table (``variable  value  source``)."""
    return table(["variable", "value", "source"], [[r["variable"], r["value"], r["source"]] for r in rows])
