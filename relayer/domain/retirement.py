"""The retirement as the settlement contract sees it, and its binding to an authorization.

The USDC EIP-3009 nonce a payer signs is
``keccak256(abi.encode(hashRetirement(r), salt))`` with ``hashRetirement`` the EIP-712-style
struct hash of RetirementSettlement.sol, so the signature binds credit, amount, attribution
and gas allowance (spec: Authentication, "nonce equals keccak256 of the retirement plus
salt"). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from eth_utils.crypto import keccak

from relayer.domain.abi_words import address_word, bytes32_word, uint_word

SOURCE_CARBON_CLASS: Final = 0
SOURCE_LISTING: Final = 1

DETAILS_TYPE: Final = (
    "RetirementDetails(address retiringAddress,address beneficiaryAddress,string beneficiaryString,"
    "string retiringEntityString,string retirementMessage,string beneficiaryLocation,"
    "string consumptionCountryCode,string consumptionPeriodStart,string consumptionPeriodEnd)"
)
RETIREMENT_TYPE: Final = (
    "Retirement(uint8 source,uint256 sourceId,address creditToken,uint256 tokenId,uint256 amount,"
    "address inputToken,uint256 gasAllowance,RetirementDetails details)" + DETAILS_TYPE
)
DETAILS_TYPEHASH: Final = keccak(text=DETAILS_TYPE)
RETIREMENT_TYPEHASH: Final = keccak(text=RETIREMENT_TYPE)


DETAIL_KEYS: Final = (
    "retiringAddress",
    "beneficiaryAddress",
    "beneficiaryString",
    "retiringEntityString",
    "retirementMessage",
    "beneficiaryLocation",
    "consumptionCountryCode",
    "consumptionPeriodStart",
    "consumptionPeriodEnd",
)
"""The wire names of the nine details fields, in the contract's struct order."""


@dataclass(frozen=True, slots=True)
class RetirementDetails:
    """Attribution and consumption metadata (the contract's 9-field struct).

    Addresses are checksummed hex strings; consumption periods are ISO dates (YYYY-MM-DD)
    or empty.
    """

    retiring_address: str
    beneficiary_address: str
    beneficiary_string: str = ""
    retiring_entity_string: str = ""
    retirement_message: str = ""
    beneficiary_location: str = ""
    consumption_country_code: str = ""
    consumption_period_start: str = ""
    consumption_period_end: str = ""

    def as_tuple(self) -> tuple[Any, ...]:
        return (
            self.retiring_address,
            self.beneficiary_address,
            self.beneficiary_string,
            self.retiring_entity_string,
            self.retirement_message,
            self.beneficiary_location,
            self.consumption_country_code,
            self.consumption_period_start,
            self.consumption_period_end,
        )

    def as_record(self) -> dict[str, str]:
        """The nine fields under their wire names (``beneficiaryString``, ...)."""
        return dict(zip(DETAIL_KEYS, self.as_tuple(), strict=True))

    def struct_hash(self) -> bytes:
        """The details' EIP-712 struct hash (32 bytes): the type hash, the two addresses, then
        the keccak of each string, one word each.

        Raises:
            ValueError: an address is not 0x and 40 hex digits.
        """
        return keccak(
            b"".join(
                [
                    DETAILS_TYPEHASH,
                    address_word(self.retiring_address),
                    address_word(self.beneficiary_address),
                    *(keccak(s.encode()) for s in self.as_tuple()[2:]),
                ]
            )
        )


@dataclass(frozen=True, slots=True)
class Retirement:
    """One retirement: source (class or listing), credit, amount and who pays how.

    ``amount`` is in credit units (1000 a tonne); ``gas_allowance`` in input-token atomic
    units (0 on the caller-paid path).
    """

    source: int
    source_id: int
    credit_token: str
    token_id: int
    amount: int
    input_token: str
    gas_allowance: int
    details: RetirementDetails

    def as_tuple(self) -> tuple[Any, ...]:
        """ABI tuple for the contract call."""
        return (
            self.source,
            self.source_id,
            self.credit_token,
            self.token_id,
            self.amount,
            self.input_token,
            self.gas_allowance,
            self.details.as_tuple(),
        )

    def struct_hash(self) -> bytes:
        """hashRetirement(r) of RetirementSettlement.sol (32 bytes): keccak256 of
        ``abi.encode`` of the type hash and the fields (all static: one word each).

        Raises:
            ValueError: a field does not fit its type (``source`` a uint8, the amounts
                uint256, the addresses 0x and 40 hex digits).
        """
        return keccak(
            b"".join(
                [
                    RETIREMENT_TYPEHASH,
                    uint_word(self.source, 8),
                    uint_word(self.source_id),
                    address_word(self.credit_token),
                    uint_word(self.token_id),
                    uint_word(self.amount),
                    address_word(self.input_token),
                    uint_word(self.gas_allowance),
                    self.details.struct_hash(),
                ]
            )
        )


def bind_nonce(retirement: Retirement, salt: bytes) -> bytes:
    """The EIP-3009 nonce bound to ``retirement``: keccak256(abi.encode(hash, salt)).

    Args:
        retirement: the retirement as it will be submitted.
        salt: 32 random bytes chosen by prepare-auth, posted back unchanged.
    """
    return keccak(retirement.struct_hash() + bytes32_word(salt))


EXPIRY_BITS: Final = 64
_EXPIRY_MASK: Final = (1 << EXPIRY_BITS) - 1


def permit_deadline(nonce: bytes, expiry: int) -> int:
    """The EIP-2612 deadline that binds a kVCM permit to a retirement: the high 192 bits of
    the bound nonce, and ``expiry`` (unix seconds) in the low 64 bits. The settlement checks
    both (RetirementSettlement.retireWithPermit)."""
    if not 0 <= expiry <= _EXPIRY_MASK:
        raise ValueError("expiry out of range")
    return (int.from_bytes(nonce, "big") >> EXPIRY_BITS << EXPIRY_BITS) | expiry


def permit_binds(deadline: int, nonce: bytes) -> bool:
    """Whether a permit ``deadline`` carries the high 192 bits of ``nonce``."""
    return deadline >> EXPIRY_BITS == int.from_bytes(nonce, "big") >> EXPIRY_BITS


def permit_expiry(deadline: int) -> int:
    """Unix seconds after which a bound permit deadline is expired (its low 64 bits)."""
    return deadline & _EXPIRY_MASK


_NO_ADDRESS: Final = "0x" + "0" * 40


def retiring_address(payer: str, details: Mapping[str, Any]) -> str:
    """Who retired an indexed retirement, as every view shows it: the ``retiringAddress`` of
    its details when one is set (not the zero address), else the payer (the relay retires for
    the payer, and requires the two to be equal)."""
    named = details.get("retiringAddress")
    return named if isinstance(named, str) and named and named != _NO_ADDRESS else payer


def retirement_links(public_base_url: str, retirement_id: str) -> dict[str, str]:
    """The links of a retirement, the same on every surface: ``viewRetirementUrl`` the page a
    person reads (the HTML certificate), ``certificateUrl`` the PDF certificate,
    ``provenanceUrl`` its provenance records (``retirement_id`` is
    ``{chainId}-{txHash}-{retirementIndex}``)."""
    base = f"{public_base_url}/retirements/{retirement_id}"
    return {
        "viewRetirementUrl": f"{base}/certificate?format=html",
        "certificateUrl": f"{base}/certificate",
        "provenanceUrl": f"{base}/provenance",
    }
