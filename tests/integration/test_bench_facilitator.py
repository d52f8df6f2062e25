"""A smoke run of ``bench/facilitator_vs_reference.py`` (issue 19, design C9) with a handful of
payments: it runs end to end against the x402 SDK's own facilitator and ours, prints its one
JSON line with every figure the issue names, our facilitator settles every payment with no
failure or stall, and the chain agrees with every answer on both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Not `alone`: this smoke run asserts what settled and that each figure is there, not the
# figures themselves (those in docs/benchmarks.md come from full runs of the benchmark)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "facilitator_vs_reference.py"
KEYS = {
    "oursPerSecond",
    "referencePerSecond",
    "ratio",
    "oursP50Seconds",
    "oursP95Seconds",
    "referenceP50Seconds",
    "referenceP95Seconds",
    "oursFailures",
    "referenceFailures",
}


def test_the_benchmark_runs_and_ours_settles_every_payment(admin_database_url: str) -> None:
    env = {**os.environ, "RELAYER_DATABASE_URL": admin_database_url}
    done = subprocess.run(
        [sys.executable, str(BENCH), "--n", "6", "--concurrency", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line.keys() >= KEYS, line
    assert (line["n"], line["concurrency"], line["scenario"]) == (6, 3, "default")
    assert (line["oursFailures"], line["oursStalls"], line["oursOnChainMismatches"]) == (0, 0, 0), line
    assert line["referenceOnChainMismatches"] == 0, line
    assert line["oursPerSecond"] > 0 and line["referencePerSecond"] > 0, line
    assert line["ratio"] == pytest.approx(line["oursPerSecond"] / line["referencePerSecond"], rel=0.02)
    assert 0 < line["oursP50Seconds"] <= line["oursP95Seconds"], line
