"""The shapes of the marketplace API's answers and of the x402 endpoint's, as typed dicts:
the builders that make the answers return them (mypy checks every key and type they write),
and the OpenAPI documents' response schemas are generated from them (:func:`json_schema`), so
the two cannot drift.

Units: tonnes and USDC as decimal strings, unix seconds as decimal strings (the spec's JSON
types); ``chainId`` and indexes as integers.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

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
    """One item of ``GET /prices`` (seller listings only). ``orderable``: POST /quotes and
    /orders take it (a listing on a chain this daemon retires on); the others are listed
    for discovery, after the orderable ones."""

    sourceId: str
    type: Literal["listing"]
    purchasePrice: str
    baseUnitPrice: str
    supply: str
    liquidSupply: str
    minFillAmount: str
    orderable: bool
    listing: Listing


# ---------------------------------------------------------------------------- x402 answers


class ActionLink(TypedDict):
    action: str
    get: str | None
    post: str


class Index(TypedDict):
    """``GET /`` and ``GET /api``: the action index."""

    name: str
    apiVersion: str
    x402FacilitatorVersion: int
    chainId: int
    settlement: str
    actions: list[ActionLink]


class InputToken(TypedDict):
    symbol: str
    address: str
    decimals: int


class ProtocolFee(TypedDict):
    classFeeBps: int
    classFeeFloorUsdc: str
    listingFeeBps: int
    listingFeeFloorUsdc: str


class DiscoverAnswer(TypedDict):
    """discover: the carbon classes and marketplace listings (each a JSON object)."""

    chainId: int
    carbonClasses: list[dict[str, Any]]
    marketplaceListings: list[dict[str, Any]]
    marketplaceEnabled: bool
    supportedInputTokens: list[InputToken]
    protocolFee: ProtocolFee


class QuoteFigures(TypedDict):
    """Input-token atomic units as decimal strings."""

    retirementCost: str
    fee: str
    total: str


class ResolvedCredit(TypedDict):
    creditToken: str
    tokenId: str
    projectId: str
    vintage: str
    registry: str


class QuoteAnswer(TypedDict):
    """quote: the live price of a tonnage (``carbonClass`` or ``listingId`` as resolved)."""

    chainId: int
    carbonClass: NotRequired[str]
    listingId: NotRequired[str]
    inputToken: InputToken
    amount: str
    tonnesFormatted: str
    quote: QuoteFigures
    retirementPriceFormatted: str
    feeFormatted: str
    totalFormatted: str
    suggestedMaxInput: str
    suggestedMaxInputFormatted: str
    humanSummary: str
    resolvedCredit: ResolvedCredit
    alternatives: list[dict[str, Any]]


class Transaction(TypedDict):
    step: Literal["approve", "prepareRetire"]
    to: str
    data: str
    value: str
    chainId: int


class ApprovalInstructions(TypedDict):
    token: str
    spender: str
    amount: str
    amountFormatted: str
    note: str


class PrepareRetireAnswer(TypedDict):
    """prepare/retire: the unsigned ``[approve, retire]`` batch."""

    chainId: int
    chain: str
    to: str
    data: str
    transactions: list[Transaction]
    quote: QuoteAnswer
    approvalRequired: bool
    approvalInstructions: ApprovalInstructions


class OnChainDetails(TypedDict):
    settlement: str
    function: Literal["retireWithAuthorization", "retireWithPermit"]
    retirementHash: str
    authorizationNonce: str
    salt: str


class PrepareAuthAnswer(TypedDict):
    """prepare-auth: EIP-712 ``typedData`` to sign and the ready ``actionsRetireRequest``."""

    chainId: int
    scheme: str
    to: str
    authValue: str
    authValueFormatted: str
    gasAllowance: str
    gasAllowanceFormatted: str
    gasAllowanceParts: dict[str, Any]
    validBefore: int
    quote: QuoteAnswer
    typedData: dict[str, Any]
    actionsRetireRequest: dict[str, Any]
    onChainDetails: OnChainDetails


class CertificateEntry(TypedDict):
    retirementId: str
    retirementIndex: int
    certificateUrl: str
    viewRetirementUrl: str
    amountInTonnes: str
    beneficiaryAddress: str
    beneficiaryName: str
    beneficiaryLocation: str
    message: str
    projectId: str
    creditId: str
    registry: str
    retiringAddress: str
    timestamp: int
    transactionHash: str
    blockNumber: int


class CertificateAnswer(TypedDict):
    """certificate: the retirements of a transaction."""

    chainId: int
    transactionHash: str
    retirements: list[CertificateEntry]


# --- the x402 endpoint's self-description documents (spec: Endpoints, Versioning, Errors) ----


class VersionedHosts(TypedDict):
    """``versionedHosts``: the base URLs by what they serve, and how to pin one."""

    latest: str
    current: str
    v0: str
    note: str


class ManifestChain(TypedDict):
    chainId: int
    name: str
    network: str
    settlement: str


class ManifestAction(TypedDict):
    """One action of the manifest: its routes (``get`` null for a POST-only action), whether
    it moves funds, its live request schema and its error codes."""

    action: str
    purpose: str
    get: str | None
    post: str
    movesFunds: bool
    schema: dict[str, Any]
    errors: list[str]


class Extension(TypedDict):
    """An additive extension beyond the spec's text: an answer status or an error code."""

    name: str
    since: str
    action: str
    description: str
    httpStatus: int
    statuses: NotRequired[list[str]]
    finalStatuses: NotRequired[list[str]]
    error: NotRequired[str]
    retryable: NotRequired[bool]


class StandardResource(TypedDict):
    url: str
    method: str
    paymentRequiredHeader: str
    paymentHeader: str
    paymentResponseHeader: str
    asset: str


class StandardFacilitator(TypedDict):
    url: str
    supported: str
    verify: str
    settle: str
    discovery: str
    authentication: str


class StandardX402(TypedDict):
    """Where this host speaks the standard x402 v2 protocol."""

    x402Version: int
    scheme: str
    network: str
    resource: StandardResource
    facilitator: StandardFacilitator
    guide: str


class Manifest(TypedDict):
    """``/.well-known/x402.json``: versions and hosts, chain, settlement, input tokens, the
    actions, extensions, the standard x402 surfaces and the other documents' paths."""

    name: str
    apiVersion: str
    latestApiVersion: str
    major: int
    versionedHosts: VersionedHosts
    x402FacilitatorVersion: int
    baseUrl: str
    settlement: str
    chains: list[ManifestChain]
    inputTokens: list[dict[str, Any]]
    actions: list[ManifestAction]
    extensions: list[Extension]
    standardX402: StandardX402
    errors: str
    changelog: str
    openapi: str
    docs: str
    securityTxt: str


class ReleaseNote(TypedDict):
    """One release of the changelog (``migration`` on a breaking one)."""

    version: str
    date: str
    breaking: bool
    summary: str
    changes: list[str]
    migration: NotRequired[str]


class Changelog(TypedDict):
    """``/.well-known/x402-changelog.json``: every release up to the latest, newest first."""

    apiVersion: str
    latestApiVersion: str
    versionedHosts: VersionedHosts
    releases: list[ReleaseNote]


class ErrorCode(TypedDict):
    code: str
    httpStatus: int
    group: str
    retryable: bool
    message: str


class ErrorsDocument(TypedDict):
    """``/.well-known/x402-errors.json`` and ``GET /api/errors``: every registered code."""

    apiVersion: str
    x402FacilitatorVersion: int
    errors: list[ErrorCode]
    commonCodes: list[str]
    actions: dict[str, list[str]]
    note: str


class GuideEntry(TypedDict):
    id: str
    title: str
    summary: str
    url: str


class GuideIndex(TypedDict):
    """``GET /api/docs``: the guides."""

    documents: list[GuideEntry]


class GuideDocument(TypedDict):
    """``GET /api/docs?id=<id>``: one guide as Markdown."""

    id: str
    title: str
    format: Literal["markdown"]
    body: str


class OpenApiDocument(TypedDict):
    """``GET /api/openapi.json``: an OpenAPI 3.1 document (its parts are JSON Schema and
    OpenAPI objects, free-form here)."""

    openapi: str
    info: dict[str, Any]
    servers: list[dict[str, str]]
    components: dict[str, Any]
    paths: dict[str, Any]


def json_schema(shape: Any, ref_template: str = "#/components/schemas/{model}") -> dict[str, Any]:
    """The JSON Schema (2020-12) of ``shape`` (a typed dict, or a list of one), its nested
    shapes under ``$defs`` named by ``ref_template``."""
    return TypeAdapter(shape).json_schema(ref_template=ref_template)
