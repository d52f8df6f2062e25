"""The error registry against the spec's Errors table (the source of truth), and the
error envelope of :class:`Rejection`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from relayer.domain.errors import REGISTRY, X402_FACILITATOR_VERSION, Rejection

ROOT = Path(__file__).resolve().parents[2]
# The specs are vendored in docs/spec/ so a clone alone can run the suite; when the shared
# folder sits beside the clone (as in CI), test_vendored_specs_match_shared checks the copy.
SPEC = ROOT / "docs" / "spec" / "x402-retirement-endpoint.md"
SHARED_SPEC_DIR = ROOT.parent / "shared" / "spec"
RELAYER = Path(__file__).resolve().parents[2] / "relayer"

_CODE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class SpecRow:
    code: str
    http_status: int
    group: str
    retryable: bool


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _table_rows(section: str) -> list[list[str]]:
    rows = []
    for line in section.splitlines():
        line = line.strip()
        if line.startswith("|") and line.endswith("|") and not set(line) <= set("|- "):
            rows.append([cell.strip() for cell in line[1:-1].split("|")])
    return rows


def _spec_errors() -> dict[str, SpecRow]:
    rows = _table_rows(_section(SPEC.read_text(encoding="utf-8"), "Errors"))
    out: dict[str, SpecRow] = {}
    for cells in rows:
        if len(cells) != 5 or not _CODE.match(cells[0]) or cells[1] == "HTTP":
            continue
        code, status, group, retryable, _meaning = cells
        assert retryable in ("yes", "no"), cells
        assert code not in out, f"duplicate code in spec table: {code}"
        out[code] = SpecRow(code, int(status), group, retryable == "yes")
    return out


def _spec_action_codes() -> dict[str, set[str]]:
    rows = _table_rows(_section(SPEC.read_text(encoding="utf-8"), "Errors"))
    out: dict[str, set[str]] = {}
    for cells in rows:
        if len(cells) == 2 and cells[0] != "Action":
            out[cells[0]] = {c for c in re.findall(r"[a-z][a-z0-9_]+", cells[1]) if "_" in c}
    return out


SPEC_ERRORS = _spec_errors()


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
    rate limit, which the spec's table has no code for)."""
    assert set(REGISTRY) - set(SPEC_ERRORS) == {"rate_limited"}


def test_per_action_codes_are_all_registered() -> None:
    per_action = _spec_action_codes()
    assert {"quote", "prepare-auth", "actions/retire", "certificate"} <= set(per_action)
    assert "params_mismatch" in per_action["actions/retire"]
    mentioned = set().union(*per_action.values())
    assert mentioned - set(REGISTRY) == set()


def test_every_code_raised_in_relayer_is_registered() -> None:
    raised: set[str] = set()
    for path in RELAYER.rglob("*.py"):
        raised |= set(re.findall(r"Rejection\(\s*\"([a-z_]+)\"", path.read_text(encoding="utf-8")))
    assert "schema_validation" in raised  # the scan found something
    assert raised - set(REGISTRY) == set()


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        REGISTRY["new_code"] = REGISTRY["not_found"]  # type: ignore[index]


def test_rejection_body_envelope_and_context() -> None:
    rej = Rejection("insufficient_authorized_value", requiredMinimum="1050000")
    body = rej.body()
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
    assert rej.body()["message"] == "no 1999 credit"
    assert rej.body()["availableVintages"] == [2019, 2020]
    assert "vintage_not_found" in str(rej)
    assert rej.spec.http_status == 400


def test_rejection_without_context_has_exactly_three_keys() -> None:
    assert set(Rejection("not_found").body()) == {"error", "message", "x402FacilitatorVersion"}


def test_unknown_code_raises_key_error() -> None:
    with pytest.raises(KeyError):
        Rejection("no_such_code")
    with pytest.raises(KeyError):
        Rejection("Not_Found")


@pytest.mark.skipif(not SHARED_SPEC_DIR.is_dir(), reason="no shared/ folder beside the clone")
def test_vendored_specs_match_shared() -> None:
    for shared in sorted(SHARED_SPEC_DIR.glob("*.md")):
        vendored = ROOT / "docs" / "spec" / shared.name
        assert vendored.read_text() == shared.read_text(), f"docs/spec/{shared.name} is stale: copy it again"


def test_every_error_shares_one_root_with_a_code_and_transient_flag() -> None:
    from relayer.chain.errors import ChainRevert, ChainUnavailable
    from relayer.domain.errors import RelayerError, Unavailable
    from relayer.store.pool import StoreUnavailable
    from relayer.store.relay_jobs import PermitInUse

    for err in (
        Rejection("listing_expired"),
        ChainUnavailable(),
        StoreUnavailable(),
        ChainRevert(None),
        PermitInUse(),
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
    assert back.body() == rej.body()
    assert RelayerError.from_record({"code": "no_such_code"}).code == "internal_error"
