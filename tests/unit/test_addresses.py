"""relayer/domain/addresses.py against eth_utils' EIP-55 implementation."""

from __future__ import annotations

import random

import pytest
from eth_utils.address import to_checksum_address

from relayer.domain.addresses import checksum_address


def test_the_same_checksum_as_eth_utils() -> None:
    rng = random.Random(55)
    for _ in range(2000):
        raw = rng.randbytes(20).hex()
        expected = to_checksum_address("0x" + raw)
        for form in ("0x" + raw, raw, "0x" + raw.upper(), expected):
            assert checksum_address(form) == expected
    assert checksum_address("0x" + "0" * 40) == "0x" + "0" * 40


@pytest.mark.parametrize(
    "bad", ["", "0x", "0x1234", "0x" + "g" * 40, "0x" + "a" * 41, "0X" + "a" * 40, " 0x" + "a" * 40]
)
def test_not_an_address_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        checksum_address(bad)
