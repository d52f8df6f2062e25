// SPDX-License-Identifier: MIT
pragma solidity 0.8.37;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";

/// @title Constant-product USDC/kVCM pool (x * y = k, 0.30 % fee), so that paying for a
///        carbon class in USDC has real price impact.
/// @notice Amount math is Uniswap V2's: getAmountIn rounds up by one atomic unit.
contract UsdcKvcmPool is Ownable {
    using SafeERC20 for IERC20;

    uint256 public constant FEE_BPS = 30;
    uint256 private constant BPS = 10_000;

    IERC20 public immutable usdc;
    IERC20 public immutable kvcm;
    uint256 public reserveUsdc;
    uint256 public reserveKvcm;

    event Swap(address indexed sender, address indexed tokenIn, uint256 amountIn, uint256 amountOut, address to);

    error UnknownToken(address token);
    error InsufficientPoolLiquidity(uint256 requested, uint256 reserve);
    error SlippageExceeded(uint256 required, uint256 limit);
    error ZeroAmount();

    constructor(IERC20 usdc_, IERC20 kvcm_) Ownable(msg.sender) {
        usdc = usdc_;
        kvcm = kvcm_;
    }

    function addLiquidity(uint256 usdcAmount, uint256 kvcmAmount) external onlyOwner {
        usdc.safeTransferFrom(msg.sender, address(this), usdcAmount);
        kvcm.safeTransferFrom(msg.sender, address(this), kvcmAmount);
        reserveUsdc += usdcAmount;
        reserveKvcm += kvcmAmount;
    }

    function getReserves() external view returns (uint256, uint256) {
        return (reserveUsdc, reserveKvcm);
    }

    function getAmountIn(address tokenOut, uint256 amountOut) public view returns (uint256) {
        (uint256 rIn, uint256 rOut) = _reserves(tokenOut, false);
        if (amountOut == 0) revert ZeroAmount();
        if (amountOut >= rOut) revert InsufficientPoolLiquidity(amountOut, rOut);
        return (rIn * amountOut * BPS) / ((rOut - amountOut) * (BPS - FEE_BPS)) + 1;
    }

    function getAmountOut(address tokenIn, uint256 amountIn) public view returns (uint256) {
        (uint256 rIn, uint256 rOut) = _reserves(tokenIn, true);
        if (amountIn == 0) revert ZeroAmount();
        uint256 inWithFee = amountIn * (BPS - FEE_BPS);
        return (inWithFee * rOut) / (rIn * BPS + inWithFee);
    }

    function swapExactOutput(address tokenOut, uint256 amountOut, uint256 maxAmountIn, address to)
        external
        returns (uint256 amountIn)
    {
        amountIn = getAmountIn(tokenOut, amountOut);
        if (amountIn > maxAmountIn) revert SlippageExceeded(amountIn, maxAmountIn);
        _swap(tokenOut == address(usdc) ? address(kvcm) : address(usdc), amountIn, amountOut, to);
    }

    function swapExactInput(address tokenIn, uint256 amountIn, uint256 minAmountOut, address to)
        external
        returns (uint256 amountOut)
    {
        amountOut = getAmountOut(tokenIn, amountIn);
        if (amountOut < minAmountOut) revert SlippageExceeded(minAmountOut, amountOut);
        _swap(tokenIn, amountIn, amountOut, to);
    }

    function _swap(address tokenIn, uint256 amountIn, uint256 amountOut, address to) private {
        IERC20(tokenIn).safeTransferFrom(msg.sender, address(this), amountIn);
        if (tokenIn == address(usdc)) {
            reserveUsdc += amountIn;
            reserveKvcm -= amountOut;
            kvcm.safeTransfer(to, amountOut);
        } else {
            reserveKvcm += amountIn;
            reserveUsdc -= amountOut;
            usdc.safeTransfer(to, amountOut);
        }
        emit Swap(msg.sender, tokenIn, amountIn, amountOut, to);
    }

    /// @dev (reserve of the input side, reserve of the output side).
    function _reserves(address token, bool isInput) private view returns (uint256, uint256) {
        if (token == address(usdc)) return isInput ? (reserveUsdc, reserveKvcm) : (reserveKvcm, reserveUsdc);
        if (token == address(kvcm)) return isInput ? (reserveKvcm, reserveUsdc) : (reserveUsdc, reserveKvcm);
        revert UnknownToken(token);
    }
}
