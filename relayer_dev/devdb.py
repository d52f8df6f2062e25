"""Dev and test databases: a private throwaway Postgres cluster and scratch databases on it.

Owns ``<state_dir>/pg/`` (data directory, socket directory, server log, recorded port and
binary directory). Policy: an explicit DSN always wins and is never touched; otherwise one
private cluster per state directory is started once and reused, listening only on its own
unix socket and on 127.0.0.1; only this cluster is ever stopped. Every wait is bounded and
no DSN with a password is ever logged. Development tooling only: the daemon itself never
starts a database.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.util
import logging
import os
import pwd
import re
import secrets
import shlex
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from relayer_dev import DevError

log = logging.getLogger("relayer_dev.devdb")


class DevDbError(DevError):
    """The private cluster could not be found, initialised, started or stopped."""


DATABASE_NAME: Final = "relayer"
SUPERUSER: Final = "postgres"
HOST: Final = "127.0.0.1"

PG_CTL_WAIT_SECONDS: Final = 30
"""``pg_ctl -t``: how long start and stop may take before we give up."""
INITDB_TIMEOUT_SECONDS: Final = 120.0
LOCK_TIMEOUT_SECONDS: Final = 180.0
"""Longest wait for another process that is initialising or starting the same cluster."""
CONNECT_TIMEOUT_SECONDS: Final = 10
PORT_WAIT_SECONDS: Final = 15.0
"""Longest wait at start for the recorded port, or a killed postmaster, to be let go."""
_SUBPROCESS_SLACK_SECONDS: Final = 15.0
_START_ATTEMPTS: Final = 5
_RETRY_PAUSE_SECONDS: Final = 1.0
_TRANSIENT_START_ERRORS: Final = (
    "could not bind",
    "already in use",  # the port
    "still in use",  # the shared memory of a killed server's last backends
    "lock file",  # a killed postmaster not yet reaped
)
_MAX_SOCKET_PATH: Final = 100  # sun_path is 108 bytes; ".s.PGSQL.65535" is appended

_REQUIRED_BINARIES: Final = ("initdb", "pg_ctl", "postgres")
_DEBIAN_PG_ROOT = Path("/usr/lib/postgresql")  # holds <major>/bin; a variable so tests can move it
_RUN_AS_CANDIDATES: Final = ("postgres", "nobody")
_NAME_PATTERN: Final = re.compile(r"[a-z_][a-z0-9_]*")
_SCRATCH_HEX_CHARS: Final = 16
_SCRATCH_NAME_PATTERN: Final = re.compile(rf"[a-z_][a-z0-9_]*_[0-9a-f]{{{_SCRATCH_HEX_CHARS}}}")
_MAX_IDENTIFIER_LENGTH: Final = 63

_PG_STATUS_RUNNING: Final = 0
_CONF_NAME: Final = "relayer_devdb.conf"


# --- public API ---------------------------------------------------------------------------


def ensure_database_url(database_url: str | None, state_dir: Path, database: str = DATABASE_NAME) -> str:
    """Return a DSN to use: the given one, or one for a private cluster started on demand.

    With ``database_url`` set it is returned unchanged and nothing is started. Otherwise a
    private cluster under ``state_dir/pg`` is initialised (first time), started (if not
    running) or reused (if running), and ``database`` (default ``relayer``) is created on it. The cluster
    listens on a unix socket in ``state_dir/pg/run`` and on 127.0.0.1 at a TCP port chosen
    free the first time and recorded in ``state_dir/pg/port``: every later start (after a stop
    or a kill -9) reuses it, so running daemons find their database again; auth is ``trust``.
    It is as durable as a production server (``fsync``, ``full_page_writes`` and
    ``synchronous_commit`` on): crash tests against it prove durability. Running as root, the server runs
    as the ``postgres`` system user (``nobody`` if there is none). Binaries come from
    ``pg_config --bindir``, ``/usr/lib/postgresql/*/bin``, ``PATH``, then the ``pgserver``
    wheel. Concurrent callers on the same ``state_dir`` are serialised by a file lock.

    Args:
        database_url: An explicit DSN (``RELAYER_DATABASE_URL``), or None for a private one.
        state_dir: Directory for dev state, e.g. ``.devdata``; created if missing.
        database: the private cluster's database to use, a plain lower-case identifier.

    Returns:
        A DSN, e.g. ``postgresql://postgres@127.0.0.1:54329/relayer`` (no password).

    Raises:
        DevDbError: No PostgreSQL binaries were found, the cluster failed to initialise or
            start within its time limits (the message quotes the server log), or another
            program holds its recorded port.
        ValueError: ``database`` is not a plain lower-case identifier.
    """
    if database_url is not None:
        return database_url
    if not _NAME_PATTERN.fullmatch(database) or len(database) > _MAX_IDENTIFIER_LENGTH:
        raise ValueError(f"database name must match {_NAME_PATTERN.pattern}: {database!r}")
    cluster = _Cluster(state_dir)
    with cluster.locked():
        port = cluster.running_port()
        if port is None:
            port = cluster.start()
        else:
            log.info(
                "reusing private postgres cluster", extra={"data_dir": str(cluster.data_dir), "port": port}
            )
        _ensure_database(port, database)
    return _tcp_url(port, database)


def stop_private_cluster(state_dir: Path) -> bool:
    """Stop the private cluster of ``state_dir`` (``pg_ctl stop -m fast``) and nothing else.

    Args:
        state_dir: The same directory that was given to :func:`ensure_database_url`.

    Returns:
        True if the cluster was running and is now stopped; False if it was not running
        (or was never created).

    Raises:
        DevDbError: The server did not stop within the time limit.
    """
    cluster = _Cluster(state_dir)
    if not (cluster.data_dir / "PG_VERSION").is_file():
        return False
    with cluster.locked():
        if cluster.running_port() is None:
            return False
        cluster.stop()
    return True


def running_private_cluster(state_dir: Path) -> tuple[int, int | None, Path] | None:
    """The private cluster of ``state_dir`` when it runs: ``(port, postmaster pid, data
    directory)``; else None (also when it was never created). Reads only, takes no lock."""
    cluster = _Cluster(state_dir)
    if not (cluster.data_dir / "PG_VERSION").is_file():
        return None
    port = cluster.running_port()
    return None if port is None else (port, cluster._postmaster_pid(), cluster.data_dir)


def restart_private_cluster(state_dir: Path) -> None:
    """Restart the running private cluster of ``state_dir`` on the same port
    (``pg_ctl restart -m fast``): every connection is dropped, as when an operator restarts
    the server. For fault tests; a stop then a start (or a start after a kill -9) comes back
    on the same port too.

    Raises:
        DevDbError: The cluster is not running or did not come back within the time limit.
    """
    cluster = _Cluster(state_dir)
    with cluster.locked():
        if cluster.running_port() is None:
            raise DevDbError(f"no private postgres cluster is running in {cluster.data_dir}")
        cluster.restart()


def create_scratch_database(admin_url: str, prefix: str = "relayer_test", template: str | None = None) -> str:
    """Create a uniquely named database on the server of ``admin_url``: empty, or a copy of
    ``template`` (``CREATE DATABASE … TEMPLATE``; nothing may be connected to it meanwhile).

    The name is ``<prefix>_<16 hex digits>``, generated here (never taken from input).

    Args:
        admin_url: DSN of a role allowed to ``CREATE DATABASE`` (URL or ``key=value`` form).
        prefix: Lower-case identifier the name starts with (``[a-z_][a-z0-9_]*``).
        template: The name of a database made here to copy (a generated scratch name).

    Returns:
        The DSN of the new database: ``admin_url`` with only the database name replaced.

    Raises:
        ValueError: ``prefix`` is not a plain lower-case identifier or is too long, or
            ``template`` is not a generated scratch name.
        psycopg.Error: The server refused.
    """
    if template is not None and not _SCRATCH_NAME_PATTERN.fullmatch(template):
        raise ValueError(f"template must be a scratch database's name: {template!r}")
    if not _NAME_PATTERN.fullmatch(prefix):
        raise ValueError(f"database prefix must match {_NAME_PATTERN.pattern}: {prefix!r}")
    name = f"{prefix}_{secrets.token_hex(_SCRATCH_HEX_CHARS // 2)}"
    if len(name) > _MAX_IDENTIFIER_LENGTH:
        raise ValueError(f"database prefix too long ({len(prefix)} characters): {prefix!r}")
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
        conn.execute(create)
    log.info("scratch database created", extra={"database": name, "template": template})
    return _with_database(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop a database made by :func:`create_scratch_database`, closing its sessions.

    Uses ``DROP DATABASE IF EXISTS ... WITH (FORCE)``; dropping one that is gone is a no-op.

    Args:
        admin_url: DSN of a role allowed to drop it, connected to another database.
        name: The database name (the last path segment of the scratch DSN).

    Raises:
        ValueError: ``name`` does not have the shape of a generated scratch name.
        psycopg.Error: The server refused.
    """
    if not _SCRATCH_NAME_PATTERN.fullmatch(name) or len(name) > _MAX_IDENTIFIER_LENGTH:
        raise ValueError(f"not a scratch database name: {name!r}")
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    log.info("scratch database dropped", extra={"database": name})


# --- the private cluster -----------------------------------------------------------------


class _Cluster:
    """Paths and processes of the private cluster under ``<state_dir>/pg``."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir.resolve() / "pg"
        self.data_dir = self.root / "data"
        self.run_dir = self.root / "run"
        self.log_file = self.root / "postgres.log"
        self.port_file = self.root / "port"
        self.bindir_file = self.root / "bindir"
        self.lock_file = self.root / ".lock"
        self.run_as = _run_as_user()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock on this cluster's directory (bounded wait)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self.lock_file.open("a") as fh:
            deadline = time.monotonic() + LOCK_TIMEOUT_SECONDS
            while True:
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise DevDbError(
                            f"timed out after {LOCK_TIMEOUT_SECONDS:.0f} s waiting for {self.lock_file}"
                        ) from None
                    time.sleep(0.1)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def running_port(self) -> int | None:
        """The TCP port of the running server, or None if it is not running (a postmaster
        killed and not yet reaped is not running, though ``pg_ctl status`` says it is)."""
        pid_file = self.data_dir / "postmaster.pid"
        if not pid_file.is_file():
            return None
        pid = self._postmaster_pid()
        if pid is not None and _is_zombie(pid):
            return None
        bindir = self._recorded_bindir()
        if bindir is None:
            return None
        status = self._pg_ctl(bindir, ["status"], timeout=_SUBPROCESS_SLACK_SECONDS)
        if status.returncode != _PG_STATUS_RUNNING:
            return None
        # postmaster.pid: line 4 is the port the server listens on.
        lines = pid_file.read_text(encoding="utf-8", errors="replace").splitlines()
        if len(lines) >= 4 and lines[3].strip().isdigit():
            return int(lines[3].strip())
        return int(self.port_file.read_text().strip())

    def start(self) -> int:
        """Initialise if needed and start the server; returns its TCP port."""
        bindir = _find_bindir()
        self._prepare_dirs(bindir)
        if not (self.data_dir / "PG_VERSION").is_file():
            self._initdb(bindir)
        self.bindir_file.write_text(f"{bindir}\n", encoding="utf-8")
        started = time.monotonic()
        self._await_killed_postmaster()
        port = self._choose_port()
        self._write_settings(port)
        self.port_file.write_text(f"{port}\n", encoding="utf-8")
        last_error = ""
        for attempt in range(_START_ATTEMPTS):
            if attempt:
                time.sleep(_RETRY_PAUSE_SECONDS)
            logged = self.log_file.stat().st_size if self.log_file.exists() else 0
            result = self._pg_ctl(
                bindir,
                ["start", "-w", "-t", str(PG_CTL_WAIT_SECONDS), "-s", "-l", str(self.log_file)],
                timeout=PG_CTL_WAIT_SECONDS + _SUBPROCESS_SLACK_SECONDS,
            )
            if result.returncode == 0:
                log.info(
                    "private postgres cluster started",
                    extra={
                        "data_dir": str(self.data_dir),
                        "port": port,
                        "seconds": round(time.monotonic() - started, 2),
                    },
                )
                return port
            last_error = f"{result.stderr.strip()}\n{_tail(self.log_file)}"
            this_start = f"{result.stderr}\n{_read_from(self.log_file, logged)}"
            if not any(sign in this_start for sign in _TRANSIENT_START_ERRORS):
                break
            log.warning("postgres did not start yet on its port, retrying", extra={"port": port})
        raise DevDbError(f"private postgres cluster in {self.data_dir} failed to start:\n{last_error}")

    def stop(self) -> None:
        """Fast shutdown (``pg_ctl stop -m fast``), waiting at most ``PG_CTL_WAIT_SECONDS``."""
        bindir = self._recorded_bindir() or _find_bindir()
        result = self._pg_ctl(
            bindir,
            ["stop", "-m", "fast", "-w", "-t", str(PG_CTL_WAIT_SECONDS), "-s"],
            timeout=PG_CTL_WAIT_SECONDS + _SUBPROCESS_SLACK_SECONDS,
        )
        if result.returncode != 0:
            raise DevDbError(
                f"private postgres cluster in {self.data_dir} did not stop: {result.stderr.strip()}"
            )
        log.info("private postgres cluster stopped", extra={"data_dir": str(self.data_dir)})

    def restart(self) -> None:
        """Fast restart on the recorded port, waiting at most ``PG_CTL_WAIT_SECONDS``."""
        bindir = self._recorded_bindir() or _find_bindir()
        started = time.monotonic()
        result = self._pg_ctl(
            bindir,
            ["restart", "-m", "fast", "-w", "-t", str(PG_CTL_WAIT_SECONDS), "-s", "-l", str(self.log_file)],
            timeout=2 * PG_CTL_WAIT_SECONDS + _SUBPROCESS_SLACK_SECONDS,
        )
        if result.returncode != 0:
            raise DevDbError(
                f"private postgres cluster in {self.data_dir} did not restart: "
                f"{result.stderr.strip()}\n{_tail(self.log_file)}"
            )
        log.info(
            "private postgres cluster restarted",
            extra={"data_dir": str(self.data_dir), "seconds": round(time.monotonic() - started, 2)},
        )

    # --- helpers ---------------------------------------------------------------------

    def _prepare_dirs(self, bindir: Path) -> None:
        socket_path = self.run_dir / ".s.PGSQL.65535"
        if len(os.fsencode(socket_path)) > _MAX_SOCKET_PATH:
            raise DevDbError(
                f"state directory path too long for a unix socket ({socket_path}); use a shorter one"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.chmod(0o700)
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            for path in (self.root, self.run_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            if self.log_file.exists():
                os.chown(self.log_file, entry.pw_uid, entry.pw_gid)
            _grant_traverse(self.root, entry)
            _grant_traverse(bindir, entry)

    def _initdb(self, bindir: Path) -> None:
        if self.data_dir.exists():
            # A data directory without PG_VERSION is what an interrupted initdb leaves behind.
            log.warning("removing incomplete data directory", extra={"data_dir": str(self.data_dir)})
            shutil.rmtree(self.data_dir)
        log.info("initialising private postgres cluster", extra={"data_dir": str(self.data_dir)})
        started = time.monotonic()
        result = self._run(
            [
                str(bindir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            timeout=INITDB_TIMEOUT_SECONDS,
        )
        if result.returncode != 0:
            raise DevDbError(f"initdb failed for {self.data_dir}:\n{result.stdout}\n{result.stderr}")
        with (self.data_dir / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(
                f"\n# Settings of the relayer dev cluster (port, sockets).\ninclude = '{_CONF_NAME}'\n"
            )
        log.info("initdb done", extra={"seconds": round(time.monotonic() - started, 2)})

    def _write_settings(self, port: int) -> None:
        conf = self.data_dir / _CONF_NAME
        conf.write_text(
            "# Written by relayer_dev.devdb on every start; edits are lost.\n"
            f"listen_addresses = '{HOST}'\n"
            f"port = {port}\n"
            f"unix_socket_directories = {_conf_quote(str(self.run_dir))}\n"
            "max_connections = 200\n"
            "# Durable as a production server (fsync, full_page_writes and synchronous_commit are\n"
            "# on by default): a crash test of this cluster proves durability, not only reconnection.\n",
            encoding="utf-8",
        )
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            os.chown(conf, entry.pw_uid, entry.pw_gid)

    def _choose_port(self) -> int:
        """The recorded port, so that a restart (after a kill -9, say) comes back where running
        daemons look for it, waiting up to :data:`PORT_WAIT_SECONDS` for it to be let go;
        a free port the first time.

        Raises:
            DevDbError: another program holds the recorded port.
        """
        text = self.port_file.read_text().strip() if self.port_file.is_file() else ""
        if text.isdigit():
            recorded = int(text)
            deadline = time.monotonic() + PORT_WAIT_SECONDS
            while not _port_is_free(recorded):
                if time.monotonic() > deadline:
                    raise DevDbError(
                        f"the private postgres cluster's port {recorded} (recorded in {self.port_file}) is "
                        f"held by another program: free it, or delete {self.port_file} to start on a new port"
                    )
                time.sleep(0.2)
            return recorded
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
            return port

    def _postmaster_pid(self) -> int | None:
        """The process id in ``postmaster.pid`` (line 1), if there is one."""
        try:
            first = (self.data_dir / "postmaster.pid").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        lines = first.splitlines()
        return int(lines[0]) if lines and lines[0].strip().isdigit() else None

    def _await_killed_postmaster(self) -> None:
        """Wait, up to :data:`PORT_WAIT_SECONDS`, for a killed postmaster that its parent has
        not reaped yet to be gone: postgres takes a live process id in ``postmaster.pid`` for
        a running server and would refuse to start."""
        pid = self._postmaster_pid()
        deadline = time.monotonic() + PORT_WAIT_SECONDS
        while pid is not None and _is_zombie(pid) and time.monotonic() < deadline:
            time.sleep(0.1)

    def _recorded_bindir(self) -> Path | None:
        if self.bindir_file.is_file():
            bindir = Path(self.bindir_file.read_text(encoding="utf-8").strip())
            if (bindir / "pg_ctl").is_file():
                return bindir
        return None

    def _pg_ctl(self, bindir: Path, args: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        return self._run([str(bindir / "pg_ctl"), "-D", str(self.data_dir), *args], timeout=timeout)

    def _run(self, argv: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        if self.run_as is not None:
            if shutil.which("runuser"):
                argv = ["runuser", "-u", self.run_as, "--", *argv]
            else:
                argv = ["su", "-s", "/bin/sh", self.run_as, "-c", shlex.join(argv)]
        try:
            return subprocess.run(
                argv,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise DevDbError(
                f"{Path(argv[0]).name} timed out after {timeout:.0f} s: {shlex.join(argv)}"
            ) from exc


# --- module helpers ----------------------------------------------------------------------


def _find_bindir() -> Path:
    """The first directory holding initdb, pg_ctl and postgres, in the documented order."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out:
                candidates.append(Path(out))
    if _DEBIAN_PG_ROOT.is_dir():
        versions = [p for p in _DEBIAN_PG_ROOT.iterdir() if p.name.isdigit()]
        candidates.extend(p / "bin" for p in sorted(versions, key=lambda p: int(p.name), reverse=True))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    pgserver = importlib.util.find_spec("pgserver")
    if pgserver is not None and pgserver.submodule_search_locations:
        candidates.extend(Path(p) / "pginstall" / "bin" for p in pgserver.submodule_search_locations)
    for bindir in candidates:
        if all(os.access(bindir / name, os.X_OK) for name in _REQUIRED_BINARIES):
            log.debug("postgres binaries found", extra={"bindir": str(bindir)})
            return bindir
    raise DevDbError(
        "no PostgreSQL server binaries found (looked at pg_config --bindir, /usr/lib/postgresql/*/bin, "
        "PATH and the pgserver wheel): install PostgreSQL or set RELAYER_DATABASE_URL"
    )


def _run_as_user() -> str | None:
    """The OS user the server runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in _RUN_AS_CANDIDATES:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise DevDbError("running as root, but there is no 'postgres' or 'nobody' user to run postgres as")


def _grant_traverse(path: Path, entry: pwd.struct_passwd) -> None:
    """Let ``entry`` reach ``path``: add o+x to every ancestor that would stop it."""
    for directory in reversed(path.parents):
        st = directory.stat()
        if st.st_uid == entry.pw_uid:
            reachable = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid == entry.pw_gid:
            reachable = bool(st.st_mode & stat.S_IXGRP)
        else:
            reachable = bool(st.st_mode & stat.S_IXOTH)
        if not reachable:
            log.info(
                "granting search permission (o+x)", extra={"path": str(directory), "user": entry.pw_name}
            )
            directory.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)


def _port_is_free(port: int) -> bool:
    """Whether postgres could listen on ``port``: bound with ``SO_REUSEADDR`` as postgres binds
    it, so the closing connections of a killed server (TIME_WAIT) do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _is_zombie(pid: int) -> bool:
    """Whether process ``pid`` has exited and awaits its parent's reaping (Linux ``/proc``;
    False elsewhere or when there is no such process)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    fields = stat_line.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] in ("Z", "X")


def _ensure_database(port: int, name: str) -> None:
    """Create database ``name`` (a constant of this module) if it does not exist."""
    with psycopg.connect(
        _tcp_url(port, "postgres"), autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS
    ) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            log.info("database created", extra={"database": name, "port": port})


def _tcp_url(port: int, database: str) -> str:
    return f"postgresql://{SUPERUSER}@{HOST}:{port}/{database}"


def _with_database(dsn: str, name: str) -> str:
    """``dsn`` with its database name replaced, in the same form (URL or ``key=value``)."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))
    return make_conninfo(dsn, dbname=name)


def _conf_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _read_from(path: Path, offset: int, limit: int = 64 * 1024) -> str:
    """At most ``limit`` bytes of ``path`` from byte ``offset`` (what a start logged)."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"
