"""Carbon project resources of the marketplace API (marketplace-api.md, "Carbon project"): one
validated record of ``data/carbon-projects.json`` plus live chain figures -> the list item.

Policy: a value the data set lacks is never invented (data/README.md). Where the API needs one
anyway it is derived by a rule documented at the function that applies it (the country's centre
point in :func:`location`, the summary in :func:`descriptions`), and the output says so.

Units and rounding (each tested at its edge):
- credit units: 1 unit = 1 kg CO2e, 1000 units = 1 tonne. ``stats`` are tonnes = units / 1000
  as a JSON number: an ``int`` when whole, else the ``float`` nearest the exact quotient, whose
  JSON text (Python's shortest repr) is the exact decimal with at most three places for any
  |units| < 10**15 (10**12 tonnes); beyond that it is the nearest double.
- ``price``: the exact decimal string of USDC per tonne from 6-decimal atomic units, trailing
  zeros trimmed (12_500_000 -> "12.5", 3_000_000 -> "3"); "0" without a live listing. No float.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import countryinfo
from countryinfo import CountryInfo, CountryNotFoundError

from relayer.domain import views
from relayer.domain.amounts import UNITS_PER_TONNE, USDC_DECIMALS, format_units
from relayer.domain.errors import RelayerError

# The seven category ids, in the order the spec's Category table lists them.
CATEGORIES: Final[tuple[str, ...]] = (
    "Blue Carbon",
    "Forestry",
    "Other",
    "Renewable Energy",
    "Industrial Processing",
    "Energy Efficiency",
    "Other Nature Based",
)

# The list item's fields, in the spec's table order (the detail adds ``listings``).
RESOURCE_FIELDS: Final[tuple[str, ...]] = (
    "key",
    "projectID",
    "registry",
    "name",
    "methodologies",
    "vintages",
    "updatedAt",
    "country",
    "region",
    "price",
    "stats",
    "hasSupply",
    "sustainableDevelopmentGoals",
    "description",
    "long_description",
    "short_description",
    "location",
    "url",
    "images",
    "registryBatchTokenId",
)

SHORT_DESCRIPTION_CHARS: Final = 200
# The data set's country value for projects with no single host country.
INTERNATIONAL: Final = "International"

# Data-set country names -> ISO 3166-1 alpha-3, for names that are not countryinfo's own name
# for the country (Viet Nam, Cote d'Ivoire without its accent, Congo = the Republic of the Congo
# as in UN usage, Timor-Leste) or whose library name may change between releases (Türkiye,
# the Koreas, the Congos, Taiwan). Every other name must equal the library's name exactly:
# matches by alternate spelling or fuzzy matching are not trusted.
COUNTRY_ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "Viet Nam": "VNM",
        "Cote d'Ivoire": "CIV",
        "Côte d'Ivoire": "CIV",
        "Democratic Republic of the Congo": "COD",
        "Congo": "COG",
        "Republic of the Congo": "COG",
        "South Korea": "KOR",
        "Taiwan": "TWN",
        "Timor-Leste": "TLS",
        "Turkey": "TUR",
        "Türkiye": "TUR",
    }
)
CENTROID_SOURCE: Final = f"countryinfo {countryinfo.__version__}"

# Bounds on a record, so everything built from one is bounded (the data set's largest values are
# far below: name 241, description 300, source 169, 3 methodologies, 51 vintages).
_MAX_TEXT_CHARS: Final = 500
_MAX_DESCRIPTION_CHARS: Final = 4000
_MAX_URL_CHARS: Final = 2048
_MAX_METHODOLOGIES: Final = 16
_MAX_VINTAGES: Final = 200

_RECORD_FIELDS: Final = frozenset(
    {
        "key",
        "registry",
        "projectID",
        "name",
        "country",
        "region",
        "methodologies",
        "category",
        "vintages",
        "latitude",
        "longitude",
        "url",
        "sdgs",
        "description",
        "source",
    }
)
_METHODOLOGY_FIELDS: Final = frozenset({"id", "name"})
_REGISTRY_RE: Final = re.compile(r"[A-Z][A-Z0-9]{0,15}")
_PROJECT_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_VINTAGE_RE: Final = re.compile(r"[0-9]{4}")
_SDGS: Final = frozenset(str(n) for n in range(1, 18))
_URL_RE: Final = re.compile(r"https?://\S+")


@dataclass(frozen=True, slots=True)
class Methodology:
    """A methodology of a project: registry code (may be ``""``: the source gave none), name
    (may be ``""``) and the project's category. Both code and name are ``""`` only in the one
    entry of a record whose source names no methodology (see :func:`parse_record`)."""

    id: str
    name: str
    category: str


@dataclass(frozen=True, slots=True)
class ProjectRecord:
    """One validated record of ``carbon-projects.json`` (fields: data/README.md).

    ``vintages`` are sorted unique four-digit strings, ``sdgs`` sorted numerically and unique;
    ``region``, ``url`` and ``description`` are ``""`` when the source did not say; latitude and
    longitude (degrees) are both set or both None. ``methodologies`` holds at least one entry,
    each with the record's category.
    """

    key: str
    registry: str
    project_id: str
    name: str
    country: str
    region: str
    category: str
    methodologies: tuple[Methodology, ...]
    vintages: tuple[str, ...]
    latitude: float | None
    longitude: float | None
    url: str
    sdgs: tuple[str, ...]
    description: str
    source: str


@dataclass(frozen=True, slots=True)
class LiveFigures:
    """A project's live figures, computed from indexed chain events.

    Attributes:
        total_bridged_units: credit units (1 unit = 1 kg; 1000 units = 1 tonne) ever minted.
        total_retired_units: credit units ever retired.
        total_supply_units: credit units minted less burned.
        listings_units: credit units left to sell in live listings.
        pools_units: credit units held by carbon class pools.
        min_listing_price: USDC atomic units (6 decimals) per tonne of the cheapest live listing;
            None when there is none.
        updated_at: unix seconds of the latest change (or the load time).
        registry_batch_token_id: ``""`` when none.

    Raises:
        ValueError: a negative figure.
    """

    total_bridged_units: int
    total_retired_units: int
    total_supply_units: int
    listings_units: int
    pools_units: int
    min_listing_price: int | None
    updated_at: int
    registry_batch_token_id: str

    def __post_init__(self) -> None:
        if (
            min(
                self.total_bridged_units,
                self.total_retired_units,
                self.total_supply_units,
                self.listings_units,
                self.pools_units,
                self.updated_at,
                0 if self.min_listing_price is None else self.min_listing_price,
            )
            < 0
        ):
            raise ValueError(f"live figures must not be negative: {self!r}")


class RecordError(RelayerError, ValueError):
    """A data-set record that breaks its schema (a ``ValueError`` too; ``internal_error``,
    not transient, should it ever reach a caller). ``str()`` is ``"<key>: <field>:
    <problem>"`` (key ``"?"`` when the record has no usable key); a loader reports it as
    ``f"record {n} ({err.key}): {err.field}: {err.problem}"``."""

    def __init__(self, key: str, field: str, problem: str) -> None:
        super().__init__(None, f"{key}: {field}: {problem}", transient=False)
        self.args = (self.message,)
        self.key = key
        self.field = field
        self.problem = problem


def _shown(value: object) -> str:
    """A bounded repr of a rejected value for an error message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


class _Reader:
    """Typed field access on one raw record, raising :class:`RecordError` named by key."""

    __slots__ = ("key", "raw")

    def __init__(self, raw: dict[Any, Any], key: str) -> None:
        self.raw = raw
        self.key = key

    def fail(self, field: str, problem: str) -> RecordError:
        return RecordError(self.key, field, problem)

    def text(self, field: str, *, required: bool, limit: int = _MAX_TEXT_CHARS) -> str:
        value = self.raw[field]
        if not isinstance(value, str):
            raise self.fail(field, f"expected a string, got {_shown(value)}")
        if required and not value:
            raise self.fail(field, "must not be empty")
        if len(value) > limit:
            raise self.fail(field, f"longer than {limit} characters")
        return value

    def strings(self, field: str, limit: int) -> list[str]:
        value = self.raw[field]
        if not isinstance(value, list):
            raise self.fail(field, f"expected an array, got {_shown(value)}")
        if len(value) > limit:
            raise self.fail(field, f"more than {limit} items")
        for item in value:
            if not isinstance(item, str):
                raise self.fail(field, f"expected strings, got {_shown(item)}")
        return value

    def coordinate(self, field: str, bound: float) -> float | None:
        value = self.raw[field]
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(field, f"expected a number or null, got {_shown(value)}")
        degrees = float(value)
        if not (math.isfinite(degrees) and -bound <= degrees <= bound):
            raise self.fail(field, f"{_shown(value)} is outside [-{bound:g}, {bound:g}]")
        return degrees

    def methodologies(self, category: str) -> tuple[Methodology, ...]:
        value = self.raw["methodologies"]
        if not isinstance(value, list):
            raise self.fail("methodologies", f"expected an array, got {_shown(value)}")
        if len(value) > _MAX_METHODOLOGIES:
            raise self.fail("methodologies", f"more than {_MAX_METHODOLOGIES} items")
        found: list[Methodology] = []
        for index, item in enumerate(value):
            field = f"methodologies[{index}]"
            if not isinstance(item, dict):
                raise self.fail(field, f"expected an object, got {_shown(item)}")
            if set(item) != _METHODOLOGY_FIELDS:
                unknown = sorted(map(str, set(item) - _METHODOLOGY_FIELDS))
                missing = sorted(_METHODOLOGY_FIELDS - set(item))
                problem = f"unknown field {unknown[0]!r}" if unknown else f"missing field {missing[0]!r}"
                raise self.fail(field, problem)
            code, name = item["id"], item["name"]
            for part, text in (("id", code), ("name", name)):
                if not isinstance(text, str) or len(text) > _MAX_TEXT_CHARS:
                    raise self.fail(f"{field}.{part}", f"expected a string, got {_shown(text)}")
            if not code and not name:
                raise self.fail(field, "both id and name are empty")
            found.append(Methodology(code, name, category))
        # Spec: every project carries one or more methodology categories. The data set knows
        # each record's category even where its source names no methodology: that entry has
        # the category and an empty code and name (never an invented one).
        return tuple(found) or (Methodology("", "", category),)


def parse_record(raw: object) -> ProjectRecord:
    """Validate one record of ``carbon-projects.json`` strictly (fields: data/README.md).

    Args:
        raw: the decoded JSON object.

    Returns:
        The record, vintages sorted and unique, SDGs sorted numerically and unique, at least
        one methodology (an empty ``methodologies`` array gives one entry with the category and
        ``""`` code and name).

    Raises:
        RecordError: (a ``ValueError``) naming the record's key and the field: an unknown or
            missing field, a wrong type, an empty required string (key, registry, projectID,
            name, country, category, source), a category not in :data:`CATEGORIES`, a vintage
            that is not four digits, an SDG outside "1".."17", a key other than
            ``f"{registry}-{projectID}"``, a latitude or longitude out of range or only one of
            them, a URL that is not http(s), or a value past the bounds above.
    """
    if not isinstance(raw, dict):
        raise RecordError("?", "record", f"expected an object, got {type(raw).__name__}")
    raw_key = raw.get("key")
    key = raw_key if isinstance(raw_key, str) and raw_key and len(raw_key) <= 100 else "?"
    read = _Reader(raw, key)
    unknown = sorted(str(name) for name in raw if name not in _RECORD_FIELDS)
    if unknown:
        raise read.fail(unknown[0], "unknown field")
    missing = sorted(_RECORD_FIELDS - set(raw))
    if missing:
        raise read.fail(missing[0], "missing field")

    registry = read.text("registry", required=True)
    if not _REGISTRY_RE.fullmatch(registry):
        raise read.fail("registry", f"{_shown(registry)} is not an upper-case registry code")
    project_id = read.text("projectID", required=True)
    if not _PROJECT_ID_RE.fullmatch(project_id):
        raise read.fail("projectID", f"{_shown(project_id)} is not a registry project id")
    if read.text("key", required=True) != f"{registry}-{project_id}":
        raise read.fail("key", f"expected {registry}-{project_id} (registry-projectID)")

    category = read.text("category", required=True)
    if category not in CATEGORIES:
        raise read.fail("category", f"{_shown(category)} is not one of the seven categories")

    vintages = read.strings("vintages", _MAX_VINTAGES)
    for vintage in vintages:
        if not _VINTAGE_RE.fullmatch(vintage):
            raise read.fail("vintages", f"{_shown(vintage)} is not a four-digit year")
    sdgs = read.strings("sdgs", 17)
    for goal in sdgs:
        if goal not in _SDGS:
            raise read.fail("sdgs", f'{_shown(goal)} is not a goal number "1".."17"')

    latitude = read.coordinate("latitude", 90.0)
    longitude = read.coordinate("longitude", 180.0)
    if (latitude is None) != (longitude is None):
        given, absent = ("latitude", "longitude") if longitude is None else ("longitude", "latitude")
        raise read.fail(absent, f"null while {given} is set: give both latitude and longitude or neither")

    url = read.text("url", required=False, limit=_MAX_URL_CHARS)
    if url and not _URL_RE.fullmatch(url):
        raise read.fail("url", f"{_shown(url)} is not an http(s) URL")

    return ProjectRecord(
        key=key,
        registry=registry,
        project_id=project_id,
        name=read.text("name", required=True),
        country=read.text("country", required=True),
        region=read.text("region", required=False),
        category=category,
        methodologies=read.methodologies(category),
        vintages=tuple(sorted(set(vintages))),
        latitude=latitude,
        longitude=longitude,
        url=url,
        sdgs=tuple(sorted(set(sdgs), key=int)),
        description=read.text("description", required=False, limit=_MAX_DESCRIPTION_CHARS),
        source=read.text("source", required=True),
    )


# ---------------------------------------------------------------------------------- figures


def stat_tonnes(units: int) -> int | float:
    """Credit units as a JSON number of tonnes: ``int`` when whole (1000 -> 1), else the float
    nearest units / 1000 (1 -> 0.001, 999 -> 0.999; exact decimal text below 10**15 units)."""
    whole, rest = divmod(units, UNITS_PER_TONNE)
    return whole if rest == 0 else units / UNITS_PER_TONNE


def listing_price(atomic_per_tonne: int | None) -> str:
    """USDC atomic units per tonne as the spec's decimal price string, exact (12_345_678 ->
    "12.345678", 10**6 -> "1"); ``"0"`` when there is no live listing (None)."""
    return "0" if atomic_per_tonne is None else format_units(atomic_per_tonne, USDC_DECIMALS)


# ---------------------------------------------------------------------------------- location


@functools.lru_cache(maxsize=1024)
def _country_point(country: str) -> tuple[float, float] | None:
    """(longitude, latitude) of the country's centre point in countryinfo, or None when the
    library does not know the name. Rule: a name in :data:`COUNTRY_ALIASES` is looked up by its
    ISO alpha-3 code, any other name must equal the library's name (case-insensitive). The first
    call reads the library's packaged JSON once per process (its own cache); each name is
    resolved once (this cache)."""
    code = COUNTRY_ALIASES.get(country)
    try:
        info = CountryInfo(code if code is not None else country)
        resolved = info.iso(3) == code if code is not None else info.name().casefold() == country.casefold()
        point = info.latlng()
    except (CountryNotFoundError, ValueError):
        return None
    if not resolved or len(point) != 2:
        return None
    latitude, longitude = float(point[0]), float(point[1])
    if not (math.isfinite(latitude) and math.isfinite(longitude)):
        return None
    if abs(latitude) > 90 or abs(longitude) > 180:
        return None
    return (longitude, latitude)


def location(record: ProjectRecord) -> dict[str, Any]:
    """The project's location as a GeoJSON Feature (coordinates: longitude, latitude; degrees).

    Rule, first that applies:
    1. the record's own latitude and longitude: ``properties = {"precision": "site",
       "source": <the record's source>}``;
    2. derived, not a fact about the site: the centre point countryinfo gives for the record's
       country (its ``latlng``; names resolved as in :data:`COUNTRY_ALIASES`):
       ``{"precision": "country", "derivedFrom": "country centroid", "source": "countryinfo
       <version>"}``;
    3. no honest point (``International``, or a country the library does not know):
       ``geometry`` is null (valid GeoJSON) with ``{"precision": "none", "reason": ...}``.

    The first call for a country may read the library's data (once per process).
    """
    if record.latitude is not None and record.longitude is not None:
        return {
            "type": "Feature",
            "geometry": {"type": "Point", "coordinates": [record.longitude, record.latitude]},
            "properties": {"precision": "site", "source": record.source},
        }
    point = None if record.country == INTERNATIONAL else _country_point(record.country)
    if point is not None:
        return {
            "type": "Feature",
            "geometry": {"type": "Point", "coordinates": [point[0], point[1]]},
            "properties": {
                "precision": "country",
                "derivedFrom": "country centroid",
                "source": CENTROID_SOURCE,
            },
        }
    reason = (
        "the record names no single country (International) and gives no coordinates"
        if record.country == INTERNATIONAL
        else f"the record gives no coordinates and {CENTROID_SOURCE} does not know its country"
    )
    return {"type": "Feature", "geometry": None, "properties": {"precision": "none", "reason": reason}}


# ---------------------------------------------------------------------------------- text

# A sentence ends at . ! ? followed by whitespace and then a capital, a digit or an opening quote,
# unless the word before the full stop is an initial or dotted abbreviation ("S.A.", "U.S.", "J.")
# or one of a few common ones ("Ltd.", "No.").
_SENTENCE_END: Final = re.compile("[.!?](?=\\s+[\"'\u201c\u2018\u00ab]?[0-9A-Z\u00c0-\u00d6\u00d8-\u00de])")
_ABBREVIATION: Final = re.compile(r"(?:^|\s|\()(?:[A-Za-z]\.)*[A-Za-z]$")
_COMMON_ABBREVIATIONS: Final = frozenset({"Ltd", "Inc", "Co", "Corp", "No", "St", "Mr", "Mrs", "Dr", "vs"})


def _first_sentence(text: str) -> str:
    """The first sentence of ``text`` by the rule above, or all of it."""
    for match in _SENTENCE_END.finditer(text):
        if match.start() >= SHORT_DESCRIPTION_CHARS:
            break  # longer than the short description anyway: it gets clipped
        head = text[: match.start()]
        words = head.rsplit(None, 1)
        if match.group() == "." and (
            _ABBREVIATION.search(head) or (words and words[-1] in _COMMON_ABBREVIATIONS)
        ):
            continue
        return text[: match.end()]
    return text


def _clip(text: str, limit: int) -> str:
    """``text`` if at most ``limit`` characters, else cut at the last word boundary that leaves
    room for "…" (a hard cut when the first word alone is too long) and "…" appended."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if not text[limit - 1].isspace():
        space = cut.rfind(" ")
        if space > 0:
            cut = cut[:space]
    cut = cut.rstrip(" ,;:-\u2013\u2014(")
    return (cut or text[: limit - 1]) + "…"


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEIOU" else "a"


def _kind_of_project(category: str) -> str:
    """ "a Forestry project", "an Energy Efficiency project"; the catch-all category reads "a
    project (category Other)", not "an Other project"."""
    if category.strip().lower() in ("", "other"):
        return f"a project (category {category.strip() or 'unknown'})"
    return f"{_article(category)} {category} project"


def _named(record: ProjectRecord) -> tuple[Methodology, ...]:
    """The record's methodologies that have a code or a name (not the category-only entry)."""
    return tuple(m for m in record.methodologies if m.id or m.name)


def _methodology_text(methodology: Methodology) -> str:
    if methodology.id and methodology.name:
        return f"{methodology.id} ({methodology.name})"
    return methodology.id or methodology.name


def _derived_description(record: ProjectRecord) -> str:
    """One sentence built only from the record's own fields (see :func:`descriptions`)."""
    where = "listed as International" if record.country == INTERNATIONAL else f"in {record.country}"
    text = (
        f"{record.name}: {_kind_of_project(record.category)} {where}"
        f" registered with {record.registry} as {record.key}"
    )
    named = _named(record)
    if named:
        label = "methodology" if len(named) == 1 else "methodologies"
        text += f"; {label} " + ", ".join(map(_methodology_text, named))
    return text if text.endswith(".") else text + "."


def _fact_lines(record: ProjectRecord) -> list[str]:
    """Bullet lines of the facts the record holds (an absent fact has no line)."""
    lines = [
        f"- Registry: {record.registry} ({record.key})",
        f"- Category: {record.category}",
        f"- Country: {record.country}",
    ]
    if record.region:
        lines.append(f"- Region: {record.region}")
    named = _named(record)
    if named:
        label = "Methodology" if len(named) == 1 else "Methodologies"
        lines.append(f"- {label}: " + "; ".join(map(_methodology_text, named)))
    if record.vintages:
        lines.append("- Vintages: " + ", ".join(record.vintages))
    if record.sdgs:
        lines.append("- Sustainable Development Goals: " + ", ".join(record.sdgs))
    if record.url:
        lines.append(f"- Registry record: {record.url}")
    lines.append(f"- Source: {record.source}")
    return lines


def descriptions(record: ProjectRecord) -> tuple[str, str, str]:
    """The three description fields: ``(description, long_description, short_description)``.

    - ``description``: the record's description when it has one. Otherwise DERIVED, not from
      the registry: one sentence built only from the record's own fields, ``"<name>: a
      <category> project in <country> registered with <registry> as <key>; methodology <id>
      (<name>)."`` (the methodology clause only when the record names one; an International
      project reads "listed as International").
    - ``short_description``: the first sentence of the description (whitespace runs collapsed;
      sentence rule at ``_SENTENCE_END``), at most 200 characters, cut at a word boundary
      with "…"; a derived description is one sentence by construction.
    - ``long_description``: the description, a blank line, then one ``- Label: value`` line per
      fact the record holds: registry and key, category, country, region, methodologies,
      vintages, Sustainable Development Goals, registry record URL, source.

    All three are bounded by the record's bounds (:func:`parse_record`).
    """
    if record.description:
        description = record.description
        short = _clip(_first_sentence(" ".join(description.split())), SHORT_DESCRIPTION_CHARS)
    else:
        description = _derived_description(record)
        short = _clip(description, SHORT_DESCRIPTION_CHARS)
    long_description = description + "\n\n" + "\n".join(_fact_lines(record))
    return description, long_description, short


# ---------------------------------------------------------------------------------- resource


def project_resource(record: ProjectRecord, live: LiveFigures) -> views.Project:
    """The spec's carbon project list item (marketplace-api.md, "Carbon project"), exactly the
    fields of :data:`RESOURCE_FIELDS` with the spec's JSON types.

    Args:
        record: the project's validated data-set record.
        live: its live figures (credit units, USDC atomic units per tonne, unix seconds).

    Returns:
        A fresh JSON-ready dict: ``projectID``, ``updatedAt`` (unix seconds) and ``price``
        (USDC per tonne, :func:`listing_price`) as strings; ``stats`` in tonnes
        (:func:`stat_tonnes`); ``hasSupply`` when listings or pools hold any units;
        ``location`` per :func:`location`; the descriptions per :func:`descriptions`;
        ``images`` empty (the data set has none).
    """
    description, long_description, short_description = descriptions(record)
    return {
        "key": record.key,
        "projectID": record.project_id,
        "registry": record.registry,
        "name": record.name,
        "methodologies": [{"id": m.id, "category": m.category, "name": m.name} for m in record.methodologies],
        "vintages": list(record.vintages),
        "updatedAt": str(live.updated_at),
        "country": record.country,
        "region": record.region,
        "price": listing_price(live.min_listing_price),
        "stats": {
            "totalBridged": stat_tonnes(live.total_bridged_units),
            "totalRetired": stat_tonnes(live.total_retired_units),
            "totalSupply": stat_tonnes(live.total_supply_units),
            "totalListingsSupply": stat_tonnes(live.listings_units),
            "totalPoolsSupply": stat_tonnes(live.pools_units),
        },
        "hasSupply": live.listings_units + live.pools_units > 0,
        "sustainableDevelopmentGoals": list(record.sdgs),
        "description": description,
        "long_description": long_description,
        "short_description": short_description,
        "location": location(record),
        "url": record.url,
        "images": [],
        "registryBatchTokenId": live.registry_batch_token_id,
    }
