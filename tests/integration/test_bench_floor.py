"""The CPU floor benchmark (issue 20, item 4's daemon target) runs end to end, shortened:
``bench/cpu_floor.py --n 100`` against a real Postgres and a real anvil; its last line is one
JSON object whose floor is the sum its counts say, every part measured (the figures
themselves are the benchmark's to report, not this test's to assert)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# alone: a benchmark: its CPU figures need the machine to itself
pytestmark = [pytest.mark.integration, pytest.mark.alone]

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("httpPostMs", "statementMs", "notificationMs", "rpcRoundTripMs", "recoverMs", "signMs")


@pytest.mark.timeout(180)
def test_the_floor_is_one_post_and_the_counted_statements_notifications_and_round_trips() -> None:
    argv = [sys.executable, str(ROOT / "bench" / "cpu_floor.py"), "--n", "100"]
    argv += ["--statements", "3", "--notifications", "2", "--round-trips", "0.5"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(report[part] > 0 for part in PARTS), report
    assert (report["statements"], report["notifications"], report["roundTrips"]) == (3, 2, 0.5)
    expected = (
        report["httpPostMs"]
        + 3 * report["statementMs"]
        + 2 * report["notificationMs"]
        + 0.5 * report["rpcRoundTripMs"]
        + report["recoverMs"]
        + report["signMs"]
    )
    assert report["floorMsPerRetirement"] == pytest.approx(expected, abs=0.002)
