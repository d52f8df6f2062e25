"""The words the relay hashes by hand on every request (relayer/domain/abi_words.py, the
EIP-712 digest's flat path in relayer/domain/eip712.py, the retirement's struct hash and
bound nonce) against eth_abi and eth_account, over random values; and the typed data the
flat path leaves to eth_account, which then answers as before."""

from __future__ import annotations

import copy
import os
import random
from typing import Any

import pytest
from eth_abi.abi import encode
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils.crypto import keccak

from relayer.domain import eip712
from relayer.domain.abi_words import address_word, bytes32_word, uint_word
from relayer.domain.retirement import (
    DETAILS_TYPEHASH,
    RETIREMENT_TYPEHASH,
    Retirement,
    RetirementDetails,
    bind_nonce,
)

RANDOM = random.Random(20)


def _address() -> str:
    raw = Account.create().address
    return RANDOM.choice([raw, raw.lower(), "0x" + raw[2:].upper()])


def _library_digest(typed: dict[str, Any]) -> bytes:
    signable = encode_typed_data(full_message=typed)
    return keccak(b"\x19" + signable.version + signable.header + signable.body)


def test_words_are_eth_abis() -> None:
    for _ in range(200):
        address, value, raw = _address(), RANDOM.getrandbits(RANDOM.choice([1, 8, 64, 256])), os.urandom(32)
        assert address_word(address) == encode(["address"], [address])
        assert uint_word(value) == encode(["uint256"], [value])
        assert uint_word(value % 256, 8) == encode(["uint8"], [value % 256])
        assert bytes32_word(raw) == encode(["bytes32"], [raw])


@pytest.mark.parametrize(
    "bad", [-1, 1 << 256, True, 1.0, "1"], ids=["negative", "too big", "bool", "float", "string"]
)
def test_a_uint_outside_its_type_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError):
        uint_word(bad)


@pytest.mark.parametrize("bad", ["0x12", "0x" + "g" * 40, "00" * 21, b"\x01" * 20], ids=repr)
def test_an_address_not_0x_and_40_hex_digits_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError):
        address_word(bad)


def _retirement() -> Retirement:
    text = ["", "Ann", "Zoë — 北京 🌳", "x" * 300]
    details = RetirementDetails(_address(), _address(), *(RANDOM.choice(text) for _ in range(7)))
    return Retirement(
        source=RANDOM.randrange(256), source_id=RANDOM.getrandbits(64), credit_token=_address(),
        token_id=RANDOM.getrandbits(256), amount=RANDOM.getrandbits(128), input_token=_address(),
        gas_allowance=RANDOM.getrandbits(96), details=details,
    )  # fmt: skip


def test_the_retirements_hashes_are_abi_encodes() -> None:
    for _ in range(100):
        r, salt = _retirement(), os.urandom(32)
        d = r.details
        details = keccak(
            encode(
                ["bytes32", "address", "address"] + ["bytes32"] * 7,
                [DETAILS_TYPEHASH, d.retiring_address, d.beneficiary_address,
                 *(keccak(text=s) for s in d.as_tuple()[2:])],
            )
        )  # fmt: skip
        types = [
            "bytes32",
            "uint8",
            "uint256",
            "address",
            "uint256",
            "uint256",
            "address",
            "uint256",
            "bytes32",
        ]
        values = [RETIREMENT_TYPEHASH, r.source, r.source_id, r.credit_token, r.token_id, r.amount,
                  r.input_token, r.gas_allowance, details]  # fmt: skip
        assert d.struct_hash() == details
        assert r.struct_hash() == keccak(encode(types, values))
        assert bind_nonce(r, salt) == keccak(encode(["bytes32", "bytes32"], [r.struct_hash(), salt]))


def _typed() -> dict[str, Any]:
    common = {
        "chain_id": RANDOM.choice([8453, 84532, 31337]),
        "value": RANDOM.getrandbits(RANDOM.choice([8, 255])),
    }
    kind = RANDOM.randrange(3)
    if kind == 0:
        return eip712.receive_with_authorization(
            usdc=_address(), payer=_address(), settlement=_address(), valid_after=0,
            valid_before=RANDOM.getrandbits(40), nonce=os.urandom(32), **common,
        )  # fmt: skip
    if kind == 1:
        return eip712.transfer_with_authorization(
            usdc=_address(), payer=_address(), to=_address(), valid_after=RANDOM.getrandbits(32),
            valid_before=RANDOM.getrandbits(40), nonce=os.urandom(32), name="USD Coin", **common,
        )  # fmt: skip
    return eip712.permit(
        kvcm=_address(), owner=_address(), spender=_address(), nonce=RANDOM.getrandbits(64),
        deadline=RANDOM.getrandbits(256), **common,
    )  # fmt: skip


def test_the_digest_of_the_typed_data_built_here_is_eth_accounts() -> None:
    for _ in range(150):
        typed = _typed()
        assert eip712._flat_digest(typed) is not None  # the flat path took it
        assert eip712.typed_data_digest(typed) == _library_digest(typed)


LENIENT = {
    "a uint256 in hex": lambda t: t["message"].__setitem__(next(iter(_uints(t))), "0x3039"),
    "a uint256 with a space": lambda t: t["message"].__setitem__(next(iter(_uints(t))), " 12345"),
    "a uint256 with a leading zero": lambda t: t["message"].__setitem__(next(iter(_uints(t))), "012"),
    "a negative uint256": lambda t: t["message"].__setitem__(next(iter(_uints(t))), "-1"),
    "a uint256 too big": lambda t: t["message"].__setitem__(next(iter(_uints(t))), str(1 << 256)),
    "a float": lambda t: t["message"].__setitem__(next(iter(_uints(t))), 12.0),
    "a bool": lambda t: t["message"].__setitem__(next(iter(_uints(t))), True),
    "a missing field": lambda t: t["message"].pop(next(iter(_uints(t)))),
    "an extra field": lambda t: t["message"].__setitem__("extra", "1"),
    "a short address": lambda t: t["domain"].__setitem__("verifyingContract", "0x1234"),
    "a chain id as a string": lambda t: t["domain"].__setitem__("chainId", "84532"),
    "a domain without version": lambda t: (t["domain"].pop("version"), t["types"].__setitem__(
        "EIP712Domain", [f for f in eip712.DOMAIN_FIELDS if f["name"] != "version"])),
    "another type beside": lambda t: t["types"].__setitem__("Other", [{"name": "a", "type": "uint256"}]),
}  # fmt: skip


def _uints(typed: dict[str, Any]) -> list[str]:
    return [f["name"] for f in typed["types"][typed["primaryType"]] if f["type"] == "uint256"]


@pytest.mark.parametrize("change", list(LENIENT), ids=list(LENIENT))
def test_typed_data_the_flat_path_does_not_take_is_eth_accounts_to_answer(change: str) -> None:
    for _ in range(3):
        typed = _typed()
        LENIENT[change](typed)
        try:
            expected: bytes | type[Exception] = _library_digest(copy.deepcopy(typed))
        except Exception as exc:  # whatever eth_account raises, the digest raises too
            expected = type(exc)
        if isinstance(expected, bytes):
            assert eip712.typed_data_digest(typed) == expected
        else:
            with pytest.raises(expected):
                eip712.typed_data_digest(typed)


@pytest.mark.parametrize("chosen", [None, "pycryptodome"])
def test_keccak_goes_through_the_c_backend_unless_the_operator_chose_another(chosen: str | None) -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ETH_HASH_BACKEND"}
    if chosen:
        env["ETH_HASH_BACKEND"] = chosen
    probe = (
        "import os, relayer; from eth_hash.auto import keccak; "
        "assert keccak(b'').hex().startswith('c5d2460186f7233c'); print(os.environ['ETH_HASH_BACKEND'])"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (chosen or "pysha3")


def _functions_the_fast_path_encodes() -> list[Any]:
    """Every function of every committed ABI whose inputs encode_tuple takes."""
    import json
    from pathlib import Path

    from relayer.chain import codec

    found = []
    for path in sorted((Path(codec.__file__).parents[2] / "contracts_abi").glob("*.json")):
        data = json.loads(path.read_text())
        items = data["abi"] if isinstance(data, dict) else data
        names = [i["name"] for i in items if i.get("type") == "function"]
        for name in names:
            if names.count(name) != 1:
                continue  # overloaded: codec.function does not take it
            function = codec.function(path.stem, name)
            if function.kinds is not None and function.inputs:
                found.append(function)
    return found


FAST_FUNCTIONS = _functions_the_fast_path_encodes()


def test_the_settlements_calls_take_the_fast_path() -> None:
    names = {f"{f.contract}.{f.name}" for f in FAST_FUNCTIONS}
    assert {
        "RetirementSettlement.retireWithAuthorization",
        "RetirementSettlement.retireWithPermit",
        "UsdcEip3009.transferWithAuthorization",
        "UsdcEip3009.balanceOf",
    } <= names


@pytest.mark.parametrize("function", FAST_FUNCTIONS, ids=lambda f: f"{f.contract}.{f.name}")
def test_the_fast_encoding_of_every_call_is_eth_abis(function: Any) -> None:
    """For values eth_abi's own strategy draws (checksummed addresses, any text, any bytes),
    the call data encode_tuple makes is eth_abi's, byte for byte."""
    from eth_abi.tools import get_abi_strategy
    from hypothesis import given, settings

    from relayer.domain.abi_words import encode_tuple

    assert function.kinds is not None

    @settings(max_examples=60, deadline=None)
    @given(get_abi_strategy("(" + ",".join(function.inputs) + ")"))
    def same(values: tuple[Any, ...]) -> None:
        assert encode_tuple(function.kinds, values) == encode(list(function.inputs), list(values))

    same()


@pytest.mark.parametrize(
    "bad",
    [
        "0x5a18a655ED88eeE6cBb275Ec7e5D3F14c0B715b8",  # mixed case, a wrong checksum
        "0X5a18a655ed88eee6cbb275ec7e5d3f14c0b715b8",  # 0X
        b"\x11" * 20,  # bytes: eth_abi's to take or refuse
        True,
    ],
)
def test_what_the_fast_path_does_not_take_as_given_is_eth_abis_to_answer(bad: Any) -> None:
    """An address eth_abi refuses is refused (never encoded as it stands); a form eth_abi
    takes that encode_tuple does not is encoded by eth_abi."""
    from eth_abi.exceptions import EncodingError

    from relayer.chain import codec
    from relayer.domain.abi_words import encode_tuple

    balance_of = codec.function("UsdcEip3009", "balanceOf")
    assert balance_of.kinds is not None
    with pytest.raises(ValueError):
        encode_tuple(balance_of.kinds, (bad,))
    try:
        expected: bytes | type[Exception] = balance_of.selector + encode(["address"], [bad])
    except EncodingError:
        expected = EncodingError
    if expected is EncodingError:
        with pytest.raises(EncodingError):
            balance_of.encode(bad)
    else:
        assert balance_of.encode(bad) == expected
