// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title GasPriceOracleDev
/// @notice Stands in, on the local devnet only, for the OP-stack GasPriceOracle predeploy at
/// 0x420000000000000000000000000000000000000F that Base runs: the Fjord L1 data fee upper
/// bound and the Isthmus operator fee, with the real formulas, over parameters that anyone may
/// set (the devnet places this code at the predeploy address with anvil_setCode; tests move
/// the parameters). A live chain's parameters are set by its operator and only read here.
contract GasPriceOracleDev {
    uint256 public constant DECIMALS = 6;
    int256 private constant COST_INTERCEPT = -42_585_600;
    uint256 private constant COST_FASTLZ_COEF = 836_500;
    uint256 private constant MIN_TRANSACTION_SIZE = 100;

    uint256 public l1BaseFee;
    uint256 public blobBaseFee;
    uint32 public baseFeeScalar;
    uint32 public blobBaseFeeScalar;
    uint32 public operatorFeeScalar;
    uint64 public operatorFeeConstant;

    function setL1Fees(uint256 l1BaseFee_, uint256 blobBaseFee_, uint32 baseFeeScalar_, uint32 blobBaseFeeScalar_)
        external
    {
        l1BaseFee = l1BaseFee_;
        blobBaseFee = blobBaseFee_;
        baseFeeScalar = baseFeeScalar_;
        blobBaseFeeScalar = blobBaseFeeScalar_;
    }

    function setOperatorFee(uint32 operatorFeeScalar_, uint64 operatorFeeConstant_) external {
        operatorFeeScalar = operatorFeeScalar_;
        operatorFeeConstant = operatorFeeConstant_;
    }

    function isFjord() external pure returns (bool) {
        return true;
    }

    function isIsthmus() external pure returns (bool) {
        return true;
    }

    /// @notice Upper bound of the L1 data fee (wei) of a transaction whose unsigned RLP
    /// encoding has `unsignedTxSize` bytes (Fjord: 68 bytes for the signature and a FastLZ
    /// bound that covers 99.99 % of transactions).
    function getL1FeeUpperBound(uint256 unsignedTxSize) external view returns (uint256) {
        uint256 txSize = unsignedTxSize + 68;
        uint256 flzUpperBound = txSize + txSize / 255 + 16;
        return _fjordL1Cost(flzUpperBound);
    }

    /// @notice The operator fee (wei) of a transaction that used `gasUsed` gas (Isthmus).
    function getOperatorFee(uint256 gasUsed) external view returns (uint256) {
        return (gasUsed * operatorFeeScalar) / 1e6 + operatorFeeConstant;
    }

    function _fjordL1Cost(uint256 fastLzSize) internal view returns (uint256) {
        int256 estimated = COST_INTERCEPT + int256(COST_FASTLZ_COEF * fastLzSize);
        if (estimated < int256(MIN_TRANSACTION_SIZE) * 1e6) estimated = int256(MIN_TRANSACTION_SIZE) * 1e6;
        uint256 feeScaled = uint256(baseFeeScalar) * 16 * l1BaseFee + uint256(blobBaseFeeScalar) * blobBaseFee;
        return (uint256(estimated) * feeScaled) / (10 ** (DECIMALS * 2));
    }
}
