"""relayer_dev.ports: a worker's free ports come from its own block, below the kernel's
ephemeral range, each checked free (the demo front-door test once met another worker's
daemon on a port it had found free: HTTP 404 from a server that was not its own)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from relayer_dev import ports


@pytest.fixture
def fresh_walk() -> Iterator[None]:
    ports._next = None
    yield
    ports._next = None


def _ephemeral() -> range:
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(low, high + 1)


def test_each_worker_of_the_suite_has_a_block_of_its_own_below_the_ephemeral_range() -> None:
    block = ports.port_block()
    assert block is not None and len(block) == 2000
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") else 8
    assert block.start == 12_000 + 2_000 * index
    assert block.stop <= _ephemeral().start


def test_ports_come_from_the_block_in_turn_and_a_taken_one_is_skipped(
    monkeypatch: pytest.MonkeyPatch, fresh_walk: None
) -> None:
    taken = {20_001, 20_003}
    monkeypatch.setattr(ports, "_bindable", lambda port: port not in taken)
    monkeypatch.setenv(ports.BLOCK_ENV, "20000:4")
    got = [ports.free_port() for _ in range(6)]
    assert set(got) == {20_000, 20_002} and got[0] != got[1] and got[:2] == got[2:4]


def test_a_block_all_taken_is_an_error_not_a_loop(monkeypatch: pytest.MonkeyPatch, fresh_walk: None) -> None:
    tried: list[int] = []
    monkeypatch.setattr(ports, "_bindable", lambda port: tried.append(port) or False)
    monkeypatch.setenv(ports.BLOCK_ENV, "20000:3")
    with pytest.raises(OSError, match="no free port"):
        ports.free_port()
    assert sorted(tried) == [20_000, 20_001, 20_002]  # each once


def test_a_listening_port_is_not_free_and_is_once_closed() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = int(server.getsockname()[1])
        assert not ports._bindable(port)
    assert ports._bindable(port)


def test_unset_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ports.BLOCK_ENV, raising=False)
    assert ports.port_block() is None
    assert ports.free_port() in _ephemeral()


@pytest.mark.parametrize("raw", ["12000", "x:10", "12000:0", "100:10", "65000:1000", "1:2:3"])
def test_a_malformed_block_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(ports.BLOCK_ENV, raw)
    with pytest.raises(ValueError, match=ports.BLOCK_ENV):
        ports.port_block()
