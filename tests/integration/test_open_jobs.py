"""A job is open until its own kind's final state (issue 37, item 1): a facilitator transfer is
final at ``confirmed``, a retirement at ``indexed``. Tried as an operator: after four standard
payments ``relayer status`` showed ``confirmed 4 9 min`` and
``relayer_relay_oldest_job_age_seconds{state="confirmed"}`` kept growing past 600, so
RelayJobsStuck paged about 15 minutes after the first settle. Here each kind is driven to its
final state on a daemon of its own, and every age gauge and the status report are read."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path

import pytest

from relayer.admin import create_api_key
from relayer.ops import status_report
from relayer.store.status import OPEN_STATES
from relayer.workers.gauges import GAUGE_INTERVAL_S
from tests.helpers.facilitator import call, fresh_address, payment
from tests.helpers.relay import challenge, signed_request
from tests.private import private_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SAMPLE = re.compile(
    r'^(relayer_relay_oldest_job_age_seconds|relayer_relay_jobs)\{state="(\w+)"\} (\S+)$', re.M
)


async def test_a_settled_transfer_and_an_indexed_retirement_leave_no_open_job_in_gauges_or_status(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(tmp_path, admin_database_url) as (d, _anvil):
        key = await create_api_key(d.runtime.settings, f"open-{uuid.uuid4().hex[:6]}", ["facilitator"])
        status, settled = await call(d, "settle", payment(d, fresh_address(), 4_321), key)
        assert (status, settled.get("success")) == (200, True), settled
        payer = d.chain["payers"][1]
        ch = await challenge(d, payer, carbonClass="RE", amount="0.01", inputToken="USDC")
        status, retired = await d.post(signed_request(ch, payer["privateKey"]))
        assert (status, retired.get("status")) == (200, "settled"), retired
        finals = await d.runtime.db.fetch("SELECT kind, state FROM relay_jobs ORDER BY kind")
        assert [(r["kind"], r["state"]) for r in finals] == [("retire", "indexed"), ("transfer", "confirmed")]

        # Until a refresh of the gauges counts both jobs and shows no open one (bounded: two
        # refreshes); with the confirmed transfer counted as open its age only grows.
        deadline = time.monotonic() + 2 * GAUGE_INTERVAL_S + 2
        while True:
            async with d.session.get(f"{d.base_url}/metrics") as r:
                text = await r.text()
            ages = {s: float(v) for name, s, v in SAMPLE.findall(text) if name.endswith("_seconds")}
            jobs = {s: float(v) for name, s, v in SAMPLE.findall(text) if name == "relayer_relay_jobs"}
            counted = jobs.get("confirmed") == 1 and jobs.get("indexed") == 1
            if (counted and not any(ages.values())) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert counted, jobs
        assert set(ages) == set(OPEN_STATES) and ages == dict.fromkeys(OPEN_STATES, 0.0), ages

        report = await status_report(d.runtime.settings)
        rows = {row["state"]: row for row in report["jobs"]}
        assert (rows["confirmed"]["jobs"], rows["confirmed"]["oldestAgeS"]) == (1, None), rows["confirmed"]
        assert (rows["indexed"]["jobs"], rows["indexed"]["oldestAgeS"]) == (1, None), rows["indexed"]
