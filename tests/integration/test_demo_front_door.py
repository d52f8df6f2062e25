"""``make demo`` as a new user meets it (issue 21): it refuses a foreign service on the
daemon's port with one line and no traceback, before it starts anything; it writes the
``relayer.env`` a command run by hand sources; it does not hand out certificate URLs of a
daemon that has stopped (it saves the PDFs); and it says what it leaves running (named by
pid) and the command that stops it."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from relayer.config import Settings
from relayer.store.migrations import migrate
from relayer_dev import devdb, devnet
from relayer_dev.demo import run_demo
from relayer_dev.settings import shown
from relayer_dev.workspace import STOP_COMMAND, closing_lines, left_running, prepare
from tests.conftest import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


class _Foreign(BaseHTTPRequestHandler):
    """Another team's service: healthy on /healthz, and JSON of its own on every path."""

    def do_GET(self) -> None:
        body = b'{"status": "ok"}' if self.path == "/healthz" else b'{"service": "not a relayer"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def foreign_http() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Foreign)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def foreign_tcp() -> Iterator[int]:
    """Something listening that speaks no HTTP: it answers every connection with a banner."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


def _demo(port: int, rpc_port: int) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "RELAYER_HTTP_PORT": str(port),
        "RELAYER_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
        "RELAYER_RPC_URL": f"http://127.0.0.1:{rpc_port}",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, "-m", "relayer_dev", "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(150)
@pytest.mark.parametrize("service", ["foreign_http", "foreign_tcp"])
def test_the_demo_refuses_a_foreign_service_on_its_port(service: str, request: pytest.FixtureRequest) -> None:
    port: int = request.getfixturevalue(service)
    rpc_port = free_port()
    done = _demo(port, rpc_port)
    try:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode != 0, done
        assert "Traceback" not in done.stderr, done.stderr
        assert len(lines) == 1, done.stderr
        assert f"127.0.0.1:{port}" in lines[0]
        assert "not this relayer" in lines[0] or "does not answer as a relayer" in lines[0]
        assert "RELAYER_HTTP_PORT=" in lines[0], lines[0]  # the way out
        assert done.stdout == ""
        assert not _listening(rpc_port), "the demo started a chain before refusing"
    finally:
        if _listening(rpc_port):  # the fault: stop the chain it started on the worktree's devnet
            devnet.down(ROOT)


@pytest.mark.timeout(240)
def test_the_demo_writes_relayer_env_saves_certificates_and_says_what_it_leaves(
    tmp_path: Path, admin_database_url: str
) -> None:
    dsn = devdb.create_scratch_database(admin_database_url, prefix="relayer_demo")
    http = free_port()
    environment = Settings(
        database_url=dsn,
        rpc_url=f"http://127.0.0.1:{free_port()}",
        http_port=http,
        public_base_url=f"http://127.0.0.1:{http}",
        settle_wait_s=30,
    )
    try:
        prepared = prepare(environment, root=tmp_path, index_port=free_port(), other_base_port=free_port())
        env_file = tmp_path / ".devdata" / "relayer.env"
        assert prepared.env_file == env_file
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600  # it holds the executor key
        written = env_file.read_text()
        for line in (f"RELAYER_RPC_URL={environment.rpc_url}", "RELAYER_EXECUTOR_PRIVATE_KEY="):
            assert line in written, written
        migrate(dsn)
        result = asyncio.run(run_demo(prepared.settings, prepared.devnet, amount="1", carbon_class=None))
        assert result["status"] == "settled", result
        # one daemon, a retirement on each Base network, each certificate of its own chain
        assert [(c["chainId"], c["status"]) for c in result["chains"]] == [
            (84532, "settled"),
            (8453, "settled"),
        ]
        assert [rid.split("-")[0] for rid in result["retirementIds"]] == ["84532", "8453"]
        assert result["payerEthBalanceWei"] == 0
        # The demo's daemon has stopped: no URL of it is handed out, the PDFs are saved instead.
        assert not _listening(http)
        assert result["daemonLeftRunning"] is False and "certificateUrls" not in result
        files = [Path(f) for f in result["certificateFiles"]]
        assert len(files) == len(result["retirementIds"]) >= 1
        assert all(f.read_bytes().startswith(b"%PDF") for f in files)

        anvils = devnet.running(tmp_path)
        assert sorted(chain for _, _, chain in anvils) == [137, 8453, 84532]  # both Base networks
        lines = closing_lines(env_file, result, root=tmp_path)
        said = "\n".join(lines)
        for pid, url, chain in anvils:
            assert f"anvil {url} (chain {chain}, pid {pid})" in said
        assert "daemon has stopped" in said
        assert f"stop them with: {STOP_COMMAND}" in lines
        assert shown(files[0]) in said and shown(env_file) in said
    finally:
        devnet.down(tmp_path)
        devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])
    assert left_running(tmp_path) == []
