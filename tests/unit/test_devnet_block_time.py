"""``DEVNET_BLOCK_TIME`` (issue 20, item 1): seconds between the devnet's blocks, fractions
allowed; unset or empty keeps a block per transaction; anything else is refused."""

from __future__ import annotations

import pytest

from relayer_dev.devnet import DevnetError, block_time_setting


@pytest.mark.parametrize(
    ("value", "seconds"), [("0.2", 0.2), (" 2 ", 2.0), ("1e-1", 0.1), ("", None), ("  ", None)]
)
def test_block_time_setting_reads_seconds(value: str, seconds: float | None) -> None:
    assert block_time_setting({"DEVNET_BLOCK_TIME": value}) == seconds


def test_block_time_setting_unset_is_a_block_per_transaction() -> None:
    assert block_time_setting({}) is None


@pytest.mark.parametrize("value", ["0", "-1", "fast", "nan", "inf", "0.001", "7200", "200ms"])
def test_block_time_setting_refuses_what_is_not_seconds(value: str) -> None:
    with pytest.raises(DevnetError, match="DEVNET_BLOCK_TIME"):
        block_time_setting({"DEVNET_BLOCK_TIME": value})
