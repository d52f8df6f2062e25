"""Free loopback ports for the dev tooling, the tests and the benchmarks.

A port found free (bound to 0, then closed) is only free until someone else takes it: the
kernel hands the same ephemeral ports (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999
here) to every process's port-0 binds and outgoing connections. Where several processes look
for ports at once (the test suite's pytest-xdist workers, each starting daemons and nodes), one
could start a server on a port another just found: a test then met another test's server.

With :data:`BLOCK_ENV` set (``start:size``, e.g. ``12000:2000``), :func:`free_port` takes ports
from that block instead, below the ephemeral range, each one checked free by binding it; the
test suite gives each worker a block of its own (``tests/conftest.py``), and the processes a
test starts inherit it. Unset (an operator's ``make demo``): the kernel picks, as before.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from typing import Final

HOST: Final = "127.0.0.1"
BLOCK_ENV: Final = "RELAYER_DEV_PORT_BLOCK"
"""``start:size``: the block :func:`free_port` takes ports from (unset: any the kernel picks)."""

# The next offset into the block, per process: starts at a random one, so that a process and
# the processes it starts (which inherit the block) do not walk the same ports in step.
_next: itertools.count[int] | None = None


def port_block() -> range | None:
    """The block of :data:`BLOCK_ENV` (None when unset).

    Raises:
        ValueError: the variable is not ``start:size`` with 1024 <= start and start + size <= 65536.
    """
    raw = os.environ.get(BLOCK_ENV, "").strip()
    if not raw:
        return None
    start_s, _, size_s = raw.partition(":")
    try:
        start, size = int(start_s), int(size_s)
    except ValueError:
        raise ValueError(f"{BLOCK_ENV}={raw!r}: expected start:size, e.g. 12000:2000") from None
    if start < 1024 or size < 1 or start + size > 65536:
        raise ValueError(f"{BLOCK_ENV}={raw!r}: the block must lie within 1024-65535")
    return range(start, start + size)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback TCP port nothing listens on now: from :data:`BLOCK_ENV`'s block when set
    (each port tried at most once, in turn), else one the kernel picks.

    Raises:
        OSError: every port of the block is taken.
        ValueError: :data:`BLOCK_ENV` is malformed.
    """
    global _next
    block = port_block()
    if block is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            return int(sock.getsockname()[1])
    if _next is None:
        _next = itertools.count(random.randrange(len(block)))
    for _ in range(len(block)):
        port = block[next(_next) % len(block)]
        if _bindable(port):
            return port
    raise OSError(f"no free port in {BLOCK_ENV}={block.start}:{len(block)}")
