// SPDX-License-Identifier: MIT
pragma solidity 0.8.37;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {ERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Permit.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";

/// @title kVCM: the protocol's carbon-class currency (local reference token).
/// @notice ERC-20 with EIP-2612 permit (EIP-712 name "kVCM", version "1"), 18 decimals.
contract KlimaVcm is ERC20, ERC20Permit, Ownable {
    constructor() ERC20("kVCM", "kVCM") ERC20Permit("kVCM") Ownable(msg.sender) {}

    function mint(address to, uint256 amount) external onlyOwner {
        _mint(to, amount);
    }
}
