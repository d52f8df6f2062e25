"""Configuration: one pydantic-settings class, env prefix ``RELAYER_``, built once at start-up.

Secrets are ``SecretStr`` (never printed); on Kubernetes they can come from files in
``secrets_dir`` (one file per setting, named like the env variable without the prefix).
Nothing else in the package reads ``os.environ``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

SECRETS_DIR = "/var/run/secrets/relayer"


class Settings(BaseSettings):
    """All daemon and dev-tool settings. Units are in the field names or descriptions."""

    model_config = SettingsConfigDict(
        env_prefix="RELAYER_",
        extra="forbid",
        secrets_dir=SECRETS_DIR if os.path.isdir(SECRETS_DIR) else None,
    )

    # --- storage -----------------------------------------------------------------------
    database_url: SecretStr | None = Field(
        default=None,
        description="Postgres DSN. Unset: dev tooling starts a private throwaway cluster.",
    )
    db_pool_min: int = Field(default=2, ge=1)
    db_pool_max: int = Field(default=10, ge=1)

    # --- chain -------------------------------------------------------------------------
    rpc_url: str = "http://127.0.0.1:8545"
    chain_id: int = Field(default=84532, description="8453 (Base) or 84532 (Base Sepolia).")
    deployment_file: Path = Field(
        default=Path(".devdata/devnet.json"),
        description="JSON with `contracts` addresses (written by `relayer devnet up`).",
    )
    projects_file: Path = Field(
        default=Path(__file__).resolve().parents[1] / "data" / "carbon-projects.json",
        description="Carbon project facts (country, category, methodologies) for discover filters.",
    )
    executor_private_key: SecretStr | None = Field(
        default=None, description="Executor key (hex). Unset locally: taken from the deployment file."
    )
    confirmations: int = Field(default=1, ge=1, description="Blocks a receipt must be buried under.")
    gas_cap: int = Field(default=1_500_000, ge=21_000, description="Executor gas ceiling per tx.")
    gas_limit_margin_bps: int = Field(default=2_000, ge=0, description="Gas limit = estimate * (1+m).")
    priority_fee_wei: int = Field(default=1_000_000, ge=0, description="EIP-1559 tip, wei per gas.")
    base_fee_multiplier: int = Field(default=2, ge=1, description="maxFee = mult * baseFee + tip.")
    eth_price_usdc: int = Field(
        default=3_000_000_000,
        gt=0,
        description="Price of 1 ETH in USDC atomic units (6 decimals), for the gas allowance.",
    )
    gas_allowance_margin_bps: int = Field(
        default=5_000, ge=0, description="Headroom on the quoted gas allowance (basis points)."
    )
    gas_budget_class: int = Field(default=450_000, gt=0, description="Gas priced into a class allowance.")
    gas_budget_listing: int = Field(default=350_000, gt=0, description="Gas priced into a listing allowance.")
    block_poll_interval_s: float = Field(default=0.25, gt=0)

    # --- relay -------------------------------------------------------------------------
    class_auth_lifetime_s: int = Field(default=3600, gt=0, description="Authorization lifetime, class.")
    listing_auth_lifetime_s: int = Field(default=300, gt=0, description="Authorization lifetime, listing.")
    class_slippage_bps: int = Field(default=400, ge=0, description="Suggested max input headroom.")
    settle_wait_s: float = Field(default=45.0, gt=0, description="How long actions/retire waits.")

    # --- http --------------------------------------------------------------------------
    http_host: str = "127.0.0.1"
    http_port: int = 8402
    public_base_url: str = Field(
        default="http://127.0.0.1:8402", description="Where callers reach this daemon (no slash)."
    )
    max_body_bytes: int = Field(default=64 * 1024, gt=0)

    # --- logging -----------------------------------------------------------------------
    log_level: str = "INFO"

    @property
    def x402_base_url(self) -> str:
        return f"{self.public_base_url}/api"
