// SPDX-License-Identifier: MIT
pragma solidity 0.8.37;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {IERC1155} from "@openzeppelin/contracts/token/ERC1155/IERC1155.sol";
import {ERC1155Holder} from "@openzeppelin/contracts/token/ERC1155/utils/ERC1155Holder.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";

/// @title Carbon classes: pools of registered credits, priced in kVCM per tonne.
/// @notice Credits are held by this contract; `redeem` sells a registered credit at the
///         class price (kVCM atomic units per tonne, cost rounded up to the next atomic
///         unit) to whoever pays. Amounts are credit units (1000 a tonne).
contract CarbonClasses is Ownable, ERC1155Holder {
    using SafeERC20 for IERC20;

    uint256 public constant UNITS_PER_TONNE = 1000;

    struct CarbonClass {
        string symbol;
        string name;
        uint256 priceKvcmPerTonne;
        uint256 minRetirementUnits;
    }

    IERC20 public immutable kvcm;
    IERC1155 public immutable credits;
    address public treasury;

    CarbonClass[] private _classes;
    mapping(uint256 classId => uint256[] tokenIds) private _classCredits;
    mapping(uint256 classId => mapping(uint256 tokenId => bool)) public isRegistered;
    mapping(uint256 classId => mapping(uint256 tokenId => uint256 units)) public liquidity;

    event ClassCreated(uint256 indexed classId, string symbol, string name, uint256 priceKvcmPerTonne);
    event CreditRegistered(uint256 indexed classId, uint256 indexed tokenId);
    event Redeemed(uint256 indexed classId, uint256 indexed tokenId, uint256 amount, uint256 cost, address to);

    error UnknownClass(uint256 classId);
    error CreditNotInClass(uint256 classId, uint256 tokenId);
    error InsufficientLiquidity(uint256 requested, uint256 available);
    error BelowClassMinimum(uint256 amount, uint256 minimum);
    error SlippageExceeded(uint256 required, uint256 limit);

    constructor(IERC20 kvcm_, IERC1155 credits_, address treasury_) Ownable(msg.sender) {
        kvcm = kvcm_;
        credits = credits_;
        treasury = treasury_;
    }

    function createClass(string calldata symbol, string calldata name, uint256 priceKvcmPerTonne, uint256 minUnits)
        external
        onlyOwner
        returns (uint256 classId)
    {
        _classes.push(CarbonClass(symbol, name, priceKvcmPerTonne, minUnits));
        classId = _classes.length;
        emit ClassCreated(classId, symbol, name, priceKvcmPerTonne);
    }

    function setPrice(uint256 classId, uint256 priceKvcmPerTonne) external onlyOwner {
        _class(classId).priceKvcmPerTonne = priceKvcmPerTonne;
    }

    function registerCredit(uint256 classId, uint256 tokenId) external onlyOwner {
        _class(classId);
        if (!isRegistered[classId][tokenId]) {
            isRegistered[classId][tokenId] = true;
            _classCredits[classId].push(tokenId);
            emit CreditRegistered(classId, tokenId);
        }
    }

    /// @notice Adds `amount` units of a registered credit from the caller to the class.
    function deposit(uint256 classId, uint256 tokenId, uint256 amount) external {
        if (!isRegistered[classId][tokenId]) revert CreditNotInClass(classId, tokenId);
        credits.safeTransferFrom(msg.sender, address(this), tokenId, amount, "");
        liquidity[classId][tokenId] += amount;
    }

    function classCount() external view returns (uint256) {
        return _classes.length;
    }

    function classInfo(uint256 classId) external view returns (CarbonClass memory) {
        return _classView(classId);
    }

    /// @notice Registered token ids of a class and the units of each the class holds.
    function classCredits(uint256 classId)
        external
        view
        returns (uint256[] memory tokenIds, uint256[] memory available)
    {
        _classView(classId);
        tokenIds = _classCredits[classId];
        available = new uint256[](tokenIds.length);
        for (uint256 i = 0; i < tokenIds.length; ++i) {
            available[i] = liquidity[classId][tokenIds[i]];
        }
    }

    /// @notice Every class with its registered credits and their liquidity, in one call.
    function allClasses()
        external
        view
        returns (CarbonClass[] memory infos, uint256[][] memory tokenIds, uint256[][] memory available)
    {
        uint256 n = _classes.length;
        infos = _classes;
        tokenIds = new uint256[][](n);
        available = new uint256[][](n);
        for (uint256 c = 0; c < n; ++c) {
            uint256[] storage ids = _classCredits[c + 1];
            tokenIds[c] = ids;
            available[c] = new uint256[](ids.length);
            for (uint256 i = 0; i < ids.length; ++i) {
                available[c][i] = liquidity[c + 1][ids[i]];
            }
        }
    }

    /// @notice kVCM atomic units for `amount` credit units, rounded up.
    function quoteRedeem(uint256 classId, uint256 amount) public view returns (uint256) {
        uint256 price = _classView(classId).priceKvcmPerTonne;
        return (price * amount + UNITS_PER_TONNE - 1) / UNITS_PER_TONNE;
    }

    function redeem(uint256 classId, uint256 tokenId, uint256 amount, uint256 maxCost, address to)
        external
        returns (uint256 cost)
    {
        CarbonClass storage c = _class(classId);
        if (!isRegistered[classId][tokenId]) revert CreditNotInClass(classId, tokenId);
        if (amount < c.minRetirementUnits) revert BelowClassMinimum(amount, c.minRetirementUnits);
        uint256 available = liquidity[classId][tokenId];
        if (amount > available) revert InsufficientLiquidity(amount, available);
        cost = quoteRedeem(classId, amount);
        if (cost > maxCost) revert SlippageExceeded(cost, maxCost);
        liquidity[classId][tokenId] = available - amount;
        kvcm.safeTransferFrom(msg.sender, treasury, cost);
        credits.safeTransferFrom(address(this), to, tokenId, amount, "");
        emit Redeemed(classId, tokenId, amount, cost, to);
    }

    function _class(uint256 classId) private view returns (CarbonClass storage) {
        if (classId == 0 || classId > _classes.length) revert UnknownClass(classId);
        return _classes[classId - 1];
    }

    function _classView(uint256 classId) private view returns (CarbonClass memory) {
        return _class(classId);
    }
}
