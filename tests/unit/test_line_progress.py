"""``relayer catalogue load`` without a terminal (a Kubernetes Job) reports progress as plain
lines: one at the start, then at most one every few seconds, and one at the end."""

from __future__ import annotations

import io

from relayer.line_progress import LineProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_at_the_start_every_interval_and_at_the_end() -> None:
    out, clock = io.StringIO(), Clock()
    with LineProgress(1000, "loading projects", out, unit="projects", every_s=5, clock=clock) as progress:
        for _ in range(9):  # 100 a second for 9 s, in chunks of 100
            clock.now += 1
            progress.update(100)
        clock.now += 1
        progress.update(100)
    assert out.getvalue().splitlines() == [
        "loading projects: 0/1000 (0 %)",
        "loading projects: 500/1000 (50 %), 100 projects/s",  # 5 s after the start line
        "loading projects: 1000/1000 (100 %), 100 projects/s",  # done: at once, and only once
    ]


def test_a_block_that_ends_short_says_where_it_stopped() -> None:
    out, clock = io.StringIO(), Clock()
    try:
        with LineProgress(648, "loading projects", out, every_s=5, clock=clock) as progress:
            clock.now += 0.5
            progress.update(200)
            raise RuntimeError("the database went away")
    except RuntimeError:
        pass
    assert out.getvalue().splitlines()[-1] == "loading projects: 200/648 (30 %), 400 items/s"


def test_fast_work_writes_two_lines() -> None:
    out, clock = io.StringIO(), Clock()
    with LineProgress(648, "loading projects", out, clock=clock) as progress:
        for chunk in (200, 200, 200, 48):
            progress.update(chunk)
    lines = out.getvalue().splitlines()
    assert lines == ["loading projects: 0/648 (0 %)", "loading projects: 648/648 (100 %)"]
