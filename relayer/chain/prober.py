"""Many executions in one ``eth_call``: the batch prober (``contracts/src/BatchProber.sol``).
Its runtime code (the compiled artifact's ``deployedBytecode``, shipped in the package's
``contracts_abi/``) is placed at the executor's address for that call only, by the call's
state override; its ``probeAll`` runs each (target, call data, gas) as the executor
(``msg.sender``) with exactly that gas, in a frame that always reverts, so no probe sees
another's state changes: the outcomes of independent ``eth_call`` s at one block, for one
JSON-RPC method call.

A probe's gas is what a transaction at the job's gas limit leaves its call: the limit less
the intrinsic gas (21,000 and the call data's); a limit under the intrinsic gas or under
EIP-7623's call data floor runs nothing (a node refuses such a transaction). The outer call
has no ``from`` (no account with code sends it: EIP-3607) and gas enough for all of its
probes, at most :data:`PROBER_GAS_MAX`: more probes go in more ``eth_call`` s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from typing import Any, Final

from eth_abi.exceptions import DecodingError

from relayer.chain import codec
from relayer.chain.abi import artifact
from relayer.chain.abi_reader import AbiReader
from relayer.domain.abi_words import tuple_array, uint_word

PROBER_GAS_MAX: Final = 25_000_000
"""Most gas one prober ``eth_call`` is given: under the nodes' own caps on an ``eth_call``'s
gas (geth's and reth's 50M by default, a devnet's 30M block gas limit)."""
TX_GAS: Final = 21_000
"""A transaction's base intrinsic gas."""
_PROBE_ALL: Final = codec.function("BatchProber", "probeAll")
_PROBE_KINDS: Final = ("address", "bytes", "uint256")
"""A ``Probe``'s fields (target, data, gas), as :func:`~relayer.domain.abi_words.tuple_array` encodes them."""
_BASE_GAS: Final = 50_000
"""``probeAll``'s own work beside its probes (dispatch, the outcomes array), gas."""
_PROBE_FRAME_GAS: Final = 10_000
"""A probe's frame beside its call's gas: the CALL's cold access and the prober's
``CALL_RESERVE``, the revert of the outcome, gas."""
_PER_PROBE_GAS: Final = 10_000
"""``probeAll``'s work per probe beside the probe's frame (the self call, decoding), gas."""
_ANSWER_BYTES: Final = 2_048
"""Memory a probe's outcome takes in ``probeAll`` (its answer and the decoded copy), bytes,
assumed for the gas budget (a call returns or reverts with a few words)."""


class Status(IntEnum):
    """What one probe came to (the prober's ``Outcome.status``)."""

    REVERTED = 0
    SUCCEEDED = 1
    NOT_RUN = 2
    """Not enough gas was left to give the call all of its gas: nothing is known."""


CALL_COST: Final = 2_600
"""What a probe's CALL costs beside its callee's execution (its cold access to the target,
EIP-2929), gas: counted in an outcome's ``gas_used``, not in a transaction to the target."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One probe's outcome: its status, the gas its CALL consumed (the callee's execution and
    the CALL's own cost: at most :data:`CALL_COST` and a few more over what a transaction's
    execution of the call spends; 0 when NOT_RUN) and the data its call returned or
    reverted with."""

    status: Status
    gas_used: int
    data: bytes


class Unknown(IntEnum):
    """What a probe's outcome is when no probe ran."""

    UNDER_INTRINSIC = 0
    """The gas limit is under the call's intrinsic gas or EIP-7623's floor: no transaction
    runs it (:func:`execution_gas` is None)."""


UNDER_INTRINSIC: Final = Unknown.UNDER_INTRINSIC


@cache
def runtime_code() -> str:
    """The prober's runtime code, 0x hex, as the package ships it (``contracts_abi/BatchProber.json``)."""
    return str(artifact("BatchProber")["deployedBytecode"])


def intrinsic_gas(data: bytes) -> int:
    """A transaction's gas before its call runs, with ``data`` its call data: 21,000 and 16 a
    non-zero byte, 4 a zero byte (EIP-2028)."""
    zeros = data.count(0)
    return TX_GAS + 16 * (len(data) - zeros) + 4 * zeros


def floor_gas(data: bytes) -> int:
    """EIP-7623's least gas a transaction with call data ``data`` is charged: 21,000 and 10
    a token (4 a non-zero byte, 1 a zero byte)."""
    zeros = data.count(0)
    return TX_GAS + 10 * (4 * (len(data) - zeros) + zeros)


def transaction_gas(data: bytes, gas_used: int) -> int:
    """A transaction's gas limit for its call to run as a probe whose CALL consumed
    ``gas_used`` did: the intrinsic gas of ``data`` and the execution (``gas_used`` less the
    CALL's own :data:`CALL_COST`), at least EIP-7623's floor. What ``eth_estimateGas`` would
    answer, give or take the few gas of the CALL's stack work (counted here, so never
    under) and the 1/64 a nested call withholds (the gas plan's margin covers it; the
    re-check before signing executes the call at the plan's limit)."""
    return max(intrinsic_gas(data) + max(0, gas_used - CALL_COST), floor_gas(data))


def execution_gas(data: bytes, gas_limit: int) -> int | None:
    """The gas a transaction of ``gas_limit`` calling with ``data`` leaves its call (the limit
    less 21,000 and 16 a non-zero byte, 4 a zero byte of ``data``), or None when the limit is
    under that intrinsic gas or under EIP-7623's floor (21,000 and 10 a token of ``data``:
    4 a non-zero byte, 1 a zero byte)."""
    intrinsic = intrinsic_gas(data)
    if gas_limit < max(intrinsic, floor_gas(data)):
        return None
    return gas_limit - intrinsic


def call_gas(probes: Sequence[tuple[str, bytes, int]]) -> int:
    """Gas enough for one ``eth_call`` of ``probeAll(probes)`` ((target, call data, gas)
    each): its intrinsic gas, then each probe's gas with the 1/64 the EVM withholds at each
    of its two calls, the frames' own work and the memory the calls and outcomes take."""
    return _call_gas(encode_probes(probes), probes)


def _call_gas(data: bytes, probes: Sequence[tuple[str, bytes, int]]) -> int:
    """:func:`call_gas` of ``probes`` whose ``probeAll`` call data is ``data``."""
    intrinsic, floor = intrinsic_gas(data), floor_gas(data)
    execution = _BASE_GAS
    memory = 0
    for _target, call, gas in probes:
        frame = gas + gas // 63 + _PROBE_FRAME_GAS + 8 * len(call)
        execution += frame + frame // 63 + _PER_PROBE_GAS + 8 * len(call)
        memory += len(call) + 256 + _ANSWER_BYTES
    words = memory // 32 + 1
    execution += 3 * words + words * words // 512
    return max(intrinsic + execution, floor)


def chunks(probes: Sequence[tuple[str, bytes, int]], most: int = PROBER_GAS_MAX) -> list[list[int]]:
    """The indexes of ``probes`` in runs, in order, each run as many as one ``eth_call`` of
    at most ``most`` gas (:func:`call_gas`) takes; a probe that needs more alone is a run of
    its own (its :func:`call_gas` is over ``most``)."""
    if not probes:
        return []
    if len(probes) == 1 or call_gas(probes) <= most:  # one call takes them all (the usual case)
        return [list(range(len(probes)))]
    runs: list[list[int]] = []
    run: list[int] = []
    for i in range(len(probes)):
        if run and call_gas([probes[j] for j in [*run, i]]) > most:
            runs.append(run)
            run = []
        run.append(i)
    if run:
        runs.append(run)
    return runs


@dataclass(frozen=True, slots=True)
class ProberCall:
    """One ``eth_call`` of ``probeAll``: the indexes of its probes (in the list given to
    :func:`prober_calls`), its call data and its gas (:func:`call_gas`)."""

    indexes: list[int]
    data: bytes
    gas: int


def prober_calls(probes: Sequence[tuple[str, bytes, int]], most: int = PROBER_GAS_MAX) -> list[ProberCall]:
    """The ``eth_call`` s that run ``probes`` in :func:`chunks`' runs, each run's call data
    encoded once (all of them in one call, the usual case: one encoding in all); a run whose
    gas passes ``most`` (a probe too big alone) is left out: its probes are not run."""
    if not probes:
        return []
    data = encode_probes(probes)
    gas = _call_gas(data, probes)
    if gas <= most:
        return [ProberCall(list(range(len(probes))), data, gas)]
    calls: list[ProberCall] = []
    for run in chunks(probes, most):
        selected = [probes[j] for j in run]
        data = encode_probes(selected)
        gas = _call_gas(data, selected)
        if gas <= most:
            calls.append(ProberCall(run, data, gas))
    return calls


def encode_probes(probes: Sequence[tuple[str, bytes, int]]) -> bytes:
    """The call data of ``probeAll(probes)``: its selector, the array's offset, then the
    array of (target, call data, gas) tuples (:func:`~relayer.domain.abi_words.tuple_array`;
    what eth_abi encodes, a tenth of its cost).

    Raises:
        ValueError: a target is not an address, or a gas not a uint256.
    """
    return _PROBE_ALL.selector + uint_word(32) + tuple_array(probes, _PROBE_KINDS)


def call_params(executor: str, call: ProberCall, block: int | None = None) -> list[Any]:
    """The ``eth_call`` params of ``call`` at ``block`` (None: the latest), with its gas, the
    prober's code at ``executor`` by state override, and no ``from``."""
    return [
        {"to": executor, "data": "0x" + call.data.hex(), "gas": hex(call.gas)},
        "latest" if block is None else hex(block),
        {executor: {"code": runtime_code()}},
    ]


def decode(result: str, count: int) -> list[Outcome]:
    """The ``count`` outcomes in ``probeAll``'s answer ``result`` (0x hex).

    Raises:
        ValueError: the answer is not ``count`` outcomes (an answer from an account without
            the prober's code, "0x": the node ignored the state override).
    """
    try:
        decoded = _outcomes(bytes.fromhex(result.removeprefix("0x")))
    except (ValueError, DecodingError) as exc:  # not the ABI's shape, a status out of range
        raise ValueError(f"the prober answered no outcomes: {type(exc).__name__}") from None
    if len(decoded) != count:
        raise ValueError(f"the prober answered {len(decoded)} outcomes for {count} probes")
    return decoded


def _outcomes(answer: bytes) -> list[Outcome]:
    """``probeAll``'s answer, an array of (uint8 status, uint256 gasUsed, bytes data), read
    word by word (what eth_abi decodes, a tenth of its cost).

    Raises:
        DecodingError: the answer is not that array.
        ValueError: a status is none of :class:`Status`.
    """
    r = AbiReader(answer)
    count, heads = r.array(r.offset(0, 0, 32))
    outcomes: list[Outcome] = []
    for i in range(count):
        at = r.offset(heads, heads + 32 * i, 32 * count)
        data = r.dynamic_bytes(r.offset(at, at + 64, 96))
        outcomes.append(Outcome(Status(r.uint(at, 8)), r.uint(at + 32), data))
    return outcomes
