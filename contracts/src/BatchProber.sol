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
    ///         give the call all of its gas; `data` empty).
    struct Outcome {
        uint8 status;
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
            if (returned || answer.length < 96) {
                outcomes[i] = Outcome(NOT_RUN, "");
            } else {
                (uint8 status, bytes memory data) = abi.decode(answer, (uint8, bytes));
                outcomes[i] = Outcome(status, data);
            }
        }
    }

    /// @notice Run `data` on `target` with exactly `gasLimit`, then revert with the outcome
    ///         ABI-encoded as (uint8 status, bytes data): the call's state changes are undone.
    function probe(address target, bytes calldata data, uint256 gasLimit) external {
        assembly {
            let ptr := mload(0x40)
            calldatacopy(ptr, data.offset, data.length)
            let status := NOT_RUN
            // The callee gets min(gasLimit, 63/64 of what is left): run it only when that is
            // all of gasLimit.
            if iszero(lt(gas(), add(add(gasLimit, div(gasLimit, 63)), CALL_RESERVE))) {
                status := call(gasLimit, target, 0, ptr, data.length, 0, 0)
            }
            let size := returndatasize()
            mstore(ptr, status)
            mstore(add(ptr, 0x20), 0x40)
            mstore(add(ptr, 0x40), size)
            returndatacopy(add(ptr, 0x60), 0, size)
            mstore(add(add(ptr, 0x60), size), 0)
            revert(ptr, add(0x60, and(add(size, 31), not(31))))
        }
    }

    receive() external payable {}

    fallback() external payable {}
}
