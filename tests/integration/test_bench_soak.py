"""The soak benchmark (issue 20, item 6) runs end to end, shortened: ``bench/soak.py --minutes
0.2`` on a real anvil at 200 ms blocks with background traffic, the daemon in a process of its
own on a scratch database, and its last line is one JSON object with the fields the issue names,
every retirement settled. The targets themselves (lag, RSS growth) are the benchmark's to
report, not this test's to assert: it checks that they are measured. And the Postgres server's
CPU, which the throughput benchmark reports beside the daemon's, is measured from its processes.
The history benchmark of the reservation's sums runs shortened too."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

# Not `alone`: these shortened runs assert what settled and that each figure is measured, not
# the figures themselves (those in docs/benchmarks.md come from full runs of the benchmarks)
pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "settled",
    "failures",
    "followerLagBlocksMax",
    "followerLagBlocksP95",
    "rssStartBytes",
    "rssEndBytes",
    "daemonCpuMsPerRetirement",
}


@pytest.mark.timeout(420)
def test_soak_for_a_fifth_of_a_minute_settles_every_retirement_and_reports_its_figures() -> None:
    argv = [sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "0.2", "--rate", "5"]
    argv += ["--background-tps", "50", "--sample-interval", "0.2"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report.keys() >= KEYS, sorted(KEYS - report.keys())
    assert report["posted"] == 60
    assert report["failures"] == 0, report
    assert report["settled"] == 60
    assert report["lagSamples"] > 0
    assert 0 <= report["followerLagBlocksP95"] <= report["followerLagBlocksMax"]
    assert report["rssStartBytes"] > 0 and report["rssEndBytes"] > 0
    assert report["daemonCpuMsPerRetirement"] > 0
    assert report["blockTimeSeconds"] == 0.2
    assert report["backgroundTps"] > 0


def test_the_daemons_warnings_are_counted_by_their_level(tmp_path: Path) -> None:
    """``log_kinds`` reads relayer.logs' ``level`` key (it read ``levelname``, renamed in issue
    21: every kind was "None …" and INFO lines counted)."""
    spec = importlib.util.spec_from_file_location("soak", ROOT / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    log = tmp_path / "daemon.log"
    lines = [
        {"level": "INFO", "message": "request"},
        {"level": "WARNING", "message": "dropped"},
        {"level": "WARNING", "message": "dropped"},
    ]
    log.write_text("\n".join(json.dumps(line) for line in lines) + "\nnot json\n")
    assert soak.log_kinds(log) == {"WARNING dropped": 2, "not JSON": 1}


async def test_the_postgres_servers_cpu_is_measured_from_its_processes(database_url: str) -> None:
    """``bench/relay_throughput.py`` reports the Postgres server's CPU beside the daemon's and
    anvil's (postgresCpuMsPerRetirement): the server behind the DSN is found (its
    checkpointer's parent) and a query's CPU shows in the sum over its processes."""
    import asyncpg

    from bench.common import postgres_server_pid, server_cpu, server_cpu_between

    server = await postgres_server_pid(database_url)
    assert server is not None
    assert Path(f"/proc/{server}/comm").read_text().strip() in ("postgres", "postmaster")
    conn = await asyncpg.connect(database_url)
    try:
        before = server_cpu(server)
        await conn.fetchval("SELECT count(*) FROM generate_series(1, 3000000)")  # about 0.2 s of CPU
        spent = server_cpu_between(before, server_cpu(server))
    finally:
        await conn.close()
    assert spent >= 0.05, spent
    assert server_cpu(None) == {}


def test_the_history_benchmark_times_each_sum_in_both_forms_which_agree() -> None:
    """``bench/reservation_history.py``, shortened: each sum of the reservation and the
    re-check is timed before and after migrations 0022 and 0023 on the same rows, churned
    and vacuumed; the benchmark stops if the two forms' answers differ, so a report means
    they agreed. Figures are reported, not asserted."""
    bench = ROOT / "bench" / "reservation_history.py"
    argv = [sys.executable, str(bench), "--history", "2000", "--runs", "1"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["historyJobs"], report["batch"]) == (2000, 17)
    for condition in ("churned", "vacuumed"):
        assert set(report[condition]) == {"payerSum", "supplySum", "supplyAhead"}
        for figures in report[condition].values():
            assert figures["before"] > 0 and figures["after"] > 0
