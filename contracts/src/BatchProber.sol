// SPDX-License-Identifier: MIT
pragma solidity 0.8.37;

/// @title BatchProber
/// @notice Never deployed. The relayer places this runtime code at its executor's address
///         for one eth_call only (a state override) and calls probeAll there: each probe runs
///         its call as the executor (msg.sender) with exactly its gas, and every state change
///         of a probe is undone before the next one runs, so the outcomes are those of
///         independent eth_calls at the same block. Everything else sent to this code (a
///         target calling the executor back, ETH) succeeds and does nothing, as with an
///         account without code.
contract BatchProber {
    /// @notice One call: run `data` on `target` as this address with exactly `gas`.
    struct Probe {
        address target;
        bytes data;
        uint256 gas;
    }

    /// @notice What one probe came to: `status` REVERTED (`data` the revert data),
    ///         SUCCEEDED (`data` the returned data) or NOT_RUN (not enough gas was left to
    ///         give the call all of its gas; `data` empty, `gasUsed` 0). `gasUsed`: the gas
    ///         the CALL instruction consumed, the callee's execution and the CALL's own cost
    ///         (its cold access to `target`, 2,600) together; a transaction calling `target`
    ///         spends its execution less that CALL cost (its `to` is warm).
    struct Outcome {
        uint8 status;
        uint256 gasUsed;
        bytes data;
    }

    uint8 internal constant REVERTED = 0;
    uint8 internal constant SUCCEEDED = 1;
    uint8 internal constant NOT_RUN = 2;
    /// @dev Gas kept, beyond the call's gas and the 1/64 the EVM withholds, for the CALL's
    ///      own cost (a cold account: 2,600) and the few instructions before it.
    uint256 internal constant CALL_RESERVE = 5_000;

    /// @notice Run each probe in turn, each in a frame that always reverts (`probe`), so no
    ///         probe sees another's state changes; their outcomes in order.
    function probeAll(Probe[] calldata probes) external returns (Outcome[] memory outcomes) {
        outcomes = new Outcome[](probes.length);
        for (uint256 i; i < probes.length; ++i) {
            Probe calldata p = probes[i];
            (bool returned, bytes memory answer) =
                address(this).call(abi.encodeCall(this.probe, (p.target, p.data, p.gas)));
            if (returned || answer.length < 128) {
                outcomes[i] = Outcome(NOT_RUN, 0, "");
            } else {
                (uint8 status, uint256 gasUsed, bytes memory data) =
                    abi.decode(answer, (uint8, uint256, bytes));
                outcomes[i] = Outcome(status, gasUsed, data);
            }
        }
    }

    /// @notice Run `data` on `target` with exactly `gasLimit`, then revert with the outcome
    ///         ABI-encoded as (uint8 status, uint256 gasUsed, bytes data): the call's state
    ///         changes (and, EIP-2929, its warm accounts and slots) are undone.
    function probe(address target, bytes calldata data, uint256 gasLimit) external {
        assembly {
            let ptr := mload(0x40)
            calldatacopy(ptr, data.offset, data.length)
            let status := NOT_RUN
            let used := 0
            // The callee gets min(gasLimit, 63/64 of what is left): run it only when that is
            // all of gasLimit.
            if iszero(lt(gas(), add(add(gasLimit, div(gasLimit, 63)), CALL_RESERVE))) {
                let before := gas()
                status := call(gasLimit, target, 0, ptr, data.length, 0, 0)
                used := sub(before, gas())
            }
            let size := returndatasize()
            mstore(ptr, status)
            mstore(add(ptr, 0x20), used)
            mstore(add(ptr, 0x40), 0x60)
            mstore(add(ptr, 0x60), size)
            returndatacopy(add(ptr, 0x80), 0, size)
            mstore(add(add(ptr, 0x80), size), 0)
            revert(ptr, add(0x80, and(add(size, 31), not(31))))
        }
    }

    receive() external payable {}

    fallback() external payable {}
}
