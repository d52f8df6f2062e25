"""The pure verifier: every refusal with its spec code, the crafted inputs that once reached
500, and random mutations of signed requests, which must all end in a refusal, never in an
exception. Signed with eth_account as a wallet would; no chain, no database."""

from __future__ import annotations

import copy
import random
from dataclasses import replace
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data

from relayer.api.errors import x402_body
from relayer.domain.eip712 import SECP256K1_N
from relayer.domain.errors import Rejection
from relayer.domain.retirement import (
    SOURCE_CARBON_CLASS,
    Retirement,
    RetirementDetails,
    bind_nonce,
    permit_deadline,
)
from relayer.domain.schemas import parse_request
from relayer.domain.verify import (
    AUTH_EXPIRY_MARGIN_S,
    BIGINT_MAX,
    Terms,
    VerifiedAuthorization,
    check_shape,
    permit_key,
    request_hash,
    typed_data,
    verify_authorization,
)
from tests.helpers.relay import mutate_request

NOW = 1_800_000_000
PAYER_KEY = "0x" + "4c" * 32
OTHER_KEY = "0x" + "5d" * 32
PAYER = Account.from_key(PAYER_KEY).address
USDC = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
KVCM = "0x6B175474E89094C44Da98b954EedeAC495271d0F"
SETTLEMENT = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
CREDITS = "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359"
SALT = bytes(range(32))
TOTAL = 24_500_000
ALLOWANCE = 18_000
PERMIT_NONCE = 7


def _terms(scheme: str = "eip3009") -> Terms:
    token = USDC if scheme == "eip3009" else KVCM
    details = RetirementDetails(retiring_address=PAYER, beneficiary_address=PAYER, beneficiary_string="B")
    retirement = Retirement(SOURCE_CARBON_CLASS, 1, CREDITS, 3, 1_000, token, ALLOWANCE, details)
    return Terms(84532, SETTLEMENT, scheme, token, retirement, TOTAL, {"amount": "1"})  # type: ignore[arg-type]


def _body(
    scheme: str = "eip3009", *, value: int = TOTAL + ALLOWANCE, key: str = PAYER_KEY, **over: Any
) -> dict[str, Any]:
    """A signed actions/retire body for ``_terms(scheme)``, as prepare-auth + a wallet make it."""
    terms = _terms(scheme)
    bound = bind_nonce(terms.retirement, SALT)
    valid_before = over.pop("valid_before", NOW + 3600)
    if scheme == "eip3009":
        nonce: str = "0x" + bound.hex()
        signed_before = valid_before
        typed = typed_data(terms, PAYER, value, 0, signed_before, bound)
    else:
        nonce = str(PERMIT_NONCE)
        signed_before = permit_deadline(bound, valid_before)
        typed = typed_data(terms, PAYER, value, 0, signed_before, PERMIT_NONCE)
    sig = Account.sign_message(encode_typed_data(full_message=typed), key).signature
    body: dict[str, Any] = {
        "action": "actions/retire",
        "chainId": 84532,
        "inputToken": "USDC" if scheme == "eip3009" else "kVCM",
        "amount": "1",
        "carbonClass": "NBO",
        "from": PAYER,
        "salt": "0x" + SALT.hex(),
        "gasAllowance": str(ALLOWANCE),
        "details": {"beneficiaryIsPayer": True, "beneficiaryString": "B"},
        "authPayload": {
            "from": PAYER,
            "to": SETTLEMENT,
            "value": str(value),
            "validAfter": "0",
            "validBefore": str(signed_before),
            "nonce": nonce,
            "signature": "0x" + bytes(sig).hex(),
        },
    }
    body.update(over)
    return body


def _verify(
    body: dict[str, Any], scheme: str = "eip3009", now: int = NOW
) -> VerifiedAuthorization | Rejection:
    return verify_authorization(parse_request(body), _terms(scheme), now)


def _refusal(body: dict[str, Any], code: str, scheme: str = "eip3009", now: int = NOW) -> Rejection:
    result = _verify(body, scheme, now)
    assert isinstance(result, Rejection), result
    assert result.code == code, x402_body(result)
    assert 400 <= result.spec.http_status < 500
    return result


def _with_signature(body: dict[str, Any], raw: bytes) -> dict[str, Any]:
    out = copy.deepcopy(body)
    out["authPayload"]["signature"] = "0x" + raw.hex()
    return out


# ------------------------------------------------------------------ accepted


@pytest.mark.parametrize("scheme", ["eip3009", "eip2612"])
def test_a_wallet_signed_request_verifies(scheme: str) -> None:
    body = _body(scheme)
    result = _verify(body, scheme)
    assert isinstance(result, VerifiedAuthorization), result
    bound = bind_nonce(_terms(scheme).retirement, SALT)
    assert result.payer == PAYER and result.scheme == scheme
    assert result.value == TOTAL + ALLOWANCE and result.gas_allowance == ALLOWANCE
    assert result.bound_nonce == bound and result.salt == SALT
    assert result.expires_at == NOW + 3600
    assert result.request_hash == request_hash(parse_request(body))
    assert result.signature.v in (27, 28)
    if scheme == "eip3009":
        assert (result.permit_nonce, result.permit_key) == (None, None)
        assert result.valid_before == NOW + 3600
    else:
        assert result.permit_nonce == PERMIT_NONCE
        assert result.permit_key == permit_key(KVCM, PAYER, PERMIT_NONCE)
        assert result.valid_before == permit_deadline(bound, NOW + 3600)


def test_value_above_the_minimum_is_accepted() -> None:
    assert isinstance(_verify(_body(value=TOTAL + ALLOWANCE + 10**6)), VerifiedAuthorization)


@pytest.mark.parametrize("v_offset", [0, -27], ids=["v=27/28", "v=0/1"])
def test_v_as_27_28_or_0_1_and_as_v_r_s_fields(v_offset: int) -> None:
    body = _body()
    raw = bytes.fromhex(body["authPayload"]["signature"][2:])
    split = copy.deepcopy(body)
    del split["authPayload"]["signature"]
    split["authPayload"].update(v=raw[64] + v_offset, r="0x" + raw[:32].hex(), s="0x" + raw[32:64].hex())
    assert isinstance(_verify(split), VerifiedAuthorization)
    assert isinstance(
        _verify(_with_signature(body, raw[:64] + bytes([raw[64] + v_offset]))), VerifiedAuthorization
    )


def test_valid_before_at_uint256_max_is_accepted_and_capped_for_storage() -> None:
    result = _verify(_body(valid_before=2**256 - 1))
    assert isinstance(result, VerifiedAuthorization), result
    assert result.valid_before == 2**256 - 1
    assert result.expires_at == BIGINT_MAX


def test_permit_expiry_at_the_64_bit_maximum_is_capped() -> None:
    result = _verify(_body("eip2612", valid_before=2**64 - 1), "eip2612")
    assert isinstance(result, VerifiedAuthorization), result
    assert result.expires_at == BIGINT_MAX


# ------------------------------------------------------------------ refusals, cheapest first


def test_missing_auth_payload() -> None:
    body = _body()
    del body["authPayload"]
    _refusal(body, "invalid_auth_payload")


def test_missing_from_is_schema_validation() -> None:
    body = _body()
    del body["from"]
    assert _refusal(body, "schema_validation").context["issues"][0]["path"] == ["from"]


def test_auth_from_differs_from_request_from() -> None:
    _refusal(_body(**{"from": Account.from_key(OTHER_KEY).address}), "invalid_auth_payload")


def test_auth_to_is_not_the_settlement() -> None:
    body = _body()
    body["authPayload"]["to"] = CREDITS
    assert _refusal(body, "invalid_auth_payload").context["expectedTo"] == SETTLEMENT


@pytest.mark.parametrize("field", ["salt", "gasAllowance"])
def test_missing_salt_or_gas_allowance(field: str) -> None:
    body = _body()
    del body[field]
    _refusal(body, "invalid_auth_payload")


def test_usdc_with_a_decimal_nonce_and_kvcm_with_a_bytes32_nonce() -> None:
    usdc = _body()
    usdc["authPayload"]["nonce"] = "7"
    _refusal(usdc, "invalid_auth_payload")
    kvcm = _body("eip2612")
    kvcm["authPayload"]["nonce"] = "0x" + "07" * 32
    _refusal(kvcm, "invalid_auth_payload", "eip2612")


def test_no_signature_or_a_partial_v_r_s() -> None:
    body = _body()
    del body["authPayload"]["signature"]
    _refusal(body, "invalid_auth_payload")
    body["authPayload"].update(v=27, r="0x" + "11" * 32)
    _refusal(body, "invalid_auth_payload")


N = SECP256K1_N


@pytest.mark.parametrize(
    "raw",
    [
        bytes(65),
        bytes(32) + (1).to_bytes(32, "big") + bytes([27]),
        (1).to_bytes(32, "big") + bytes(32) + bytes([27]),
        (1).to_bytes(32, "big") + N.to_bytes(32, "big") + bytes([27]),
        N.to_bytes(32, "big") + (1).to_bytes(32, "big") + bytes([27]),
        (1).to_bytes(32, "big") + (N // 2 + 1).to_bytes(32, "big") + bytes([27]),
        (5).to_bytes(32, "big") + (1).to_bytes(32, "big") + bytes([27]),
    ],
    ids=["all-zero", "r=0", "s=0", "s=n", "r=n", "high-s", "r-not-on-curve"],
)
def test_non_canonical_or_unrecoverable_signatures(raw: bytes) -> None:
    _refusal(_with_signature(_body(), raw), "invalid_auth_payload")


@pytest.mark.parametrize("v", [2, 26, 29, 35, 36, 37, 100, 255])
def test_v_outside_27_28_or_0_1(v: int) -> None:
    raw = bytes.fromhex(_body()["authPayload"]["signature"][2:])
    _refusal(_with_signature(_body(), raw[:64] + bytes([v])), "invalid_auth_payload")


def test_the_high_s_twin_of_a_valid_signature() -> None:
    body = _body()
    raw = bytes.fromhex(body["authPayload"]["signature"][2:])
    s = int.from_bytes(raw[32:64], "big")
    twin = raw[:32] + (N - s).to_bytes(32, "big") + bytes([55 - raw[64]])
    assert "high-s" in _refusal(_with_signature(body, twin), "invalid_auth_payload").message


@pytest.mark.parametrize("scheme", ["eip3009", "eip2612"])
def test_expired_or_about_to_expire(scheme: str) -> None:
    _refusal(_body(scheme, valid_before=NOW - 1), "invalid_auth_payload", scheme)
    _refusal(_body(scheme, valid_before=NOW + AUTH_EXPIRY_MARGIN_S), "invalid_auth_payload", scheme)
    assert isinstance(
        _verify(_body(scheme, valid_before=NOW + AUTH_EXPIRY_MARGIN_S + 1), scheme), VerifiedAuthorization
    )


def test_a_usdc_authorization_not_valid_yet_is_left_to_the_simulation() -> None:
    """It becomes valid later: the simulation reverts it as a retryable contract_revert
    rather than the verifier refusing it for good (and the clocks of two hosts may differ)."""
    terms = _terms()
    bound = bind_nonce(terms.retirement, SALT)
    typed = typed_data(terms, PAYER, TOTAL + ALLOWANCE, NOW + 60, NOW + 3600, bound)
    body = _body()
    body["authPayload"]["validAfter"] = str(NOW + 60)
    body["authPayload"]["signature"] = (
        "0x" + bytes(Account.sign_message(encode_typed_data(full_message=typed), PAYER_KEY).signature).hex()
    )
    result = _verify(body)
    assert isinstance(result, VerifiedAuthorization) and result.valid_after == NOW + 60, result


@pytest.mark.parametrize(
    ("scheme", "nonce"),
    [
        ("eip3009", "²"),
        ("eip3009", "0x" + "ab" * 31),
        ("eip3009", "0x" + "ab" * 31 + "zz"),
        ("eip2612", "²"),
        ("eip2612", "٣"),  # an Arabic-Indic digit: isdigit() is True, int() accepts it
        ("eip2612", "07"),
        ("eip2612", str(2**256)),
        ("eip2612", "-1"),
    ],
)
def test_a_malformed_nonce_is_invalid_auth_payload(scheme: str, nonce: str) -> None:
    body = _body(scheme)
    body["authPayload"]["nonce"] = nonce
    _refusal(body, "invalid_auth_payload", scheme)


def test_an_upper_case_bytes32_nonce_verifies() -> None:
    body = _body()
    body["authPayload"]["nonce"] = "0x" + body["authPayload"]["nonce"][2:].upper()
    assert isinstance(_verify(body), VerifiedAuthorization)


def test_a_foreign_signature_is_refused_as_such_whatever_the_value() -> None:
    """The signer is checked before the value: a forged request is never told to re-sign for more."""
    _refusal(_body(value=1, key=OTHER_KEY), "invalid_auth_payload")
    assert _refusal(_body(value=1), "insufficient_authorized_value").context["authorized"] == "1"


def test_the_shape_check_needs_no_terms() -> None:
    body = _body()
    shaped = check_shape(parse_request(body), SETTLEMENT, "eip3009")
    assert not isinstance(shaped, Rejection) and shaped.payer == PAYER and shaped.salt == SALT
    body["authPayload"]["to"] = CREDITS
    refused = check_shape(parse_request(body), SETTLEMENT, "eip3009")
    assert isinstance(refused, Rejection) and refused.code == "invalid_auth_payload"
    assert isinstance(check_shape(parse_request(_body()), SETTLEMENT, "eip2612"), Rejection)


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.update(amount="2"),
        lambda b: b.update(gasAllowance=str(ALLOWANCE + 1)),
        lambda b: b.update(salt="0x" + "ee" * 32),
    ],
    ids=["amount", "gas-allowance", "salt"],
)
def test_changed_retirement_or_salt_is_params_mismatch(change: Any) -> None:
    """The terms follow the request (amount, allowance), so the bound nonce moves with them."""
    body = _body()
    change(body)
    req = parse_request(body)
    terms = _terms()
    if req.amount == "2":
        terms = replace(terms, retirement=replace(terms.retirement, amount=2_000))
    result = verify_authorization(req, terms, NOW)
    assert isinstance(result, Rejection) and result.code == "params_mismatch", result
    assert result.context["receivedNonce"] == body["authPayload"]["nonce"]
    assert result.context["expectedNonce"] != result.context["receivedNonce"]
    assert result.context["submitted"] == {"amount": "1"}


def test_changed_beneficiary_is_params_mismatch_for_both_schemes() -> None:
    for scheme in ("eip3009", "eip2612"):
        terms = _terms(scheme)
        other = replace(terms.retirement.details, beneficiary_address=CREDITS)
        moved = replace(terms, retirement=replace(terms.retirement, details=other))
        result = verify_authorization(parse_request(_body(scheme)), moved, NOW)
        assert isinstance(result, Rejection) and result.code == "params_mismatch", result


def test_kvcm_deadline_that_does_not_carry_the_bound_nonce() -> None:
    body = _body("eip2612")
    body["authPayload"]["validBefore"] = str(NOW + 3600)  # the plain expiry, no bound high bits
    result = _refusal(body, "params_mismatch", "eip2612")
    assert result.context["receivedNonce"] == "0x" + "0" * 48


def test_value_below_total_plus_allowance() -> None:
    result = _refusal(_body(value=TOTAL + ALLOWANCE - 1), "insufficient_authorized_value")
    assert result.context["requiredMinimum"] == str(TOTAL + ALLOWANCE)
    assert result.context["authorized"] == str(TOTAL + ALLOWANCE - 1)


@pytest.mark.parametrize("scheme", ["eip3009", "eip2612"])
def test_signature_from_another_key(scheme: str) -> None:
    _refusal(_body(scheme, key=OTHER_KEY), "invalid_auth_payload", scheme)


def test_value_raised_after_signing_does_not_recover_the_payer() -> None:
    body = _body()
    body["authPayload"]["value"] = str(TOTAL + ALLOWANCE + 1)
    _refusal(body, "invalid_auth_payload")


# ------------------------------------------------------------------ crafted inputs (schema)


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda b: b.update(listingId=2**256), ["listingId"]),
        (lambda b: b.update(tokenId=2**256), ["tokenId"]),
        (lambda b: b.update(chainId=2**256), ["chainId"]),
        (lambda b: b.update(index=2**40), ["index"]),
        (lambda b: b["authPayload"].update(nonce="1" * 81), ["authPayload", "nonce"]),
        (lambda b: b["authPayload"].update(validBefore=str(2**256)), ["authPayload", "validBefore"]),
        (
            lambda b: b["authPayload"].update(v=36, r="0x" + "11" * 32, s="0x" + "22" * 32),
            ["authPayload", "v"],
        ),
        (
            lambda b: b["authPayload"].update(v=True, r="0x" + "11" * 32, s="0x" + "22" * 32),
            ["authPayload", "v"],
        ),
        (lambda b: b["details"].update(beneficiaryString="a\x00b"), ["details", "beneficiaryString"]),
        (lambda b: b["details"].update(retirementMessage="\ud800"), ["details", "retirementMessage"]),
        (lambda b: b.update(carbonClass="NBO\x00"), ["carbonClass"]),
        (lambda b: b.update(inputToken=USDC[:-1] + USDC[-1].swapcase()), ["inputToken"]),
        (lambda b: b.update({"from": PAYER.lower().replace("0x", "0X")}), ["from"]),
    ],
    ids=[
        "listingId",
        "tokenId",
        "chainId",
        "index",
        "nonce-too-long",
        "validBefore-2^256",
        "v=36",
        "v=true",
        "nul-in-details",
        "lone-surrogate",
        "nul-in-carbonClass",
        "inputToken-bad-checksum",
        "0X-prefix",
    ],
)
def test_out_of_range_or_malformed_fields_are_schema_validation(change: Any, path: list[str]) -> None:
    body = _body()
    change(body)
    with pytest.raises(Rejection) as exc:
        parse_request(body)
    assert exc.value.code == "schema_validation"
    assert exc.value.context["issues"][0]["path"][: len(path)] == path


BAD_CHECKSUM = PAYER[:-1] + (PAYER[-1].lower() if PAYER[-1].isupper() else PAYER[-1].upper())


@pytest.mark.parametrize(
    ("where", "address"),
    [
        ("from", BAD_CHECKSUM),
        ("from", "0x" + "0" * 40),
        ("authPayload.from", "0x" + "0" * 40),
        ("authPayload.to", "0x" + "0" * 40),
        ("details.beneficiaryAddress", "0x" + "0" * 40),
        ("details.beneficiaryAddress", BAD_CHECKSUM),
    ],
)
def test_bad_checksum_or_zero_address_is_refused(where: str, address: str) -> None:
    assert BAD_CHECKSUM != PAYER and BAD_CHECKSUM.lower() == PAYER.lower()
    body = _body()
    head, _, tail = where.partition(".")
    (body[head] if tail else body)[tail or head] = address
    with pytest.raises(Rejection) as exc:
        parse_request(body)
    assert exc.value.code == "schema_validation"


def test_lowercase_address_has_no_checksum_and_is_accepted() -> None:
    body = _body(**{"from": PAYER.lower()})
    body["authPayload"]["from"] = PAYER.lower()
    result = _verify(body)
    assert isinstance(result, VerifiedAuthorization), result
    assert result.payer == PAYER  # normalised to the checksummed form


# ------------------------------------------------------------------ the request hash


def test_request_hash_is_stable_and_covers_every_field() -> None:
    body = _body()
    assert request_hash(parse_request(body)) == request_hash(parse_request(copy.deepcopy(body)))
    reordered = dict(reversed(list(body.items())))
    assert request_hash(parse_request(reordered)) == request_hash(parse_request(body))
    for change in (
        lambda b: b["details"].update(retirementMessage="x"),
        lambda b: b["authPayload"].update(validAfter="1"),
        lambda b: b.update(amount="1.0"),
    ):
        other = copy.deepcopy(body)
        change(other)
        assert request_hash(parse_request(other)) != request_hash(parse_request(body))


def test_permit_key_names_token_owner_and_nonce() -> None:
    keys = {
        permit_key(KVCM, PAYER, 1),
        permit_key(KVCM, PAYER, 2),
        permit_key(USDC, PAYER, 1),
        permit_key(KVCM, SETTLEMENT, 1),
    }
    assert len(keys) == 4 and all(len(k) == 32 for k in keys)


# ------------------------------------------------------------------ random mutations


@pytest.mark.parametrize("scheme", ["eip3009", "eip2612"])
def test_random_mutations_end_in_a_refusal_never_an_exception(scheme: str) -> None:
    rng = random.Random(5)
    body = _body(scheme)
    outcomes: dict[str, int] = {}
    for _ in range(1_500):
        mutated = mutate_request(rng, body)
        try:
            request = parse_request(mutated)
        except Rejection as rej:
            outcomes[rej.code] = outcomes.get(rej.code, 0) + 1
            continue
        result = verify_authorization(request, _terms(scheme), NOW)
        code = result.code if isinstance(result, Rejection) else "verified"
        if isinstance(result, Rejection):
            assert 400 <= result.spec.http_status < 500, x402_body(result)
        outcomes[code] = outcomes.get(code, 0) + 1
    # The mutations reach every stage: schema, shape, binding, value and recovery.
    assert {"schema_validation", "invalid_auth_payload", "params_mismatch"} <= set(outcomes), outcomes
    assert set(outcomes) <= {
        "schema_validation",
        "invalid_auth_payload",
        "params_mismatch",
        "insufficient_authorized_value",
        "verified",
    }, outcomes
