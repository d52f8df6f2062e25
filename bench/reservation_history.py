"""The reservation's and the re-check's sums against a long history (issue 20): one payer and
one class credit with ``--history`` past jobs, each taken through every step (accepted to
indexed, one statement a step, as the daemon moves them), and ``--batch`` jobs in flight.
Autovacuum is off for the table: the figures are those of the time between two vacuums, when
each step's dead row versions are still indexed; a second set follows a ``VACUUM``.

Each sum is timed in its form before migrations 0022 and 0023 (one sum over an OR of the
in-flight and the mined parts; the payer's full index on (chain_id, payer, input_token)) and
in its form now (a sum a part, each over its partial index), on the same rows in one run:
the payer's sum and the supply's sum (each reservation takes them under that payer's and that
supply's lock) and what takes the supply before each job of a signing batch (the re-check).

    python bench/reservation_history.py --history 40000

Each form's answer must be the other's (the run stops otherwise). Prints a line a figure, then
one JSON line last: ``historyJobs``, ``batch`` and, for
``churned`` and ``vacuumed``, each sum's median milliseconds ``before`` and ``after`` and
their ratio."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relayer.store import relay_jobs as store  # noqa: E402
from relayer.store.migrations import migrate  # noqa: E402
from relayer_dev import devdb  # noqa: E402

CHAIN, PAYER, TOKEN, SUPPLY = 31337, "0xheavy", "0xusdc", (0, 1, 0)
STEPS = ("simulated", "signed", "submitted", "mined", "confirmed", "indexed")

# The forms before migrations 0022 and 0023 (relay_payer_reserved's and relay_supply_reserved's
# sums, and SUPPLY_AHEAD), for the comparison; the payer's is timed with the payer's indexes
# as they were (the full index, not migration 0023's two), in a transaction rolled back.
PAYER_BEFORE = """
SELECT coalesce(sum(auth_value), 0) FROM relay_jobs
WHERE chain_id = $1 AND payer = $2 AND input_token = $3 AND bound_nonce <> $5
  AND ((state IN ('accepted', 'simulated', 'signed', 'submitted')
        AND auth_expires_at > extract(epoch FROM now())::bigint - 60)
       OR (state IN ('mined', 'confirmed', 'indexed') AND block_number > $4))
"""
SUPPLY_BEFORE = """
SELECT coalesce(sum(supply_units), 0) FROM relay_jobs
WHERE chain_id = $1 AND supply_source = $2 AND supply_id = $3 AND supply_token_id = $4 AND bound_nonce <> $6
  AND ((state IN ('accepted', 'simulated', 'signed', 'submitted')
        AND auth_expires_at > extract(epoch FROM now())::bigint - 60)
       OR (state IN ('mined', 'confirmed', 'indexed') AND block_number > $5))
"""
AHEAD_BEFORE = """
SELECT b.id,
       coalesce(sum(o.supply_units) FILTER (WHERE o.state IN ('mined', 'confirmed', 'indexed')), 0)
           AS mined_after,
       coalesce(sum(o.supply_units)
                FILTER (WHERE o.state IN ('accepted', 'simulated', 'signed', 'submitted')), 0) AS ahead
FROM relay_jobs b
LEFT JOIN relay_jobs o
  ON o.chain_id = b.chain_id AND o.supply_source = b.supply_source AND o.supply_id = b.supply_id
 AND o.supply_token_id = b.supply_token_id AND o.id <> b.id
 AND ((o.state IN ('signed', 'submitted') AND o.auth_expires_at > extract(epoch FROM now())::bigint - 60)
      OR (o.state IN ('accepted', 'simulated') AND o.id < b.id
          AND o.auth_expires_at > extract(epoch FROM now())::bigint - 60)
      OR (o.state IN ('mined', 'confirmed', 'indexed') AND o.block_number > $2))
WHERE b.id = ANY($1::bigint[]) AND b.supply_units IS NOT NULL
GROUP BY b.id
"""
FULL_PAYER_INDEX = "CREATE INDEX bench_payer_full ON relay_jobs (chain_id, payer, input_token)"


async def fill(conn: asyncpg.Connection, history: int, batch: int) -> list[int]:
    """``history`` jobs of the payer and the supply taken through every step, then ``batch``
    simulated ones (returned: the signing batch), 20 jobs a block."""
    total = history + batch
    await conn.execute("ALTER TABLE relay_jobs SET (autovacuum_enabled = false)")
    await conn.execute(
        """
        INSERT INTO relay_jobs (chain_id, bound_nonce, salt, scheme, payer, input_token, auth_value,
          gas_allowance, request_hash, settlement, call_data, summary, auth_expires_at, state,
          supply_source, supply_id, supply_token_id, supply_units, block_number)
        SELECT $1, int8send(g), int8send(g), 'eip3009', $2, $3, 1, 0, '\\x00', '0xsettlement', '\\x',
               '{}', 9999999999, 'accepted', $4, $5, $6, 10, g / 20
        FROM generate_series(1, $7::bigint) g
        """,
        CHAIN,
        PAYER,
        TOKEN,
        *SUPPLY,
        total,
    )
    for step in STEPS:  # a statement a step, as the daemon moves its batches
        await conn.execute("UPDATE relay_jobs SET state = $1 WHERE id <= $2", step, history)
    await conn.execute("UPDATE relay_jobs SET state = 'simulated' WHERE id > $1", history)
    await conn.execute("ANALYZE relay_jobs")
    return [int(r["id"]) for r in await conn.fetch("SELECT id FROM relay_jobs WHERE id > $1", history)]


async def median_ms(
    conn: asyncpg.Connection, query: str, args: tuple[Any, ...], runs: int, answers: dict[str, Any], name: str
) -> float:
    """The median of ``runs`` executions' wall milliseconds, after one to warm up, whose
    answer must be the one ``answers`` holds for ``name`` (the other form's), or is kept there."""
    rows = await conn.fetch(query, *args)
    answer = sorted(tuple(row.values()) for row in rows)
    if answers.setdefault(name, answer) != answer:
        raise SystemExit(f"{name}: the two forms disagree: {answers[name]} against {answer}")
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await conn.fetch(query, *args)
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


async def measure(conn: asyncpg.Connection, ids: list[int], history: int, runs: int) -> dict[str, Any]:
    """Each sum before and after, on the rows as they are now."""
    block = history // 20 - 5  # the supply's and the payer's figure read 5 blocks back
    payer = (CHAIN, PAYER, TOKEN, block, b"new")
    supply = (CHAIN, *SUPPLY, block, b"new")
    answers: dict[str, Any] = {}
    before_schema = conn.transaction()  # the payer's indexes as before migration 0023, rolled back
    await before_schema.start()
    try:
        await conn.execute(FULL_PAYER_INDEX)
        await conn.execute("DROP INDEX relay_jobs_payer_in_flight, relay_jobs_payer_mined")
        before = {
            "payerSum": await median_ms(conn, PAYER_BEFORE, payer, runs, answers, "payerSum"),
            "supplySum": await median_ms(conn, SUPPLY_BEFORE, supply, runs, answers, "supplySum"),
            "supplyAhead": await median_ms(conn, AHEAD_BEFORE, (ids, block), runs, answers, "supplyAhead"),
        }
    finally:
        await before_schema.rollback()
    after = {
        "payerSum": await median_ms(conn, store.RESERVED_BY_PAYER, payer, runs, answers, "payerSum"),
        "supplySum": await median_ms(conn, store.RESERVED_SUPPLY, supply, runs, answers, "supplySum"),
        "supplyAhead": await median_ms(conn, store.SUPPLY_AHEAD, (ids, block), runs, answers, "supplyAhead"),
    }
    return {
        name: {"before": before[name], "after": after[name], "ratio": round(before[name] / after[name], 1)}
        for name in before
    }


async def main(args: argparse.Namespace) -> None:
    admin = devdb.ensure_database_url(os.environ.get("RELAYER_DATABASE_URL"), ROOT / ".devdata")
    dsn = devdb.create_scratch_database(admin, prefix="relayer_bench_history")
    try:
        migrate(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            started = time.monotonic()
            ids = await fill(conn, args.history, args.batch)
            took = time.monotonic() - started
            print(f"{args.history} past jobs through {len(STEPS)} steps in {took:.1f} s")
            result: dict[str, Any] = {"historyJobs": args.history, "batch": args.batch}
            for condition in ("churned", "vacuumed"):
                if condition == "vacuumed":
                    await conn.execute("VACUUM ANALYZE relay_jobs")
                result[condition] = await measure(conn, ids, args.history, args.runs)
                for name, figures in result[condition].items():
                    print(f"{condition:9s} {name:12s} before {figures['before']:8.2f} ms  "
                          f"after {figures['after']:7.2f} ms  ({figures['ratio']}x)")  # fmt: skip
        finally:
            await conn.close()
    finally:
        devdb.drop_database(admin, dsn.rsplit("/", 1)[1])
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--history", type=int, default=40_000, help="past jobs of the payer and the supply")
    parser.add_argument("--batch", type=int, default=17, help="jobs in flight (the signing batch)")
    parser.add_argument("--runs", type=int, default=7, help="timed runs a figure (the median)")
    asyncio.run(main(parser.parse_args()))
