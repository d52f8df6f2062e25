"""The follower's block receipts (relayer/chain/blocks.py): which JSON-RPC errors mean a node
will not serve ``eth_getBlockReceipts`` (the per-transaction reads from then on) and which are
its failure (asked again); and that of a block's receipts only ours are parsed."""

from __future__ import annotations

import pytest

from relayer.chain.blocks import _ours, refuses_block_receipts
from relayer.chain.errors import ChainUnavailable


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        ({"code": -32601, "message": "Method not found"}, True),
        ({"code": -32600, "message": "Unsupported method: eth_getBlockReceipts on BASE_MAINNET"}, True),
        (
            {"code": -32602, "message": "Invalid params", "data": "number too large to fit in target type"},
            True,
        ),
        ({"code": -32000, "message": "header not found"}, False),
        ({"code": -32603, "message": "batch failed: timeout"}, False),
        ({"code": -32005, "message": "limit exceeded"}, False),
        ({"code": 429, "message": "Too Many Requests"}, False),
        ({"message": "no code"}, False),
        ("a string error member", False),
        ({"code": "-32601"}, False),
    ],
)
def test_only_a_refusal_of_the_method_or_its_params_is_remembered(error: object, refused: bool) -> None:
    assert refuses_block_receipts(error) is refused


def _receipt(tx: str, **fields: str) -> dict[str, str]:
    return {
        "transactionHash": tx,
        "blockNumber": "0x5",
        "blockHash": "0x" + "22" * 32,
        "status": "0x1",
        "gasUsed": "0x5208",
        "effectiveGasPrice": "0x3b9aca00",
        **fields,
    }


def test_of_a_blocks_receipts_only_ours_are_parsed() -> None:
    ours, theirs = "0x" + "11" * 32, "0x" + "33" * 32
    foreign = {"transactionHash": theirs, "gasUsed": "not a quantity", "logs": "whatever"}
    [receipt] = _ours([foreign, _receipt(ours)], {ours})
    assert (receipt.tx_hash, receipt.block_number, receipt.gas_used) == (bytes.fromhex("11" * 32), 5, 21_000)
    assert _ours([foreign], {ours}) == []
    with pytest.raises(ChainUnavailable):
        _ours([_receipt(ours, gasUsed="nonsense")], {ours})
    with pytest.raises(ChainUnavailable):
        _ours([foreign, "not a receipt"], {ours})
    with pytest.raises(ChainUnavailable):
        _ours({"not": "a list"}, {ours})
