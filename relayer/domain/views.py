"""The shapes of the marketplace API's answers, as typed dicts: the builders that make the
answers return them (mypy checks every key and type they write), and the OpenAPI document's
response schemas are generated from them (:func:`json_schema`), so the two cannot drift.

Units: tonnes and USDC as decimal strings, unix seconds as decimal strings (the spec's JSON
types); ``chainId`` and indexes as integers.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import TypeAdapter
from typing_extensions import TypedDict


class Category(TypedDict):
    """One item of ``GET /categories``."""

    id: str


class CreditToken(TypedDict):
    address: str
    tokenId: str


class ProvenanceRecord(TypedDict):
    """One step of ``GET /retirements/{id}/provenance`` (oldest first)."""

    id: str
    transactionType: Literal["ORIGINATION", "TRANSFER", "RETIREMENT"]
    transactionHash: str
    registrySerialNumbers: list[str]
    token: CreditToken
    creditId: str
    sender: str
    receiver: str
    originalAmount: str
    remainingAmount: str
    createdAt: str
    updatedAt: str


class RetiredProject(TypedDict):
    key: str
    vintage: str
    registry: str


class Retirement(TypedDict):
    """One retirement (``GET /retirements`` items, ``GET /retirements/{id}``)."""

    id: str
    chainId: int
    chain: str
    amount: str
    hash: str
    index: int
    blockNumber: int
    timestamp: str
    beneficiaryAddress: str
    beneficiaryName: str
    beneficiaryLocation: str
    retirementMessage: str
    retiringAddress: str
    retiringName: str
    token: str
    tokenId: str
    creditId: str
    project: RetiredProject
    onChainExplorerUrl: str | None
    viewRetirementUrl: str
    certificateUrl: str
    provenanceUrl: str


class _QuoteFigures(TypedDict):
    uuid: str
    created_at: str
    expires_at: str
    asset_price_source_id: str
    quantity_tonnes: str
    unit_price_usdc: str
    cost_usdc: str
    consumed: bool


class Quote(_QuoteFigures, total=False):
    """``POST /quotes`` (201) and an order's ``quote``; the fee and total when the operator
    charges a fee."""

    fee_usdc: str
    total_usdc: str


OrderStatus = Literal["SUBMITTED", "INITIATED", "COMMITTED", "MINTED", "COMPLETED", "FAILED"]


class Order(TypedDict):
    """``POST /orders`` (201) and ``GET /orders/{id}``."""

    id: str
    status: OrderStatus
    transaction_hash: str | None
    retirement_index: int | None
    view_retirement_url: str | None
    beneficiary_name: str
    beneficiary_address: str | None
    retirement_message: str
    created_at: str
    updated_at: str
    error: dict[str, Any] | None
    quote: Quote


class Methodology(TypedDict):
    id: str
    category: str
    name: str


class ProjectStats(TypedDict):
    """Tonnes (an integer when whole)."""

    totalBridged: int | float
    totalRetired: int | float
    totalSupply: int | float
    totalListingsSupply: int | float
    totalPoolsSupply: int | float


class Project(TypedDict):
    """A carbon project (``GET /carbonProjects`` items); ``location`` a GeoJSON Feature."""

    key: str
    projectID: str
    registry: str
    name: str
    methodologies: list[Methodology]
    vintages: list[str]
    updatedAt: str
    country: str
    region: str
    price: str
    stats: ProjectStats
    hasSupply: bool
    sustainableDevelopmentGoals: list[str]
    description: str
    long_description: str
    short_description: str
    location: dict[str, Any]
    url: str
    images: list[str]
    registryBatchTokenId: str


class ListedProject(TypedDict):
    key: str
    vintage: str
    registry: str
    name: str
    category: str
    country: str
    methodology: str


class Seller(TypedDict):
    id: str


class ListedToken(TypedDict):
    address: str
    tokenId: str
    tokenStandard: Literal["ERC1155"]
    decimals: int


class Listing(TypedDict):
    """A live seller listing (tonnes and USDC per tonne as decimal strings)."""

    id: str
    assetPriceSourceId: str
    chainId: int
    leftToSell: str
    totalAmountToSell: str
    singleUnitPrice: str
    minFillAmount: str
    tokenAddress: str
    active: bool
    deleted: bool
    createdAt: str
    updatedAt: str
    expiration: str
    seller: Seller
    creditId: str
    project: ListedProject | None
    token: ListedToken


class ProjectDetail(Project):
    """``GET /carbonProjects/{key}``: the project with its live listings, cheapest first."""

    listings: list[Listing]


class Price(TypedDict):
    """One item of ``GET /prices`` (seller listings only)."""

    sourceId: str
    type: Literal["listing"]
    purchasePrice: str
    baseUnitPrice: str
    supply: str
    liquidSupply: str
    minFillAmount: str
    listing: Listing


def json_schema(shape: Any, ref_template: str = "#/components/schemas/{model}") -> dict[str, Any]:
    """The JSON Schema (2020-12) of ``shape`` (a typed dict, or a list of one), its nested
    shapes under ``$defs`` named by ``ref_template``."""
    return TypeAdapter(shape).json_schema(ref_template=ref_template)
