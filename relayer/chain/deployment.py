"""The deployment description files the settings name: this chain's
(``RELAYER_DEPLOYMENT_FILE``) and the marketplace's index chains' (``RELAYER_INDEX_CHAINS``),
read into contract addresses and first blocks. A file that cannot be used stops the start
with a :class:`ConfigError` naming its setting."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from relayer.chain.types import Contracts
from relayer.config import ConfigError, IndexChain, Settings


def load_deployment(
    path: Path,
    setting: str = "RELAYER_DEPLOYMENT_FILE",
    chain_id: int | None = None,
    chain_setting: str = "RELAYER_CHAIN_ID",
) -> tuple[Contracts, int]:
    """The deployment's contract addresses and first block, from its description file
    (``contracts``, ``deployBlock``; its ``chainId``, when it says one, must be ``chain_id``).

    Raises:
        ConfigError: the file is missing, not JSON, lacks a contract address, or is the
            deployment of another chain (naming ``setting``).
    """
    try:
        data = json.loads(path.read_text())
        contracts, block = Contracts.from_deployment(data["contracts"]), int(data.get("deployBlock", 0))
        said = data.get("chainId")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            message=f"{setting} {path}: not a usable deployment ({type(exc).__name__}: {exc})"
        ) from None
    if chain_id is not None and said is not None and str(said) != str(chain_id):
        raise ConfigError(
            message=f"{setting} {path}: the deployment of chain {said}, not {chain_id} ({chain_setting}); "
            "give this chain's deployment file"
        )
    return contracts, block


@dataclass(frozen=True)
class ExtraChain:
    """A chain indexed for the marketplace only (``RELAYER_INDEX_CHAINS``)."""

    config: IndexChain
    contracts: Contracts
    deploy_block: int


def extra_chains(settings: Settings) -> list[ExtraChain]:
    """The chains of ``RELAYER_INDEX_CHAINS`` with their deployments.

    Raises:
        ConfigError: a deployment file is unusable, or a chain is this daemon's own or repeated.
    """
    out: list[ExtraChain] = []
    seen = {settings.chain_id}
    for ic in settings.index_chains:
        if ic.chain_id in seen:
            raise ConfigError(
                message=f"RELAYER_INDEX_CHAINS names chain {ic.chain_id} twice (or this daemon's own)"
            )
        seen.add(ic.chain_id)
        setting = f"RELAYER_INDEX_CHAINS (chain {ic.chain_id})"
        contracts, block = load_deployment(ic.deployment_file, setting, ic.chain_id, f"{setting}'s chainId")
        out.append(ExtraChain(ic, contracts, block))
    return out
