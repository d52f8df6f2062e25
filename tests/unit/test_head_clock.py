"""The follower's head clock (relayer.domain.head_clock): it locks on to the chain's blocks
and sees each within one fine interval of its arrival, with a few looks a block; off time
(a devnet that mines on demand, a stall) it falls back to the slow cadence."""

from __future__ import annotations

import random

import pytest

from relayer.domain.head_clock import HeadClock


def _follow(clock: HeadClock, arrivals: list[float], until: float) -> tuple[list[float], int]:
    """Drive ``clock`` against blocks arriving at ``arrivals`` (seconds, sorted) until
    ``until``: each look reads the head at that moment. Returns how late each block was seen
    (seconds after its arrival) and how many looks were made."""
    now, looks, late = 0.0, 0, []
    seen = 0  # blocks arrived by the last look
    while now < until:
        looks += 1
        arrived = sum(1 for a in arrivals if a <= now)
        if arrived > seen:
            late.append(now - arrivals[arrived - 1])
            seen = arrived
        clock.observe(now, arrived)
        wait = clock.wait_s(now)
        assert 0 <= wait <= max(clock.slow_s, clock.block_time_s), wait
        now += wait
    return late, looks


def test_blocks_on_time_are_seen_within_a_fine_interval_for_few_looks() -> None:
    clock = HeadClock(block_time_s=0.2, slow_s=0.1)
    arrivals = [0.037 + 0.2 * k for k in range(500)]
    late, looks = _follow(clock, arrivals, 100.0)
    assert clock.fine_s == pytest.approx(0.2 / 12)
    settled = late[5:]  # the first blocks find the phase
    assert max(settled) <= clock.fine_s + 1e-9
    assert looks / len(late) <= 4  # a fixed cadence of half a block: 2 looks a block
    # (a fixed cadence of half a block sees a block 50 ms late on average, 100 ms at worst)


def test_jittered_blocks_stay_locked_on() -> None:
    rng = random.Random(7)
    clock = HeadClock(block_time_s=0.2, slow_s=0.1)
    arrivals, t = [], 0.0
    for _ in range(500):
        t += 0.2 + rng.uniform(-0.01, 0.01)
        arrivals.append(t)
    late, looks = _follow(clock, arrivals, arrivals[-1] + 0.05)
    settled = sorted(late[5:])
    assert settled[int(0.95 * len(settled))] <= clock.fine_s + 0.011
    assert looks / len(late) <= 5


def test_blocks_off_time_fall_back_to_the_slow_cadence() -> None:
    """A chain that mines on demand: after one block past due, the clock looks every
    ``slow_s``, and before a first new head it never looks faster."""
    clock = HeadClock(block_time_s=0.2, slow_s=0.1)
    assert clock.wait_s(0.0) == 0.1  # nothing seen yet
    clock.observe(0.0, 5)
    assert clock.wait_s(0.0) == 0.1  # the first head read: its arrival is not known
    clock.observe(1.0, 6)  # a new head, seen at 1.0: the next is due at 1.2
    assert clock.wait_s(1.0) == pytest.approx(1.2 - 2 * clock.fine_s - 1.0)
    assert clock.wait_s(1.19) == clock.fine_s
    assert clock.wait_s(1.39) == clock.fine_s  # within one block past due
    assert clock.wait_s(1.41) == 0.1  # off time: the slow cadence
    clock.observe(5.0, 6)  # the same head: still off time
    assert clock.wait_s(5.0) == 0.1
    clock.observe(5.05, 9)  # a new head locks on again
    assert clock.wait_s(5.05) == pytest.approx(0.2 - 2 * clock.fine_s)


@pytest.mark.parametrize(
    ("block_time_s", "fine_s"), [(0.2, 0.2 / 12), (0.05, 0.010), (2.0, 0.100), (1.0, 1 / 12)]
)
def test_the_fine_cadence_is_a_twelfth_of_a_block_within_bounds(block_time_s: float, fine_s: float) -> None:
    assert HeadClock(block_time_s, 0.5).fine_s == pytest.approx(fine_s)
