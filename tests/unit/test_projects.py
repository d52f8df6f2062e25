"""Carbon project resources (relayer/domain/projects.py) against the spec's "Carbon project"
table (docs/spec/marketplace-api.md) and the data set (data/carbon-projects.json, data/README.md):
strict parsing, exact units and prices, derived locations and descriptions that hold only facts."""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from relayer.domain.projects import (
    CATEGORIES,
    CENTROID_SOURCE,
    COUNTRY_ALIASES,
    INTERNATIONAL,
    RESOURCE_FIELDS,
    LiveFigures,
    ProjectRecord,
    RecordError,
    descriptions,
    listing_price,
    location,
    parse_record,
    project_resource,
    stat_tonnes,
)
from tests.helpers.records import project_record

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "carbon-projects.json"
SPEC = ROOT / "docs" / "spec" / "marketplace-api.md"

NO_LIVE = LiveFigures(0, 0, 0, 0, 0, None, 0, "")
LIVE = LiveFigures(
    total_bridged_units=12_345,
    total_retired_units=1,
    total_supply_units=999,
    listings_units=1000,
    pools_units=0,
    min_listing_price=12_345_678,
    updated_at=1_760_000_000,
    registry_batch_token_id="0xabc-7",
)

BASE: dict[str, Any] = project_record(
    methodologies=[{"id": "ACM0002", "name": "Grid-connected electricity generation from renewable sources"}],
    vintages=["2014", "2012", "2013", "2012"],
    url="https://registry.verra.org/app/projectDetail/VCS/10",
    sdgs=["13", "3", "7"],
    source="KlimaDAO/klima-subgraph@186a356:lib/projects/Projects.ts",
)
"""VCS-10 as the catalogue's source has it (its methodology, vintages, URL and SDGs)."""


def _raw(**changes: Any) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return raw


@cache
def _data() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(DATA.read_text()))


@cache
def _records() -> tuple[ProjectRecord, ...]:
    return tuple(parse_record(raw) for raw in _data())


def _spec_fields() -> dict[str, str]:
    """Field -> type of the spec's "Carbon project (list item and detail)" table."""
    text = SPEC.read_text()
    start = text.index("### Carbon project")
    end = text.index("\n## ", start)
    rows: dict[str, str] = {}
    for line in text[start:end].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and line.startswith("|") and cells[0] not in ("Field", "") and "---" not in line:
            rows[cells[0]] = cells[1]
    return rows


# ---------------------------------------------------------------------------------- the data set


def test_every_record_of_the_data_set_parses() -> None:
    records = _records()
    assert len(records) == 648
    assert len({r.key for r in records}) == 648
    for record in records:
        assert record.key == f"{record.registry}-{record.project_id}"
        assert record.category in CATEGORIES
        assert list(record.vintages) == sorted(set(record.vintages))
        assert list(record.sdgs) == sorted(set(record.sdgs), key=int)


def test_categories_are_the_seven_of_the_spec_and_cover_the_data() -> None:
    spec = SPEC.read_text()
    seen = re.search(r"Values seen: ([^.]+)\.", spec)
    assert seen is not None
    assert tuple(v.strip() for v in seen.group(1).split(",")) == CATEGORIES
    assert {r.category for r in _records()} == set(CATEGORIES)


def test_every_country_gets_a_point_or_the_documented_null_geometry() -> None:
    for country in sorted({r.country for r in _records()}):
        record = next(r for r in _records() if r.country == country)
        bare = parse_record({**_raw(), "country": country})  # no coordinates: the derived rule
        feature = location(bare)
        assert feature["type"] == "Feature"
        if country == INTERNATIONAL:
            assert feature["geometry"] is None, country
            assert feature["properties"]["precision"] == "none"
            assert "International" in feature["properties"]["reason"]
            continue
        assert feature["geometry"] is not None, f"{country} ({record.key}) has no point"
        assert feature["geometry"]["type"] == "Point"
        longitude, latitude = feature["geometry"]["coordinates"]
        assert -180 <= longitude <= 180 and -90 <= latitude <= 90
        assert feature["properties"] == {
            "precision": "country",
            "derivedFrom": "country centroid",
            "source": CENTROID_SOURCE,
        }
    assert CENTROID_SOURCE.startswith("countryinfo ")


def test_every_alias_resolves_to_its_iso_code() -> None:
    from countryinfo import CountryInfo

    for name, code in COUNTRY_ALIASES.items():
        assert CountryInfo(code).iso(3) == code
        feature = location(parse_record({**_raw(), "country": name}))
        assert feature["geometry"] is not None, name


@pytest.mark.parametrize(
    ("country", "lon_range", "lat_range"),
    [
        ("Brazil", (-75, -35), (-30, 5)),
        ("Canada", (-140, -55), (45, 75)),
        ("Japan", (128, 146), (30, 46)),
        ("Viet Nam", (102, 110), (8, 24)),
        ("Cote d'Ivoire", (-9, -2), (4, 11)),
        ("Congo", (11, 19), (-5, 4)),
        ("Democratic Republic of the Congo", (12, 32), (-14, 6)),
        ("South Korea", (125, 130), (33, 39)),
        ("Taiwan", (119, 123), (21, 26)),
        ("Timor-Leste", (124, 128), (-10, -8)),
        ("Turkey", (25, 45), (35, 43)),
    ],
)
def test_country_points_are_longitude_then_latitude(
    country: str, lon_range: tuple[float, float], lat_range: tuple[float, float]
) -> None:
    longitude, latitude = location(parse_record({**_raw(), "country": country}))["geometry"]["coordinates"]
    assert lon_range[0] <= longitude <= lon_range[1]
    assert lat_range[0] <= latitude <= lat_range[1]


def test_unknown_country_and_alternate_spellings_are_not_guessed() -> None:
    for name in ("Atlantis", "Brasil", "Untied States"):
        feature = location(parse_record({**_raw(), "country": name}))
        assert feature["geometry"] is None
        assert feature["properties"]["precision"] == "none"
        assert CENTROID_SOURCE in feature["properties"]["reason"]


def test_a_record_with_coordinates_gets_precision_site() -> None:
    sited = [r for r in _records() if r.latitude is not None]
    assert len(sited) == 62
    for record in sited:
        feature = location(record)
        assert feature["geometry"] == {"type": "Point", "coordinates": [record.longitude, record.latitude]}
        assert feature["properties"] == {"precision": "site", "source": record.source}
    record = parse_record(_raw(latitude=-22.4149, longitude=-47.5651, country=INTERNATIONAL))
    assert location(record)["geometry"]["coordinates"] == [-47.5651, -22.4149]
    assert location(record)["properties"]["precision"] == "site"


# ---------------------------------------------------------------------------------- the resource


def test_resource_fields_equal_the_spec_table() -> None:
    spec = _spec_fields()
    assert "listings" in spec  # only on the detail: the lead's detail endpoint adds it
    assert list(RESOURCE_FIELDS) == [f for f in spec if f != "listings"]
    for record in _records():
        assert list(project_resource(record, LIVE)) == list(RESOURCE_FIELDS)


_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "boolean": bool,
    "object": dict,
    "array": list,
    "array of object": list,
    "array of string": list,
}


@pytest.mark.parametrize("live", [NO_LIVE, LIVE], ids=["no-live", "live"])
def test_every_resource_has_the_spec_json_types(live: LiveFigures) -> None:
    spec = _spec_fields()
    for record in _records():
        resource = project_resource(record, live)
        assert json.loads(json.dumps(resource)) == resource  # plain JSON, nothing lost
        for field, value in resource.items():
            assert isinstance(value, _JSON_TYPES[spec[field]]), (record.key, field, value)
        for item in resource["methodologies"]:
            assert set(item) == {"id", "category", "name"}
            assert all(isinstance(v, str) for v in item.values())
            assert item["category"] == record.category
        assert all(re.fullmatch(r"[0-9]{4}", v) for v in resource["vintages"])
        assert resource["vintages"] == sorted(set(resource["vintages"]))
        goals = resource["sustainableDevelopmentGoals"]
        assert all(isinstance(g, str) and 1 <= int(g) <= 17 and str(int(g)) == g for g in goals)
        assert goals == sorted(set(goals), key=int)
        assert re.fullmatch(r"[0-9]+", resource["updatedAt"])
        assert re.fullmatch(r"0|[1-9][0-9]*(\.[0-9]*[1-9])?|0\.[0-9]*[1-9]", resource["price"])
        assert set(resource["stats"]) == {
            "totalBridged",
            "totalRetired",
            "totalSupply",
            "totalListingsSupply",
            "totalPoolsSupply",
        }
        for number in resource["stats"].values():
            assert isinstance(number, int | float) and not isinstance(number, bool)
        assert resource["images"] == []
        assert resource["location"]["type"] == "Feature"
        assert len(resource["short_description"]) <= 200


def test_resource_values_from_record_and_live_figures() -> None:
    record = parse_record(_raw())
    resource = project_resource(record, LIVE)
    assert resource["key"] == "VCS-10" and resource["projectID"] == "10"
    assert resource["vintages"] == ["2012", "2013", "2014"]
    assert resource["sustainableDevelopmentGoals"] == ["3", "7", "13"]
    assert resource["updatedAt"] == "1760000000"
    assert resource["price"] == "12.345678"
    assert resource["stats"] == {
        "totalBridged": 12.345,
        "totalRetired": 0.001,
        "totalSupply": 0.999,
        "totalListingsSupply": 1,
        "totalPoolsSupply": 0,
    }
    assert isinstance(resource["stats"]["totalListingsSupply"], int)
    assert resource["hasSupply"] is True
    assert resource["registryBatchTokenId"] == "0xabc-7"
    assert resource["methodologies"] == [
        {
            "id": "ACM0002",
            "category": "Renewable Energy",
            "name": "Grid-connected electricity generation from renewable sources",
        }
    ]
    # deterministic, and a fresh dict each call
    again = project_resource(record, LIVE)
    assert again == resource and again is not resource
    resource["location"]["properties"]["precision"] = "mutated"
    assert project_resource(record, LIVE)["location"]["properties"]["precision"] == "country"


def test_empty_methodology_id_stays_empty() -> None:
    raw = _raw(methodologies=[{"id": "", "name": "GS MS Simplified Methodology for Efficient Cookstoves"}])
    item = project_resource(parse_record(raw), NO_LIVE)["methodologies"][0]
    assert item == {
        "id": "",
        "category": "Renewable Energy",
        "name": "GS MS Simplified Methodology for Efficient Cookstoves",
    }
    assert sum(1 for r in _records() for m in r.methodologies if m.id == "") > 0


@pytest.mark.parametrize(
    ("listings", "pools", "has_supply"),
    [(0, 0, False), (1, 0, True), (0, 1, True), (1000, 5, True)],
)
def test_has_supply(listings: int, pools: int, has_supply: bool) -> None:
    live = LiveFigures(0, 0, 0, listings, pools, None, 0, "")
    assert project_resource(parse_record(_raw()), live)["hasSupply"] is has_supply


# ---------------------------------------------------------------------------------- rounding


@pytest.mark.parametrize(
    ("units", "tonnes", "kind"),
    [
        (0, 0, int),
        (1, 0.001, float),
        (999, 0.999, float),
        (1000, 1, int),
        (1001, 1.001, float),
        (1500, 1.5, float),
        (12_345, 12.345, float),
        (2_000_000, 2000, int),
        (999_999_999_999_999, 999_999_999_999.999, float),
        (10**30, 10**27, int),
    ],
)
def test_stat_tonnes(units: int, tonnes: float, kind: type) -> None:
    value = stat_tonnes(units)
    assert value == tonnes and type(value) is kind
    # the JSON text is the exact decimal of units / 1000
    whole, rest = divmod(units, 1000)
    exact = f"{whole}.{rest:03d}".rstrip("0") if rest else str(whole)
    assert json.dumps(value) == exact


@pytest.mark.parametrize(
    ("atomic", "text"),
    [
        (None, "0"),
        (0, "0"),
        (1, "0.000001"),
        (10**6, "1"),
        (3_000_000, "3"),
        (12_500_000, "12.5"),
        (12_345_678, "12.345678"),
        (10**24 + 1, "1000000000000000000.000001"),
    ],
)
def test_listing_price(atomic: int | None, text: str) -> None:
    assert listing_price(atomic) == text
    live = LiveFigures(0, 0, 0, 0, 0, atomic, 0, "")
    assert project_resource(parse_record(_raw()), live)["price"] == text


def test_live_figures_refuse_negatives() -> None:
    with pytest.raises(ValueError, match="negative"):
        LiveFigures(0, 0, -1, 0, 0, None, 0, "")
    with pytest.raises(ValueError, match="negative"):
        LiveFigures(0, 0, 0, 0, 0, -1, 0, "")


# ---------------------------------------------------------------------------------- strict parsing


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"colour": "green"}, "colour", "unknown field"),
        ({"vintages": ["2012", "12"]}, "vintages", "four-digit"),
        ({"vintages": ["2012a"]}, "vintages", "four-digit"),
        ({"vintages": [2012]}, "vintages", "expected strings"),
        ({"vintages": "2012"}, "vintages", "expected an array"),
        ({"sdgs": ["18"]}, "sdgs", '"1".."17"'),
        ({"sdgs": ["0"]}, "sdgs", '"1".."17"'),
        ({"sdgs": ["03"]}, "sdgs", '"1".."17"'),
        ({"sdgs": [3]}, "sdgs", "expected strings"),
        ({"key": "VCS-11"}, "key", "VCS-10"),
        ({"key": "GS-10"}, "key", "registry-projectID"),
        ({"latitude": 12.5}, "longitude", "latitude"),
        ({"longitude": 12.5}, "latitude", "longitude"),
        ({"latitude": 90.5, "longitude": 0.0}, "latitude", "outside"),
        ({"latitude": 0.0, "longitude": -180.1}, "longitude", "outside"),
        ({"latitude": "1.0", "longitude": 0.0}, "latitude", "number"),
        ({"latitude": True, "longitude": 0.0}, "latitude", "number"),
        ({"category": "Agriculture"}, "category", "seven categories"),
        ({"projectID": 10}, "projectID", "expected a string"),
        ({"name": ""}, "name", "empty"),
        ({"country": ""}, "country", "empty"),
        ({"registry": "vcs", "key": "vcs-10"}, "registry", "registry code"),
        ({"url": "ftp://example.org/x"}, "url", "http"),
        ({"description": "x" * 4001}, "description", "longer than"),
        ({"methodologies": [{"id": "ACM0002"}]}, "methodologies[0]", "missing field 'name'"),
        ({"methodologies": [{"id": "A", "name": "B", "x": 1}]}, "methodologies[0]", "unknown field 'x'"),
        ({"methodologies": [{"id": "", "name": ""}]}, "methodologies[0]", "both id and name are empty"),
        ({"methodologies": [{"id": 2, "name": ""}]}, "methodologies[0].id", "expected a string"),
    ],
)
def test_strict_parsing_names_the_key_and_the_field(changes: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(RecordError) as caught:
        parse_record(_raw(**changes))
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.field == field
    assert words in error.problem
    key = changes.get("key", "VCS-10") if isinstance(changes.get("key", "VCS-10"), str) else "?"
    assert error.key == key
    assert str(error) == f"{key}: {field}: {error.problem}"


def test_missing_field_and_non_object() -> None:
    raw = _raw()
    del raw["sdgs"]
    with pytest.raises(RecordError, match=r"^VCS-10: sdgs: missing field$"):
        parse_record(raw)
    with pytest.raises(RecordError, match=r"^\?: record: expected an object, got list$"):
        parse_record([BASE])
    with pytest.raises(RecordError, match=r"^\?: key: expected a string"):
        parse_record(_raw(key=None))


def test_error_messages_are_bounded() -> None:
    with pytest.raises(RecordError) as caught:
        parse_record(_raw(vintages=["9" * 10_000]))
    assert len(str(caught.value)) < 200


# ---------------------------------------------------------------------------------- descriptions

_TEMPLATE_WORDS = {
    "a",
    "an",
    "project",
    "category",  # "a project (category Other)"
    "in",
    "listed",
    "as",
    "registered",
    "with",
    "methodology",
    "methodologies",
}


def _leftover(text: str, facts: list[str]) -> set[str]:
    """Words of ``text`` left once every fact is removed (longest facts first)."""
    for fact in sorted(filter(None, facts), key=len, reverse=True):
        text = text.replace(fact, " ")
    return set(re.findall(r"[^\s:;,.()]+", text))


def test_derived_descriptions_hold_only_facts_from_the_record() -> None:
    derived = [r for r in _records() if not r.description]
    assert len(derived) == 549
    for record in derived:
        description, long_description, short = descriptions(record)
        facts = [record.name, record.category, record.country, record.registry, record.key]
        facts += [m.id for m in record.methodologies] + [m.name for m in record.methodologies]
        assert _leftover(description, facts) <= _TEMPLATE_WORDS, record.key
        assert description.startswith(f"{record.name}: ")
        assert f"registered with {record.registry} as {record.key}" in description
        assert long_description.startswith(description + "\n\n")
        assert len(short) <= 200
        assert short == description or (short.endswith("…") and description.startswith(short[:-1]))


def test_derived_description_reads_as_documented() -> None:
    record = parse_record(_raw())
    assert descriptions(record)[0] == (
        "BAESA Project: a Renewable Energy project in Brazil registered with VCS as VCS-10;"
        " methodology ACM0002 (Grid-connected electricity generation from renewable sources)."
    )
    bare = parse_record(_raw(methodologies=[], category="Other", country=INTERNATIONAL))
    assert (
        descriptions(bare)[0]
        == "BAESA Project: a project (category Other) listed as International registered with VCS as VCS-10."
    )  # issue 37: not "an Other project"


def test_long_description_lists_the_present_facts_only() -> None:
    record = parse_record(_raw(region="Santa Catarina"))
    _, long_description, _ = descriptions(record)
    assert long_description.split("\n\n", 1)[1].splitlines() == [
        "- Registry: VCS (VCS-10)",
        "- Category: Renewable Energy",
        "- Country: Brazil",
        "- Region: Santa Catarina",
        "- Methodology: ACM0002 (Grid-connected electricity generation from renewable sources)",
        "- Vintages: 2012, 2013, 2014",
        "- Sustainable Development Goals: 3, 7, 13",
        "- Registry record: https://registry.verra.org/app/projectDetail/VCS/10",
        f"- Source: {BASE['source']}",
    ]
    bare = parse_record(_raw(methodologies=[], vintages=[], sdgs=[], url="", description="Plain."))
    assert descriptions(bare)[1].split("\n\n", 1)[1].splitlines() == [
        "- Registry: VCS (VCS-10)",
        "- Category: Renewable Energy",
        "- Country: Brazil",
        f"- Source: {BASE['source']}",
    ]


def test_registry_descriptions_are_kept_verbatim() -> None:
    for record in _records():
        if record.description:
            description, long_description, short = descriptions(record)
            assert description == record.description
            assert long_description.startswith(record.description + "\n\n")
            assert 0 < len(short) <= 200
            assert record.description.startswith(short.removesuffix("…"))


@pytest.mark.parametrize(
    ("text", "short"),
    [
        ("One. Two.", "One."),
        ("No full stop at all", "No full stop at all"),
        (
            "Built by Clean Cooking S.R.L. (CCT) as developer. The rest.",
            "Built by Clean Cooking S.R.L. (CCT) as developer.",
        ),
        ("Run by Grupo Custodiar S.A. It grows.", "Run by Grupo Custodiar S.A. It grows."),
        ("Made in the U.S. Then sold.", "Made in the U.S. Then sold."),
        ("Version 1.3 of the rule applies. Next.", "Version 1.3 of the rule applies."),
        ("Is it? Yes.", "Is it?"),
        ('It said so. "Quoted" next.', "It said so."),
        ("Spaced   out\ttext. Two.", "Spaced out text."),
        ("word " * 60, ("word " * 40).strip() + "…"),
        ("x" * 300, "x" * 199 + "…"),
        ("a" * 150 + " " + "b" * 100, "a" * 150 + "…"),
    ],
)
def test_short_description_is_the_first_sentence_clipped(text: str, short: str) -> None:
    result = descriptions(parse_record(_raw(description=text)))[2]
    assert result == short
    assert len(result) <= 200


def test_short_description_cut_at_exactly_200() -> None:
    text = "w" * 199 + " tail"
    assert descriptions(parse_record(_raw(description=text)))[2] == "w" * 199 + "…"
    exact = "y" * 200
    assert descriptions(parse_record(_raw(description=exact)))[2] == exact


def test_every_project_carries_a_methodology_with_its_category() -> None:
    """Spec: every project carries one or more methodology categories. A record whose source
    names no methodology gets one entry with its category and an empty code and name (the
    data knows the category, not the code: nothing invented)."""
    raws = {raw["key"]: raw for raw in _data()}
    records = _records()
    assert len(records) == 648
    bare = 0
    for record in records:
        given = raws[record.key]["methodologies"]
        items = project_resource(record, NO_LIVE)["methodologies"]
        assert items and all(m["category"] == record.category for m in items), record.key
        if given:
            assert [(m["id"], m["name"]) for m in items] == [(m["id"], m["name"]) for m in given]
        else:
            bare += 1
            assert items == [{"id": "", "category": record.category, "name": ""}], record.key
    assert bare == 87  # data/README.md: methodology codes often empty (87)


def test_a_record_without_methodologies_has_its_category_only() -> None:
    record = parse_record(_raw(methodologies=[], category="Blue Carbon"))
    assert [(m.id, m.name, m.category) for m in record.methodologies] == [("", "", "Blue Carbon")]
    assert "methodolog" not in descriptions(record)[0] + descriptions(record)[1]
