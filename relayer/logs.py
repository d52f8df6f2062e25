"""Structured logging: one JSON object per line on stderr (python-json-logger), every line
stamped in RFC 3339 UTC (``2026-11-26T01:02:03.456Z``) and carrying the id of the HTTP
request it was written for (a context variable set per request). Callers put ids in
``extra``; keys, signatures and DSNs are never logged."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final, Protocol

from pythonjsonlogger.json import JsonFormatter

FIELDS: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
RENAMED: Final = {"asctime": "time", "levelname": "level", "name": "logger"}
"""Every line's own fields: ``time``, ``level``, ``logger``, ``message`` (then ``extra``)."""

CURRENT_REQUEST_ID: Final[ContextVar[str | None]] = ContextVar("request_id", default=None)
"""The id of the HTTP request being served (None outside one); see :func:`request_scope`."""


def utc_timestamp(created: float) -> str:
    """``created`` (unix seconds) as RFC 3339 UTC with milliseconds, e.g.
    ``2026-11-26T01:02:03.456Z`` (the milliseconds truncated, as ``logging`` does)."""
    whole = int(created)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(whole))}.{int((created - whole) * 1000):03d}Z"


class UtcJsonFormatter(JsonFormatter):
    """python-json-logger's formatter with :func:`utc_timestamp` times."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_timestamp(record.created)


class RequestContext(logging.Filter):
    """On the handler: a record without a ``request_id`` gets the current request's (if any),
    so a line written anywhere while a request is served names it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "request_id" not in record.__dict__:
            request_id = CURRENT_REQUEST_ID.get()
            if request_id is not None:
                record.request_id = request_id
        return True


@contextmanager
def request_scope(request_id: str) -> Iterator[None]:
    """Lines written inside (and in tasks started inside) name ``request_id``."""
    token = CURRENT_REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        CURRENT_REQUEST_ID.reset(token)


class JobLike(Protocol):
    """What :func:`job_fields` reads of a job row."""

    @property
    def id(self) -> int: ...
    @property
    def tx_hash(self) -> bytes | None: ...
    @property
    def request_id(self) -> str | None: ...


def trace_fields(
    job_id: int | None, tx_hash: bytes | None, request_id: str | None, **more: Any
) -> dict[str, Any]:
    """The ``extra`` of a line about a job: ``job_id``, ``tx_hash`` (``0x`` hex, when signed)
    and the ``request_id`` of the HTTP request that made it (when one did), then ``more``."""
    fields: dict[str, Any] = {"job_id": job_id}
    if tx_hash is not None:
        fields["tx_hash"] = "0x" + tx_hash.hex()
    if request_id is not None:
        fields["request_id"] = request_id
    fields.update(more)
    return fields


def job_fields(job: JobLike, **more: Any) -> dict[str, Any]:
    """:func:`trace_fields` of a job row."""
    return trace_fields(job.id, job.tx_hash, job.request_id, **more)


def setup_logging(level: str = "INFO") -> None:
    """JSON lines on stderr at ``level`` (a logging level name) for the whole process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(UtcJsonFormatter(FIELDS, rename_fields=RENAMED))
    handler.addFilter(RequestContext())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("web3").setLevel(logging.WARNING)
    # What no line shows is not gathered (the logging HOWTO's "Optimization"): the caller's
    # frame, thread and process ids; a line costs some 15 % fewer Python calls.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
