"""The facilitator's API keys, request limits and daily gas budgets (issue 19, design:
docs/design/x402-v2.md, C3) on real anvil and Postgres, through HTTP: verify and settle need a
key of scope ``facilitator`` (a marketplace key is 401 there, and the other way round) while
``supported`` is public; each key has its own request limit (429 ``rate_limited`` with
Retry-After); a settle its day's budget cannot take is 429 ``gas_budget_exhausted`` with
nothing recorded; a settle reserves its fee ceiling while in flight and its receipt moves the
reservation into the gas paid, which ``relayer ledger`` shows per key; a rejected job gives its
reservation back, and concurrent reservations never pass the budget; ``relayer apikey create``
takes the scopes and limits."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from relayer.admin import create_api_key
from relayer.domain.budget import seconds_to_utc_midnight, utc_day
from relayer.domain.states import JobState
from relayer.domain.verify import TransferAuthorization, VerifiedTransfer
from relayer.domain.x402_wire import Payment, Requirements
from relayer.ops import ledger_summary
from relayer.service.relay import _transfer_job
from relayer.store.relay_jobs import GasBudgetExhausted, GasReservation, NewJob
from tests.chain_helpers import token_balance
from tests.conftest import Daemon
from tests.helpers.facilitator import call, fresh_address, held_unmined, payment
from tests.processes import RELAYER, DaemonProcess, daemon_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def new_key(
    d: Daemon, *scopes: str, rate: str | None = None, budget: int | None = None
) -> tuple[str, str, int]:
    """(token, name, id) of a new API key."""
    name = f"keys-{uuid.uuid4().hex[:8]}"
    token = await create_api_key(d.runtime.settings, name, scopes, rate, budget)
    key_id = await d.runtime.db.fetchval("SELECT id FROM api_keys WHERE name = $1", name)
    return token, name, int(key_id)


async def jobs_of(d: Daemon, key_id: int) -> int:
    return int(await d.runtime.db.fetchval("SELECT count(*) FROM relay_jobs WHERE api_key_id = $1", key_id))


async def gas_day(d: Daemon, key_id: int) -> dict[str, int] | None:
    row = await d.runtime.db.fetchrow(
        "SELECT reserved_wei, paid_wei, settles FROM api_key_gas_days WHERE api_key_id = $1 AND day = $2",
        key_id,
        utc_day(int(time.time())),
    )
    return None if row is None else {k: int(v) for k, v in row.items()}


async def test_only_a_facilitator_key_may_verify_and_settle_and_supported_is_public(daemon: Daemon) -> None:
    market, _, market_id = await new_key(daemon, "marketplace")
    facilitator, _, _ = await new_key(daemon, "facilitator")
    both, _, _ = await new_key(daemon, "marketplace", "facilitator")
    body = payment(daemon, fresh_address(), 1_000)
    for path in ("verify", "settle"):
        status, answer = await call(daemon, path, body, market)
        assert status == 401, answer
        assert answer == {"error": "unauthorized", "message": answer["message"]}
        assert "facilitator" in answer["message"]
    assert await jobs_of(daemon, market_id) == 0
    async with daemon.session.get(f"{daemon.base_url}/facilitator/supported") as r:  # no key
        assert r.status == 200 and (await r.json())["kinds"][0]["scheme"] == "exact"
    for key in (facilitator, both):
        status, answer = await call(daemon, "verify", body, key)
        assert status == 200 and answer["isValid"] is True, answer
    # A facilitator-only key is no marketplace key; one with both scopes is.
    quote = {"asset_price_source_id": "listing-1-0x" + "0" * 64, "quantity_tonnes": "1"}
    for key, expected in ((facilitator, 401), (market, None), (both, None)):
        headers = {"Authorization": f"Bearer {key}"}
        async with daemon.session.post(f"{daemon.base_url}/quotes", json=quote, headers=headers) as r:
            answer = await r.json()
            if expected is None:
                assert r.status != 401, answer
            else:
                assert (r.status, answer["code"]) == (401, "unauthorized"), answer


async def test_each_key_has_its_own_request_limit(daemon: Daemon) -> None:
    slow, _, _ = await new_key(daemon, "facilitator", rate="3/minute")
    other, _, _ = await new_key(daemon, "facilitator")
    body = payment(daemon, fresh_address(), 1_000)
    for _ in range(3):
        status, answer = await call(daemon, "verify", body, slow)
        assert status == 200 and answer["isValid"] is True, answer
    for path in ("verify", "settle"):
        headers = {"Authorization": f"Bearer {slow}"}
        async with daemon.session.post(
            f"{daemon.base_url}/facilitator/{path}", json=body, headers=headers
        ) as r:
            answer = await r.json()
            assert r.status == 429, answer
            assert answer == {"error": "rate_limited", "message": answer["message"]}
            assert 1 <= int(r.headers["Retry-After"]) <= 60
    status, answer = await call(daemon, "verify", body, other)  # another key counts on its own
    assert status == 200 and answer["isValid"] is True, answer


async def test_a_settle_past_the_daily_budget_is_429_and_records_nothing(daemon: Daemon) -> None:
    poor, _, poor_id = await new_key(daemon, "facilitator", budget=1)
    pay_to = fresh_address()
    body = payment(daemon, pay_to, 2_222)
    headers = {"Authorization": f"Bearer {poor}"}
    async with daemon.session.post(f"{daemon.base_url}/facilitator/settle", json=body, headers=headers) as r:
        answer = await r.json()
        assert r.status == 429, answer
        assert answer == {"error": "gas_budget_exhausted", "message": answer["message"]}
        assert abs(int(r.headers["Retry-After"]) - seconds_to_utc_midnight(int(time.time()))) <= 5
    assert await jobs_of(daemon, poor_id) == 0
    assert (await gas_day(daemon, poor_id)) is None
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == 0
    # Nothing of the refused attempt is left: a key with budget settles the same payment.
    rich, _, rich_id = await new_key(daemon, "facilitator")
    status, settled = await call(daemon, "settle", body, rich)
    assert status == 200 and settled["success"] is True, settled
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == 2_222
    assert await jobs_of(daemon, rich_id) == 1


async def test_a_settle_reserves_its_ceiling_and_the_ledger_shows_the_gas_each_key_paid(
    daemon: Daemon,
) -> None:
    token, name, key_id = await new_key(daemon, "facilitator")
    pay_to = fresh_address()
    body = payment(daemon, pay_to, 4_321)
    with held_unmined(daemon, 2.0) as w3:
        status, pending = await call(daemon, "settle", body, token)
        assert (status, pending["errorReason"]) == (200, "settlement_pending"), pending
        job = await daemon.runtime.db.fetchrow(
            "SELECT gas_limit, max_fee_per_gas, gas_reserved_wei FROM relay_jobs WHERE api_key_id = $1",
            key_id,
        )
        day = await gas_day(daemon, key_id)
        assert day is not None and day["reserved_wei"] == int(job["gas_reserved_wei"]), (day, job)
        ceiling = daemon.runtime.settings.facilitator_max_fee_per_gas_wei
        assert (
            day["reserved_wei"]
            >= int(job["gas_limit"]) * ceiling
            >= int(job["gas_limit"]) * int(job["max_fee_per_gas"])
        )
        assert (day["paid_wei"], day["settles"]) == (0, 0)
        reserved = day["reserved_wei"]
        w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    status, final = await call(daemon, "settle", body, token)
    assert status == 200 and final["success"] is True, final
    paid = int(
        await daemon.runtime.db.fetchval(
            "SELECT paid_wei FROM relay_transactions WHERE tx_hash = $1",
            bytes.fromhex(final["transaction"][2:]),
        )
    )
    assert paid > 0
    print(f"\none settle: gas limit {job['gas_limit']}, reserved {reserved} wei, paid {paid} wei")
    assert await gas_day(daemon, key_id) == {"reserved_wei": 0, "paid_wei": paid, "settles": 1}
    assert (
        await daemon.runtime.db.fetchval(
            "SELECT gas_reserved_wei FROM relay_jobs WHERE api_key_id = $1", key_id
        )
        is None
    )
    ledger = await ledger_summary(daemon.runtime.settings)
    mine = [k for k in ledger["facilitator"] if k["apiKey"] == name]
    today = {"settles": 1, "paidWei": str(paid), "reservedWei": "0"}
    assert mine == [{"apiKey": name, **today, "today": today}], ledger["facilitator"]


def _transfer(d: Daemon, key_id: int) -> NewJob:
    """The job of a new signed transfer of the test payer (not recorded)."""
    body = payment(d, fresh_address(), 1_000)

    def req(m: dict[str, Any]) -> Requirements:
        return Requirements(
            m["scheme"],
            m["network"],
            m["asset"],
            int(m["amount"]),
            m["payTo"],
            m["maxTimeoutSeconds"],
            m["extra"],
        )

    auth = body["paymentPayload"]["payload"]["authorization"]
    authorization = TransferAuthorization(
        auth["from"],
        auth["to"],
        int(auth["value"]),
        int(auth["validAfter"]),
        int(auth["validBefore"]),
        bytes.fromhex(auth["nonce"][2:]),
        bytes.fromhex(body["paymentPayload"]["payload"]["signature"][2:]),
    )
    r = req(body["paymentRequirements"])
    verified = d.runtime.facilitator.check(Payment(r, r, authorization), int(time.time()))
    assert isinstance(verified, VerifiedTransfer), verified
    return _transfer_job(verified, key_id, 0)


async def test_a_rejected_job_gives_its_reservation_back_and_concurrent_ones_never_pass_the_budget(
    daemon: Daemon,
) -> None:
    """At the store, on the daemon's database (each job is rejected at once, long before the
    sweeper would take it as an orphan: none is ever sent)."""
    jobs = daemon.runtime.jobs
    _, _, key_id = await new_key(daemon, "facilitator")
    now = int(time.time())
    ceiling, budget = 1_000_000, 3_000_000

    def gas() -> GasReservation:
        return GasReservation(key_id, utc_day(now), ceiling, budget, seconds_to_utc_midnight(now))

    async def attempt(new: NewJob) -> int | None:
        try:
            job, owned = await jobs.reserve(new, gas=gas())
        except GasBudgetExhausted:
            return None
        assert owned and job.gas_reserved_wei == ceiling
        return job.id

    news = [_transfer(daemon, key_id) for _ in range(8)]
    ids = await asyncio.gather(*(attempt(n) for n in news))
    taken = [i for i in ids if i is not None]
    try:
        assert len(taken) == 3, ids  # 3 ceilings fit in the budget, whatever the interleaving
        assert await jobs_of(daemon, key_id) == 3  # the refused ones recorded nothing
        assert await gas_day(daemon, key_id) == {"reserved_wei": 3 * ceiling, "paid_wei": 0, "settles": 0}
        first = taken[0]
        rejected = await jobs.move(first, JobState.REJECTED)
        assert rejected is not None and rejected.gas_reserved_wei is None
        assert await gas_day(daemon, key_id) == {"reserved_wei": 2 * ceiling, "paid_wei": 0, "settles": 0}
        # The identical request re-opens the rejected job, which reserves again.
        again = await attempt(news[ids.index(first)])
        assert again == first
        assert await gas_day(daemon, key_id) == {"reserved_wei": 3 * ceiling, "paid_wei": 0, "settles": 0}
        assert await attempt(news[ids.index(None)]) is None
    finally:
        for job_id in taken:
            await jobs.move(job_id, JobState.REJECTED)
    assert await gas_day(daemon, key_id) == {"reserved_wei": 0, "paid_wei": 0, "settles": 0}


def _relayer(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "RELAYER_DATABASE_URL": d.runtime.dsn,
        "RELAYER_CHAIN_ID": str(d.chain["chainId"]),
    }
    return subprocess.run([str(RELAYER), *args], env=env, capture_output=True, text=True, timeout=60)


async def test_the_cli_creates_a_scoped_key_with_its_limits_and_refuses_bad_ones(daemon: Daemon) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    args = ("apikey", "create", "--name", name, "--scope", "facilitator", "--scope", "marketplace")
    done = await asyncio.to_thread(_relayer, daemon, *args, "--rate", "5/second", "--gas-budget-wei", "7")
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert token.startswith("mk_") and token not in done.stderr
    row = await daemon.runtime.db.fetchrow(
        "SELECT scopes, rate_limit, gas_budget_wei_per_day, key_hash FROM api_keys WHERE name = $1", name
    )
    assert (sorted(row["scopes"]), row["rate_limit"], int(row["gas_budget_wei_per_day"])) == (
        ["facilitator", "marketplace"],
        "5/second",
        7,
    )
    assert bytes(row["key_hash"]) != token.encode()  # only its hash is stored
    status, answer = await call(daemon, "verify", payment(daemon, fresh_address(), 1_000), token)
    assert status == 200 and answer["isValid"] is True, answer
    plain = await asyncio.to_thread(_relayer, daemon, "apikey", "create", "--name", f"{name}-plain")
    assert plain.returncode == 0, plain.stderr
    scopes = await daemon.runtime.db.fetchval("SELECT scopes FROM api_keys WHERE name = $1", f"{name}-plain")
    assert scopes == ["marketplace"]  # the default: existing usage unchanged
    for bad in (("--rate", "fast"), ("--gas-budget-wei", "-1"), ("--scope", "admin")):
        refused = await asyncio.to_thread(_relayer, daemon, "apikey", "create", "--name", "bad", *bad)
        assert refused.returncode == 2, (bad, refused.stdout, refused.stderr)
        assert not refused.stdout.strip()
    ledger = await asyncio.to_thread(_relayer, daemon, "ledger")
    assert ledger.returncode == 0, ledger.stderr
    assert isinstance(json.loads(ledger.stdout)["facilitator"], list)


async def test_a_settle_cancelled_unsigned_gives_its_reservation_back(daemon: Daemon) -> None:
    """With no wait the job is cancelled (rejected) before the broadcaster signs it, as a rule
    (see test_facilitator): its reservation is given back at once and nothing is paid."""
    token, _, key_id = await new_key(daemon, "facilitator")
    facilitator = daemon.runtime.facilitator
    wait, facilitator.settle_wait_s = facilitator.settle_wait_s, 0.0
    cancelled = 0
    try:
        for _ in range(5):
            status, answer = await call(daemon, "settle", payment(daemon, fresh_address(), 1_500), token)
            assert status == 200, answer
            if answer["success"] is False and answer["errorReason"] == "unexpected_settle_error":
                cancelled += 1
                break
    finally:
        facilitator.settle_wait_s = wait
    assert cancelled == 1, "no settle was cancelled unsigned"
    rows = await daemon.runtime.db.fetch(
        "SELECT state, gas_reserved_wei FROM relay_jobs WHERE api_key_id = $1 AND state = 'rejected'", key_id
    )
    assert len(rows) == 1 and rows[0]["gas_reserved_wei"] is None, rows
    await asyncio.sleep(2)  # the ones signed before the cancel (if any) are mined by now
    day = await gas_day(daemon, key_id)
    assert day is not None and day["reserved_wei"] == 0, day


async def test_an_operator_lists_revokes_and_rotates_keys_and_every_process_obeys_at_once(
    daemon: Daemon, tmp_path: Path
) -> None:
    """Issue 35, finding 7: ``relayer apikey list`` shows a key (id, name, scopes, rate, gas
    budget, created, last used; never the secret or its hash); ``revoke`` refuses the key's
    next request at once in this process and in a ``relayer serve`` beside it; ``rotate`` gives
    a new key with the same limits and takes the old one back."""
    name = f"ops-{uuid.uuid4().hex[:8]}"
    created = await asyncio.to_thread(
        _relayer, daemon, "apikey", "create", "--name", name, "--scope", "facilitator", "--rate", "9/second"
    )
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    body = payment(daemon, fresh_address(), 1_000)
    env = daemon_env(daemon.chain, daemon.runtime.dsn)
    other = await DaemonProcess("serve", env, tmp_path / "serve.log").start()
    try:
        for base in (daemon.base_url, other.base):  # both processes take it, and its use shows
            async with daemon.session.post(
                f"{base}/facilitator/verify", json=body, headers={"Authorization": f"Bearer {token}"}
            ) as r:
                assert r.status == 200, await r.text()
        listed = await asyncio.to_thread(_relayer, daemon, "apikey", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        # mk_<prefix>_<secret>: the url-safe secret may hold "_" itself (split once past the prefix)
        _mk, prefix, secret = token.split("_", 2)
        assert len(secret) == 43 and token not in listed.stdout and secret not in listed.stdout
        mine = next(k for k in json.loads(listed.stdout) if k["name"] == name)
        assert mine["scopes"] == ["facilitator"] and mine["rateLimit"] == "9/second", mine
        assert mine["prefix"] == prefix and mine["revokedAt"] is None, mine
        assert mine["lastUsedAt"] is not None and mine["createdAt"], mine
        table = await asyncio.to_thread(_relayer, daemon, "apikey", "list")
        assert table.returncode == 0 and name in table.stdout and "last used" in table.stdout, table

        rotated = await asyncio.to_thread(_relayer, daemon, "apikey", "rotate", str(mine["id"]))
        assert rotated.returncode == 0, rotated.stderr
        fresh = rotated.stdout.strip()
        assert fresh.startswith("mk_") and fresh != token
        for base in (daemon.base_url, other.base):  # the old key is refused at once, the new one taken
            for bearer, expected in ((token, 401), (fresh, 200)):
                async with daemon.session.post(
                    f"{base}/facilitator/verify", json=body, headers={"Authorization": f"Bearer {bearer}"}
                ) as r:
                    assert r.status == expected, (base, expected, await r.text())
        keys = json.loads((await asyncio.to_thread(_relayer, daemon, "apikey", "list", "--json")).stdout)
        new = next(k for k in keys if k["name"] == name and k["revokedAt"] is None)
        assert (new["scopes"], new["rateLimit"]) == (mine["scopes"], mine["rateLimit"]), new

        revoked = await asyncio.to_thread(_relayer, daemon, "apikey", "revoke", str(new["id"]))
        assert revoked.returncode == 0 and "revoked" in revoked.stdout, revoked
        for base in (daemon.base_url, other.base):
            async with daemon.session.post(
                f"{base}/facilitator/verify", json=body, headers={"Authorization": f"Bearer {fresh}"}
            ) as r:
                assert r.status == 401, await r.text()
        again = await asyncio.to_thread(_relayer, daemon, "apikey", "rotate", str(new["id"]))
        assert again.returncode == 2 and "not a live key" in again.stderr, again  # nothing to rotate
        missing = await asyncio.to_thread(_relayer, daemon, "apikey", "revoke", "999999999")
        assert missing.returncode == 2 and "no API key" in missing.stderr, missing
    finally:
        other.stop()
