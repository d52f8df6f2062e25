"""The exactly-once check shared by the load tests (faults, shutdown): every retirement is one
indexed job with one transaction, no nonce is shared, the chain holds exactly one
RetirementSettled per answered transaction after the devnet's own seeded ones, and no relay
reverted or paid more than its allowance."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import aiohttp

from relayer.chain import codec
from relayer.store.executor_lane import ExecutorLane
from relayer.store.pool import Database

_SETTLED: Final = codec.event("RetirementSettlement", "RetirementSettled")


async def assert_settled_exactly_once(
    db: Database, session: aiohttp.ClientSession, info: dict[str, Any], tx_hashes: Iterable[str], count: int
) -> None:
    """``count`` retirements, each settled once, answered with ``tx_hashes`` (0x hex)."""
    assert await db.fetchval("SELECT count(*) FROM relay_jobs") == count
    assert await db.fetchval("SELECT count(*) FROM relay_jobs WHERE state = 'indexed'") == count
    assert await db.fetchval("SELECT count(*) FROM relay_transactions") == count
    shared = await db.fetchval(
        "SELECT count(*) FROM (SELECT nonce FROM relay_transactions GROUP BY executor, nonce "
        "HAVING count(DISTINCT job_id) > 1) AS shared"
    )
    assert shared == 0
    query = {
        "address": info["contracts"]["settlement"],
        # after the retirements the devnet seeds itself (not relayed)
        "fromBlock": hex(max(r["blockNumber"] for r in info["seededRetirements"]) + 1),
        "toBlock": "latest",
        "topics": ["0x" + _SETTLED.topic.hex()],
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "eth_getLogs", "params": [query]}
    async with session.post(info["rpcUrl"], json=body) as r:
        logs = (await r.json())["result"]
    assert sorted(entry["transactionHash"] for entry in logs) == sorted(tx_hashes)
    ledger = {(row.kind, row.succeeded): row for row in await ExecutorLane(db, 84532).ledger()}
    assert ("relay", False) not in ledger, ledger
    assert ledger[("relay", True)].transactions == count
    assert ledger[("relay", True)].at_a_loss == 0
