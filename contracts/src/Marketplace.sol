// SPDX-License-Identifier: MIT
pragma solidity 0.8.37;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {IERC1155} from "@openzeppelin/contracts/token/ERC1155/IERC1155.sol";
import {ERC1155Holder} from "@openzeppelin/contracts/token/ERC1155/utils/ERC1155Holder.sol";

/// @title Seller listings of carbon credits, paid in USDC only.
/// @notice A listing escrows the seller's credits. `unitPrice` is USDC atomic units per
///         tonne; a fill of `amount` credit units costs ceil(unitPrice * amount / 1000).
///         A fill below `minFill` is refused unless it takes the whole remainder.
contract Marketplace is ERC1155Holder {
    using SafeERC20 for IERC20;

    uint256 public constant UNITS_PER_TONNE = 1000;

    struct Listing {
        address seller;
        address creditToken;
        uint256 tokenId;
        uint256 unitPrice;
        uint256 totalAmountToSell;
        uint256 leftToSell;
        uint256 minFill;
        uint64 expiration;
        bool active;
    }

    IERC20 public immutable usdc;
    uint256 public listingCount;
    mapping(uint256 listingId => Listing) private _listings;

    event ListingCreated(
        uint256 indexed listingId,
        address indexed seller,
        address creditToken,
        uint256 tokenId,
        uint256 amount,
        uint256 unitPrice,
        uint256 minFill,
        uint64 expiration
    );
    event ListingFilled(uint256 indexed listingId, address indexed buyer, uint256 amount, uint256 cost);
    event ListingCancelled(uint256 indexed listingId);
    event ListingUpdated(uint256 indexed listingId, uint256 unitPrice, uint256 minFill, uint64 expiration);

    error ListingNotFound(uint256 listingId);
    error ListingNotActive(uint256 listingId);
    error ListingExpired(uint256 listingId, uint64 expiration);
    error BelowMinFill(uint256 amount, uint256 minFill);
    error InsufficientListingSupply(uint256 requested, uint256 leftToSell);
    error SlippageExceeded(uint256 required, uint256 limit);
    error NotSeller(address caller);
    error InvalidListing();

    constructor(IERC20 usdc_) {
        usdc = usdc_;
    }

    function createListing(
        address creditToken,
        uint256 tokenId,
        uint256 amount,
        uint256 unitPrice,
        uint256 minFill,
        uint64 expiration
    ) external returns (uint256 listingId) {
        if (amount == 0 || unitPrice == 0 || minFill > amount || expiration <= block.timestamp) {
            revert InvalidListing();
        }
        IERC1155(creditToken).safeTransferFrom(msg.sender, address(this), tokenId, amount, "");
        listingId = ++listingCount;
        _listings[listingId] = Listing(msg.sender, creditToken, tokenId, unitPrice, amount, amount, minFill, expiration, true);
        emit ListingCreated(listingId, msg.sender, creditToken, tokenId, amount, unitPrice, minFill, expiration);
    }

    function cancelListing(uint256 listingId) external {
        Listing storage l = _listing(listingId);
        if (msg.sender != l.seller) revert NotSeller(msg.sender);
        if (!l.active) revert ListingNotActive(listingId);
        l.active = false;
        uint256 left = l.leftToSell;
        l.leftToSell = 0;
        if (left > 0) IERC1155(l.creditToken).safeTransferFrom(address(this), l.seller, l.tokenId, left, "");
        emit ListingCancelled(listingId);
    }

    /// @notice The seller reprices an active listing: new unit price, smallest fill and expiry,
    ///         under createListing's rules (against what is left to sell). Escrow is unchanged.
    function updateListing(uint256 listingId, uint256 unitPrice, uint256 minFill, uint64 expiration) external {
        Listing storage l = _listing(listingId);
        if (msg.sender != l.seller) revert NotSeller(msg.sender);
        if (!l.active) revert ListingNotActive(listingId);
        if (unitPrice == 0 || minFill > l.leftToSell || expiration <= block.timestamp) revert InvalidListing();
        l.unitPrice = unitPrice;
        l.minFill = minFill;
        l.expiration = expiration;
        emit ListingUpdated(listingId, unitPrice, minFill, expiration);
    }

    function getListing(uint256 listingId) external view returns (Listing memory) {
        return _listing(listingId);
    }

    /// @notice Listings `first` .. `first + count - 1` (clipped to the existing ones), in one call.
    function getListings(uint256 first, uint256 count) external view returns (Listing[] memory out) {
        if (first == 0) first = 1;
        uint256 last = first + count - 1;
        if (last > listingCount) last = listingCount;
        if (count == 0 || first > last) return new Listing[](0);
        out = new Listing[](last - first + 1);
        for (uint256 i = first; i <= last; ++i) {
            out[i - first] = _listings[i];
        }
    }

    function fillCost(uint256 listingId, uint256 amount) public view returns (uint256) {
        return (_listing(listingId).unitPrice * amount + UNITS_PER_TONNE - 1) / UNITS_PER_TONNE;
    }

    function fill(uint256 listingId, uint256 amount, uint256 maxCost, address to) external returns (uint256 cost) {
        Listing storage l = _listing(listingId);
        if (!l.active) revert ListingNotActive(listingId);
        if (block.timestamp >= l.expiration) revert ListingExpired(listingId, l.expiration);
        if (amount > l.leftToSell) revert InsufficientListingSupply(amount, l.leftToSell);
        if (amount == 0 || (amount < l.minFill && amount != l.leftToSell)) revert BelowMinFill(amount, l.minFill);
        cost = fillCost(listingId, amount);
        if (cost > maxCost) revert SlippageExceeded(cost, maxCost);
        l.leftToSell -= amount;
        usdc.safeTransferFrom(msg.sender, l.seller, cost);
        IERC1155(l.creditToken).safeTransferFrom(address(this), to, l.tokenId, amount, "");
        emit ListingFilled(listingId, msg.sender, amount, cost);
    }

    function _listing(uint256 listingId) private view returns (Listing storage l) {
        l = _listings[listingId];
        if (l.seller == address(0)) revert ListingNotFound(listingId);
    }
}
