// SPDX-License-Identifier: MIT
pragma solidity 0.8.37;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {IERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/IERC20Permit.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ERC1155Holder} from "@openzeppelin/contracts/token/ERC1155/utils/ERC1155Holder.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {CarbonCredits} from "./CarbonCredits.sol";
import {CarbonClasses} from "./CarbonClasses.sol";
import {Marketplace} from "./Marketplace.sol";
import {UsdcKvcmPool} from "./UsdcKvcmPool.sol";

interface IEip3009 {
    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external;
}

/// @title Settlement of carbon retirements: caller-paid, EIP-3009 gasless (USDC) and
///        EIP-2612 permit gasless (kVCM).
/// @notice Every path spends exactly retirement cost + protocol fee (+ the signed gas
///         allowance on gasless paths) out of the payer's `value` and refunds the rest in
///         the same transaction. On the USDC path the EIP-3009 nonce must equal
///         keccak256(abi.encode(hashRetirement(r), salt)), and on the kVCM path the permit's
///         deadline carries its high 192 bits, so the executor cannot change credit, amount,
///         attribution or gas allowance on either path. Fee = max(floor, ceil(cost * bps
///         / 10000)); the floor is in USDC and converted to kVCM at the pool's spot price
///         (rounded up) when paying in kVCM. One `RetirementSettled` event per retirement,
///         with its index within the transaction.
contract RetirementSettlement is Ownable, ERC1155Holder, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    uint8 public constant SOURCE_CARBON_CLASS = 0;
    uint8 public constant SOURCE_LISTING = 1;
    uint256 private constant BPS = 10_000;

    struct RetirementDetails {
        address retiringAddress;
        address beneficiaryAddress;
        string beneficiaryString;
        string retiringEntityString;
        string retirementMessage;
        string beneficiaryLocation;
        string consumptionCountryCode;
        string consumptionPeriodStart;
        string consumptionPeriodEnd;
    }

    /// @dev `sourceId` is the carbon class id or the listing id; `amount` is in credit
    ///      units (1000 a tonne); `gasAllowance` is in `inputToken` atomic units and goes
    ///      to the transaction's sender (the executor) on gasless paths, 0 otherwise.
    struct Retirement {
        uint8 source;
        uint256 sourceId;
        address creditToken;
        uint256 tokenId;
        uint256 amount;
        address inputToken;
        uint256 gasAllowance;
        RetirementDetails details;
    }

    struct Authorization {
        address from;
        uint256 value;
        uint256 validAfter;
        uint256 validBefore;
        uint8 v;
        bytes32 r;
        bytes32 s;
    }

    struct Permit {
        address owner;
        uint256 value;
        uint256 deadline;
        uint8 v;
        bytes32 r;
        bytes32 s;
    }

    struct Fees {
        uint16 classFeeBps;
        uint256 classFeeFloorUsdc;
        uint16 listingFeeBps;
        uint256 listingFeeFloorUsdc;
    }

    bytes32 public constant RETIREMENT_DETAILS_TYPEHASH = keccak256(
        "RetirementDetails(address retiringAddress,address beneficiaryAddress,string beneficiaryString,string retiringEntityString,string retirementMessage,string beneficiaryLocation,string consumptionCountryCode,string consumptionPeriodStart,string consumptionPeriodEnd)"
    );
    bytes32 public constant RETIREMENT_TYPEHASH = keccak256(
        "Retirement(uint8 source,uint256 sourceId,address creditToken,uint256 tokenId,uint256 amount,address inputToken,uint256 gasAllowance,RetirementDetails details)RetirementDetails(address retiringAddress,address beneficiaryAddress,string beneficiaryString,string retiringEntityString,string retirementMessage,string beneficiaryLocation,string consumptionCountryCode,string consumptionPeriodStart,string consumptionPeriodEnd)"
    );

    IERC20 public immutable usdc;
    IERC20 public immutable kvcm;
    CarbonCredits public immutable credits;
    CarbonClasses public immutable classes;
    Marketplace public immutable marketplace;
    UsdcKvcmPool public immutable pool;

    address public feeRecipient;
    Fees public fees;
    mapping(address => bool) public isExecutor;

    uint256 private transient _retirementsInTx;

    event RetirementSettled(
        address indexed payer,
        address indexed beneficiary,
        uint256 indexed retirementIndex,
        uint256 value,
        uint256 fee,
        uint256 retirementCost,
        uint256 refunded,
        bytes32 authorizationNonce,
        Retirement retirement
    );
    event ExecutorSet(address indexed executor, bool allowed);
    event FeesSet(Fees fees, address feeRecipient);

    error UnsupportedInputToken(address token);
    error ListingRequiresUsdc(address token);
    error InvalidSource(uint8 source);
    error RetiringAddressMismatch(address payer, address retiringAddress);
    error BeneficiaryRequired();
    error ConsumptionMetadataRequired(uint256 tokenId);
    error CreditMismatch(address creditToken, uint256 tokenId);
    error GasAllowanceNotAllowed();
    error InsufficientValue(uint256 required, uint256 available);
    error NotExecutor(address caller);
    error PermitFailed(address owner, uint256 allowance, uint256 value);
    error PermitNotBound(bytes32 authorizationNonce, uint256 deadline);
    error PermitExpired(uint64 expiry, uint256 timestamp);

    constructor(
        IERC20 usdc_,
        IERC20 kvcm_,
        CarbonCredits credits_,
        CarbonClasses classes_,
        Marketplace marketplace_,
        UsdcKvcmPool pool_,
        address feeRecipient_,
        Fees memory fees_
    ) Ownable(msg.sender) {
        usdc = usdc_;
        kvcm = kvcm_;
        credits = credits_;
        classes = classes_;
        marketplace = marketplace_;
        pool = pool_;
        feeRecipient = feeRecipient_;
        fees = fees_;
        usdc_.forceApprove(address(pool_), type(uint256).max);
        usdc_.forceApprove(address(marketplace_), type(uint256).max);
        kvcm_.forceApprove(address(classes_), type(uint256).max);
    }

    function setExecutor(address executor, bool allowed) external onlyOwner {
        isExecutor[executor] = allowed;
        emit ExecutorSet(executor, allowed);
    }

    function setFees(Fees calldata fees_, address feeRecipient_) external onlyOwner {
        fees = fees_;
        feeRecipient = feeRecipient_;
        emit FeesSet(fees_, feeRecipient_);
    }

    // ---------------------------------------------------------------- hashing

    function hashRetirement(Retirement calldata r) public pure returns (bytes32) {
        RetirementDetails calldata d = r.details;
        bytes32 detailsHash = keccak256(
            abi.encode(
                RETIREMENT_DETAILS_TYPEHASH,
                d.retiringAddress,
                d.beneficiaryAddress,
                keccak256(bytes(d.beneficiaryString)),
                keccak256(bytes(d.retiringEntityString)),
                keccak256(bytes(d.retirementMessage)),
                keccak256(bytes(d.beneficiaryLocation)),
                keccak256(bytes(d.consumptionCountryCode)),
                keccak256(bytes(d.consumptionPeriodStart)),
                keccak256(bytes(d.consumptionPeriodEnd))
            )
        );
        return keccak256(
            abi.encode(
                RETIREMENT_TYPEHASH,
                r.source,
                r.sourceId,
                r.creditToken,
                r.tokenId,
                r.amount,
                r.inputToken,
                r.gasAllowance,
                detailsHash
            )
        );
    }

    /// @notice The EIP-3009 nonce a payer signs for retirement `r` with `salt`.
    function authorizationNonce(Retirement calldata r, bytes32 salt) public pure returns (bytes32) {
        return keccak256(abi.encode(hashRetirement(r), salt));
    }

    // ---------------------------------------------------------------- quotes

    /// @notice (retirementCost, fee) in `r.inputToken` atomic units at current prices.
    function quote(Retirement calldata r) public view returns (uint256 cost, uint256 fee) {
        return _quote(r.source, r.sourceId, r.amount, r.inputToken);
    }

    // ---------------------------------------------------------------- entry points

    /// @notice Caller-paid path (`[approve, retire]`): pulls `maxInput` of the input token
    ///         from the caller, spends cost + fee, refunds the rest.
    function retire(Retirement calldata r, uint256 maxInput) external nonReentrant returns (uint256) {
        if (r.gasAllowance != 0) revert GasAllowanceNotAllowed();
        IERC20(r.inputToken).safeTransferFrom(msg.sender, address(this), maxInput);
        return _settle(msg.sender, r, maxInput, bytes32(0));
    }

    /// @notice USDC gasless path: pulls `a.value` with EIP-3009 receiveWithAuthorization,
    ///         whose nonce must be authorizationNonce(r, salt). Anyone may submit; the
    ///         signed gas allowance goes to the submitter.
    function retireWithAuthorization(Retirement calldata r, bytes32 salt, Authorization calldata a)
        external
        nonReentrant
        returns (uint256)
    {
        if (r.inputToken != address(usdc)) revert UnsupportedInputToken(r.inputToken);
        bytes32 nonce = authorizationNonce(r, salt);
        IEip3009(address(usdc)).receiveWithAuthorization(
            a.from, address(this), a.value, a.validAfter, a.validBefore, nonce, a.v, a.r, a.s
        );
        return _settle(a.from, r, a.value, nonce);
    }

    /// @notice kVCM gasless path. A permit cannot carry a nonce of our choosing, so the
    ///         retirement is bound through the signed `deadline`: its high 192 bits must equal
    ///         the high 192 bits of authorizationNonce(r, salt) and its low 64 bits are the
    ///         expiry (unix seconds), enforced here. Applies the EIP-2612 permit (tolerating
    ///         one already applied by a front-runner) and pulls `p.value`. Only registered
    ///         executors may submit, since the allowance fallback checks no signature.
    function retireWithPermit(Retirement calldata r, bytes32 salt, Permit calldata p)
        external
        nonReentrant
        returns (uint256)
    {
        if (!isExecutor[msg.sender]) revert NotExecutor(msg.sender);
        if (r.inputToken != address(kvcm)) revert UnsupportedInputToken(r.inputToken);
        bytes32 nonce = authorizationNonce(r, salt);
        if (p.deadline >> 64 != uint256(nonce) >> 64) revert PermitNotBound(nonce, p.deadline);
        if (block.timestamp > uint64(p.deadline)) revert PermitExpired(uint64(p.deadline), block.timestamp);
        try IERC20Permit(address(kvcm)).permit(p.owner, address(this), p.value, p.deadline, p.v, p.r, p.s) {}
        catch {
            uint256 allowance = kvcm.allowance(p.owner, address(this));
            if (allowance < p.value) revert PermitFailed(p.owner, allowance, p.value);
        }
        kvcm.safeTransferFrom(p.owner, address(this), p.value);
        return _settle(p.owner, r, p.value, nonce);
    }

    // ---------------------------------------------------------------- internals

    function _settle(address payer, Retirement calldata r, uint256 value, bytes32 nonce)
        private
        returns (uint256 index)
    {
        RetirementDetails calldata d = r.details;
        if (d.retiringAddress != payer) revert RetiringAddressMismatch(payer, d.retiringAddress);
        if (d.beneficiaryAddress == address(0)) revert BeneficiaryRequired();
        if (r.creditToken != address(credits)) revert CreditMismatch(r.creditToken, r.tokenId);
        (,,,, bool needsMetadata) = credits.creditInfo(r.tokenId);
        if (
            needsMetadata
                && (
                    bytes(d.beneficiaryLocation).length == 0 || bytes(d.consumptionCountryCode).length == 0
                        || bytes(d.consumptionPeriodStart).length == 0 || bytes(d.consumptionPeriodEnd).length == 0
                )
        ) revert ConsumptionMetadataRequired(r.tokenId);

        (uint256 cost, uint256 fee) = _quote(r.source, r.sourceId, r.amount, r.inputToken);
        uint256 required = cost + fee + r.gasAllowance;
        if (required > value) revert InsufficientValue(required, value);

        if (r.source == SOURCE_CARBON_CLASS) {
            uint256 kvcmCost = classes.quoteRedeem(r.sourceId, r.amount);
            if (r.inputToken == address(usdc)) pool.swapExactOutput(address(kvcm), kvcmCost, cost, address(this));
            classes.redeem(r.sourceId, r.tokenId, r.amount, kvcmCost, address(this));
        } else {
            Marketplace.Listing memory l = marketplace.getListing(r.sourceId);
            if (l.creditToken != r.creditToken || l.tokenId != r.tokenId) revert CreditMismatch(l.creditToken, l.tokenId);
            marketplace.fill(r.sourceId, r.amount, cost, address(this));
        }
        credits.retire(r.tokenId, r.amount, d.beneficiaryAddress);

        IERC20 token = IERC20(r.inputToken);
        if (fee > 0) token.safeTransfer(feeRecipient, fee);
        if (r.gasAllowance > 0) token.safeTransfer(msg.sender, r.gasAllowance);
        uint256 refunded = value - required;
        if (refunded > 0) token.safeTransfer(payer, refunded);

        index = _retirementsInTx++;
        emit RetirementSettled(payer, d.beneficiaryAddress, index, value, fee, cost, refunded, nonce, r);
    }

    function _quote(uint8 source, uint256 sourceId, uint256 amount, address inputToken)
        private
        view
        returns (uint256 cost, uint256 fee)
    {
        Fees memory f = fees;
        if (source == SOURCE_CARBON_CLASS) {
            uint256 kvcmCost = classes.quoteRedeem(sourceId, amount);
            if (inputToken == address(usdc)) {
                cost = pool.getAmountIn(address(kvcm), kvcmCost);
                fee = _fee(cost, f.classFeeBps, f.classFeeFloorUsdc);
            } else if (inputToken == address(kvcm)) {
                cost = kvcmCost;
                (uint256 ru, uint256 rk) = pool.getReserves();
                fee = _fee(cost, f.classFeeBps, (f.classFeeFloorUsdc * rk + ru - 1) / ru);
            } else {
                revert UnsupportedInputToken(inputToken);
            }
        } else if (source == SOURCE_LISTING) {
            if (inputToken != address(usdc)) revert ListingRequiresUsdc(inputToken);
            cost = marketplace.fillCost(sourceId, amount);
            fee = _fee(cost, f.listingFeeBps, f.listingFeeFloorUsdc);
        } else {
            revert InvalidSource(source);
        }
    }

    function _fee(uint256 cost, uint16 bps, uint256 floor) private pure returns (uint256) {
        uint256 proportional = (cost * bps + BPS - 1) / BPS;
        return proportional > floor ? proportional : floor;
    }
}
