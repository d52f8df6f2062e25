"""What an OP-stack receipt says a transaction paid beyond L2 gas (relayer/chain/blocks.py):
the L1 data fee and the Isthmus operator fee, in whatever form web3 leaves those fields."""

from __future__ import annotations

import pytest

from relayer.chain.blocks import _operator_fee, _quantity


def test_quantities_in_every_form_web3_leaves_them() -> None:
    assert _quantity(None) == 0
    assert _quantity(12) == 12
    assert _quantity("0x0c") == 12
    assert _quantity("0x") == 0


def test_the_operator_fee_of_an_isthmus_receipt() -> None:
    # 100,000 gas at a scalar of 1.5 (1,500,000 / 1e6) plus a constant of 7 wei, rounded down.
    receipt = {"gasUsed": 100_001, "operatorFeeScalar": "0x16e360", "operatorFeeConstant": 7}
    assert _operator_fee(receipt) == 100_001 * 1_500_000 // 10**6 + 7
    assert _operator_fee({"gasUsed": 100_000}) == 0  # not an OP-stack receipt


def test_bytes_are_big_endian() -> None:
    assert _quantity(b"\x01\x00") == 256


def test_a_malformed_receipt_or_log_is_the_node_failing_not_a_crash() -> None:
    from relayer.chain.blocks import _parsed, _receipt, _settled
    from relayer.chain.errors import ChainUnavailable

    good = {
        "transactionHash": "0x" + "11" * 32,
        "blockNumber": "0x5",
        "blockHash": "0x" + "22" * 32,
        "status": "0x1",
        "gasUsed": "0x5208",
        "effectiveGasPrice": "0x3b9aca00",
    }
    receipt = _parsed(_receipt, good)
    assert (receipt.block_number, receipt.gas_used, receipt.effective_gas_price) == (5, 21_000, 10**9)
    for broken in (
        {**good, "transactionHash": "0x11"},  # short hash
        {**good, "status": None},
        {**good, "gasUsed": "21000"},  # not a hex quantity
        {k: v for k, v in good.items() if k != "blockHash"},
    ):
        with pytest.raises(ChainUnavailable):
            _parsed(_receipt, broken)
    log = {**good, "logIndex": "0x0", "topics": ["0x" + "33" * 32], "data": "0x"}
    with pytest.raises(ChainUnavailable):  # not a RetirementSettled log
        _parsed(_settled, log)
