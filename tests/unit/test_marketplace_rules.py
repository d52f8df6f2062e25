"""The marketplace API's pure rules: ids, strict requests, removed endpoints, the listing fold
and the provenance walk (relayer/domain/marketplace.py)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from relayer.api.errors import marketplace_body, status_of
from relayer.domain.errors import Rejection
from relayer.domain.marketplace import (
    MAX_LIMIT,
    REMOVED_PRICE_PARAMETERS,
    REMOVED_PRODUCTS,
    REPLACED_RETIREMENT,
    ZERO_ADDRESS,
    CarbonProjectsQuery,
    ListingEvent,
    OrderRequest,
    QuoteRequest,
    RetirementId,
    SourceId,
    Transfer,
    fold_listing,
    parse_retirement_id,
    parse_source_id,
    provenance,
    quantity_units,
    removed_parameters,
    validated,
)

TX = bytes.fromhex("ab" * 32)
SELLER = "0x" + "11" * 20
POOL = "0x" + "22" * 20
SETTLEMENT = "0x" + "33" * 20
MINTER = "0x" + "44" * 20


def test_retirement_id_round_trips_and_normalises_case() -> None:
    rid = parse_retirement_id(f"137-0x{'AB' * 32}-3")
    assert rid == RetirementId(137, TX, 3)
    assert str(rid) == f"137-0x{'ab' * 32}-3"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "84532",
        f"84532-0x{'ab' * 31}-0",  # short hash
        f"84532-{'ab' * 32}-0",  # no 0x
        f"0-0x{'ab' * 32}-0",  # chain 0
        f"84532-0x{'ab' * 32}-01",  # leading zero
        f"84532-0x{'ab' * 32}--1",
        f"84532-0x{'ab' * 32}-0-",
        f"0x{'ab' * 20}-0",  # the replaced beneficiary form
        f"84532-0x{'zz' * 32}-0",
        f"84532-0x{'ab' * 32}-9999999999",  # index beyond INTEGER
    ],
)
def test_malformed_retirement_ids_are_400(text: str) -> None:
    with pytest.raises(Rejection) as caught:
        parse_retirement_id(text)
    assert status_of(caught.value) == 400 and caught.value.code == "invalid_retirement_id"
    body = marketplace_body(caught.value)
    assert set(body) >= {"statusCode", "error", "message", "code"} and body["error"] == "Bad Request"


def test_source_id_is_a_listing_only() -> None:
    sid = SourceId(84532, 7)
    assert str(sid) == "listing-84532-0x" + "0" * 63 + "7"
    assert parse_source_id(str(sid)) == sid
    for bad in ("pool-84532-0x" + "0" * 64, "product-1", "listing-84532-7", "listing-84532-0x" + "0" * 63):
        with pytest.raises(Rejection) as caught:
            parse_source_id(bad)
        assert status_of(caught.value) == 400 and caught.value.code == "not_a_listing"


def test_quantity_is_exact_tonnes_to_units() -> None:
    assert quantity_units("1") == 1000
    assert quantity_units("0.001") == 1
    assert quantity_units(Decimal("2.5")) == 2500
    assert quantity_units(3) == 3000
    for bad in ("0", "0.0001", "-1", "1e3", "abc", Decimal("NaN"), 10**13):
        with pytest.raises(Rejection):
            quantity_units(bad)


@pytest.mark.parametrize(
    ("value", "units"),
    [
        ("999999999999.999", 999_999_999_999_999),  # the largest quantity
        ("1.500", 1500),
        ("1.000000000000000000", 1000),  # zeros past the third decimal
        (Decimal("1000.0"), 1_000_000),
        (Decimal("1E-3"), 1),  # str() writes it 0.001: a plain decimal
        (999_999_999_999, 999_999_999_999_000),
    ],
)
def test_quantity_edges_accepted(value: str | Decimal | int, units: int) -> None:
    assert quantity_units(value) == units


@pytest.mark.parametrize(
    "bad",
    [
        "1e999999",  # answered 500 (decimal.Overflow) before issue 18
        Decimal("1e999999"),
        "\u0661",  # ARABIC-INDIC DIGIT ONE: Decimal took it
        "\uff11",  # FULLWIDTH DIGIT ONE
        "1e3",
        Decimal("1E+3"),  # an exponent str() keeps
        "01",
        ".5",
        "1.",
        "1\n",
        "1,5",
        "1_000",
        "-1",
        -1,
        0,
        Decimal("-0"),
        Decimal("Infinity"),
        Decimal("sNaN"),
        "1000000000000",  # 10**12 t: one past the range
        10**12,
        "1.0005",  # a fraction of a kg
        "0.0009",
        "1.0000000000000000001",  # 19 decimals
        "9" * 5000,
    ],
)
def test_bad_quantities_are_invalid_quantity(bad: str | Decimal | int) -> None:
    with pytest.raises(Rejection) as caught:
        quantity_units(bad)
    assert (status_of(caught.value), caught.value.code) == (400, "invalid_quantity")


def test_quote_request_hands_every_string_to_the_one_parser() -> None:
    """A string of any length or content is the parser's to refuse (invalid_quantity); a JSON
    true or a list is a schema error."""
    for text in ("9" * 5000, "\u0661", "1e999999"):
        req = validated(QuoteRequest, {"asset_price_source_id": "x", "quantity_tonnes": text})
        with pytest.raises(Rejection) as caught:
            quantity_units(req.quantity_tonnes)
        assert caught.value.code == "invalid_quantity"
    for wrong in (True, [1], None):
        with pytest.raises(Rejection) as caught:
            validated(QuoteRequest, {"asset_price_source_id": "x", "quantity_tonnes": wrong})
        assert caught.value.code == "schema_validation"


def test_an_order_to_the_zero_address_is_a_schema_error() -> None:
    body = {"quote_uuid": "0" * 8 + "-0000-0000-0000-" + "0" * 12, "beneficiary_name": "B"}
    with pytest.raises(Rejection) as caught:
        validated(OrderRequest, {**body, "beneficiary_address": "0x" + "0" * 40})
    assert caught.value.code == "schema_validation"
    ok = validated(OrderRequest, {**body, "beneficiary_address": "0x" + "ab" * 20})
    assert ok.beneficiary_address is not None and ok.beneficiary_address.lower() == "0x" + "ab" * 20


def test_requests_are_strict() -> None:
    with pytest.raises(Rejection) as caught:
        validated(QuoteRequest, {"asset_price_source_id": "x", "quantity_tonnes": "1", "extra": 1})
    assert caught.value.code == "schema_validation"
    assert any(f["field"] == "extra" for f in caught.value.context["fields"])
    with pytest.raises(Rejection):
        validated(CarbonProjectsQuery, {"limit": str(MAX_LIMIT + 1)})
    with pytest.raises(Rejection):
        validated(CarbonProjectsQuery, {"vintage": "19"})
    assert validated(CarbonProjectsQuery, {"limit": "5", "offset": "10"}).limit == 5
    with pytest.raises(Rejection):
        validated(OrderRequest, {"quote_uuid": "not-a-uuid", "beneficiary_name": "A"})


def test_removed_parameters_name_their_replacement() -> None:
    assert removed_parameters({"chainId": "1"}, REMOVED_PRICE_PARAMETERS, "GET /prices") is None
    error = removed_parameters(
        {"productIds": "1", "isDefaultCredit": "true"}, REMOVED_PRICE_PARAMETERS, "GET /prices"
    )
    assert error is not None and status_of(error) == 400 and error.code == "parameter_removed"
    assert set(error.context["removed"]) == {"productIds", "isDefaultCredit"}
    gone = REPLACED_RETIREMENT["certificate"].error()
    assert status_of(gone) == 410 and gone.context["replacement"] == "GET /retirements/{id}/certificate"
    assert status_of(REMOVED_PRODUCTS.error()) == 410


def _event(kind: str, block: int, **data: int | str) -> ListingEvent:
    return ListingEvent(1, kind, dict(data), block, 1000 + block)  # type: ignore[arg-type]


def test_listing_fold_follows_created_updated_filled_cancelled() -> None:
    created = _event(
        "created",
        1,
        seller=SELLER,
        creditToken=POOL,
        tokenId=5,
        amount=10_000,
        unitPrice=3_000_000,
        minFill=1000,
        expiration=2000,
    )
    state = fold_listing(None, created)
    assert state is not None and state.left_to_sell == 10_000 and state.live(1999) and not state.live(2000)
    state = fold_listing(state, _event("updated", 2, unitPrice=4_000_000, minFill=500, expiration=3000))
    assert state is not None and (state.unit_price, state.min_fill, state.expiration) == (
        4_000_000,
        500,
        3000,
    )
    state = fold_listing(state, _event("filled", 3, amount=10_000, cost=1, buyer=SELLER))
    assert state is not None and state.left_to_sell == 0 and state.active and not state.live(0)  # sold out
    state = fold_listing(state, _event("cancelled", 4))
    assert state is not None and not state.active and state.updated_block == 4
    assert fold_listing(None, _event("filled", 5, amount=1, cost=1, buyer=SELLER)) is None  # unknown listing
    cancelled = fold_listing(fold_listing(None, created), _event("cancelled", 2))
    assert cancelled is not None and cancelled.active is False


def _t(block: int, sender: str, receiver: str, amount: int) -> Transfer:
    return Transfer(block, 0, 0, bytes([block]) * 32, 100 + block, sender, receiver, amount)


def test_provenance_walks_back_to_the_mint() -> None:
    mint = _t(1, ZERO_ADDRESS, MINTER, 5000)
    other_mint = _t(2, ZERO_ADDRESS, SELLER, 99)  # another holder's history stays out
    deposit = _t(3, MINTER, POOL, 5000)
    to_settlement = _t(4, POOL, SETTLEMENT, 1000)
    burn = _t(5, SETTLEMENT, ZERO_ADDRESS, 1000)
    steps = provenance([burn, deposit, other_mint, mint, to_settlement], burn)
    assert [s.kind for s in steps] == ["ORIGINATION", "TRANSFER", "TRANSFER", "RETIREMENT"]
    assert [s.transfer for s in steps] == [mint, deposit, to_settlement, burn]
    assert [s.remaining for s in steps] == [5000, 5000, 1000, 0]


def test_provenance_is_bounded_and_stops_without_a_mint() -> None:
    burn = _t(200, SETTLEMENT, ZERO_ADDRESS, 1)
    loop = [_t(b, SETTLEMENT if b % 2 else POOL, POOL if b % 2 else SETTLEMENT, 1) for b in range(1, 199)]
    steps = provenance([*loop, burn], burn)
    assert len(steps) <= 33 and steps[-1].kind == "RETIREMENT"
    assert provenance([burn], burn)[0].kind == "RETIREMENT"
