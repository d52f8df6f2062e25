"""The log line's shape: RFC 3339 UTC times, the request's id on every line written while it
is served, a job's trace fields."""

from __future__ import annotations

import asyncio
import calendar
import io
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from relayer.logs import (
    FIELDS,
    RENAMED,
    RequestContext,
    UtcJsonFormatter,
    job_fields,
    request_scope,
    trace_fields,
    utc_timestamp,
)

RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


Lines = Callable[[], list[dict[str, Any]]]


@pytest.fixture
def lines() -> Iterator[Lines]:
    """The JSON lines logger ``tests.logs`` wrote so far through the daemon's handler (its
    formatter and filter)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(UtcJsonFormatter(FIELDS, rename_fields=RENAMED))
    handler.addFilter(RequestContext())
    logger = logging.getLogger("tests.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield lambda: [json.loads(line) for line in out.getvalue().splitlines()]
    finally:
        logger.removeHandler(handler)


def test_timestamps_are_rfc3339_utc_with_milliseconds() -> None:
    at = calendar.timegm((2026, 11, 26, 1, 2, 3)) + 0.4567
    assert utc_timestamp(at) == "2026-11-26T01:02:03.456Z"
    assert utc_timestamp(calendar.timegm((1999, 12, 31, 23, 59, 59)) + 0.9999) == "1999-12-31T23:59:59.999Z"


def test_a_line_has_its_time_in_utc_whatever_the_local_zone(
    lines: Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # +05:30: a local time would show
    time.tzset()
    try:
        before = time.time()
        logging.getLogger("tests.logs").info("hello", extra={"job_id": 7})
        after = time.time()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    (line,) = lines()
    assert RFC3339_UTC.fullmatch(line["time"]), line
    assert utc_timestamp(before)[:19] <= line["time"][:19] <= utc_timestamp(after)[:19]
    assert {k: line[k] for k in ("level", "logger", "message", "job_id")} == {
        "level": "INFO",
        "logger": "tests.logs",
        "message": "hello",
        "job_id": 7,
    }


def test_lines_written_while_a_request_is_served_name_it(lines: Lines) -> None:
    log = logging.getLogger("tests.logs")

    async def serve() -> None:
        with request_scope("client-id-1"):
            log.info("inside")
            await asyncio.create_task(_log_later(log))  # a task started inside inherits it
            log.info("explicit", extra={"request_id": "other"})
        log.info("after")

    log.info("before")
    asyncio.run(serve())
    got = [(line["message"], line.get("request_id")) for line in lines()]
    assert got == [
        ("before", None),
        ("inside", "client-id-1"),
        ("in a task", "client-id-1"),
        ("explicit", "other"),
        ("after", None),
    ]


def test_a_jobs_trace_fields() -> None:
    class Row:
        id = 12
        tx_hash = b"\xab" * 32
        request_id = "req-1"

    assert job_fields(Row(), block=5) == {
        "job_id": 12,
        "tx_hash": "0x" + "ab" * 32,
        "request_id": "req-1",
        "block": 5,
    }
    assert trace_fields(3, None, None) == {"job_id": 3}  # not signed, no request: nothing made up


async def _log_later(log: logging.Logger) -> None:
    await asyncio.sleep(0)
    log.info("in a task")
