"""The executor's solvency (issue 7): a ledger of what each mined transaction paid against
what its signed gas allowance was worth, a floor on the executor's balance below which new
work is refused, and rejected rows purged after their retention period."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from relayer.ops import ledger_summary
from relayer.store.orders import Orders, Quote
from relayer.workers.sweeper import SWEEP_EVERY_S
from tests.conftest import Daemon
from tests.helpers.relay import challenge, sign, signed_request
from tests.private import private_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def _signed(d: Daemon, payer: int = 0) -> dict[str, Any]:
    who = d.chain["payers"][payer]
    ch = await challenge(d, who, carbonClass="RE", amount="0.01", inputToken="USDC")
    return signed_request(ch, who["privateKey"])


async def _not_yet_valid(d: Daemon) -> dict[str, Any]:
    """A signed request whose EIP-3009 authorization becomes valid only in an hour: the
    simulation reverts, so its job ends rejected before anything is signed."""
    who = d.chain["payers"][0]
    ch = await challenge(d, who, carbonClass="RE", amount="0.01", inputToken="USDC")
    later = int(time.time()) + 3600
    typed = copy.deepcopy(ch["typedData"])
    typed["message"]["validAfter"] = later
    body = copy.deepcopy(ch["actionsRetireRequest"])
    body["authPayload"]["validAfter"] = str(later)
    body["authPayload"]["signature"] = sign(typed, who["privateKey"])
    return body


async def _rows(d: Daemon, body: dict[str, Any]) -> tuple[int, int]:
    salt = bytes.fromhex(body["salt"][2:])
    db = d.runtime.db
    jobs = await db.fetchval("SELECT count(*) FROM relay_jobs WHERE salt = $1", salt)
    salts = await db.fetchval("SELECT count(*) FROM spent_salts WHERE salt = $1", salt)
    return int(jobs), int(salts)


async def test_a_settled_relay_is_in_the_ledger_paid_within_its_allowance(daemon: Daemon) -> None:
    received = daemon.runtime.metrics.allowance_received_wei._value.get()
    status, result = await daemon.post(await _signed(daemon))
    assert (status, result["status"]) == (200, "settled"), result
    tx_hash = bytes.fromhex(result["transactionHash"][2:])
    row = await daemon.runtime.db.fetchrow(
        "SELECT t.paid_wei, t.gas_used, t.succeeded, j.allowance_wei FROM relay_transactions t "
        "JOIN relay_jobs j ON j.id = t.job_id WHERE t.tx_hash = $1",
        tx_hash,
    )
    assert row is not None and row["succeeded"] is True
    assert 0 < int(row["paid_wei"]) <= int(row["allowance_wei"])
    summary = await ledger_summary(daemon.runtime.settings)
    relays = [r for r in summary["rows"] if (r["kind"], r["outcome"]) == ("relay", "success")]
    assert relays and relays[0]["atALoss"] == 0 and int(relays[0]["paidWei"]) > 0
    metric = daemon.runtime.metrics.gas_paid_wei.labels("relay", "success")._value.get()
    assert metric >= int(row["paid_wei"])
    # the move to mined counts the job's allowance as received (the shared daemon may have
    # settled others meanwhile: at least this one's)
    assert (
        daemon.runtime.metrics.allowance_received_wei._value.get() - received >= int(row["allowance_wei"]) > 0
    )
    print(f"\nledger: {summary['paidWei']} wei paid, {summary['receivedWei']} wei received so far")


async def test_below_the_executor_floor_new_work_is_refused_with_payment_unavailable(daemon: Daemon) -> None:
    body = await _signed(daemon, 1)
    relay = daemon.runtime.services.relay
    floor = relay.min_executor_balance_wei
    relay.min_executor_balance_wei = 10**40  # more than the executor holds
    try:
        status, refused = await daemon.post(body)
    finally:
        relay.min_executor_balance_wei = floor
    assert (status, refused["error"]) == (503, "payment_unavailable"), refused
    assert await _rows(daemon, body) == (0, 0)  # nothing recorded, nothing stranded
    status, settled = await daemon.post(body)  # topped up: the same request settles
    assert (status, settled["status"]) == (200, "settled"), settled


async def test_rejected_rows_are_purged_after_their_retention_period(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(tmp_path, admin_database_url, rejected_retention_s=1.0) as (d, _anvil):
        body = await _not_yet_valid(d)
        status, refused = await d.post(body)
        assert (status, refused["error"]) == (422, "contract_revert"), refused
        assert await _rows(d, body) == (1, 1)
        started = time.monotonic()
        while await _rows(d, body) != (0, 0):
            assert time.monotonic() - started < 15, "rejected rows not purged"
            await asyncio.sleep(0.2)
        purged_in = time.monotonic() - started
        # The identical request starts afresh and is refused the same way.
        status, again = await d.post(body)
        assert (status, again["error"]) == (422, "contract_revert"), again
        # A settled job is never purged.
        status, settled = await d.post(await _signed(d))
        assert (status, settled["status"]) == (200, "settled")
        await asyncio.sleep(3)
        assert await d.runtime.db.fetchval("SELECT count(*) FROM relay_jobs WHERE state = 'indexed'") == 1
        print(f"\nrejected rows purged {purged_in:.1f} s after rejection (retention 1 s)")


async def _order_on(d: Daemon, job_id: int) -> tuple[int, uuid.UUID]:
    """An order (with its key and quote) linked to relay job ``job_id``, recorded through the
    store as ``POST /orders`` does; (its key's id, its id)."""
    orders = Orders(d.runtime.db)
    key_hash = hashlib.sha256(uuid.uuid4().bytes).digest()
    key_id = await orders.add_key(key_hash, uuid.uuid4().hex[:12], "sweeper")
    now = int(time.time())
    quote = Quote(uuid.uuid4(), key_id, 84532, "test", 1, 1000, 1, 1, now, now + 600, None)
    await orders.add_quote(quote)
    order_id = uuid.uuid4()
    await orders.place(order_id, quote.uuid, key_id, "B", d.chain["payers"][0]["address"], "", None, now)
    await orders.set_job(order_id, job_id, now)
    return key_id, order_id


async def _purges_beside(d: Daemon) -> None:
    """Another rejected request, unreferenced: the sweeper purges it within 15 s and lives on
    for a few more sweeps past the retention period (no restart)."""
    unreferenced = await _not_yet_valid(d)
    status, refused = await d.post(unreferenced)
    assert (status, refused["error"]) == (422, "contract_revert"), refused
    restarts = d.runtime.metrics.worker_restarts.labels("sweeper")
    before = restarts._value.get()
    started = time.monotonic()
    while await _rows(d, unreferenced) != (0, 0):
        assert time.monotonic() - started < 15, "unreferenced rejected rows not purged"
        await asyncio.sleep(0.2)
    await asyncio.sleep(3 * SWEEP_EVERY_S)
    assert restarts._value.get() - before == 0, "the sweeper died"


async def test_a_rejected_job_an_order_references_is_kept_and_the_sweeper_lives_on(
    tmp_path: Path, admin_database_url: str
) -> None:
    """Issue 18: the purge deleted a rejected job that ``orders.job_id`` still references; the
    foreign key refused it, the sweeper died and restarted every second and purged nothing."""
    async with private_daemon(tmp_path, admin_database_url, rejected_retention_s=1.0) as (d, _anvil):
        referenced = await _not_yet_valid(d)
        status, refused = await d.post(referenced)
        assert (status, refused["error"]) == (422, "contract_revert"), refused
        job_id = await d.runtime.db.fetchval(
            "SELECT id FROM relay_jobs WHERE salt = $1", bytes.fromhex(referenced["salt"][2:])
        )
        key_id, order_id = await _order_on(d, int(job_id))
        await _purges_beside(d)
        assert await _rows(d, referenced) == (1, 1), "a job an order references is kept"
        order = await d.runtime.marketplace.desk.order(key_id, str(order_id))
        assert order["status"] == "FAILED" and order["error"]["code"] == "contract_revert", order


@pytest.mark.parametrize("column", ["transfer_job_id", "retire_job_id", "refund_job_id"])
async def test_a_rejected_job_an_x402_payment_references_is_kept_and_the_sweeper_lives_on(
    tmp_path: Path, admin_database_url: str, column: str
) -> None:
    """Issue 19: a standard x402 payment references its transfer, retirement and refund jobs
    (``x402_payments``, no ON DELETE); a rejected one of them must outlive the purge, as an
    order's does, or the foreign key refuses the whole batch and the sweeper purges nothing."""
    async with private_daemon(tmp_path, admin_database_url, rejected_retention_s=1.0) as (d, _anvil):
        referenced = await _not_yet_valid(d)
        status, refused = await d.post(referenced)
        assert (status, refused["error"]) == (422, "contract_revert"), refused
        job_id = await d.runtime.db.fetchval(
            "SELECT id FROM relay_jobs WHERE salt = $1", bytes.fromhex(referenced["salt"][2:])
        )
        now = int(time.time())
        await d.runtime.db.execute(
            "INSERT INTO x402_payments (id, chain_id, quote_id, request_hash, request, payload, "
            f"payload_hash, payer, auth_nonce, amount, received, {column}, state, created_at, updated_at, "
            "due_at) VALUES ($1, 84532, $2, $3, '{}', '{}', $3, $4, $3, 1, 1, $5, 'failed', $6, $6, $6)",
            uuid.uuid4(),
            uuid.uuid4().hex,
            b"\x01" * 32,
            d.chain["payers"][0]["address"],
            int(job_id),
            now,
        )
        await _purges_beside(d)
        assert await _rows(d, referenced) == (1, 1), "a job an x402 payment references is kept"
