"""The private dev cluster: start, reuse, scratch databases, stop; the system cluster untouched."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from relayer_dev import devdb

SYSTEM_CLUSTER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state directory outside pytest's base temporary directory: run as root, the cluster
    runs as ``postgres``, which must traverse every parent, and any pytest starting meanwhile
    takes search permission off ``/tmp/pytest-of-root`` again (the cluster's ``pg_ctl`` then
    reads neither its data directory nor ``postmaster.pid``)."""
    made = Path(tempfile.mkdtemp(prefix="relayer_devdb_"))
    try:
        yield made / "devdata"
    finally:
        shutil.rmtree(made, ignore_errors=True)


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
def test_private_cluster_lifecycle(state_dir: Path) -> None:
    system_before = _system_cluster_fingerprint()

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


def _postmaster_gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie nobody reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_private_cluster_is_durable_and_comes_back_on_its_port_after_a_kill_9(state_dir: Path) -> None:
    """Issue 18: the dev cluster ran with fsync, full_page_writes and synchronous_commit off
    (a kill -9 test proved reconnection, not durability), and after a kill -9 it started on
    another port, so a running daemon lost its database."""
    url = devdb.ensure_database_url(None, state_dir)
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT name, setting FROM pg_settings "
                "WHERE name IN ('fsync', 'full_page_writes', 'synchronous_commit') ORDER BY name"
            ).fetchall()
        assert rows == [("fsync", "on"), ("full_page_writes", "on"), ("synchronous_commit", "on")]
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            conn.execute("INSERT INTO kept VALUES (42)")  # acknowledged: it must survive the kill
        sessions = [psycopg.connect(url, connect_timeout=5) for _ in range(3)]  # cut by the kill
        pid = int((state_dir / "pg" / "data" / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not _postmaster_gone(pid):
            assert time.monotonic() < deadline, "the postmaster outlived SIGKILL"
            time.sleep(0.1)
        for session in sessions:
            session.close()  # the killed server's side of each closed first: TIME_WAIT on its port
        again = devdb.ensure_database_url(None, state_dir)
        print(f"\nport before the kill -9: {urlsplit(url).port}, after: {urlsplit(again).port}")
        assert again == url, "the cluster came back on another port"
        with psycopg.connect(url, connect_timeout=5) as conn:
            assert conn.execute("SELECT x FROM kept").fetchall() == [(42,)]
    finally:
        devdb.stop_private_cluster(state_dir)


def test_a_port_whose_last_connections_are_in_time_wait_is_free_for_postgres() -> None:
    """Issue 18: the recorded port was probed without ``SO_REUSEADDR``, which postgres sets, so
    the TIME_WAIT connections a killed server leaves made a restart choose another port."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((devdb.HOST, 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection((devdb.HOST, port), timeout=5)
        served, _ = listener.accept()
        served.close()  # the server side closes first: its end waits in TIME_WAIT
        time.sleep(0.1)
        client.close()
    time.sleep(0.1)
    with socket.socket() as plain, pytest.raises(OSError):  # what the probe did
        plain.bind((devdb.HOST, port))
    assert devdb._port_is_free(port)
