"""Strict request parsing: unknown keys are errors reported as ``issues[].path``/``keys``
(spec: Resources, Errors `schema_validation`)."""

from __future__ import annotations

from typing import Any

import pytest

from relayer.api.errors import x402_body
from relayer.domain.errors import Rejection
from relayer.domain.schemas import ACTIONS, ActionRequest, AuthPayload, nest_query, parse_request, require

ADDR_LOWER = "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed"
ADDR = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"  # EIP-55 checksum of ADDR_LOWER
ADDR2_LOWER = "0xfb6916095ca1df60bb79ce92ce3ea74c37c5d359"
ADDR2 = "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359"
SALT = "0x" + "AB" * 32
R = "0x" + "11" * 32
S_ = "0x" + "22" * 32


def _auth(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "from": ADDR_LOWER,
        "to": ADDR2_LOWER,
        "value": "10360000",
        "validBefore": "1900000000",
        "nonce": "0x" + "0f" * 32,
        "signature": "0x" + "aa" * 64 + "1b",
    }
    body.update(extra)
    return body


def _reject(body: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(Rejection) as exc:
        parse_request(body)
    assert exc.value.code == "schema_validation"
    issues: list[dict[str, Any]] = x402_body(exc.value)["issues"]
    return issues


def _unknown(issues: list[dict[str, Any]]) -> dict[tuple[str | int, ...], list[str]]:
    return {tuple(i["path"]): i["keys"] for i in issues if i["keys"]}


def test_actions() -> None:
    assert ACTIONS == ("discover", "quote", "prepare/retire", "prepare-auth", "actions/retire", "certificate")


def test_minimal_and_full_valid_request() -> None:
    assert parse_request({}) == ActionRequest()
    req = parse_request(
        {
            "action": "actions/retire",
            "chainId": 84532,
            "inputToken": "USDC",
            "amount": "1.5",
            "carbonClass": "BCT",
            "from": ADDR_LOWER,
            "salt": SALT,
            "authPayload": _auth(),
            "details": {
                "beneficiaryAddress": ADDR2_LOWER,
                "beneficiaryIsPayer": False,
                "consumptionCountryCode": "DE",
            },
        }
    )
    assert req.action == "actions/retire"
    assert req.chainId == 84532
    assert req.amount == "1.5"
    assert req.details is not None
    assert req.details.beneficiaryIsPayer is False
    assert req.details.consumptionCountryCode == "DE"


def test_unknown_top_level_key() -> None:
    issues = _reject({"action": "quote", "bogus": 1})
    assert issues == [{"path": [], "keys": ["bogus"], "message": "unrecognized keys"}]


def test_unknown_key_inside_details() -> None:
    issues = _reject({"details": {"beneficiaryAddress": ADDR, "bogus": True}})
    assert [(i["path"], i["keys"]) for i in issues] == [(["details"], ["bogus"])]


def test_unknown_key_inside_auth_payload() -> None:
    issues = _reject({"authPayload": _auth(bogus="x")})
    assert [(i["path"], i["keys"]) for i in issues] == [(["authPayload"], ["bogus"])]


def test_several_unknown_keys_grouped_and_sorted() -> None:
    issues = _reject(
        {
            "zeta": 1,
            "alpha": 2,
            "mid": 3,
            "details": {"zz": 1, "aa": 2},
            "authPayload": _auth(q=1, b=2),
        }
    )
    assert _unknown(issues) == {
        (): ["alpha", "mid", "zeta"],
        ("details",): ["aa", "zz"],
        ("authPayload",): ["b", "q"],
    }
    assert len(issues) == 3  # one issue per object, nothing else wrong


def test_attribution_outside_details_is_unknown() -> None:
    # spec rule 4: attribution fields belong inside `details`
    issues = _reject({"beneficiaryAddress": ADDR})
    assert _unknown(issues) == {(): ["beneficiaryAddress"]}


def test_from_alias_accepted_and_from_underscore_rejected() -> None:
    assert parse_request({"from": ADDR_LOWER}).from_ == ADDR
    issues = _reject({"from_": ADDR_LOWER})
    assert issues == [{"path": [], "keys": ["from_"], "message": "unrecognized keys"}]
    auth_issues = _reject({"authPayload": {**_auth(), "from_": ADDR_LOWER}})
    assert _unknown(auth_issues) == {("authPayload",): ["from_"]}


def test_addresses_are_checksummed_everywhere() -> None:
    req = parse_request(
        {
            "from": ADDR_LOWER,
            "creditToken": ADDR2_LOWER.upper().replace("0X", "0x"),
            "authPayload": _auth(),
            "details": {"beneficiaryAddress": ADDR2_LOWER, "retiringAddress": ADDR_LOWER},
        }
    )
    assert req.from_ == ADDR
    assert req.creditToken == ADDR2
    assert req.authPayload is not None
    assert (req.authPayload.from_, req.authPayload.to) == (ADDR, ADDR2)
    assert req.details is not None
    assert (req.details.beneficiaryAddress, req.details.retiringAddress) == (ADDR2, ADDR)


def test_bytes32_fields_are_lowercased() -> None:
    req = parse_request({"salt": SALT, "txHash": SALT})
    assert req.salt == SALT.lower()
    assert req.txHash == SALT.lower()


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"from": "0x1234"}, ["from"]),
        ({"from": ADDR_LOWER + "0"}, ["from"]),
        ({"from": "5aaeb6053f3e94c9b9a09f33669435e7ef1beaed00"}, ["from"]),
        ({"from": "0x" + "g" * 40}, ["from"]),
        ({"from": ADDR_LOWER + "\n"}, ["from"]),
        ({"creditToken": "vitalik.eth"}, ["creditToken"]),
        ({"details": {"beneficiaryAddress": "0xzz"}}, ["details", "beneficiaryAddress"]),
        ({"authPayload": _auth(to="0x00")}, ["authPayload", "to"]),
        ({"salt": "0x12"}, ["salt"]),
        ({"salt": "0x" + "ab" * 31 + "zz"}, ["salt"]),
        ({"salt": "ab" * 32}, ["salt"]),
        ({"salt": 12}, ["salt"]),
        ({"txHash": "0x" + "ab" * 33}, ["txHash"]),
        ({"chainId": "base"}, ["chainId"]),
        ({"vintage": 1800}, ["vintage"]),
        ({"listingId": -1}, ["listingId"]),
        ({"details": {"consumptionCountryCode": "de"}}, ["details", "consumptionCountryCode"]),
        ({"details": {"consumptionPeriodStart": "2024-13-01"}}, ["details", "consumptionPeriodStart"]),
        ({"details": {"beneficiaryString": "x" * 201}}, ["details", "beneficiaryString"]),
        ({"authPayload": _auth(value="-1")}, ["authPayload", "value"]),
        ({"authPayload": _auth(value="01")}, ["authPayload", "value"]),
        ({"authPayload": _auth(signature="0x" + "aa" * 64)}, ["authPayload", "signature"]),
        ({"authPayload": _auth(v=29)}, ["authPayload", "v"]),
        ({"details": "Acme"}, ["details"]),
    ],
)
def test_bad_value_reported_at_its_path(body: dict[str, Any], path: list[str]) -> None:
    issues = _reject(body)
    assert [i["path"] for i in issues] == [path]
    assert issues[0]["keys"] == []
    assert issues[0]["message"]


def test_missing_auth_payload_fields_named() -> None:
    issues = _reject({"authPayload": {"signature": "0x" + "aa" * 65}})
    assert sorted(tuple(i["path"]) for i in issues) == [
        ("authPayload", "from"),
        ("authPayload", "nonce"),
        ("authPayload", "to"),
        ("authPayload", "validBefore"),
        ("authPayload", "value"),
    ]


def test_request_is_frozen() -> None:
    req = parse_request({"action": "quote"})
    with pytest.raises(ValueError):
        req.action = "discover"  # type: ignore[misc]


# ---------------------------------------------------------------- nest_query


def test_nest_query_builds_nested_details() -> None:
    nested = nest_query(
        {
            "action": "quote",
            "amount": "1",
            "details.beneficiaryAddress": ADDR_LOWER,
            "details.beneficiaryString": "Acme",
        }
    )
    assert nested == {
        "action": "quote",
        "amount": "1",
        "details": {"beneficiaryAddress": ADDR_LOWER, "beneficiaryString": "Acme"},
    }
    req = parse_request(nested)
    assert req.details is not None
    assert req.details.beneficiaryAddress == ADDR


def test_nest_query_query_strings_are_coerced_like_json() -> None:
    req = parse_request(
        nest_query({"chainId": "8453", "listingId": "4", "details.beneficiaryIsPayer": "true"})
    )
    assert (req.chainId, req.listingId) == (8453, 4)
    assert req.details is not None
    assert req.details.beneficiaryIsPayer is True


def test_nest_query_rejects_two_levels() -> None:
    with pytest.raises(Rejection) as exc:
        nest_query({"a.b.c": "1"})
    assert exc.value.code == "schema_validation"
    assert x402_body(exc.value)["issues"] == [{"path": ["a"], "keys": ["a.b.c"], "message": "bad key"}]


def test_nest_query_rejects_nesting_under_a_scalar() -> None:
    with pytest.raises(Rejection) as exc:
        nest_query({"details": "x", "details.beneficiaryAddress": ADDR})
    assert exc.value.code == "schema_validation"
    assert x402_body(exc.value)["issues"][0]["keys"] == ["details.beneficiaryAddress"]


def test_nest_query_unknown_nested_key_then_rejected_by_parse() -> None:
    issues = _reject(nest_query({"details.bogus": "1", "authPayload.x": "2"}))
    assert _unknown(issues) == {("details",): ["bogus"], ("authPayload",): ["x"]}


# ---------------------------------------------------------------- require


def test_require_names_every_missing_field() -> None:
    req = parse_request({"action": "quote", "amount": "1"})
    with pytest.raises(Rejection) as exc:
        require(req, "amount", "chainId", "from", "inputToken")
    body = x402_body(exc.value)
    assert body["error"] == "schema_validation"
    assert body["issues"] == [
        {"path": ["chainId"], "keys": [], "message": "required"},
        {"path": ["from"], "keys": [], "message": "required"},
        {"path": ["inputToken"], "keys": [], "message": "required"},
    ]
    assert "chainId, from, inputToken" in body["message"]
    assert "amount" not in body["message"]


def test_require_passes_when_present() -> None:
    req = parse_request({"action": "quote", "from": ADDR, "chainId": 8453})
    require(req, "action", "from", "chainId")
    require(req)


# ---------------------------------------------------------------- AuthPayload.signature_bytes


def test_signature_bytes_from_signature_field() -> None:
    sig = "0x" + "aa" * 32 + "bb" * 32 + "1c"
    auth = AuthPayload.model_validate(_auth(signature=sig))
    raw = auth.signature_bytes()
    assert raw == bytes.fromhex("aa" * 32 + "bb" * 32 + "1c")
    assert raw is not None
    assert len(raw) == 65


@pytest.mark.parametrize("v", [0, 1, 27, 28])
def test_signature_bytes_from_v_r_s(v: int) -> None:
    body = _auth(v=v, r=R, s=S_)
    del body["signature"]
    auth = AuthPayload.model_validate(body)
    assert auth.signature_bytes() == bytes.fromhex("11" * 32 + "22" * 32) + bytes([v])


def test_signature_bytes_r_s_case_insensitive() -> None:
    body = _auth(v=27, r="0x" + "AB" * 32, s="0x" + "Cd" * 32)
    del body["signature"]
    assert AuthPayload.model_validate(body).signature_bytes() == bytes.fromhex("ab" * 32 + "cd" * 32 + "1b")


def test_signature_bytes_none_when_absent_or_partial() -> None:
    body = _auth()
    del body["signature"]
    assert AuthPayload.model_validate(body).signature_bytes() is None
    assert AuthPayload.model_validate({**body, "v": 27, "r": R}).signature_bytes() is None


def test_auth_payload_defaults() -> None:
    auth = AuthPayload.model_validate(_auth())
    assert auth.validAfter == "0"
    assert auth.from_ == ADDR


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("7", 7),
        (7, 7),
        ("0x" + "0" * 63 + "7", 7),
        ("listing-84532-0x" + "0" * 63 + "7", 7),
    ],
)
def test_a_listing_id_in_any_of_its_forms(given: object, expected: int) -> None:
    assert parse_request({"listingId": given}).listingId == expected


@pytest.mark.parametrize("given", ["abc", "listing-1", "0x7", "pool-84532-0x" + "0" * 64])
def test_a_listing_id_of_another_shape_names_no_listing(given: str) -> None:
    with pytest.raises(Rejection) as caught:
        parse_request({"listingId": given})
    assert caught.value.code == "listing_not_found" and caught.value.context["listingId"] == given


@pytest.mark.parametrize("given", [-1, 1.5, True, "", "1" * 80, [1]])
def test_a_listing_id_of_the_wrong_type_is_a_schema_error(given: object) -> None:
    with pytest.raises(Rejection) as caught:
        parse_request({"listingId": given})
    assert caught.value.code == "schema_validation"


@pytest.mark.parametrize("field", ["chainId", "tokenId", "listingId", "index", "vintage"])
def test_a_boolean_is_not_a_number(field: str) -> None:
    with pytest.raises(Rejection) as caught:
        parse_request({field: True})
    assert caught.value.code == "schema_validation" and caught.value.context["issues"][0]["path"] == [field]
