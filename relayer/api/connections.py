"""The HTTP front's bounds on connections (aiohttp does the parsing and the timers; this adds
what it lacks): a cap on the connections one process holds, answered 503 past it (the
spec's error envelope, ``Retry-After``); the file descriptors the cap needs; and logs that a
hostile client cannot flood (a request the HTTP parser refuses is one throttled INFO line,
not an ERROR with a traceback; the accept loop running out of descriptors is one throttled
WARNING)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import resource
import socket
import time
import traceback
from collections.abc import Iterable
from typing import Any, Final, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from relayer.api.access import ACCESS_LOGGER, AccessLog
from relayer.api.errors import Surface, error_body, status_of, surface_of
from relayer.domain.errors import Rejection

log = logging.getLogger(__name__)

MAX_FIELD_SIZE: Final = 8190
"""The longest header (name or value) the server reads, bytes: aiohttp's default. Past it the
parser refuses the request (a bare 400) before any of it is kept."""
MAX_HEADERS: Final = 64
"""The most headers one request may carry (aiohttp's default is 128; clients send about 20).
The memory request heads can hold is about the connection cap times twice
``MAX_HEADERS * MAX_FIELD_SIZE`` (the raw bytes and the decoded text: about 1 MB a
connection; 512 stalled connections measured +500 MB), for at most the idle timeout."""
RECEIVE_BUFFER: Final = 32 * 1024
"""The kernel receive buffer of a client connection, bytes (Linux doubles it): what one read
can take from a client. A request is at most a 64 KiB line, its headers and a 64 KiB body, so
a larger window buys nothing; without it a client that sends megabytes of headers has each
connection read 256 KiB at a time, which aiohttp keeps until its refusal is collected."""
FD_RESERVE: Final = 256
"""Descriptors kept for everything but client connections (database pool, chain node, logs,
the listening sockets): the connection cap is lowered to fit the process's limit with them."""
COLLECT_AFTER_S: Final = 1.0
"""How long after a request the HTTP parser refused the garbage it leaves is collected (by
then the refused connection is closed); at most one collection per this many seconds."""
LOG_EVERY_S: Final = 10.0
"""At most one line per kind of noise (parser refusals, connections refused, accept errors)
per this many seconds; the line says how many were not logged."""

REFUSAL_WAIT_S: Final = 0.25
"""How long a connection past the cap may take to send its first bytes before it is answered:
the request line names the path, hence the surface whose error body it gets; and a socket
closed with the request unread would answer the client's bytes with a reset, which can lose
the 503 before the client reads it. A connection that sends nothing in time gets the x402
body."""
REFUSALS_WAITING: Final = 32
"""At most this many connections past the cap wait (:data:`REFUSAL_WAIT_S`) for their request
line at once; more are answered at once with the x402 body: a burst past the cap must not hold
the descriptors the accept loop needs (each waiting one keeps its socket open)."""
REFUSAL_RETRY_AFTER_S: Final = 1
"""``Retry-After`` (seconds) of an answer past the connection cap."""
_REQUEST_LINE: Final = re.compile(rb"[A-Z]{1,16} (/[^ \r\n?#]{0,2048})")


def refusal(surface: Surface) -> bytes:
    """The raw HTTP answer to a connection past the cap on ``surface``: 503 with the surface's
    error body of the registry's retryable ``gas_estimate_unavailable`` (the answer to any
    upstream that cannot serve now, nothing attempted) naming the ``server`` as the upstream,
    ``retryAfterSeconds`` and the ``Retry-After`` header; the connection closes."""
    error = Rejection(
        "gas_estimate_unavailable",
        f"this server is at its connection limit; nothing was attempted. Retry in {REFUSAL_RETRY_AFTER_S} s",
        upstream="server",
        retryAfterSeconds=REFUSAL_RETRY_AFTER_S,
    )
    body = json.dumps(error_body(error, surface)).encode()
    return (
        b"HTTP/1.1 %d %s\r\n"
        b"Content-Type: application/json; charset=utf-8\r\n"
        b"Retry-After: %d\r\n"
        b"Connection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s"
        % (status_of(error), b"Service Unavailable", REFUSAL_RETRY_AFTER_S, len(body), body)
    )


_REFUSALS: Final = {surface: refusal(surface) for surface in ("x402", "marketplace", "facilitator")}


class Throttle:
    """Whether to log one more of a kind of event: the first, then at most one per ``every_s``
    seconds; :meth:`allow` also returns how many were held back since the last line."""

    def __init__(self, every_s: float = LOG_EVERY_S) -> None:
        self.every_s = every_s
        self._last = float("-inf")
        self._held = 0

    def allow(self) -> tuple[bool, int]:
        """(log this one?, events not logged before it)."""
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._held += 1
            return False, 0
        held, self._held, self._last = self._held, 0, now
        return True, held


class ParserRefusals(logging.Filter):
    """On aiohttp's server logger: a request its parser refused (malformed, a header or line
    too long, too many headers, a TLS handshake on the plain port) is the client's fault, so
    it is logged at INFO, without the traceback, at most once per :data:`LOG_EVERY_S`;
    everything else passes unchanged (records below INFO only when the root logger takes
    them: the logger is set to DEBUG so that aiohttp's debug-level refusals reach here too).

    aiohttp keeps each refusal in a reference cycle (the exception's traceback holds the
    parsing frame, whose locals hold the bytes read, up to 256 KiB, and the exception): only a
    full collection frees it, and the collector counts objects, not bytes, so a flood of
    refused requests would pile them up (hundreds of MB). A refusal therefore schedules one
    collection :data:`COLLECT_AFTER_S` later (at most one pending at a time)."""

    def __init__(self) -> None:
        super().__init__()
        self.throttle = Throttle()
        self._collect: asyncio.TimerHandle | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return record.levelno >= logging.INFO or logging.getLogger().isEnabledFor(record.levelno)
        if exc.__traceback__ is not None:  # frees the bytes read now, not at the collection
            traceback.clear_frames(exc.__traceback__)
        self._schedule_collection()
        allowed, held = self.throttle.allow()
        if not allowed or record.levelno < logging.INFO:  # aiohttp's own debug-level refusal
            return False
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "-"
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg = "request refused by the HTTP parser from %s: %s (%d more not logged)"
        record.args = (peer, str(exc.message).strip().splitlines()[0][:200], held)
        record.exc_info, record.exc_text = None, None
        return True

    def _schedule_collection(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the event loop: nothing to schedule on
            return
        if self._collect is None or self._collect.when() <= loop.time():
            self._collect = loop.call_later(COLLECT_AFTER_S, gc.collect)


PARSER_REFUSALS: Final = ParserRefusals()


def runner_options(idle_timeout_s: float, max_line_size: int) -> dict[str, Any]:
    """The bounds every HTTP server of the daemon runs with, as ``web.AppRunner`` keyword
    arguments: a connection that has not sent a complete request head within
    ``idle_timeout_s`` seconds of opening or of its last answer is closed (idle keep-alive and
    a slow head alike; aiohttp's keep-alive timer starts at the connection and is not reset by
    a partial head); heads bounded by :data:`MAX_FIELD_SIZE` and :data:`MAX_HEADERS`, the
    request line by ``max_line_size`` bytes; one access line per request
    (:class:`relayer.api.access.AccessLog`)."""
    server_log = logging.getLogger("aiohttp.server")
    server_log.addFilter(PARSER_REFUSALS)  # once: a filter already there is not added again
    server_log.setLevel(logging.DEBUG)  # the filter sees every refusal, and keeps what root takes
    return {
        "access_log": ACCESS_LOGGER,
        "access_log_class": AccessLog,
        "keepalive_timeout": idle_timeout_s,
        "max_line_size": max_line_size,
        "max_field_size": MAX_FIELD_SIZE,
        "max_headers": MAX_HEADERS,
    }


class Refused(asyncio.Protocol):
    """A connection past the cap: answered :func:`refusal` on the surface its request line
    names, once its first bytes arrive or :data:`REFUSAL_WAIT_S` passed, and closed (nothing
    more is read or kept)."""

    waiting: int = 0
    """Connections of this process waiting for their request line now (class-wide)."""

    def __init__(self, wait_s: float = REFUSAL_WAIT_S) -> None:
        self.wait_s = wait_s if Refused.waiting < REFUSALS_WAITING else 0.0
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's TCPTransport is one without subclassing asyncio's)
        self._transport = cast(asyncio.Transport, transport)
        if self.wait_s <= 0:
            self._answer("x402")
            return
        Refused.waiting += 1
        self._timer = asyncio.get_running_loop().call_later(self.wait_s, self._answer, "x402")

    def data_received(self, data: bytes) -> None:
        line = _REQUEST_LINE.match(data)
        self._answer(surface_of(line.group(1).decode("latin-1")) if line else "x402")

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            Refused.waiting -= 1
        self._transport = None

    def _answer(self, surface: Surface) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            Refused.waiting -= 1
        transport, self._transport = self._transport, None
        if transport is not None and not transport.is_closing():
            transport.write(_REFUSALS[surface])
            transport.close()


def idle_victim(connections: Iterable[Any]) -> asyncio.BaseTransport | None:
    """The oldest of ``connections`` (aiohttp's handlers, oldest first) that has not sent a
    request (no request parsed on it and none in progress: idle since it opened, or a head
    still arriving byte by byte) and is not closing already: its transport (None when every
    one has). Its place is worth more to a new client than to one that has asked for nothing.
    Reads aiohttp's ``RequestHandler._request_count`` and ``_request_in_progress`` (a handler
    without them is never chosen)."""
    for handler in connections:
        transport = getattr(handler, "transport", None)
        if transport is None or transport.is_closing():
            continue
        if getattr(handler, "_request_count", 1) == 0 and not getattr(handler, "_request_in_progress", True):
            return cast(asyncio.BaseTransport, transport)
    return None


class BoundedSite(web.BaseSite):
    """A TCP listener (as ``web.TCPSite``) that holds at most ``max_connections`` client
    connections. At the cap, the oldest connection that has not sent a request is closed to
    make room (:func:`idle_victim`; ``evicted`` counts it), so an idle flood cannot keep real
    clients and ``/healthz`` out; when every connection has sent one, a new connection is
    answered 503 in the error envelope (``Retry-After: 1``, :class:`Refused`) and closed,
    and ``refused`` counts it. The count is aiohttp's own (``Server.connections``): it may
    exceed the cap by the connections accepted in one burst of the accept loop (at most the
    listen ``backlog``)."""

    __slots__ = ("_evicted", "_host", "_max", "_port", "_refused", "_throttle")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        max_connections: int,
        refused: Any = None,
        *,
        evicted: Any = None,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host, self._port, self._max = host, port, max_connections
        self._refused = refused  # prometheus Counters (or None)
        self._evicted = evicted
        self._throttle = Throttle()

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        """Listen (the runner must be set up).

        Raises:
            OSError: the address cannot be listened on.
        """
        await super().start()
        server = self._runner.server
        assert server is not None

        def admit() -> asyncio.BaseProtocol:
            if len(server.connections) < self._max:
                return server()
            victim = idle_victim(server.connections)
            if victim is not None:  # its place goes to a client that may send a request
                victim.close()
                if self._evicted is not None:
                    self._evicted.inc()
                return server()
            if self._refused is not None:
                self._refused.inc()
            allowed, held = self._throttle.allow()
            if allowed:
                log.warning(
                    "connection refused: at the connection cap",
                    extra={"max_connections": self._max, "refused_not_logged": held},
                )
            return Refused()

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            admit, self._host, self._port, backlog=self._backlog, reuse_address=True
        )
        for sock in self._server.sockets:  # inherited by the connections accepted from now on
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)


def fitted_cap(max_connections: int) -> int:
    """The connection cap this process can keep: ``max_connections`` plus :data:`FD_RESERVE`
    descriptors must fit the open-file limit; the soft limit is raised towards the hard one
    when short, and the cap lowered (with a warning) when that is not enough."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < needed:
        fitted = max(1, soft - FD_RESERVE)
        log.warning(
            "connection cap lowered to fit the open-file limit",
            extra={"max_connections": max_connections, "fitted": fitted, "nofile": soft},
        )
        return fitted
    return max_connections


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Make the loop's reports of ``socket.accept() out of system resource`` (the process out
    of descriptors: asyncio retries the accept every second) one WARNING per
    :data:`LOG_EVERY_S`; every other report goes to the handler there was."""
    previous = loop.get_exception_handler()
    throttle = Throttle()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            allowed, held = throttle.allow()
            if allowed:
                exc = context.get("exception")
                log.warning(
                    "cannot accept connections: out of file descriptors",
                    extra={"error": str(exc), "not_logged": held},
                )
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
