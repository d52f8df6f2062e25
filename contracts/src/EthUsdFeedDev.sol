// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title EthUsdFeedDev
/// @notice A Chainlink-style ETH/USD aggregator for the local devnet (AggregatorV3Interface:
/// 8 decimals, latestRoundData). Anyone may set the answer and its update time, so tests can
/// move the price or let it go stale.
contract EthUsdFeedDev {
    uint8 public constant decimals = 8;
    string public constant description = "ETH / USD (devnet)";
    uint256 public constant version = 4;

    uint80 private _round;
    int256 private _answer;
    uint256 private _updatedAt;

    constructor(int256 answer_) {
        _set(answer_, block.timestamp);
    }

    function setAnswer(int256 answer_, uint256 updatedAt_) external {
        _set(answer_, updatedAt_);
    }

    function latestRoundData()
        external
        view
        returns (uint80 roundId, int256 answer, uint256 startedAt, uint256 updatedAt, uint80 answeredInRound)
    {
        return (_round, _answer, _updatedAt, _updatedAt, _round);
    }

    function _set(int256 answer_, uint256 updatedAt_) private {
        _round += 1;
        _answer = answer_;
        _updatedAt = updatedAt_;
    }
}
