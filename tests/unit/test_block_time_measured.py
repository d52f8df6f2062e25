"""The chain's block interval measured from header timestamps (issue 20, item 2): whole-second
timestamps over many blocks, and when a measure is too far off the table to trust quietly."""

from __future__ import annotations

import pytest

from relayer.domain.confirmation import differs_much, measured_block_time_ms


def test_whole_second_timestamps_of_64_blocks_at_200_ms_measure_about_200_ms() -> None:
    # block n at 1000 + 0.2 n seconds, its timestamp floored to whole seconds (anvil's)
    stamps = [(n, 1000 + (2 * n) // 10) for n in range(100, 164)]
    measured = measured_block_time_ms(stamps)
    assert measured is not None and 180 <= measured <= 210


def test_the_measure_is_the_span_of_the_oldest_and_newest_whatever_the_order() -> None:
    assert measured_block_time_ms([(20, 1040), (10, 1020), (15, 1031)]) == 2000


@pytest.mark.parametrize(
    "stamps",
    [[], [(5, 100)], [(5, 100), (6, 100)], [(7, 100), (7, 100)], [(n, 100 + n // 40) for n in range(64)]],
)
def test_too_few_blocks_or_too_short_a_span_measure_nothing(stamps: list[tuple[int, int]]) -> None:
    assert measured_block_time_ms(stamps) is None


def test_a_burst_of_automined_blocks_is_not_a_block_time() -> None:
    """A devnet mining a block per transaction: 64 blocks of a deployment within 9 s."""
    assert measured_block_time_ms([(n, 1000 + n // 7) for n in range(64)]) is None
    assert measured_block_time_ms([(n, 1000 + n // 6) for n in range(64)]) == 159  # 10 s


def test_a_measure_more_than_half_again_off_either_way_differs_much() -> None:
    assert not differs_much(200, 200) and not differs_much(290, 200) and not differs_much(140, 200)
    assert differs_much(2000, 200) and differs_much(100, 200)
