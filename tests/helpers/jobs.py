"""Relay jobs as the store holds them: a :class:`NewJob` to reserve by hand, and the
``relay_jobs`` row of a posted request, read once or waited for in given states."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from relayer.store.relay_jobs import NewJob
from tests.conftest import Daemon


def new_job(
    salt: bytes,
    *,
    tag: bytes,
    chain_id: int = 98,
    permit_key: bytes | None = None,
    scheme: str = "eip3009",
    input_token: str = "0xusdc",
    request_hash: bytes = b"h",
) -> NewJob:
    """A job to reserve by hand with ``salt`` (32 bytes) and bound nonce ``tag + salt``, on
    ``chain_id`` (98: a chain no worker serves, so only its test moves it): payer ``0xpayer``,
    1 atomic unit authorized until 2**40 (unix seconds), no gas allowance, no call data."""
    return NewJob(
        chain_id=chain_id,
        bound_nonce=tag + salt,
        permit_key=permit_key,
        salt=salt,
        scheme=scheme,
        payer="0xpayer",
        input_token=input_token,
        auth_value=1,
        auth_expires_at=2**40,
        gas_allowance=0,
        request_hash=request_hash,
        settlement="0xsettlement",
        call_data=b"",
        summary={},
        quote_total=0,
    )


async def job_row(d: Daemon, body: dict[str, Any]) -> Any:
    """The ``relay_jobs`` row of the posted request ``body`` (by its ``salt``), or None."""
    return await d.runtime.db.fetchrow(
        "SELECT * FROM relay_jobs WHERE salt = $1", bytes.fromhex(body["salt"][2:])
    )


async def wait_for_job(d: Daemon, body: dict[str, Any], states: set[str], timeout_s: float = 20.0) -> Any:
    """The ``relay_jobs`` row of ``body`` once it is in one of ``states`` (polled every 50 ms;
    fails after ``timeout_s`` seconds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = await job_row(d, body)
        if job is not None and job["state"] in states:
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"job not in {states} within {timeout_s} s: {job and job['state']}")
