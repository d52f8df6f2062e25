"""The shapes a healthy node's JSON-RPC results have (``relayer.chain.transport.RESULT_SHAPES``):
anything else is the node failing, not a bug further on."""

from __future__ import annotations

import os
from typing import Any

import pytest

from relayer.chain.transport import RESULT_SHAPES


@pytest.mark.parametrize("result", ["0x", "0x00", "0xAbCd", "0x" + os.urandom(12_000).hex()])
def test_an_eth_call_answers_hex_data_of_whole_bytes(result: str) -> None:
    assert RESULT_SHAPES["eth_call"](result)


@pytest.mark.parametrize(
    "result",
    ["0xabc", "0x0", "abcd", "0xzz", "0x12 ", " 0x12", "0X12", "", None, 12, ["0x"], "0x" + "a" * 8001],
)
def test_anything_else_is_not_an_eth_call_answer(result: Any) -> None:
    assert not RESULT_SHAPES["eth_call"](result)


@pytest.mark.parametrize("method", ["eth_blockNumber", "eth_estimateGas", "eth_getBalance"])
def test_a_quantity_is_hex_digits(method: str) -> None:
    shape = RESULT_SHAPES[method]
    assert shape("0x0") and shape("0x1a2B")
    assert not any(shape(r) for r in ("0x", "12", "0xg", None, 5))
