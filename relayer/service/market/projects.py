"""The marketplace's project and price views over a catalogue snapshot (spec:
marketplace-api.md, GET /categories, /carbonProjects, /carbonProjects/{key}, /prices; Rules 1
and 3: live seller listings only). Pure functions of the snapshot: amounts in tonnes and prices
in USDC per tonne as decimal strings on the wire.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from relayer.domain import views
from relayer.domain.amounts import format_tonnes, tonnes_ceil_units
from relayer.domain.marketplace import (
    CarbonProjectsQuery,
    PricesQuery,
    SourceId,
    bad_request,
    not_found,
    price_units,
    usdc,
)
from relayer.domain.projects import CATEGORIES, ProjectRecord, project_resource
from relayer.service.market.snapshot import Snapshot, zero_figures
from relayer.store.catalogue import ChainListing


@dataclass(slots=True)
class Page:
    """One page of a list: the items and how many match in all."""

    items: Sequence[Mapping[str, object]]
    total: int
    offset: int
    limit: int


def categories() -> list[views.Category]:
    """Every methodology category (spec: GET /categories; the authority on allowed values)."""
    return [{"id": c} for c in CATEGORIES]


def _keys(snap: Snapshot, q: CarbonProjectsQuery) -> list[str]:
    """The keys of the projects matching every filter of ``q``, in key order (400
    ``invalid_category`` for an unknown category)."""
    category = None
    if q.category is not None:
        category = next((c for c in CATEGORIES if c.lower() == q.category.lower()), None)
        if category is None:
            raise bad_request(
                "invalid_category",
                f"unknown category {q.category!r}; allowed values are those of GET /categories",
                allowed=list(CATEGORIES),
            )
    if q.country is not None and category is not None:
        keys = snap.index.by_both.get((q.country.lower(), category.lower()), [])
    elif q.country is not None:
        keys = snap.index.by_country.get(q.country.lower(), [])
    elif category is not None:
        keys = snap.index.by_category.get(category.lower(), [])
    else:
        keys = snap.index.keys
    if any(
        v is not None
        for v in (q.search, q.vintage, q.sdg, q.registry, q.minSupply, q.minPriceUSD, q.maxPriceUSD)
    ):
        keys = [k for k in keys if _matches(snap, snap.records[k], q)]
    return keys


def project_page_json(snap: Snapshot, q: CarbonProjectsQuery) -> tuple[bytes, int]:
    """GET /carbonProjects: the projects matching every filter given, by key, one page, as a
    JSON array (each project rendered once per snapshot), and how many projects match.

    Raises:
        Rejection: 400 ``invalid_category`` naming the allowed values.
    """
    keys = _keys(snap, q)
    rendered = []
    for key in keys[q.offset : q.offset + q.limit]:
        body = snap.project_json.get(key)
        if body is None:
            body = snap.project_json[key] = json_bytes(project(snap, key))
        rendered.append(body)
    return b"[" + b",".join(rendered) + b"]", len(keys)


def _matches(snap: Snapshot, r: ProjectRecord, q: CarbonProjectsQuery) -> bool:
    if q.registry is not None and r.registry.lower() != q.registry.lower():
        return False
    if q.vintage is not None and q.vintage not in r.vintages:
        return False
    if q.sdg is not None and q.sdg not in r.sdgs:
        return False
    if q.search is not None:
        needle = q.search.lower()
        if not any(needle in s.lower() for s in (r.key, r.name, r.description, r.country)):
            return False
    live = snap.live.get(r.key)
    if q.minSupply is not None:
        supply = 0 if live is None else live.listings_units + live.pools_units
        if supply < tonnes_ceil_units(q.minSupply):
            return False
    if q.minPriceUSD is not None or q.maxPriceUSD is not None:
        price = None if live is None else live.min_listing_price
        if price is None:
            return False
        if q.minPriceUSD is not None and price < price_units(q.minPriceUSD):
            return False
        if q.maxPriceUSD is not None and price > price_units(q.maxPriceUSD):
            return False
    return True


def project(snap: Snapshot, key: str) -> views.Project:
    record = snap.records[key]
    return project_resource(record, snap.live.get(key) or zero_figures(snap.index.loaded.get(key, 0)))


def project_detail(snap: Snapshot, key: str) -> views.ProjectDetail:
    """GET /carbonProjects/{key}: the project with its live listings (cheapest first).

    Raises:
        Rejection: 404 ``project_not_found``.
    """
    found = snap.records.get(key) or snap.records.get(snap.index.lower_keys.get(key.lower(), ""))
    if found is None:
        raise not_found("project", key[:200])
    listings = [listing(snap, cl) for cl in snap.listings.get(found.key, [])]
    return {**project(snap, found.key), "listings": listings}


def listing(snap: Snapshot, cl: ChainListing) -> views.Listing:
    """A live seller listing (amounts in tonnes, prices in USDC per tonne, decimal strings)."""
    s = cl.state
    credit = snap.credits.get((cl.chain_id, s.credit_token, s.token_id))
    record = None if credit is None else snap.records.get(credit.project_key)
    return {
        "id": f"0x{s.listing_id:064x}",
        "assetPriceSourceId": str(SourceId(cl.chain_id, s.listing_id)),
        "chainId": cl.chain_id,
        "leftToSell": format_tonnes(s.left_to_sell),
        "totalAmountToSell": format_tonnes(s.total_amount),
        "singleUnitPrice": usdc(s.unit_price),
        "minFillAmount": format_tonnes(s.min_fill),
        "tokenAddress": s.credit_token,
        "active": s.active,
        "deleted": False,
        "createdAt": str(s.created_at),
        "updatedAt": str(s.updated_at),
        "expiration": str(s.expiration),
        "seller": {"id": s.seller},
        "creditId": "" if credit is None else f"{credit.project_key}-{credit.vintage}",
        "project": None
        if credit is None
        else {
            "key": credit.project_key,
            "vintage": str(credit.vintage),
            "registry": credit.registry,
            "name": record.name if record else "",
            "category": record.category if record else "",
            "country": record.country if record else "",
            "methodology": record.methodologies[0].id if record and record.methodologies else "",
        },
        "token": {
            "address": s.credit_token,
            "tokenId": str(s.token_id),
            "tokenStandard": "ERC1155",
            "decimals": 3,
        },
    }


def prices(snap: Snapshot, q: PricesQuery, order_chains: Collection[int]) -> Page:
    """GET /prices: live seller listings only (spec: Rules 1, 3): first those an order can
    take (listings on ``order_chains``, the chains this daemon retires on), then the others
    (listed for discovery: ``orderable`` false), each part cheapest first; ``chainId`` and
    ``projectKey`` filter."""
    items = []
    for cl in snap.all_listings:
        if q.chainId is not None and cl.chain_id != q.chainId:
            continue
        credit = snap.credits.get((cl.chain_id, cl.state.credit_token, cl.state.token_id))
        if credit is None:
            continue
        if q.projectKey is not None and credit.project_key.lower() != q.projectKey.lower():
            continue
        items.append(cl)
    items.sort(key=lambda cl: cl.chain_id not in order_chains)  # stable: cheapest first in each part
    page = items[q.offset : q.offset + q.limit]
    out: list[views.Price] = []
    for cl in page:
        s = cl.state
        out.append(
            {
                "sourceId": str(SourceId(cl.chain_id, s.listing_id)),
                "type": "listing",
                "purchasePrice": usdc(s.unit_price),
                "baseUnitPrice": usdc(s.unit_price),
                "supply": format_tonnes(s.left_to_sell),
                "liquidSupply": format_tonnes(s.left_to_sell),
                "minFillAmount": format_tonnes(s.min_fill),
                "orderable": cl.chain_id in order_chains,
                "listing": listing(snap, cl),
            }
        )
    return Page(out, len(items), q.offset, q.limit)


def json_bytes(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
