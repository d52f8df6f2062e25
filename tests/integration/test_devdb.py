"""The private dev cluster: start, reuse, scratch databases, stop; the system cluster untouched."""

from __future__ import annotations

import importlib.util
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from relayer_dev import devdb

SYSTEM_CLUSTER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _system_cluster_fingerprint() -> tuple[str, str] | None:
    """Start time and data directory of the machine's own Postgres, or None if there is none."""
    try:
        with psycopg.connect(SYSTEM_CLUSTER_URL, connect_timeout=3) as conn:
            row = conn.execute(
                "SELECT pg_postmaster_start_time()::text, current_setting('data_directory')"
            ).fetchone()
    except psycopg.OperationalError:
        return None
    assert row is not None
    return row[0], row[1]


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_private_cluster_lifecycle(tmp_path: Path) -> None:
    system_before = _system_cluster_fingerprint()
    state_dir = tmp_path / "devdata"

    started = time.monotonic()
    url = devdb.ensure_database_url(None, state_dir)
    start_seconds = time.monotonic() - started
    try:
        parts = urlsplit(url)
        assert parts.scheme == "postgresql"
        assert parts.hostname == "127.0.0.1"
        assert parts.username == "postgres"
        assert parts.password is None
        assert parts.path == "/relayer"
        assert parts.port is not None
        assert parts.port != 5432
        assert (state_dir / "pg" / "port").read_text().strip() == str(parts.port)
        assert (state_dir / "pg" / "run" / f".s.PGSQL.{parts.port}").is_socket()

        with psycopg.connect(url, connect_timeout=5) as conn:
            row = conn.execute("SELECT 1, current_database(), current_setting('data_directory')").fetchone()
        assert row is not None
        assert row[0] == 1
        assert row[1] == "relayer"
        assert Path(row[2]) == (state_dir / "pg" / "data").resolve()

        # A second call reuses the running cluster; an explicit URL is returned untouched.
        assert devdb.ensure_database_url(None, state_dir) == url
        explicit = "postgresql://someone:secret@db.example:6543/elsewhere"
        assert devdb.ensure_database_url(explicit, state_dir) == explicit

        scratch_url = devdb.create_scratch_database(url)
        scratch = urlsplit(scratch_url)
        name = scratch.path.lstrip("/")
        assert name.startswith("relayer_test_")
        assert (scratch.hostname, scratch.port, scratch.username) == (
            parts.hostname,
            parts.port,
            parts.username,
        )
        other_url = devdb.create_scratch_database(url)
        assert other_url != scratch_url
        devdb.drop_database(url, urlsplit(other_url).path.lstrip("/"))

        # An open session does not stop the drop (WITH (FORCE)).
        holder = psycopg.connect(scratch_url, connect_timeout=5)
        try:
            holder.execute("CREATE TABLE t (x int)")
            holder.commit()
            devdb.drop_database(url, name)
        finally:
            holder.close()
        with psycopg.connect(url, connect_timeout=5) as conn:
            left = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone()
        assert left == (0,)
        devdb.drop_database(url, name)  # already gone: a no-op

        with pytest.raises(ValueError):
            devdb.drop_database(url, "relayer")
        with pytest.raises(ValueError):
            devdb.create_scratch_database(url, prefix='x"; DROP')

        # A restart (for fault tests) drops every session and comes back on the same port.
        session = psycopg.connect(url, connect_timeout=5)
        try:
            devdb.restart_private_cluster(state_dir)
            with pytest.raises(psycopg.OperationalError):
                session.execute("SELECT 1")
        finally:
            session.close()
        assert devdb.ensure_database_url(None, state_dir) == url
        with psycopg.connect(url, connect_timeout=5) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        assert devdb.stop_private_cluster(state_dir) is True

    assert devdb.stop_private_cluster(state_dir) is False
    with pytest.raises(devdb.DevDbError):
        devdb.restart_private_cluster(state_dir)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=3)
    assert _system_cluster_fingerprint() == system_before
    assert start_seconds < 30, f"private cluster took {start_seconds:.1f} s to start"


def test_no_binaries_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devdb, "_DEBIAN_PG_ROOT", tmp_path / "none")
    monkeypatch.setattr(shutil, "which", lambda *_args, **_kw: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda *_args, **_kw: None)
    with pytest.raises(RuntimeError, match="install PostgreSQL or set RELAYER_DATABASE_URL"):
        devdb.ensure_database_url(None, tmp_path / "devdata")
    assert not (tmp_path / "devdata" / "pg" / "data").exists()
