"""The x402 endpoint's versions (spec: Versioning): the release history, the version policy
(which major ignores unknown keys, the newest release of a major), the versioned hosts, and
the paths and constants the self-description documents share (:class:`X402Info` is what a
request is served as)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, get_args

from relayer.domain import views
from relayer.service.outcome import RetireOutcome, Status

JSON: Final = "application/json"

MANIFEST_PATH: Final = "/.well-known/x402.json"
CHANGELOG_PATH: Final = "/.well-known/x402-changelog.json"
ERRORS_PATH: Final = "/.well-known/x402-errors.json"
SECURITY_TXT_PATH: Final = "/.well-known/security.txt"
API_ERRORS_PATH: Final = "/api/errors"
DOCS_PATH: Final = "/api/docs"
OPENAPI_PATH: Final = "/api/openapi.json"

POST_ONLY: Final = frozenset({"actions/retire"})
"""Actions with no GET route: they move funds, and a signature never goes in a URL."""
MOVES_FUNDS: Final = frozenset({"actions/retire"})
"""Actions that move the payer's funds (spec: Endpoints, "Moves funds")."""
PURPOSES: Final[Mapping[str, str]] = {
    "discover": "Lists carbonClasses[] and marketplaceListings[] with prices, credits and input tokens.",
    "quote": "Live price for a tonnage (retirement cost plus protocol fee), by carbonClass or listingId.",
    "prepare/retire": "The unsigned [approve, retire] batch for a caller that pays its own gas.",
    "prepare-auth": "EIP-712 typedData and a ready actionsRetireRequest for the gasless relay.",
    "actions/retire": "The executor submits the retirement; needs a signed authPayload.",
    "certificate": "Certificate URL(s) of the retirements of a txHash.",
}

GUIDE_IDS: Final = ("quick-start", "relay-flow", "errors", "fees", "versioning", "standard-x402")
"""The packaged guide documents (``relayer/guides/<id>.md``), in index order."""

PINNING_NOTE: Final = (
    "Pin a major by its host only; there is no version header, query parameter or Accept "
    "negotiation. `latest` serves the newest release and moves to a new major on a breaking "
    "release; `current` serves major 1 and every later 1.x minor and patch, and never moves to 2; "
    "`v0` serves the previous major, 0 (before either breaking release), kept reachable for "
    "migration only and not extended."
)

# The 200 and 202 statuses of actions/retire, from the outcome type itself.
FINAL_STATUSES: Final = tuple(s for s in get_args(Status) if RetireOutcome(s, {}).final)
WAITING_STATUSES: Final = tuple(s for s in get_args(Status) if not RetireOutcome(s, {}).final)


@dataclass(frozen=True, slots=True)
class X402Info:
    """What this host is, per request (the ``Host`` decides the major).

    Attributes:
        api_version: semantic version of the latest release, e.g. ``"1.1.0"``.
        major: the major this request is served as (1, or 0 on the v0 host).
        base_url: this host's x402 base URL, e.g. ``"http://127.0.0.1:8402/api"``.
        versioned_hosts: ``{"latest", "current" (the major-1 host), "v0"}`` base URLs.
        chain_id: the chain served (8453 or 84532).
        settlement: the checksummed settlement contract address.
        input_tokens: ``[{"symbol", "address", "decimals", "scheme"}]``, scheme
            ``"eip3009"`` or ``"eip2612"``.
        security_contact: the RFC 9116 ``Contact`` URI, e.g. ``"mailto:security@example.org"``.
        served: every chain this endpoint relays on as ``(chain id, settlement)``, the first
            (``chain_id``'s) first; empty: that one alone.
    """

    api_version: str
    major: int
    base_url: str
    versioned_hosts: dict[str, str]
    chain_id: int
    settlement: str
    input_tokens: list[dict[str, Any]]
    security_contact: str
    served: tuple[tuple[int, str], ...] = ()

    def chains(self) -> tuple[tuple[int, str], ...]:
        """``(chain id, settlement)`` of every chain served, the first first."""
        return self.served or ((self.chain_id, self.settlement),)


# ---------------------------------------------------------------------------- releases


@dataclass(frozen=True, slots=True)
class Release:
    """One release of the API (dates ISO 8601). A breaking release says in ``migration``
    what a caller changes; ``changes`` lists what it brought, one sentence each."""

    version: str
    date: str
    breaking: bool
    summary: str
    changes: tuple[str, ...]
    migration: str | None = None

    def body(self) -> views.ReleaseNote:
        out: views.ReleaseNote = {
            "version": self.version,
            "date": self.date,
            "breaking": self.breaking,
            "summary": self.summary,
            "changes": list(self.changes),
        }
        if self.migration is not None:
            out["migration"] = self.migration
        return out


RELEASES: Final[tuple[Release, ...]] = (
    Release(
        "1.3.0",
        "2026-11-26",
        False,
        "Additive: 405 method_not_allowed on a known path asked with another method, and an "
        "OpenAPI document with per-action request schemas and typed answers.",
        (
            "A known path asked with a method it does not serve answers 405 "
            "`method_not_allowed` (not retryable) with `allow` and the `Allow` header; it "
            "answered 404 `not_found` before. GET /api/actions/retire answers 405 (Allow: POST).",
            "GET /api/openapi.json declares each action's own request schema (the fields it "
            "reads, those it needs), a typed schema for every 2xx answer, and every status "
            "an operation can answer (429 with Retry-After, 405 with Allow, 503).",
            "A 400's `issues[].message` names the field and the rule it broke.",
        ),
    ),
    Release(
        "1.2.0",
        "2026-11-24",
        False,
        "Additive: a per-client rate limit, answered 429 rate_limited on any route.",
        (
            "Any route may answer 429 `rate_limited` (retryable: wait `retryAfterSeconds`, also "
            "sent as the Retry-After header) when a client sends more than the operator's limit.",
            "A request that runs past the operator's request timeout answers the retryable "
            "`internal_error` with `cause` `timeout`.",
        ),
    ),
    Release(
        "1.1.0",
        "2026-11-24",
        False,
        "Additive: a 202 answer of actions/retire while its relay is on its way, "
        "payment_unavailable on actions/retire, and the OpenAPI document.",
        (
            "actions/retire may answer HTTP 202 with status `submitted` (broadcast, "
            "`transactionHash` given) or `accepted` (not yet broadcast, `transactionHash` null) "
            "when the relay is still on its way after the wait; post the identical request "
            "again to get its outcome (the same transaction, never a second one).",
            "actions/retire may answer 503 `payment_unavailable` (retryable) when every "
            "executor key is below its ETH floor: nothing was recorded or signed.",
            "GET /api/openapi.json: an OpenAPI 3.1 document of the whole endpoint, generated "
            "from the models that validate requests.",
        ),
    ),
    Release(
        "1.0.0",
        "2026-11-22",
        True,
        "Major 1: the second breaking release, rejecting unknown top-level keys. With "
        "1.0.0-rc.1 before it, the two breaking releases bundled into one major bump.",
        (
            "Breaking: rejecting unknown top-level keys. A request with a top-level key the "
            "endpoint does not know answers 400 `schema_validation`, naming the keys in "
            "`issues[].keys`; major 0 ignored them.",
        ),
        migration=(
            "Remove every top-level key the manifest's request schemas do not list (a 400 "
            "`schema_validation` names them in `issues[].keys`; keys inside `details` and "
            "`authPayload` were always checked). Until then the v0 host keeps serving major 0."
        ),
    ),
    Release(
        "1.0.0-rc.1",
        "2026-11-22",
        True,
        "The first breaking release, a newly required attribution field: a pre-release of "
        "major 1, which 1.0.0 completed.",
        (
            "Breaking: a newly required attribution field. A relayed retirement (prepare-auth "
            "and actions/retire) must name its beneficiary: `details.beneficiaryAddress`, or "
            "`details.beneficiaryIsPayer: true` (rule 6); without one it answers 400 "
            "`attribution_required`. Major 0 retired for the payer.",
        ),
        migration=(
            "Send `details.beneficiaryAddress` (the beneficiary's address) or "
            "`details.beneficiaryIsPayer: true` with every prepare-auth and actions/retire "
            "request (prepare-auth's `actionsRetireRequest` then carries it: post it back "
            "unchanged). Until then the v0 host keeps serving major 0."
        ),
    ),
    Release(
        "0.9.0",
        "2026-11-22",  # no earlier date of its own here: the day this service began (with 1.0.0)
        False,
        "Major 0 (the public endpoint's rules before either breaking release), served on the "
        "v0 host for migration only.",
        (
            "discover, quote, prepare/retire, prepare-auth, actions/retire and certificate, "
            "by GET or by POST to /api with `action`.",
            "Unknown top-level keys are ignored.",
            "No attribution field is required: a relayed retirement that names no beneficiary "
            "retires for the payer.",
        ),
    ),
)
"""The releases, newest first."""

LATEST_VERSION: Final = RELEASES[0].version
STRICT_KEYS_MAJOR: Final = 1
"""The first major that refuses unknown top-level request keys (release 1.0.0)."""


def ignores_unknown_keys(major: int) -> bool:
    """Whether ``major`` ignores unknown top-level request keys (major 0) rather than
    refusing them (major 1 on)."""
    return major < STRICT_KEYS_MAJOR


def _semver(version: str) -> tuple[int, int, int, int, str]:
    """A sort key of a semantic version: a pre-release (``1.0.0-rc.1``) before its release
    (SemVer 2.0.0 section 11; our pre-release identifiers compare as one string)."""
    core, _, pre = version.partition("-")
    major, minor, patch = (int(part) for part in core.split("."))
    return (major, minor, patch, 0 if pre else 1, pre)


def releases_up_to(api_version: str) -> list[Release]:
    """The releases up to and including ``api_version``, newest first."""
    latest = _semver(api_version)
    return [r for r in RELEASES if _semver(r.version) <= latest]


def newest_of_major(major: int, latest: str = LATEST_VERSION) -> str:
    """The version a host of ``major`` serves: the newest release of that major up to
    ``latest`` (``latest`` itself when the major has none)."""
    return next((r.version for r in releases_up_to(latest) if _semver(r.version)[0] == major), latest)


def served_version(info: X402Info) -> str:
    """The version this host serves: the newest release of its major (up to the latest)."""
    return newest_of_major(info.major, info.api_version)


def versioned_hosts(info: X402Info) -> views.VersionedHosts:
    """``versionedHosts``: ``latest``, ``current``, ``v0`` and the pinning ``note``."""
    hosts = info.versioned_hosts
    return {
        "latest": hosts.get("latest", info.base_url),
        "current": hosts.get("current", info.base_url),
        "v0": hosts.get("v0", info.base_url),
        "note": PINNING_NOTE,
    }


def origin_of(info: X402Info) -> str:
    """The host's root URL (well-known documents live there), from its x402 base URL."""
    return info.base_url.removesuffix("/").removesuffix("/api")
