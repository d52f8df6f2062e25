"""Background traffic for a benchmark's anvil (issue 20): ``python -m relayer_dev traffic`` in
a process of its own (its CPU is its own, not the client's), started once the chain is set up
and stopped before the chain; its summary (``achievedTps``, ``errors``, ``cpuPercentOfACore``,
...) is what it printed when it stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 120.0


class Background:
    """A running traffic generator: ``proc``, its log (stderr) and its summary file (stdout)."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, out: Path) -> None:
        self.proc, self.log, self.out = proc, log, out

    def stop(self, timeout_s: float = 30) -> dict[str, Any]:
        """SIGTERM it and wait (bounded; killed if it ignores it); its summary, or ``{}``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"traffic (pid {self.proc.pid}) ignored SIGTERM; killed", file=sys.stderr)
            self.proc.kill()
            self.proc.wait(timeout=10)
        lines = self.out.read_text().strip().splitlines() if self.out.is_file() else []
        try:
            summary: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        except ValueError:
            summary = {}
        return summary


def start_background(tps: float, rpc_url: str, deployment_file: Path, state: Path) -> Background:
    """Start the traffic generator at ``tps`` against ``rpc_url`` (moving the devnet's USDC and
    kVCM of ``deployment_file`` and a token of its own) and wait until it sends (bounded by
    :data:`READY_TIMEOUT_S`). Its log is ``state/traffic.log``.

    Raises:
        RuntimeError: it exited or did not start sending in time (the log's tail is in the message).
    """
    log, out = state / "traffic.log", state / "traffic.json"
    argv = [sys.executable, "-m", "relayer_dev", "traffic", "--rpc", rpc_url, "--tps", f"{tps:g}"]
    argv += ["--deployment-file", str(deployment_file), "--report-every", "10"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("ab") as err, out.open("wb") as stdout:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=stdout, stderr=err, stdin=subprocess.DEVNULL)
    background = Background(proc, log, out)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while "traffic: sending" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            background.stop()
            raise RuntimeError(f"the traffic generator did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    return background
