// SPDX-License-Identifier: MIT
pragma solidity 0.8.37;

import {ERC1155} from "@openzeppelin/contracts/token/ERC1155/ERC1155.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";

/// @title Carbon credits as ERC-1155 tokens, one token id per project and vintage.
/// @notice Balances are in kilograms of CO2e (UNITS_PER_TONNE = 1000 units a tonne).
///         Each credit belongs to a registry; a whole-tonne registry (Puro-like) retires
///         only multiples of a tonne and requires consumption metadata.
contract CarbonCredits is ERC1155, Ownable {
    uint256 public constant UNITS_PER_TONNE = 1000;

    struct Registry {
        bool exists;
        bool wholeTonnesOnly;
        bool requiresConsumptionMetadata;
    }

    struct Credit {
        string projectId;
        uint16 vintage;
        string registry;
    }

    mapping(string code => Registry) private _registries;
    mapping(uint256 tokenId => Credit) private _credits;
    mapping(uint256 tokenId => uint256 units) public totalRetired;
    uint256 public creditCount;

    event RegistryAdded(string code, bool wholeTonnesOnly, bool requiresConsumptionMetadata);
    event CreditRegistered(uint256 indexed tokenId, string projectId, uint16 vintage, string registry);
    event CreditRetired(address indexed holder, address indexed beneficiary, uint256 indexed tokenId, uint256 amount);

    error UnknownRegistry(string code);
    error UnknownCredit(uint256 tokenId);
    error WholeTonnesOnly(uint256 tokenId, uint256 amount);
    error ZeroAmount();

    constructor() ERC1155("") Ownable(msg.sender) {}

    function addRegistry(string calldata code, bool wholeTonnesOnly, bool requiresConsumptionMetadata)
        external
        onlyOwner
    {
        _registries[code] = Registry(true, wholeTonnesOnly, requiresConsumptionMetadata);
        emit RegistryAdded(code, wholeTonnesOnly, requiresConsumptionMetadata);
    }

    function registerCredit(string calldata projectId, uint16 vintage, string calldata registry)
        external
        onlyOwner
        returns (uint256 tokenId)
    {
        if (!_registries[registry].exists) revert UnknownRegistry(registry);
        tokenId = ++creditCount;
        _credits[tokenId] = Credit(projectId, vintage, registry);
        emit CreditRegistered(tokenId, projectId, vintage, registry);
    }

    function mint(address to, uint256 tokenId, uint256 amount) external onlyOwner {
        if (tokenId == 0 || tokenId > creditCount) revert UnknownCredit(tokenId);
        _mint(to, tokenId, amount, "");
    }

    function creditInfo(uint256 tokenId)
        external
        view
        returns (
            string memory projectId,
            uint16 vintage,
            string memory registry,
            bool wholeTonnesOnly,
            bool requiresConsumptionMetadata
        )
    {
        if (tokenId == 0 || tokenId > creditCount) revert UnknownCredit(tokenId);
        Credit storage c = _credits[tokenId];
        Registry storage r = _registries[c.registry];
        return (c.projectId, c.vintage, c.registry, r.wholeTonnesOnly, r.requiresConsumptionMetadata);
    }

    /// @notice Burns `amount` units of the caller's credit for `beneficiary`.
    function retire(uint256 tokenId, uint256 amount, address beneficiary) external {
        if (amount == 0) revert ZeroAmount();
        if (tokenId == 0 || tokenId > creditCount) revert UnknownCredit(tokenId);
        if (_registries[_credits[tokenId].registry].wholeTonnesOnly && amount % UNITS_PER_TONNE != 0) {
            revert WholeTonnesOnly(tokenId, amount);
        }
        _burn(msg.sender, tokenId, amount);
        totalRetired[tokenId] += amount;
        emit CreditRetired(msg.sender, beneficiary, tokenId, amount);
    }
}
