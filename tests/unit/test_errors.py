"""The error registry against the spec's Errors table (the source of truth), the
marketplace API's codes in the same registry, each surface's error body (relayer.api.errors),
and the one root of every exception class of the package."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
from http import HTTPStatus
from pathlib import Path

import pytest

import relayer
from relayer.api.errors import BODIES, error_body, marketplace_body, status_of, x402_body
from relayer.domain.errors import REGISTRY, X402_FACILITATOR_VERSION, X402_REGISTRY, Rejection, RelayerError
from tests.helpers.spec import SPEC, SPEC_ERRORS, SpecRow, section, table_rows

ROOT = Path(__file__).resolve().parents[2]
# The specs are vendored in docs/spec/ so a clone alone can run the suite; when the shared
# folder sits beside the clone (as in CI), test_vendored_specs_match_shared checks the copy.
SHARED_SPEC_DIR = ROOT.parent / "shared" / "spec"
RELAYER = Path(__file__).resolve().parents[2] / "relayer"


def _spec_action_codes() -> dict[str, set[str]]:
    rows = table_rows(section(SPEC.read_text(encoding="utf-8"), "Errors"))
    out: dict[str, set[str]] = {}
    for cells in rows:
        if len(cells) == 2 and cells[0] != "Action":
            out[cells[0]] = {c for c in re.findall(r"[a-z][a-z0-9_]+", cells[1]) if "_" in c}
    return out


def test_spec_table_was_parsed() -> None:
    # Guards the parser: the spec's table has 33 rows at the time of writing, including
    # both ends of the table.
    assert len(SPEC_ERRORS) >= 30
    assert SPEC_ERRORS["invalid_json"] == SpecRow("invalid_json", 400, "request", False)
    assert SPEC_ERRORS["payment_unavailable"] == SpecRow("payment_unavailable", 503, "upstream", True)


@pytest.mark.parametrize("code", sorted(SPEC_ERRORS))
def test_spec_code_registered_with_same_status_group_retryable(code: str) -> None:
    want = SPEC_ERRORS[code]
    assert code in REGISTRY, f"{code} is in the spec but not in REGISTRY"
    got = REGISTRY[code]
    assert got.code == code
    assert (got.http_status, got.group, got.retryable) == (want.http_status, want.group, want.retryable)
    assert got.message.strip()


def test_registry_has_no_code_the_spec_lacks() -> None:
    """Beyond the spec's table only the declared extension of release 1.2.0 (the per-client
    rate limit, which the spec's table has no code for), the marketplace API's own codes and
    the x402 facilitator's own, marked as such (never published as x402 codes)."""
    assert set(X402_REGISTRY) - set(SPEC_ERRORS) == {"rate_limited", "method_not_allowed"}
    assert list(X402_REGISTRY) == [*SPEC_ERRORS, "rate_limited", "method_not_allowed"]
    marketplace_only = set(REGISTRY) - set(X402_REGISTRY)
    assert marketplace_only and not marketplace_only & set(SPEC_ERRORS)
    assert {REGISTRY[c].surface for c in marketplace_only} == {"marketplace", "facilitator"}
    assert {c for c in marketplace_only if REGISTRY[c].surface == "facilitator"} >= {
        "payment_identifier_conflict"
    }
    assert {s.surface for s in X402_REGISTRY.values()} == {"x402"}


def test_per_action_codes_are_all_registered() -> None:
    per_action = _spec_action_codes()
    assert {"quote", "prepare-auth", "actions/retire", "certificate"} <= set(per_action)
    assert "params_mismatch" in per_action["actions/retire"]
    mentioned = set().union(*per_action.values())
    assert mentioned - set(REGISTRY) == set()


def test_every_code_raised_in_relayer_is_registered() -> None:
    raised: set[str] = set()
    for path in RELAYER.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        raised |= set(re.findall(r"(?:Rejection|bad_request)\(\s*\"([a-z_]+)\"", text))
        raised |= {f"{what}_not_found" for what in re.findall(r"not_found\(\"([a-z_]+)\"", text)}
    assert {"schema_validation", "invalid_quantity", "order_not_found"} <= raised  # the scan found them
    assert raised - set(REGISTRY) == set()


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        REGISTRY["new_code"] = REGISTRY["not_found"]  # type: ignore[index]


def test_rejection_body_envelope_and_context() -> None:
    rej = Rejection("insufficient_authorized_value", requiredMinimum="1050000")
    body = x402_body(rej)
    assert body == {
        "error": "insufficient_authorized_value",
        "message": REGISTRY["insufficient_authorized_value"].message,
        "x402FacilitatorVersion": 2,
        "requiredMinimum": "1050000",
    }
    assert X402_FACILITATOR_VERSION == 2
    assert isinstance(body["x402FacilitatorVersion"], int)
    assert json.loads(json.dumps(body)) == body
    assert rej.code == "insufficient_authorized_value"
    assert rej.spec is REGISTRY["insufficient_authorized_value"]


def test_rejection_custom_message_overrides_default() -> None:
    rej = Rejection("vintage_not_found", "no 1999 credit", availableVintages=[2019, 2020])
    assert x402_body(rej)["message"] == "no 1999 credit"
    assert x402_body(rej)["availableVintages"] == [2019, 2020]
    assert "vintage_not_found" in str(rej)
    assert rej.spec.http_status == 400


def test_rejection_without_context_has_exactly_three_keys() -> None:
    assert set(x402_body(Rejection("not_found"))) == {"error", "message", "x402FacilitatorVersion"}


def test_unknown_code_raises_key_error() -> None:
    with pytest.raises(KeyError):
        Rejection("no_such_code")
    with pytest.raises(KeyError):
        Rejection("Not_Found")


@pytest.mark.skipif(
    not SHARED_SPEC_DIR.is_dir(),
    reason="the specs' source (../shared/spec) is not beside this clone: docs/spec/ has nothing "
    "to be compared with (expected outside the team's workspace)",
)
def test_vendored_specs_match_shared() -> None:
    for shared in sorted(SHARED_SPEC_DIR.glob("*.md")):
        vendored = ROOT / "docs" / "spec" / shared.name
        assert vendored.read_text() == shared.read_text(), f"docs/spec/{shared.name} is stale: copy it again"


def _classes_of(owner: object, module: str) -> list[type]:
    """The classes defined in ``module`` among ``owner``'s members, nested ones too."""
    found: list[type] = []
    for _, cls in inspect.getmembers(owner, inspect.isclass):
        if cls.__module__ == module and cls is not owner:
            found += [cls, *_classes_of(cls, module)]
    return found


def _exception_classes() -> set[type[BaseException]]:
    """Every exception class defined in any module of the ``relayer`` package."""
    found: set[type[BaseException]] = set()
    for info in pkgutil.walk_packages(relayer.__path__, "relayer."):
        module = importlib.import_module(info.name)
        found |= {c for c in _classes_of(module, module.__name__) if issubclass(c, BaseException)}
    return found


def test_every_exception_class_of_the_package_descends_from_the_root() -> None:
    """Walks every module of the package (no hand-picked list): an exception class defined
    anywhere in relayer/ is a RelayerError, with a registered code and a transient flag."""
    classes = _exception_classes()
    names = {c.__name__ for c in classes}
    assert {"QuoteSpent", "RecordError", "ChainRevert", "StoreUnavailable", "BatchRefused"} <= names
    strays = sorted(f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, RelayerError))
    assert strays == []
    for cls in classes:
        assert cls.default_code in REGISTRY, cls  # type: ignore[attr-defined]


def test_every_error_shares_one_root_with_a_code_and_transient_flag() -> None:
    from relayer.chain.errors import ChainRevert, ChainUnavailable
    from relayer.domain.errors import Unavailable
    from relayer.domain.projects import RecordError
    from relayer.store.orders import QuoteSpent
    from relayer.store.pool import StoreUnavailable
    from relayer.store.relay_jobs import PermitInUse

    for err in (
        Rejection("listing_expired"),
        ChainUnavailable(),
        StoreUnavailable(),
        ChainRevert(None),
        PermitInUse(),
        QuoteSpent(),
        RecordError("VCS-1", "name", "missing field"),
        RelayerError(),
    ):
        assert isinstance(err, RelayerError)
        assert err.code in REGISTRY and isinstance(err.transient, bool)
    assert RelayerError().code == "internal_error"
    for outage in (ChainUnavailable(), StoreUnavailable()):
        assert isinstance(outage, Unavailable)
        assert (outage.code, outage.transient, outage.spec.http_status) == (
            "gas_estimate_unavailable",
            True,
            503,
        )
    assert ChainUnavailable().context == {"upstream": "chain node"}
    assert StoreUnavailable().context == {"upstream": "database"}
    assert Rejection("listing_expired").transient is False
    assert Rejection("insufficient_liquidity").transient is True
    assert QuoteSpent().code == "quote_consumed" and QuoteSpent().spec.http_status == 409
    record_error = RecordError("VCS-1", "name", "missing field")
    assert isinstance(record_error, ValueError) and str(record_error) == "VCS-1: name: missing field"


def test_an_error_record_has_no_http_and_round_trips() -> None:
    from relayer.domain.errors import RelayerError

    rej = Rejection("insufficient_authorized_value", "gas moved", requiredMinimum="12")
    record = rej.record()
    assert record == {
        "code": "insufficient_authorized_value",
        "message": "gas moved",
        "context": {"requiredMinimum": "12"},
    }
    assert "status" not in json.dumps(record)
    back = RelayerError.from_record(json.loads(json.dumps(record)))
    assert x402_body(back) == x402_body(rej)
    assert RelayerError.from_record({"code": "no_such_code"}).code == "internal_error"


# ---------------------------------------------------------------- each surface's body


@pytest.mark.parametrize("code", sorted(REGISTRY))
def test_every_code_answers_the_registry_status_in_each_surface_body(code: str) -> None:
    err = Rejection(code, "why", leftToSell="5", error="ignored", statusCode=1)
    assert set(BODIES) == {"x402", "marketplace", "facilitator"}
    assert status_of(err) == REGISTRY[code].http_status
    market = marketplace_body(err)
    assert list(market)[:4] == ["statusCode", "error", "message", "code"]
    assert market["statusCode"] == REGISTRY[code].http_status
    assert (market["code"], market["message"], market["leftToSell"]) == (code, "why", "5")
    assert market["error"] == HTTPStatus(REGISTRY[code].http_status).phrase
    x402 = x402_body(err)
    assert (x402["error"], x402["message"], x402["x402FacilitatorVersion"]) == (code, "why", 2)
    assert error_body(err, "marketplace") == market and error_body(err, "x402") == x402


@pytest.mark.parametrize(
    ("code", "status"),
    [
        # the codes that answered 409 or 400 on the marketplace before one registry
        ("listing_expired", 422),
        ("insufficient_listing_supply", 422),
        ("below_min_fill", 422),
        ("amount_not_whole_tonnes", 422),
        ("listing_not_found", 404),
        ("retirement_not_found", 404),
    ],
)
def test_a_shared_code_answers_the_spec_status_on_the_marketplace(code: str, status: int) -> None:
    from relayer.domain.marketplace import bad_request

    assert SPEC_ERRORS[code].http_status == status
    assert marketplace_body(bad_request(code, "refused"))["statusCode"] == status


def test_marketplace_refusals_keep_their_statuses() -> None:
    from relayer.domain.marketplace import REMOVED_PRODUCTS, bad_request, not_found

    assert marketplace_body(not_found("order", "x")) == {
        "statusCode": 404,
        "error": "Not Found",
        "message": "no order 'x'",
        "code": "order_not_found",
        "order": "x",
    }
    assert status_of(REMOVED_PRODUCTS.error()) == 410
    assert status_of(bad_request("invalid_quantity", "q")) == 400
    for code, status in {
        "unauthorized": 401,
        "listing_cancelled": 409,
        "listing_sold_out": 409,
        "quote_consumed": 409,
        "quote_expired": 409,
        "quote_outdated": 409,
        "orders_unavailable": 503,
        "timeout": 503,
        "endpoint_replaced": 410,
    }.items():
        assert (REGISTRY[code].http_status, REGISTRY[code].surface) == (status, "marketplace")
