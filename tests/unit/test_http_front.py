"""The HTTP front's pure parts (issue 18): the rate limit's client key (the trusted proxies'
``X-Forwarded-For`` entry, never the client's own) and its bounded client table; request ids;
the log filter for requests aiohttp's parser refuses; the one JSON policy of both APIs."""

from __future__ import annotations

import asyncio
import json
import logging
import tracemalloc
from typing import Any
from unittest import mock

import pytest
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from relayer.api.connections import REFUSALS_WAITING, ParserRefusals, Refused, Throttle
from relayer.api.errors import Surface, error_body
from relayer.api.kernel import RateLimit, read_json, request_id_of
from relayer.domain.errors import Rejection


def _request(path: str = "/api", peer: str = "10.0.0.9", forwarded: list[str] | None = None) -> Any:
    headers = CIMultiDict[str]()
    for value in forwarded or []:
        headers.add("X-Forwarded-For", value)
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" else default
    )
    return make_mocked_request("GET", path, headers=headers, transport=transport)


def _passed(limit: RateLimit, requests: list[Any]) -> int:
    return sum(limit.retry_after(r) is None for r in requests)


@pytest.mark.parametrize(
    "forwarded",
    [
        lambda n: [f"198.51.100.{n % 250}, 203.0.113.7"],  # rotating spoofed entries left of the proxy's
        lambda n: ["127.0.0.1, 203.0.113.7"],  # "<spoofed>, ..." naming loopback
        lambda n: [f"198.51.100.{n % 250}", "203.0.113.7"],  # the proxy appended a header of its own
    ],
    ids=["rotating", "loopback", "two-headers"],
)
def test_the_forwarded_for_key_is_the_entry_the_trusted_proxy_added(forwarded: Any) -> None:
    limit = RateLimit("10/minute", forwarded_for=True, proxy_hops=1)
    passed = _passed(limit, [_request(forwarded=forwarded(n)) for n in range(300)])
    print(f"\nspoofed X-Forwarded-For: {passed} of 300 passed a 10/minute limit")
    assert passed == 10


def test_the_proxy_hop_count_picks_the_outermost_trusted_entry() -> None:
    limit = RateLimit("10/minute", forwarded_for=True, proxy_hops=2)
    # client -> proxy A (adds the client, 203.0.113.7) -> proxy B (adds A, 10.1.1.1) -> daemon
    assert limit.client_of("10.0.0.9", ["1.2.3.4, 203.0.113.7, 10.1.1.1"]) == "203.0.113.7"
    assert limit.client_of("10.0.0.9", ["203.0.113.7"]) == "10.0.0.9"  # fewer entries than hops: the peer
    assert limit.client_of("10.0.0.9", ["nonsense, 10.1.1.1"]) == "10.0.0.9"  # not an address: the peer
    assert RateLimit("1/minute").client_of("10.0.0.9", ["203.0.113.7"]) == "10.0.0.9"  # off: the peer


def test_the_client_table_is_bounded_and_new_clients_share_a_window_when_full() -> None:
    limit = RateLimit("5/minute", max_clients=1_000)
    tracemalloc.start()
    for n in range(20_000):
        limit.hit(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}")
    grown, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    keys = len(limit.limiter.storage.events)  # type: ignore[attr-defined]
    print(f"\n20,000 client addresses: {len(limit.clients)} tracked, {keys} windows, {grown / 2**20:.1f} MiB")
    assert len(limit.clients) == 1_000 and keys <= 1_001
    assert limit.retry_after(_request(peer="192.0.2.1")) is not None  # the shared window is long spent


def test_clients_idle_past_the_longest_window_are_forgotten() -> None:
    limit = RateLimit("5/second", max_clients=2)
    limit.hit("192.0.2.1")
    limit.hit("192.0.2.2")
    first = next(iter(limit.clients))
    limit.clients[first] -= 5  # idle for 5 s
    limit.clients.move_to_end(first, last=False)
    limit.hit("192.0.2.3")
    assert list(limit.clients) == ["192.0.2.2", "192.0.2.3"]


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("abc-123.X_y:z", True),
        ("0" * 64, True),
        ("0" * 65, False),
        ("bad id", False),
        ("<x>", False),
        ("", False),
    ],
)
def test_request_ids_are_bounded_and_validated(sent: str, kept: bool) -> None:
    got = request_id_of(sent)
    assert (got == sent) is kept and 0 < len(got) <= 64
    assert request_id_of(None) != request_id_of(None)


def _record(exc: BaseException, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(
        "aiohttp.server",
        level,
        __file__,
        1,
        "Error handling request from %s",
        ("127.0.0.1",),
        (type(exc), exc, None),
    )


async def test_parser_refusals_are_one_throttled_info_line() -> None:
    refusals = ParserRefusals()
    first = _record(LineTooLong(b"a" * 9000, "8190"))
    assert refusals.filter(first)
    assert (first.levelno, first.exc_info) == (logging.INFO, None)
    assert "8190" in first.getMessage()
    assert not refusals.filter(_record(BadHttpMessage("Invalid header token")))  # within 10 s: held
    other = _record(RuntimeError("a bug"))
    assert refusals.filter(other) and other.levelno == logging.ERROR and other.exc_info is not None


def test_throttle_lets_one_a_period_through_and_counts_the_rest() -> None:
    throttle = Throttle(every_s=3600)
    assert throttle.allow() == (True, 0)
    assert [throttle.allow() for _ in range(3)] == [(False, 0)] * 3
    throttle._last -= 3600
    assert throttle.allow() == (True, 3)


@pytest.mark.parametrize(
    "raw",
    [
        '{"a": 1}'.encode("utf-16"),
        '{"a": 1}'.encode("utf-32"),
        b"\xef\xbb\xbf" + b'{"a": 1}',
        b'{"a": "\xff"}',
    ],
    ids=["utf-16", "utf-32", "bom", "not-utf-8"],
)
async def test_json_bodies_are_utf8_only(raw: bytes) -> None:
    request = make_mocked_request("POST", "/api")
    request._read_bytes = raw
    with pytest.raises(ValueError, match="UTF-8"):
        await read_json(request)


async def test_json_bodies_in_utf8_parse() -> None:
    request = make_mocked_request("POST", "/api")
    request._read_bytes = '{"a": "é"}'.encode()
    assert await read_json(request) == {"a": "é"}


async def _refused_answer(sent: bytes | None) -> tuple[list[str], dict[str, Any]]:
    """What a connection past the cap is answered (a :class:`Refused` protocol on loopback):
    the head lines and the JSON body; ``sent`` is the request written first (None: nothing)."""
    server = await asyncio.get_running_loop().create_server(lambda: Refused(0.2), "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if sent is not None:
            writer.write(sent)
        raw = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    finally:
        server.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.decode().split("\r\n"), json.loads(body)


@pytest.mark.parametrize(
    ("sent", "surface"),
    [
        (b"POST /api HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", "x402"),
        (b"GET /v1/projects?x=1 HTTP/1.1\r\nHost: x\r\n\r\n", "marketplace"),
        (b"POST /facilitator/settle HTTP/1.1\r\nHost: x\r\n\r\n", "facilitator"),
        (None, "x402"),  # nothing sent within the wait
    ],
)
async def test_a_connection_past_the_cap_is_answered_503_in_its_surfaces_error_envelope(
    sent: bytes | None, surface: Surface
) -> None:
    lines, body = await _refused_answer(sent)
    assert lines[0] == "HTTP/1.1 503 Service Unavailable"
    assert "Retry-After: 1" in lines and "Connection: close" in lines
    assert "Content-Type: application/json; charset=utf-8" in lines
    error = Rejection("gas_estimate_unavailable", body["message"], upstream="server", retryAfterSeconds=1)
    assert body == error_body(error, surface)
    assert "connection limit" in body["message"]


async def test_a_burst_past_the_cap_waits_for_at_most_refusals_waiting_request_lines() -> None:
    """Each connection waiting for its request line keeps its socket open; a burst past the
    cap (every descriptor the accept loop needs) must not: past :data:`REFUSALS_WAITING`
    waiting at once, a connection is answered (x402 body) and closed at once."""
    server = await asyncio.get_running_loop().create_server(lambda: Refused(30), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    held = []
    try:
        for _ in range(REFUSALS_WAITING + 5):
            held.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.2)  # every connection is accepted
        assert Refused.waiting == REFUSALS_WAITING
        answered = await asyncio.gather(*(asyncio.wait_for(r.read(), 5) for r, _ in held[REFUSALS_WAITING:]))
        assert all(raw.startswith(b"HTTP/1.1 503 ") for raw in answered)
    finally:
        for _, writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    await asyncio.sleep(0.1)
    assert Refused.waiting == 0  # the waiting ones closed by their clients are counted out
