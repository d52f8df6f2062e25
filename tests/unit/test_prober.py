"""The batch prober's arithmetic (relayer/chain/prober.py): the gas a transaction leaves its
call, and how many probes one ``eth_call`` takes. That the prober runs them with exactly that
gas, independently, is tests/integration/test_batch_prober.py on anvil."""

from __future__ import annotations

import itertools

import pytest
from eth_abi.abi import encode

from relayer.chain import prober

TOKEN = "0x5FbDB2315678afecb367f032d93F642f64180aa3"


def test_a_call_gets_its_gas_limit_less_the_intrinsic_gas() -> None:
    data = b"\x00" * 10 + b"\x01" * 5  # intrinsic: 21,000 + 10 * 4 + 5 * 16 = 21,120
    assert prober.execution_gas(data, 100_000) == 100_000 - 21_120
    assert prober.execution_gas(b"", 21_000) == 0
    assert prober.execution_gas(b"", 20_999) is None


def test_a_limit_under_the_call_data_floor_runs_nothing() -> None:
    data = b"\x01" * 1_000  # intrinsic 37,000; EIP-7623 floor 21,000 + 10 * 4,000 = 61,000
    assert prober.execution_gas(data, 60_999) is None
    assert prober.execution_gas(data, 61_000) == 61_000 - 37_000


@pytest.mark.parametrize("gas", [50_000, 400_000, 3_000_000, 30_000_000])
def test_probes_go_in_as_few_calls_as_the_gas_bound_allows_in_order(gas: int) -> None:
    probes = [(TOKEN, bytes([i % 7]) * (200 + i), gas) for i in range(80)]
    runs = prober.chunks(probes)
    assert [i for run in runs for i in run] == list(range(80))
    for run in runs:
        budget = prober.call_gas([probes[i] for i in run])
        assert budget <= prober.PROBER_GAS_MAX or len(run) == 1
        assert budget > sum(probes[i][2] for i in run)  # at least the probes' own gas
    for run, following in itertools.pairwise(runs):
        assert prober.call_gas([probes[i] for i in [*run, following[0]]]) > prober.PROBER_GAS_MAX


def test_an_answer_without_the_outcomes_is_refused() -> None:
    with pytest.raises(ValueError):
        prober.decode("0x", 1)  # the executor's own (empty) code ran: the override was ignored
    with pytest.raises(ValueError):
        prober.decode("0x" + "00" * 31 + "20" + "00" * 32, 1)  # no outcomes for one probe


def test_no_probes_make_no_call_and_probes_within_the_gas_make_one() -> None:
    probe = ("0x" + "11" * 20, b"\x01" * 100, 300_000)
    assert prober.chunks([]) == []
    assert prober.chunks([probe] * 32) == [list(range(32))]


def test_a_probes_gas_gives_the_transactions_limit_less_the_calls_own_cost() -> None:
    data = b"\x00" * 10 + b"\x01" * 5  # intrinsic 21,120; floor 21,000 + 10 * (20 + 10) = 21,300
    assert prober.transaction_gas(data, 50_000) == 21_120 + 50_000 - prober.CALL_COST
    assert prober.transaction_gas(data, 1_000) == 21_300  # never under the floor
    floor_bound = b"\x01" * 1_000  # intrinsic 37,000, floor 61,000
    assert prober.transaction_gas(floor_bound, 20_000 + prober.CALL_COST) == 61_000
    assert prober.transaction_gas(floor_bound, 30_000 + prober.CALL_COST) == 67_000


def test_an_answer_carries_each_probes_status_gas_and_data() -> None:
    outcomes = [(1, 51_234, b"\x00" * 31 + b"\x01"), (0, 1_500_000, b""), (2, 0, b"")]
    result = "0x" + encode(["(uint8,uint256,bytes)[]"], [outcomes]).hex()  # probeAll's answer
    assert prober.decode(result, 3) == [
        prober.Outcome(prober.Status.SUCCEEDED, 51_234, b"\x00" * 31 + b"\x01"),
        prober.Outcome(prober.Status.REVERTED, 1_500_000, b""),
        prober.Outcome(prober.Status.NOT_RUN, 0, b""),
    ]


@pytest.mark.parametrize("gas", [300_000, 3_000_000, 30_000_000])
def test_the_calls_run_the_probes_in_the_runs_of_chunks_each_with_its_data_and_gas(gas: int) -> None:
    probes = [(TOKEN, bytes([i % 7]) * (200 + i), gas) for i in range(40)]
    calls = prober.prober_calls(probes)
    runs = [
        run
        for run in prober.chunks(probes)
        if prober.call_gas([probes[i] for i in run]) <= prober.PROBER_GAS_MAX
    ]
    assert [c.indexes for c in calls] == runs
    for call in calls:
        selected = [probes[i] for i in call.indexes]
        assert call.gas == prober.call_gas(selected)
        assert call.data == prober._PROBE_ALL.encode(selected)
