"""Contract ABIs from the packaged ``contracts_abi/`` (the only ABIs the daemon loads) and
custom-error decoding: a selector table built from every ABI, so a revert's data becomes
``{selector, errorName, contract, args}``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from eth_abi.abi import decode
from eth_utils.crypto import keccak

from relayer.package_data import abi_artifact

CONTRACT_NAMES: Final = (
    "UsdcEip3009",
    "KlimaVcm",
    "CarbonCredits",
    "CarbonClasses",
    "UsdcKvcmPool",
    "Marketplace",
    "RetirementSettlement",
)


@cache
def artifact(name: str) -> dict[str, Any]:
    """``{contractName, abi, bytecode}`` of a compiled contract."""
    return abi_artifact(name)


def abi(name: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = artifact(name)["abi"]
    return result


def canonical_type(param: dict[str, Any]) -> str:
    """The ABI's canonical type of one parameter (tuples spelled out, arrays kept)."""
    kind: str = param["type"]
    if kind.startswith("tuple"):
        inner = ",".join(canonical_type(c) for c in param["components"])
        return f"({inner}){kind[5:]}"
    return kind


@dataclass(frozen=True, slots=True)
class ErrorAbi:
    contract: str
    name: str
    types: tuple[str, ...]
    names: tuple[str, ...]


@cache
def error_table() -> dict[bytes, ErrorAbi]:
    """4-byte selector -> custom error, over all contracts (first definition wins)."""
    table: dict[bytes, ErrorAbi] = {}
    for contract in CONTRACT_NAMES:
        for item in abi(contract):
            if item.get("type") != "error":
                continue
            types = tuple(canonical_type(i) for i in item["inputs"])
            selector = keccak(text=f"{item['name']}({','.join(types)})")[:4]
            table.setdefault(
                selector, ErrorAbi(contract, item["name"], types, tuple(i["name"] for i in item["inputs"]))
            )
    return table


_ERROR_STRING: Final = bytes.fromhex("08c379a0")
_PANIC: Final = bytes.fromhex("4e487b71")


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def decode_revert(data: bytes) -> dict[str, Any]:
    """Decode revert data into ``{selector, decoded: {errorName, args}, contract}``.

    Integers in ``args`` are decimal strings (they can exceed JSON number precision).
    Unknown selectors give ``errorName: null``.
    """
    selector = data[:4]
    out: dict[str, Any] = {"selector": "0x" + selector.hex(), "contract": None}
    if selector == _ERROR_STRING:
        (reason,) = decode(["string"], data[4:])
        out["decoded"] = {"errorName": "Error", "args": {"reason": reason}}
        return out
    if selector == _PANIC:
        (code,) = decode(["uint256"], data[4:])
        out["decoded"] = {"errorName": "Panic", "args": {"code": str(code)}}
        return out
    known = error_table().get(selector)
    if known is None:
        out["decoded"] = {"errorName": None, "args": {}}
        return out
    try:
        values = decode(list(known.types), data[4:])
    except Exception:  # malformed arguments: still name the error
        values = ()
    out["contract"] = known.contract
    out["decoded"] = {
        "errorName": known.name,
        "args": {
            n or f"arg{i}": _jsonable(v) for i, (n, v) in enumerate(zip(known.names, values, strict=False))
        },
    }
    return out
