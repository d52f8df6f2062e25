"""Committed contract artifacts equal a fresh compile; migrations apply to a fresh database,
concurrently and twice, and give the declared tables."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from relayer.store.migrations import migrate
from relayer_dev import devdb

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
