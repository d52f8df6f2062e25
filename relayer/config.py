"""Configuration: one pydantic-settings class, env prefix ``RELAYER_``, built once at start-up.

Secrets are ``SecretStr`` (never printed); on Kubernetes they can come from files in
``secrets_dir`` (one file per setting, named as the setting, ``executor_private_key``, or as
its variable, ``RELAYER_EXECUTOR_PRIVATE_KEY``; the environment wins over a file). The
executor key is given once: as a key (``RELAYER_EXECUTOR_PRIVATE_KEY``) or as an encrypted
JSON keystore with its password, decrypted once when the settings are built. Nothing else in
the package reads ``os.environ``. There are no development defaults: a command that needs the
database, the chain node, the deployment or the executor key stops at once, naming the
missing setting; a malformed value stops it without being echoed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Final, Literal, Self

import limits
from pydantic import (
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources import PathType

from relayer.domain.chains import BASE_SEPOLIA, default_confirmation, default_confirmations, relay_supported
from relayer.domain.confirmation import ConfirmationPolicy, parse_confirmation
from relayer.domain.errors import RelayerError
from relayer.domain.lane import LanePolicy
from relayer.domain.models import StrictModel
from relayer.package_data import projects_json

SECRETS_DIR: Final = "/var/run/secrets/relayer"
SECRETS_DIR_IN_USE: Final = SECRETS_DIR if os.path.isdir(SECRETS_DIR) else None
"""Secret files are read from :data:`SECRETS_DIR` when it exists (a Kubernetes secret volume)."""
ENV_PREFIX: Final = "RELAYER_"
SECP256K1_N: Final = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_KEY: Final = re.compile(r"(0x)?[0-9a-fA-F]{64}")


class IndexChain(StrictModel):
    """Another chain whose marketplace listings, credits and retirements are indexed for the
    catalogue API (no relaying there): ``{"chainId", "rpcUrl", "deploymentFile",
    "confirmations"?}``, as JSON in ``RELAYER_INDEX_CHAINS``."""

    model_config = ConfigDict(populate_by_name=True)

    chain_id: int = Field(alias="chainId", gt=0)
    rpc_url: str = Field(alias="rpcUrl", min_length=1)
    deployment_file: Path = Field(alias="deploymentFile")
    confirmations: int | None = Field(default=None, ge=1)

    def depth(self) -> int:
        """Blocks under an event before it is indexed (``confirmations`` or the chain's default)."""
        return self.confirmations or default_confirmations(self.chain_id)

    def confirmation_policy(self) -> ConfirmationPolicy:
        """``confirmations`` blocks at the chain's block time, or the chain's default policy."""
        policy = default_confirmation(self.chain_id)
        return (
            policy
            if self.confirmations is None
            else ConfirmationPolicy(policy.block_time_ms, self.confirmations)
        )


class RelayChain(StrictModel):
    """Another chain this daemon relays on beside ``RELAYER_CHAIN_ID`` (8453 or 84532), with
    its own node, deployment, nonce lanes, leases and follower; the executor keys are the same
    (one address, its own nonces on each chain): ``{"chainId", "rpcUrl", "deploymentFile",
    "confirmations"?, "confirmation"?, "blockTimeMs"?}``, as JSON in ``RELAYER_RELAY_CHAINS``.
    Unset confirmation settings take the chain's defaults (``relayer.domain.chains``), not the
    first chain's."""

    model_config = ConfigDict(populate_by_name=True)

    chain_id: int = Field(alias="chainId", gt=0)
    rpc_url: str = Field(alias="rpcUrl", min_length=1)
    deployment_file: Path = Field(alias="deploymentFile")
    confirmations: int | None = Field(default=None, ge=1)
    confirmation: str | None = None
    block_time_ms: int | None = Field(default=None, alias="blockTimeMs", gt=0)

    @field_validator("chain_id")
    @classmethod
    def _relayed(cls, value: int) -> int:
        if not relay_supported(value):
            raise ValueError(f"chain {value} is not relayed here: 8453 (Base) or 84532 (Base Sepolia)")
        return value

    @field_validator("confirmation")
    @classmethod
    def _confirmation(cls, value: str | None) -> str | None:
        return checked_confirmation(value)


RELAY_CHAINS_ENV: Final = "RELAYER_RELAY_CHAINS"


class ConfigError(RelayerError):
    """A setting is missing or malformed. The message names the environment variable and
    never carries the value."""


class Settings(BaseSettings):
    """All daemon settings. Units are in the field names or descriptions."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        secrets_dir=SECRETS_DIR_IN_USE,
        hide_input_in_errors=True,
        env_ignore_empty=True,  # RELAYER_RPC_URL= (e.g. from an absent ConfigMap key) is missing
    )

    # --- storage -----------------------------------------------------------------------
    database_url: SecretStr | None = Field(default=None, description="Postgres DSN")
    db_pool_min: int = Field(
        default=2,
        ge=1,
        description="Connections the database pool keeps open.",
        json_schema_extra={"unit": "connections"},
    )
    db_pool_max: int = Field(
        default=10,
        ge=1,
        description="Most connections the database pool opens.",
        json_schema_extra={"unit": "connections"},
    )

    # --- chain -------------------------------------------------------------------------
    rpc_url: str | None = Field(default=None, description="JSON-RPC URL of the chain node")
    chain_id: int = Field(
        default=BASE_SEPOLIA.chain_id,
        description="8453 (Base) or 84532 (Base Sepolia); checked against the node at start.",
    )
    deployment_file: Path | None = Field(
        default=None, description="JSON file with the deployment's `contracts` addresses and `deployBlock`"
    )
    projects_file: Path | None = Field(
        default=None,
        description=(
            "Carbon projects loaded into an empty catalogue at start (default: the packaged data set);"
            " later changes come from `relayer catalogue load`."
        ),
    )
    executor_private_key: SecretStr | None = Field(
        default=None, description="the executor's secp256k1 key: 64 hex digits, optionally 0x-prefixed"
    )
    executor_private_keys: SecretStr | None = Field(
        default=None,
        description="more executor keys, each with its own nonce lane and lease: 64 hex digits "
        "each, separated by commas or whitespace (a secret file may hold one a line)",
    )
    executor_keystore_file: Path | None = Field(
        default=None,
        description="the executor key as an encrypted JSON keystore (Web3 Secret Storage v3, as geth "
        "and eth-account write it), instead of RELAYER_EXECUTOR_PRIVATE_KEY",
    )
    executor_keystore_password: SecretStr | None = Field(
        default=None, description="the password of RELAYER_EXECUTOR_KEYSTORE_FILE"
    )
    confirmations: int | None = Field(
        default=None,
        ge=1,
        description="Blocks a receipt must be buried under before a retirement is settled "
        "(overrides RELAYER_CONFIRMATION; default per chain: relayer.domain.chains).",
        json_schema_extra={"unit": "blocks"},
    )
    confirmation: str | None = Field(
        default=None,
        description="When a receipt counts as confirmed, in time: seconds of blocks over it ('20', "
        "'0.6s'; the depth is derived from the block time), or 'safe' / 'finalized' to settle at the "
        "node's safe or finalized head (default per chain: relayer.domain.chains, e.g. Base 20 s).",
    )
    block_time_ms: int | None = Field(
        default=None, gt=0, description="The chain's block interval, ms (default: the chain table's)."
    )
    gas_cap: int = Field(
        default=1_500_000,
        ge=21_000,
        description="Executor gas ceiling per transaction: a request whose gas limit is above it "
        "answers gas_limit_exceeds_cap.",
        json_schema_extra={"unit": "gas"},
    )
    gas_limit_margin_bps: int = Field(
        default=2_000,
        ge=0,
        description="Headroom on the simulation's gas estimate (the batch prober's measure, or "
        "eth_estimateGas): the gas limit is the estimate times (1 + margin), capped at the gas cap.",
    )
    priority_fee_wei: int = Field(
        default=1_000_000,
        ge=0,
        description="Lowest EIP-1559 tip per gas (the recent median tip when higher, within "
        "RELAYER_PRIORITY_FEE_MAX_BASE_FEE_BPS and RELAYER_PRIORITY_FEE_MAX_WEI).",
        json_schema_extra={"unit": "wei per gas"},
    )
    priority_fee_max_wei: int = Field(
        default=100_000_000,
        ge=0,
        description="Highest EIP-1559 tip per gas a quote prices and the executor sends with (it "
        "wins over RELAYER_PRIORITY_FEE_WEI): the recent tip never raises what payers authorize past it.",
        json_schema_extra={"unit": "wei per gas"},
    )
    priority_fee_max_base_fee_bps: int = Field(
        default=10_000,
        ge=0,
        description="Highest tip per gas relative to the next block's base fee, in basis points "
        "(10000: the tip is at most the base fee; never below RELAYER_PRIORITY_FEE_WEI).",
        json_schema_extra={"unit": "basis points"},
    )
    base_fee_multiplier: int = Field(
        default=2, ge=1, description="Max fee per gas = this times the next block's base fee, plus the tip."
    )
    facilitator_max_fee_per_gas_wei: int = Field(
        default=10 * 10**9,
        gt=0,
        json_schema_extra={"unit": "wei per gas"},
        description="Highest max fee per gas (wei) of a sponsored transfer (an EIP-3009 "
        "transferWithAuthorization whose gas no signed allowance pays: x402 settles, payment pulls, "
        "refunds): its first fees and every bump stay at or below it.",
    )
    eth_price_usdc: int = Field(
        default=3_000_000_000,
        gt=0,
        description="Price of 1 ETH in USDC atomic units (6 decimals) used when the deployment's "
        "ETH/USD feed is absent or stale: set it at or above the market (it bounds the gas allowance).",
    )
    l1_fee_headroom_bps: int = Field(
        default=20_000,
        ge=10_000,
        description="The L1 data fee is priced at this many basis points of the oracle's upper bound "
        "(it is charged at the L1 prices of the including block, whatever the fee cap).",
    )
    price_feed_max_age_s: int = Field(
        default=3600, gt=0, description="Oldest ETH/USD feed answer used, seconds (else eth_price_usdc)."
    )
    gas_allowance_margin_bps: int = Field(
        default=5_000, ge=0, description="Headroom on the quoted gas allowance (basis points)."
    )
    gas_budget_class: int = Field(
        default=450_000,
        gt=0,
        description="Gas priced into the gas allowance of a class retirement.",
        json_schema_extra={"unit": "gas"},
    )
    gas_budget_listing: int = Field(
        default=350_000,
        gt=0,
        description="Gas priced into the gas allowance of a listing retirement.",
        json_schema_extra={"unit": "gas"},
    )
    block_poll_interval_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "How often the follower and indexers look for a head (default: half a block; the follower"
            " then looks just before each block is due, and every twelfth of a block until it comes)."
        ),
    )

    # --- relay -------------------------------------------------------------------------
    class_auth_lifetime_s: int = Field(
        default=3600,
        gt=0,
        description="How long an authorization prepare-auth issues for a class retirement is valid.",
    )
    listing_auth_lifetime_s: int = Field(
        default=300,
        gt=0,
        description="How long an authorization prepare-auth issues for a listing retirement is valid.",
    )
    class_slippage_bps: int = Field(
        default=400,
        ge=0,
        description="Headroom over a class quote's total in the suggested maximum input amount.",
    )
    settle_wait_s: float = Field(
        default=45.0,
        gt=0,
        description="How long actions/retire waits for the outcome before answering 202 submitted "
        "(or accepted).",
    )
    rejected_retention_s: float = Field(
        default=7 * 24 * 3600.0,
        ge=0,
        description="How long a job rejected before signing (and its salt) is kept, seconds.",
    )
    min_executor_balance_wei: int = Field(
        default=10**15,
        ge=0,
        description="Below this executor ETH balance (wei) new work is refused with payment_unavailable.",
    )

    relay_chains: list[RelayChain] = Field(
        default_factory=list,
        description="more chains this daemon relays on beside RELAYER_CHAIN_ID (JSON list of chainId, "
        "rpcUrl, deploymentFile and optional confirmations, confirmation and blockTimeMs), e.g. Base "
        "(8453) beside Base Sepolia: one endpoint serves both, each request's chainId choosing",
    )

    # --- marketplace catalogue (see relayer/api/marketplace.py) ------------------------
    index_chains: list[IndexChain] = Field(
        default_factory=list,
        description="more chains indexed for the marketplace API (JSON list of chainId, rpcUrl, "
        "deploymentFile and optional confirmations), e.g. Polygon (137) beside this daemon's Base chain",
    )
    treasury_private_key: SecretStr | None = Field(
        default=None,
        description="the operator's treasury key, which pays marketplace orders in USDC through the "
        "gasless relay (64 hex digits); without it POST /orders answers 503",
    )
    quote_lifetime_s: int = Field(default=300, gt=0, description="How long a marketplace quote is valid, s.")
    order_grace_s: int = Field(
        default=10,
        gt=0,
        le=300,
        description="How long the order keeper leaves a marketplace order without a relay job alone after "
        "it was recorded (its own request is still attempting it), seconds.",
    )
    facilitator_settle_wait_s: float = Field(
        default=20.0, gt=0, description="How long /facilitator/settle waits for confirmation, seconds."
    )
    x402_quote_secret: SecretStr | None = Field(
        default=None,
        description="HMAC key of the standard x402 retirement resource's quote references (at least 32 "
        "characters; the same on every replica); with a treasury key it turns the resource's "
        "PAYMENT-REQUIRED header on (the dev tooling supplies one)",
    )
    x402_quote_lifetime_s: int = Field(
        default=300, gt=0, description="How long a standard x402 quote reference is valid, seconds."
    )
    facilitator_expiry_margin_s: int = Field(
        default=30,
        ge=30,
        description="validBefore must be this far ahead for /facilitator, seconds (the relay takes 30).",
    )
    facilitator_default_rate_limit: str = Field(
        default="20/second",
        description="Request limit of /facilitator/verify and /settle per API key, per process, in "
        "the `limits` notation (e.g. '20/second;600/minute'), for keys created without --rate",
    )
    facilitator_default_gas_budget_wei_per_day: int = Field(
        default=5 * 10**16,
        ge=0,
        description="Gas (wei) the settles of one API key may cost the executor per UTC day, "
        "reserved at each settle's fee ceiling until mined, for keys created without "
        "--gas-budget-wei (default 0.05 ETH)",
    )

    # --- executor lane (see relayer/domain/lane.py) -------------------------------------
    resend_after_s: float = Field(
        default=10.0, gt=0, description="Re-send the same bytes of a transaction not mined for this long."
    )
    replace_after_s: float = Field(
        default=30.0,
        gt=0,
        description="Replace a transaction at the same nonce, fees bumped at least 10 %, when unmined this "
        "long and priced out.",
    )
    hole_after_s: float = Field(
        default=10.0,
        gt=0,
        description="Fill nonces no transaction holds with no-ops once the lane has not moved for this long.",
    )
    noop_before_expiry_s: float = Field(
        default=30.0, gt=0, description="No-op a job's nonce when its authorization is about to expire."
    )

    # --- http --------------------------------------------------------------------------
    http_host: str = Field(
        default="127.0.0.1", description="Address the HTTP API (and `relayer work`'s ops port) listens on."
    )
    http_port: int = Field(
        default=8402,
        description="Port of the HTTP API (`relayer serve` and `all`).",
        json_schema_extra={"unit": "TCP port"},
    )
    ops_port: int = Field(
        default=9402,
        description="`relayer work` serves /metrics, /healthz and /readyz on this port",
        json_schema_extra={"unit": "TCP port"},
    )
    shutdown_grace_s: float = Field(
        default=20.0,
        gt=0,
        description="On SIGTERM, how long requests in flight get to finish after listening stops, s",
    )
    public_base_url: str = Field(
        default="http://127.0.0.1:8402", description="Where callers reach this daemon (no slash)."
    )
    max_body_bytes: int = Field(
        default=64 * 1024, gt=0, description="Largest request body either API accepts."
    )
    http_idle_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="A connection that has not sent a complete request head this many seconds "
        "after it opened or after its last answer is closed (idle keep-alive and slow headers), s",
    )
    http_max_connections: int = Field(
        default=512,
        ge=1,
        description="Most client connections one process holds (per port); past it a connection "
        "is answered 503 with Retry-After and closed at once. Each may hold up to about 1 MB of "
        "request head while it arrives (64 headers of 8 KiB, for at most the idle timeout): "
        "budget the memory limit for it",
    )
    x402_v1_base_url: str | None = Field(
        default=None,
        description="The x402 host pinned to major 1 (default: the public host prefixed with v1.)",
    )
    x402_v0_base_url: str | None = Field(
        default=None,
        description="The x402 host of the previous major, 0 (default: the public host prefixed with v0.)",
    )
    rate_limit: str | None = Field(
        default="50/second;1000/minute",
        description="Per-client request limit of both APIs in the `limits` notation (e.g. "
        "'50/second;1000/minute'), counted in each process's memory; 'off': no limit",
    )
    rate_limit_forwarded_for: bool = Field(
        default=False,
        description="Key the rate limit on the X-Forwarded-For address the trusted proxies added "
        "(see RELAYER_RATE_LIMIT_PROXY_HOPS; only behind proxies that append to it) instead of "
        "the peer address",
    )
    rate_limit_proxy_hops: int = Field(
        default=1,
        ge=1,
        description="How many trusted proxies in front of the daemon append to X-Forwarded-For: "
        "the client is that many entries from the right (the entries left of it are the client's own)",
    )
    rate_limit_max_clients: int = Field(
        default=10_000,
        ge=1,
        description="Most clients the rate limit tracks per process; while that many are live, new "
        "ones share one window",
        json_schema_extra={"unit": "clients"},
    )
    request_timeout_s: float = Field(
        default=75.0, gt=0, description="Longest an HTTP request may run, seconds (above settle_wait_s)"
    )
    security_contact: str = Field(
        default="mailto:security@example.invalid",
        description="The security.txt Contact (RFC 9116): set it to the operator's address",
    )
    certificate_issuer: str = Field(
        default="",
        max_length=80,
        description="Who issues the retirement certificates, as each certificate names it (the "
        "operator's name); empty: the host of RELAYER_PUBLIC_BASE_URL",
    )

    # --- process -----------------------------------------------------------------------
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop",
        description="The daemon's event loop: uvloop (libuv; about a third less CPU a retirement "
        "than the standard loop, see docs/benchmarks.md) or asyncio (the standard library's).",
    )

    # --- logging -----------------------------------------------------------------------
    log_level: str = Field(
        default="INFO", description="Lowest level logged: DEBUG, INFO, WARNING, ERROR or CRITICAL."
    )

    @field_validator("facilitator_default_rate_limit")
    @classmethod
    def _facilitator_rate(cls, value: str) -> str:
        """A limit in the `limits` notation (a facilitator key always has one)."""
        return check_rate_limit(value)

    @field_validator("confirmation")
    @classmethod
    def _confirmation(cls, value: str | None) -> str | None:
        return checked_confirmation(value)

    @field_validator("executor_private_key")
    @classmethod
    def _executor_key(cls, value: SecretStr | None) -> SecretStr | None:
        """Exactly 32 bytes (a 63-digit key would otherwise load as another address)."""
        if value is None:
            return None
        return SecretStr(_checked_key(value.get_secret_value()))

    @field_validator("treasury_private_key")
    @classmethod
    def _treasury_key(cls, value: SecretStr | None) -> SecretStr | None:
        """Exactly 32 bytes, as the executor key."""
        if value is None:
            return None
        return SecretStr(_checked_key(value.get_secret_value()))

    @field_validator("x402_quote_secret")
    @classmethod
    def _quote_secret(cls, value: SecretStr | None) -> SecretStr | None:
        """At least 32 characters (an HMAC-SHA256 key); blank is unset."""
        if value is None or not value.get_secret_value().strip():
            return None
        if len(value.get_secret_value().strip()) < 32:
            raise ValueError("must be at least 32 characters (e.g. `openssl rand -hex 32`)")
        return SecretStr(value.get_secret_value().strip())

    @field_validator("executor_private_keys")
    @classmethod
    def _executor_keys(cls, value: SecretStr | None) -> SecretStr | None:
        """Each one exactly 32 bytes, as the main key."""
        if value is None:
            return None
        keys = [_checked_key(k) for k in value.get_secret_value().replace(",", " ").split()]
        return SecretStr(" ".join(keys)) if keys else None

    @model_validator(mode="after")
    def _one_executor_key(self) -> Self:
        """The executor key comes from one place: ``executor_private_key``, or the keystore
        with its password, decrypted here (once, when the settings are built) into
        ``executor_private_key``, so every user of the key reads it there.

        Raises:
            ConfigError: both are given, the keystore lacks its password (or the password its
                keystore), or the keystore cannot be read, is not one, or the password does
                not open it. The message names the settings, never a value.
        """
        keystore, password = self.executor_keystore_file, self.executor_keystore_password
        if keystore is None:
            if password is not None:
                raise ConfigError(
                    message=f"{KEYSTORE_PASSWORD} is set without {KEYSTORE_FILE}: set both, or neither"
                )
            return self
        if self.executor_private_key is not None:
            raise ConfigError(
                message=f"{env_name('executor_private_key')} and {KEYSTORE_FILE} are both set: "
                "give the executor key one way"
            )
        if password is None:
            raise ConfigError(message=f"{KEYSTORE_FILE} is set without {KEYSTORE_PASSWORD}")
        self.executor_private_key = SecretStr(decrypt_keystore(keystore, password))
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment, then secret files named as the setting or as its
        variable (``executor_private_key`` or ``RELAYER_EXECUTOR_PRIVATE_KEY``)."""
        assert isinstance(file_secret_settings, SecretsSettingsSource)
        return (init_settings, env_settings, *_secret_sources(settings_cls, file_secret_settings.secrets_dir))

    def executor_keys(self) -> list[str]:
        """Every executor key: ``executor_private_key`` first, then ``executor_private_keys``,
        without repeats (hex, as given; never logged).

        Raises:
            ConfigError: the main key is missing.
        """
        self.require("executor_private_key")
        assert self.executor_private_key is not None
        keys = [self.executor_private_key.get_secret_value()]
        if self.executor_private_keys is not None:
            keys += self.executor_private_keys.get_secret_value().split()
        seen: set[int] = set()
        unique = []
        for key in keys:
            if int(key.removeprefix("0x"), 16) not in seen:
                seen.add(int(key.removeprefix("0x"), 16))
                unique.append(key)
        return unique

    def issuer(self) -> str:
        """The certificates' issuer: ``certificate_issuer``, else the host (and port) of
        ``public_base_url`` ("relay.example.org")."""
        if self.certificate_issuer.strip():
            return self.certificate_issuer.strip()
        return self.public_base_url.partition("://")[2].split("/", 1)[0] or self.public_base_url

    @property
    def x402_base_url(self) -> str:
        return f"{self.public_base_url}/api"

    def x402_hosts(self) -> dict[str, str]:
        """The x402 base URLs by what they serve: ``latest`` (this daemon's public host),
        ``v1`` (pinned to major 1) and ``v0`` (the previous major); the pinned ones default
        to the public host prefixed with ``v1.`` and ``v0.`` (spec: Versioning)."""
        scheme, _, host = self.public_base_url.partition("://")
        return {
            "latest": self.x402_base_url,
            "v1": self.x402_v1_base_url or f"{scheme}://v1.{host}/api",
            "v0": self.x402_v0_base_url or f"{scheme}://v0.{host}/api",
        }

    def depth(self) -> int:
        """The confirmation depth in blocks (:meth:`confirmation_policy`; with a ``safe`` or
        ``finalized`` tag, the blocks its horizon spans)."""
        return self.confirmation_policy().depth

    def confirmation_policy(self) -> ConfirmationPolicy:
        """When a receipt counts as confirmed (issue 20): ``confirmations`` blocks, else
        ``confirmation`` (seconds at the block time, or the node's safe/finalized head), else
        the chain's default; the block time is ``block_time_ms`` or the chain table's."""
        policy = default_confirmation(self.chain_id, self.block_time_ms)
        if self.confirmations is not None:
            return ConfirmationPolicy(policy.block_time_ms, self.confirmations)
        if self.confirmation is None:
            return policy
        wanted = parse_confirmation(self.confirmation)
        if isinstance(wanted, str):
            return ConfirmationPolicy.at_tag(wanted, policy.block_time_ms)
        return ConfirmationPolicy.in_seconds(wanted, policy.block_time_ms)

    def served_chain_ids(self) -> list[int]:
        """The chains this daemon relays on: ``chain_id`` first, then ``relay_chains``."""
        return [self.chain_id, *(c.chain_id for c in self.relay_chains)]

    def chain_settings(self) -> list[Settings]:
        """These settings once per relayed chain, ``chain_id``'s first (itself): in each the
        chain's own node, deployment and confirmation policy, and as ``relay_chains`` the
        others (so each copy serves the same chains).

        Raises:
            ConfigError: ``relay_chains`` names ``chain_id`` or a chain twice, or a chain it
                names is also in ``RELAYER_INDEX_CHAINS``.
        """
        seen = {self.chain_id}
        for c in self.relay_chains:
            if c.chain_id in seen:
                raise ConfigError(
                    message=f"{RELAY_CHAINS_ENV} names chain {c.chain_id} twice, or RELAYER_CHAIN_ID's own; "
                    "give each relayed chain once"
                )
            seen.add(c.chain_id)
        both = sorted(seen & {c.chain_id for c in self.index_chains})
        if both:
            raise ConfigError(
                message=f"RELAYER_INDEX_CHAINS names chain {both[0]}, which this daemon relays on "
                f"(RELAYER_CHAIN_ID or {RELAY_CHAINS_ENV}): a relayed chain is indexed with its relay; "
                "leave it out of RELAYER_INDEX_CHAINS"
            )
        if not self.relay_chains:
            return [self]
        own = RelayChain(
            chain_id=self.chain_id,
            rpc_url=self.rpc_url or "",
            deployment_file=self.deployment_file or Path(),
            confirmations=self.confirmations,
            confirmation=self.confirmation,
            block_time_ms=self.block_time_ms,
        )
        out = [self]
        for c in self.relay_chains:
            others = [own, *(o for o in self.relay_chains if o.chain_id != c.chain_id)]
            update = {
                "chain_id": c.chain_id,
                "rpc_url": c.rpc_url,
                "deployment_file": c.deployment_file,
                "confirmations": c.confirmations,
                "confirmation": c.confirmation,
                "block_time_ms": c.block_time_ms,
                "relay_chains": others,
                "index_chains": [],
            }
            out.append(self.model_copy(update=update))
        return out

    def poll_interval_s(self) -> float:
        """How often the follower and the indexers look for a new head: ``block_poll_interval_s``,
        else half a block (at most 1 s)."""
        return self.block_poll_interval_s or self.confirmation_policy().poll_interval_s()

    def lane_policy(self) -> LanePolicy:
        """How patient the executor lane is (seconds)."""
        return LanePolicy(
            resend_after_s=self.resend_after_s,
            replace_after_s=self.replace_after_s,
            hole_after_s=self.hole_after_s,
            noop_before_expiry_s=self.noop_before_expiry_s,
        )

    def projects(self) -> bytes:
        """The carbon projects JSON: ``projects_file`` if set, else the packaged data set."""
        return projects_json() if self.projects_file is None else self.projects_file.read_bytes()

    def require(self, *names: str) -> None:
        """Stop unless every named setting is present and not blank.

        Raises:
            ConfigError: naming each missing environment variable and what it is.
        """
        missing = [n for n in names if _blank(getattr(self, n))]
        if missing:
            fields = type(self).model_fields
            described = ", ".join(
                f"{env_name(n)} ({fields[n].description})" + _ALTERNATIVES.get(n, "") for n in missing
            )
            raise ConfigError(message=f"missing setting{'s' if len(missing) > 1 else ''} {described}")


KEYSTORE_FILE: Final = "RELAYER_EXECUTOR_KEYSTORE_FILE"
KEYSTORE_PASSWORD: Final = "RELAYER_EXECUTOR_KEYSTORE_PASSWORD"
_ALTERNATIVES: Final = {"executor_private_key": f" or {KEYSTORE_FILE} with {KEYSTORE_PASSWORD}"}
"""What else satisfies a required setting, said when it is missing."""


def decrypt_keystore(path: Path, password: SecretStr) -> str:
    """The private key (0x-prefixed hex) of an encrypted JSON keystore: Web3 Secret Storage
    version 3 (scrypt or pbkdf2, aes-128-ctr), as geth and eth-account write it.

    Raises:
        ConfigError: the file cannot be read, is not such a keystore, the password does not
            open it, or it holds no valid secp256k1 key. Neither the password nor the key
            (nor the library's message) is in the error.
    """
    from eth_account import Account  # eth-account only where a keystore is used

    try:
        document = json.loads(path.read_bytes())
    except OSError as exc:
        raise ConfigError(message=f"{KEYSTORE_FILE} {path} cannot be read ({type(exc).__name__})") from None
    except ValueError:
        raise ConfigError(message=f"{KEYSTORE_FILE} {path} is not JSON") from None
    crypto = document.get("crypto", document.get("Crypto")) if isinstance(document, dict) else None
    if not isinstance(crypto, dict) or document.get("version") != 3:
        raise ConfigError(
            message=f"{KEYSTORE_FILE} {path} is not an encrypted JSON keystore (Web3 Secret Storage v3)"
        )
    try:
        key = bytes(Account.decrypt(document, password.get_secret_value()))
    except ValueError:  # eth-keyfile's MAC mismatch, or ciphertext that is not hex
        raise ConfigError(
            message=f"{KEYSTORE_PASSWORD} does not open {KEYSTORE_FILE} {path} (a wrong password or a "
            "damaged keystore)"
        ) from None
    except (KeyError, TypeError, NotImplementedError) as exc:  # a field missing or of the wrong type
        raise ConfigError(
            message=f"{KEYSTORE_FILE} {path} is not a usable keystore ({type(exc).__name__})"
        ) from None
    try:
        return _checked_key("0x" + key.hex())
    except ValueError:
        raise ConfigError(message=f"{KEYSTORE_FILE} {path} holds no valid secp256k1 key") from None


def _secret_sources(
    settings_cls: type[BaseSettings], secrets_dir: PathType | None
) -> tuple[SecretsSettingsSource, ...]:
    """The secret-file sources of ``secrets_dir`` (none without one): files named as the
    setting first, then as its variable."""
    if secrets_dir is None:
        return ()
    return (
        SecretsSettingsSource(settings_cls, secrets_dir=secrets_dir, env_prefix=""),
        SecretsSettingsSource(settings_cls, secrets_dir=secrets_dir),
    )


def setting_origins(secrets_dir: PathType | None = SECRETS_DIR_IN_USE) -> dict[str, str]:
    """Where each setting given outside the defaults comes from: ``env`` or ``secret file``
    (by field name; ``executor_private_key`` from a keystore is ``keystore``). Read from the
    same sources as :class:`Settings`, after they built it (the values are not kept)."""
    origins: dict[str, str] = {}
    sources: list[tuple[str, PydanticBaseSettingsSource]] = [("env", EnvSettingsSource(Settings))]
    sources += [("secret file", source) for source in _secret_sources(Settings, secrets_dir)]
    for origin, source in sources:
        for name in source():
            origins.setdefault(name, origin)
    if "executor_keystore_file" in origins:
        origins["executor_private_key"] = "keystore"
    return origins


def checked_confirmation(value: str | None) -> str | None:
    """``RELAYER_CONFIRMATION`` (or a relayed chain's ``confirmation``) as given, when it is
    seconds, ``safe`` or ``finalized``.

    Raises:
        ValueError: anything else (pydantic reports it as the setting's validation error).
    """
    if value is not None:
        parse_confirmation(value)
    return value


def check_rate_limit(text: str) -> str:
    """``text`` when it is one or more rate limits in the `limits` notation (``"50/second"``,
    ``"20/second;600/minute"``), at most 200 characters.

    Raises:
        ValueError: it is not.
    """
    try:
        if not text.strip() or len(text) > 200 or not limits.parse_many(text):
            raise ValueError
    except ValueError:
        raise ValueError(f"not a rate limit such as '50/second': {text[:40]!r}") from None
    return text


def _checked_key(text: str) -> str:
    """An executor key: exactly 32 bytes (a 63-digit key would otherwise load as another
    address), a valid secp256k1 scalar. The error never carries the value."""
    text = text.strip()
    if not _KEY.fullmatch(text) or not 0 < int(text.removeprefix("0x"), 16) < SECP256K1_N:
        raise ValueError("must be 32 bytes: 64 hex digits (optionally 0x-prefixed), a valid secp256k1 key")
    return text


def _blank(value: object) -> bool:
    """Unset, or only whitespace (an empty secret file counts as missing too)."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    return value is None or (isinstance(value, str) and not value.strip())


def env_name(field: str) -> str:
    """The environment variable of a setting (``rpc_url`` -> ``RELAYER_RPC_URL``)."""
    return f"{ENV_PREFIX}{field.upper()}"


def load_settings() -> Settings:
    """Settings from the environment and secret files.

    Raises:
        ConfigError: a value is malformed; the message names the variable and the rule,
            never the value.
    """
    try:
        return Settings()
    except ValidationError as exc:
        raise ConfigError(message=f"invalid setting {'; '.join(validation_problems(exc))}") from None


def validation_problems(exc: ValidationError) -> list[str]:
    """One line per invalid setting: its variable and the rule it breaks (never the value)."""
    return [f"{env_name(str(e['loc'][0])) if e['loc'] else 'settings'}: {e['msg']}" for e in exc.errors()]
