"""The one table of chain facts (relayer.domain.chains): each chain's facts, what every lookup
answers for a chain not in the table, and that no other module of the package keeps its own
copy of a chain fact or of a shared constant (issue 17)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from relayer.domain import chains
from relayer.domain.chains import CHAINS, ChainFacts

PACKAGE = Path(chains.__file__).resolve().parents[1]
SEPOLIA, AMOY = "https://sepolia.basescan.org", "https://amoy.polygonscan.com"
UNKNOWN = 31337  # anvil's default chain id: not in the table


# Block 0 of each public chain (read from the public nodes; the same in reth's and silkworm's
# chain specs): what tells the public chain from a devnet that uses its chain id.
GENESIS = {
    8453: "f712aa9241cc24369b143cf6dce85f0902a9731e70d66818a3a5845b296c73dd",
    84532: "0dcc9e089e30b90ddfc55be9a37dd15bc551aeee999d2e2b51414c54eaf934e4",
    137: "a9c28ce2141b56c474f1dc504bee9b01eb1bd7d1a507580d5519d4437a97de1b",
    80002: "7202b2b53c5a0836e773e319d18922cc756dd67432f9a1f65352b61f4406c697",
}


@pytest.mark.parametrize(
    ("chain_id", "name", "network", "explorer", "block_ms", "seconds", "confirmations", "relay", "usdc"),
    [
        # Base since Denim: 200 ms blocks; the confirmation is a time, its depth derived.
        (8453, "Base", "base", "https://basescan.org/tx/", 200, 20.0, 100, True, "USD Coin"),
        (84532, "Base Sepolia", "base-sepolia", f"{SEPOLIA}/tx/", 200, 10, 50, True, "USDC"),
        (137, "Polygon", "polygon", "https://polygonscan.com/tx/", 2_000, 128.0, 64, False, None),
        (80002, "Polygon Amoy", "polygon-amoy", f"{AMOY}/tx/", 2000, 32, 16, False, None),
    ],
)
def test_each_chains_facts(
    chain_id: int,
    name: str,
    network: str,
    explorer: str,
    block_ms: int,
    seconds: float,
    confirmations: int,
    relay: bool,
    usdc: str | None,
) -> None:
    facts = chains.facts(chain_id)
    assert facts is not None and facts.confirmations == confirmations
    assert facts == ChainFacts(
        chain_id=chain_id,
        name=name,
        network=network,
        explorer_tx=explorer,
        genesis_hash=bytes.fromhex(GENESIS[chain_id]),
        block_time_ms=block_ms,
        confirmation_s=seconds,
        relay=relay,
        catalogue=True,
        usdc_domain_name=usdc,
    )
    assert CHAINS[chain_id] is facts
    assert facts.caip2 == chains.caip2(chain_id) == f"eip155:{chain_id}"
    assert chains.display_name(chain_id) == name
    assert chains.network(chain_id) == network
    tx = "0x" + "ab" * 32
    public = bytes.fromhex(GENESIS[chain_id])
    assert chains.explorer_tx_url(chain_id, tx, public) == explorer + tx
    # a devnet or fork that uses the chain id, or a chain whose genesis is not known yet
    assert chains.explorer_tx_url(chain_id, tx, b"\x01" * 32) is None
    assert chains.explorer_tx_url(chain_id, tx, None) is None
    assert chains.default_confirmations(chain_id) == confirmations
    assert chains.relay_supported(chain_id) is relay
    assert chains.catalogue_supported(chain_id) is True
    assert chains.usdc_domain_name(chain_id) == (usdc or "USDC")


def test_the_table_lists_exactly_the_relay_and_catalogue_chains() -> None:
    assert sorted(CHAINS) == [137, 8453, 80002, 84532]
    assert chains.RELAY_CHAINS == (8453, 84532)
    assert chains.CATALOGUE_CHAINS == (8453, 84532, 137, 80002)
    assert all(chain_id == facts.chain_id for chain_id, facts in CHAINS.items())


def test_an_unknown_chain_gets_the_stated_fallbacks() -> None:
    assert chains.facts(UNKNOWN) is None
    assert chains.caip2(UNKNOWN) == "eip155:31337"
    assert chains.display_name(UNKNOWN) == "chain 31337"
    assert chains.network(UNKNOWN) == "eip155:31337"
    assert chains.explorer_tx_url(UNKNOWN, "0x" + "00" * 32, b"\x01" * 32) is None
    assert chains.default_confirmations(UNKNOWN) == chains.UNKNOWN_CHAIN_CONFIRMATIONS == 100
    assert chains.relay_supported(UNKNOWN) is False
    assert chains.catalogue_supported(UNKNOWN) is False
    assert chains.usdc_domain_name(UNKNOWN) == chains.UNKNOWN_USDC_DOMAIN_NAME == "USDC"


def test_the_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        CHAINS[1] = chains.BASE  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        chains.BASE.confirmation_s = 1.0  # type: ignore[misc]


def test_config_and_eip712_read_the_table() -> None:
    from relayer.config import IndexChain, Settings
    from relayer.domain.eip712 import usdc_domain_name

    assert usdc_domain_name is chains.usdc_domain_name
    for chain_id in (*CHAINS, UNKNOWN):
        settings = Settings(chain_id=chain_id, confirmations=None)
        assert settings.depth() == chains.default_confirmations(chain_id)
        index = IndexChain(chainId=chain_id, rpcUrl="http://x", deploymentFile=Path("d.json"))
        assert index.depth() == chains.default_confirmations(chain_id)
    assert Settings(chain_id=8453, confirmations=3).depth() == 3


# ---------------------------------------------------------------------------- one definition

OWNERS = {
    "CHAIN_NAMES": "domain/chains.py",
    "EXPLORERS": "domain/chains.py",
    "SUPPORTED_CHAINS": "domain/chains.py",
    "DEFAULT_CONFIRMATIONS": "domain/chains.py",
    "UNITS_PER_TONNE": "domain/amounts.py",
    "SOURCE_ID": "domain/marketplace.py",
    "_SOURCE_ID": "domain/marketplace.py",
    "StrictModel": "domain/models.py",
}
"""A name (module-level assignment or class) and the one module allowed to define it (or, for
the names the table replaced, none: chains.py defines ``CHAINS`` instead)."""
CHAIN_IDS = frozenset(CHAINS)


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
    return names


def test_each_shared_constant_is_defined_once() -> None:
    strays = [
        f"{module} defines {name}"
        for module, tree in _modules()
        for name in _defined(tree) & OWNERS.keys()
        if module != OWNERS[name]
    ]
    assert strays == []
    defined = {name for module, tree in _modules() for name in _defined(tree)}
    assert {"UNITS_PER_TONNE", "SOURCE_ID", "StrictModel", "CHAINS"} <= defined
    assert not {"CHAIN_NAMES", "EXPLORERS", "SUPPORTED_CHAINS", "DEFAULT_CONFIRMATIONS"} & defined


def test_no_chain_id_literal_outside_the_table() -> None:
    """A chain id written as a number anywhere but the table is a second copy of a chain fact
    (docstrings and messages may name chains; code reads the table)."""
    strays = [
        f"{module}:{node.lineno}: {node.value}"
        for module, tree in _modules()
        if module != "domain/chains.py"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value in CHAIN_IDS
    ]
    assert strays == []


def test_strict_models_derive_from_the_one_base() -> None:
    """No pydantic model sets ``extra`` in its own ``ConfigDict``: strictness comes from
    :class:`StrictModel` (the settings class keeps ``SettingsConfigDict(extra="forbid")``)."""
    strays = [
        f"{module}:{node.lineno}"
        for module, tree in _modules()
        if module != "domain/models.py"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "ConfigDict"
        and any(k.arg in ("extra", "frozen") for k in node.keywords)
    ]
    assert strays == []
