"""Tonne parsing and exact atomic-unit formatting (spec: Limits 1; STYLE 3: every rounding
rule has a test at its edge)."""

from __future__ import annotations

import random

import pytest

from relayer.api.errors import x402_body
from relayer.domain.amounts import (
    KVCM_DECIMALS,
    TONNES_MAX_CHARS,
    UNITS_PER_TONNE,
    USDC_DECIMALS,
    TonnesFault,
    format_tonnes,
    format_units,
    parse_tonnes,
    parse_units,
    read_tonnes,
    tonnes_ceil_units,
)
from relayer.domain.errors import Rejection


@pytest.mark.parametrize(
    ("text", "units"),
    [
        ("0.001", 1),
        ("0.01", 10),
        ("0.5", 500),
        ("1", 1000),
        ("1.0", 1000),
        ("1.000000", 1000),
        ("1.001", 1001),
        ("12.345", 12_345),
        ("0.999", 999),
        ("999999999999", 999_999_999_999_000),
    ],
)
def test_parse_tonnes_valid(text: str, units: int) -> None:
    assert parse_tonnes(text) == units


@pytest.mark.parametrize("text", ["0.0005", "0", "0.0", "0.000", "0.0009"])
def test_parse_tonnes_below_minimum(text: str) -> None:
    with pytest.raises(Rejection) as exc:
        parse_tonnes(text)
    assert exc.value.code == "amount_below_increment"
    assert x402_body(exc.value)["minimum"] == "0.001"


@pytest.mark.parametrize("text", ["1.0015", "0.0011", "2.0001", "1.000000000000000001"])
def test_parse_tonnes_not_a_multiple_of_a_kg(text: str) -> None:
    with pytest.raises(Rejection) as exc:
        parse_tonnes(text)
    assert exc.value.code == "amount_below_increment"
    assert x402_body(exc.value)["minimum"] == "0.001"


@pytest.mark.parametrize(
    "text",
    [
        "-1",
        "+1",
        "1e3",
        "1E3",
        "",
        " 1",
        "1 ",
        "01",
        "00.5",
        ".5",
        "1.",
        "1,5",
        "1_000",
        "0x10",
        "NaN",
        "Infinity",
        "\uff11",  # fullwidth digit one: Decimal would accept it
        "1234567890123",  # 13 integer digits
        "1.0000000000000000001",  # 19 fractional digits
    ],
)
def test_parse_tonnes_not_a_plain_decimal(text: str) -> None:
    with pytest.raises(Rejection) as exc:
        parse_tonnes(text)
    assert exc.value.code == "schema_validation"
    issues = x402_body(exc.value)["issues"]
    assert [issue["path"] for issue in issues] == [["amount"]]


def test_parse_tonnes_rejects_trailing_newline() -> None:
    with pytest.raises(Rejection) as exc:
        parse_tonnes("1\n")
    assert exc.value.code == "schema_validation"


def test_parse_tonnes_fraction_of_a_kg_on_a_large_amount_is_rejected() -> None:
    with pytest.raises(Rejection) as exc:
        parse_tonnes("100000000000.000000000000000001")
    assert exc.value.code == "amount_below_increment"


def test_parse_tonnes_returns_int() -> None:
    assert type(parse_tonnes("2.5")) is int


# -- the one tonne parser of both surfaces (issue 18) ---------------------------------------


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("0.001", 1),  # the smallest: 1 kg
        ("1", 1000),
        ("1.5", 1500),
        ("1.500", 1500),
        ("1.500000000000000000", 1500),  # zeros past the third decimal, up to 18 decimals
        ("999999999999.999", 10**15 - 1),  # the largest: 12 integer digits
        ("999999999999.999000000000000000", 10**15 - 1),  # the longest text, 31 characters
        ("0", TonnesFault.NOT_WHOLE_KG),  # zero
        ("0.000", TonnesFault.NOT_WHOLE_KG),
        ("0.0009", TonnesFault.NOT_WHOLE_KG),  # below 1 kg: never rounded up
        ("1.0005", TonnesFault.NOT_WHOLE_KG),  # a fraction of a kg: never rounded
        ("1.000000000000000001", TonnesFault.NOT_WHOLE_KG),
        ("1000000000000", TonnesFault.MALFORMED),  # 10**12 t: 13 integer digits
        ("1.0000000000000000000", TonnesFault.MALFORMED),  # 19 decimals
        ("1e3", TonnesFault.MALFORMED),  # exponent
        ("1E-3", TonnesFault.MALFORMED),
        ("1e999999", TonnesFault.MALFORMED),
        ("-1", TonnesFault.MALFORMED),  # sign
        ("+1", TonnesFault.MALFORMED),
        ("01", TonnesFault.MALFORMED),  # leading zero
        (".5", TonnesFault.MALFORMED),  # bare point
        ("1.", TonnesFault.MALFORMED),
        ("1,5", TonnesFault.MALFORMED),  # separators
        ("1_000", TonnesFault.MALFORMED),
        (" 1", TonnesFault.MALFORMED),  # spaces
        ("1\n", TonnesFault.MALFORMED),
        ("", TonnesFault.MALFORMED),
        ("NaN", TonnesFault.MALFORMED),
        ("Infinity", TonnesFault.MALFORMED),
        ("\u0661", TonnesFault.MALFORMED),  # ARABIC-INDIC DIGIT ONE: ASCII digits only
        ("\uff11", TonnesFault.MALFORMED),  # FULLWIDTH DIGIT ONE
        ("\u0661.5", TonnesFault.MALFORMED),
        ("1.\u0665", TonnesFault.MALFORMED),
        ("9" * 5000, TonnesFault.MALFORMED),  # bounded length
    ],
)
def test_read_tonnes_every_rule(text: str, read: int | TonnesFault) -> None:
    assert read_tonnes(text) == read


def test_read_tonnes_refuses_past_its_length_bound_before_matching() -> None:
    longest = "999999999999.999000000000000000"
    assert len(longest) == TONNES_MAX_CHARS and read_tonnes(longest) == 10**15 - 1
    assert read_tonnes(longest + "0") is TonnesFault.MALFORMED


def test_x402_and_marketplace_read_tonnes_alike() -> None:
    """Both surfaces accept exactly the same strings with the same value (their codes differ)."""
    from relayer.domain.marketplace import quantity_units

    for text in ["1", "0.001", "1.500", "1e3", "\u0661", "01", "0", "1.0005", "1000000000000", "9" * 40]:
        read = read_tonnes(text)
        if isinstance(read, int):
            assert parse_tonnes(text) == quantity_units(text) == read
            continue
        with pytest.raises(Rejection) as x402:
            parse_tonnes(text)
        with pytest.raises(Rejection) as market:
            quantity_units(text)
        x402_code = "schema_validation" if read is TonnesFault.MALFORMED else "amount_below_increment"
        assert (x402.value.code, market.value.code) == (x402_code, "invalid_quantity")


@pytest.mark.parametrize(
    ("atomic", "decimals", "text"),
    [
        (0, 6, "0"),
        (1, 6, "0.000001"),
        (10, 6, "0.00001"),
        (1_500_000, 6, "1.5"),
        (1_000_000, 6, "1"),
        (1_050_000, 6, "1.05"),
        (1_000_001, 6, "1.000001"),
        (100_000_000, 6, "100"),
        (10**18 - 1, 18, "0.999999999999999999"),
        (10**18, 18, "1"),
        (123 * 10**18 + 4 * 10**17, 18, "123.4"),
        (7, 0, "7"),
        (0, 0, "0"),
        (-1_500_000, 6, "-1.5"),
        (-1, 6, "-0.000001"),
    ],
)
def test_format_units_trims_trailing_zeros(atomic: int, decimals: int, text: str) -> None:
    assert format_units(atomic, decimals) == text


@pytest.mark.parametrize(("units", "text"), [(1, "0.001"), (1000, "1"), (1500, "1.5"), (12_345, "12.345")])
def test_format_tonnes(units: int, text: str) -> None:
    assert format_tonnes(units) == text
    assert parse_tonnes(text) == units


def _roundtrip_values(decimals: int) -> list[int]:
    rng = random.Random(20_240_601 + decimals)
    scale = 10**decimals
    # Full uint256 range: parsing is exact string arithmetic.
    limit = 2**256
    fixed = [0, 1, 9, 10, 11, scale - 1, scale, scale + 1, 10 * scale, 10**18 - 1, 10**18, limit - 1]
    randoms = [rng.randrange(0, limit) for _ in range(300)]
    # values with many trailing zeros exercise the trimming
    trimmed = [rng.randrange(1, 10**6) * 10 ** rng.randrange(0, decimals + 1) for _ in range(100)]
    return [v for v in fixed + randoms + trimmed if 0 <= v < limit]


@pytest.mark.parametrize("decimals", [0, 3, USDC_DECIMALS, 9, KVCM_DECIMALS])
def test_format_parse_round_trip(decimals: int) -> None:
    for value in _roundtrip_values(decimals):
        text = format_units(value, decimals)
        assert parse_units(text, decimals) == value, text
        assert text == "0" or not text.endswith("0") or "." not in text, text
        assert not text.endswith(".")


def test_parse_units_accepts_untrimmed_and_rejects_too_many_decimals() -> None:
    assert parse_units("1.500000", 6) == 1_500_000
    assert parse_units("0.000001", 6) == 1
    assert parse_units("1", 0) == 1
    with pytest.raises(ValueError, match="decimals"):
        parse_units("0.0000001", 6)
    with pytest.raises(ValueError, match="decimals"):
        parse_units("1.5", 0)


@pytest.mark.parametrize("text", ["-1", "1e6", "", " 1", "01", ".1", "1."])
def test_parse_units_rejects_non_plain_decimal(text: str) -> None:
    with pytest.raises(ValueError, match="not a decimal amount"):
        parse_units(text, 6)


def test_parse_units_exact_at_full_precision() -> None:
    text = "123456789012.123456789012345678"
    assert parse_units(text, KVCM_DECIMALS) == 123_456_789_012_123_456_789_012_345_678


def test_parse_units_inverts_format_units_for_big_numbers() -> None:
    for value, decimals in [(10**30, KVCM_DECIMALS), (10**18, USDC_DECIMALS), (2**256 - 1, KVCM_DECIMALS)]:
        assert parse_units(format_units(value, decimals), decimals) == value


def test_units_per_tonne() -> None:
    assert UNITS_PER_TONNE == 1000
    assert (USDC_DECIMALS, KVCM_DECIMALS) == (6, 18)


@pytest.mark.parametrize(
    ("text", "units"),
    [
        ("0", 0),
        ("0.000", 0),
        ("0.001", 1),
        ("0.0005", 1),  # half a unit: a lower bound of 0.0005 t is first met by 1 kg
        ("0.0001", 1),
        ("1.0005", 1001),
        ("1.0000000000000000000001", 1001),  # float reads 1.0: the tail is lost
        ("2", 2000),
        ("2.500", 2500),
        ("999999999999.999", 999_999_999_999_999),
        ("123456789012345678901234567890", 123456789012345678901234567890 * 1000),
    ],
)
def test_tonnes_ceil_units_rounds_any_fraction_of_a_unit_up(text: str, units: int) -> None:
    assert tonnes_ceil_units(text) == units


def test_tonnes_ceil_units_is_the_exact_lower_bound() -> None:
    """``supply >= tonnes`` exactly when ``supply >= tonnes_ceil_units(tonnes)``, where the old
    float filter (``int(float(t) * 1000 + 0.5)``) let a supply below the bound through."""
    for text in ("0.0001", "0.0004", "1.0004", "7.0000000000000000001"):
        bound = tonnes_ceil_units(text)
        assert int(float(text) * UNITS_PER_TONNE + 0.5) == bound - 1  # the float filter's miss
        whole, _, frac = text.partition(".")
        scale = 10 ** len(frac)
        kg_scaled = (int(whole) * scale + int(frac)) * UNITS_PER_TONNE  # text in kg, times scale
        assert (bound - 1) * scale < kg_scaled <= bound * scale


@pytest.mark.parametrize("text", ["", "-1", "+1", "1e3", " 1", "1.", ".5", "01", "1,5", "0x10", "NaN"])
def test_tonnes_ceil_units_refuses_what_is_not_a_plain_decimal(text: str) -> None:
    with pytest.raises(ValueError, match="not a decimal amount"):
        tonnes_ceil_units(text)
