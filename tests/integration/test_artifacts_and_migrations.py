"""Committed contract artifacts equal a fresh compile; migrations apply to a fresh database,
concurrently and twice, and give the declared tables; migration 0027 keeps the gas budget rows
of an older one-chain database."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from relayer.admin import create_api_key
from relayer.config import Settings
from relayer.store.migrations import migrate
from relayer.store.pool import Database
from relayer.store.relay_jobs import RelayJobs
from relayer_dev import devdb
from tests.helpers.jobs import new_job

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def test_committed_artifacts_match_a_fresh_compile() -> None:
    done = subprocess.run(
        ["node", "contracts/compile.js", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_migrations_are_safe_concurrently_and_idempotent(admin_database_url: str) -> None:
    dsn = devdb.create_scratch_database(admin_database_url, prefix="relayer_migrate")
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(migrate, [dsn] * 4))
        assert sorted(len(r) for r in results) == [0, 0, 0, len(list((ROOT / "migrations").glob("*.sql")))]
        assert migrate(dsn) == []
        with psycopg.connect(dsn) as conn:
            tables = {
                r[0]
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
                )
            }
        assert {
            "relay_jobs",
            "spent_salts",
            "relay_transactions",
            "executor_nonces",
            "retirements",
            "indexer_cursor",
        } <= tables
    finally:
        devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])


def test_migration_failures_say_what_failed(admin_database_url: str, tmp_path: Path) -> None:
    from relayer.config import ConfigError

    (tmp_path / "0001_broken.sql").write_text("-- depends:\nSELEC broken;\n")
    dsn = devdb.create_scratch_database(admin_database_url, prefix="relayer_migrate")
    try:
        with pytest.raises(psycopg.errors.SyntaxError):  # the SQL's own error, not "a bad URL"
            migrate(dsn, tmp_path)
    finally:
        devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])
    with pytest.raises(ConfigError, match="RELAYER_DATABASE_URL"):
        migrate("host=127.0.0.1 nosuchoption=1")
    with pytest.raises(ConfigError) as exc:  # issue 37: the start-up line, password left out
        migrate("postgresql://someone:hunter2@127.0.0.1:1/nowhere")
    assert exc.value.message == (
        "RELAYER_DATABASE_URL postgresql://someone@127.0.0.1:1/nowhere: connection refused; "
        "is Postgres running, and listening on that port?"
    )


def test_the_per_chain_gas_budget_migration_keeps_a_one_chain_databases_rows(
    admin_database_url: str, tmp_path: Path
) -> None:
    """Migration 0027 on a database of an older release: each gas budget row takes the chain of
    its key's jobs (a key without jobs, the database's chain), and the job-end trigger then
    settles in that chain's row."""
    before = tmp_path / "migrations"
    before.mkdir()
    for path in sorted((ROOT / "migrations").glob("*.sql")):
        if path.name < "0027":
            (before / path.name).write_text(path.read_text())
    dsn = devdb.create_scratch_database(admin_database_url, prefix="relayer_migrate_0027")
    try:
        migrate(dsn, before)
        settings = Settings(database_url=dsn)
        names = ("with-jobs", "without-jobs")
        asyncio.run(_older_rows(settings, names))
        assert [p.name for p in (ROOT / "migrations").glob("0027*.sql")] and migrate(dsn) != []
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT k.name, d.chain_id FROM api_key_gas_days d JOIN api_keys k ON k.id = d.api_key_id "
                "ORDER BY k.name"
            ).fetchall()
            assert rows == [("with-jobs", 84532), ("without-jobs", 84532)]
            # the job ends: its reservation leaves its chain's row
            conn.execute("UPDATE relay_jobs SET state = 'rejected'")
            reserved = conn.execute(
                "SELECT reserved_wei FROM api_key_gas_days d JOIN api_keys k ON k.id = d.api_key_id "
                "WHERE k.name = 'with-jobs'"
            ).fetchone()
            assert reserved is not None and int(reserved[0]) == 0
    finally:
        devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])


async def _older_rows(settings: Settings, names: tuple[str, str]) -> None:
    """Two facilitator keys, a job of the first on 84532 holding 500 wei of its budget, and a
    budget row of each (as a release before migration 0027 wrote them)."""
    assert settings.database_url is not None
    for name in names:
        await create_api_key(settings, name, ["facilitator"])
    db = await Database.connect(settings.database_url.get_secret_value(), 1, 1)
    try:
        key_id = await db.fetchval("SELECT id FROM api_keys WHERE name = $1", names[0])
        other_id = await db.fetchval("SELECT id FROM api_keys WHERE name = $1", names[1])
        job = replace(new_job(b"\x01" * 32, tag=b"\x00" * 32, chain_id=84532), api_key_id=key_id)
        made, _ = await RelayJobs(db).reserve(job)
        today = dt.date.today()
        await db.execute(
            "UPDATE relay_jobs SET gas_reserved_wei = 500, gas_reserved_on = $2 WHERE id = $1", made.id, today
        )
        for k, reserved in ((key_id, 500), (other_id, 0)):
            await db.execute(
                "INSERT INTO api_key_gas_days (api_key_id, day, reserved_wei) VALUES ($1, $2, $3)",
                k,
                today,
                reserved,
            )
    finally:
        await db.close()
