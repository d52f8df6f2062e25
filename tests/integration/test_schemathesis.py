"""Both OpenAPI documents checked against the running daemon by Schemathesis (pinned in the
dev extras, run unmodified as its CLI): every operation the document declares, positive and
negative data, every phase, with a bounded example count per operation (issue 21).

Required: no failure of the checks a document owes its clients (:data:`REQUIRED_CHECKS`), and
at most 2 % of the requests are positive-data refusals: a schema-valid request answered with
a status Schemathesis' ``positive_data_acceptance`` does not expect (its default: 2xx, 3xx,
401, 403, 404, 409, 429, 5xx), i.e. a rule the server applies that the document does not say.

``SCHEMATHESIS_EXAMPLES`` raises the example count for a longer run, and
``SCHEMATHESIS_REPORT=dir`` keeps the reports and prints the counts of every check.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
import yaml

from tests.conftest import Daemon

pytestmark = pytest.mark.integration

ST = Path(sys.executable).with_name("st")
REQUIRED_CHECKS = (
    "not_a_server_error",
    "response_schema_conformance",
    "status_code_conformance",
    "content_type_conformance",
    "unsupported_method",
)
POSITIVE_REFUSALS_AT_MOST = 0.02
GONE_BY_DESIGN = """
[[operations]]
include-path-regex = "^/products"
checks.positive_data_acceptance.expected-statuses = ["410"]
"""
"""The removed v17 endpoints (deprecated in the document) answer 410 to every request: that is
their declared answer, not a refusal of the data."""
DOCUMENTS = {"x402": "/api/openapi.json", "marketplace": "/marketplace/openapi.json"}


@dataclass
class Run:
    """What one Schemathesis run found: per check, the requests it failed on (from the VCR
    cassette) and its distinct failures (Schemathesis' own grouping, from its JSON report);
    the requests sent, and the positive-data refusals among them."""

    failed_requests: Counter[str] = field(default_factory=Counter)
    unique_failures: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    positive_refusals: int = 0
    errors: list[str] = field(default_factory=list)
    examples: dict[str, list[str]] = field(default_factory=dict)
    output: str = ""


def _read_cassette(path: Path, run: Run) -> None:
    """Per request of the cassette: its generation mode, response status and checks."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for interaction in yaml.load(path.read_text(), Loader=loader).get("http_interactions") or []:
        run.requests += 1
        request = interaction.get("request") or {}
        what = f"{request.get('method')} {str(request.get('uri', ''))[:120]}"
        for check in interaction.get("checks") or []:
            if check.get("status") != "FAILURE":
                continue
            name = check["name"]
            run.failed_requests[name] += 1
            seen = run.examples.setdefault(name, [])
            if len(seen) < 4:
                seen.append(f"{what}: {check.get('message')}"[:300])
            if name == "positive_data_acceptance":
                run.positive_refusals += 1


_CHECK_OF_TYPE: Final = {
    "ServerError": "not_a_server_error",
    "UndefinedStatusCode": "status_code_conformance",
    "UndefinedContentType": "content_type_conformance",
    "MalformedMediaType": "content_type_conformance",
    "MissingContentType": "content_type_conformance",
    "JsonSchemaError": "response_schema_conformance",
    "MalformedJson": "response_schema_conformance",
    "ContentDeserializationError": "response_schema_conformance",
    "DiscriminatorMismatch": "response_schema_conformance",
    "MissingHeaders": "response_headers_conformance",
    "JsonSchemaHeaderError": "response_headers_conformance",
    "RejectedPositiveData": "positive_data_acceptance",
    "AcceptedNegativeData": "negative_data_rejection",
    "UnsupportedMethodResponse": "unsupported_method",
    "MissingHeaderNotRejected": "missing_required_header",
    "AllowHeaderMismatch": "allow_header_conformance",
}


def _read_report(path: Path, run: Run) -> None:
    """Schemathesis' distinct failures, per check (its failure types named by check)."""
    report = json.loads(path.read_text())
    for group in report.get("failures", []):
        run.unique_failures[_CHECK_OF_TYPE.get(group["type"], group["type"])] += group["count"]
    run.errors = [f"{e['title']} ({e['count']})" for e in report.get("errors", [])]


async def schemathesis(base: str, document: str, report: Path, examples: int, checks: str = "all") -> Run:
    """Run ``st run`` on ``base + document`` (the daemon serves both the document and the
    API): ``checks``, every phase, at most ``examples`` test cases per operation, a fixed
    seed; its VCR cassette and JSON report in ``report``."""
    report.mkdir(parents=True, exist_ok=True)
    (report / "schemathesis.toml").write_text(GONE_BY_DESIGN)
    command = [
        str(ST),
        "--config-file",
        str(report / "schemathesis.toml"),
        "run",
        f"{base}{document}",
        "--url",
        base,
        "--checks",
        checks,
        "--max-examples",
        str(examples),
        "--seed",
        "21",
        "--workers",
        "1",
        "--continue-on-failure",
        "--request-timeout",
        "30",
        "--report",
        "vcr,json",
        "--report-vcr-path",
        str(report / "vcr.yaml"),
        "--report-json-path",
        str(report / "report.json"),
        "--no-color",
    ]
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=report
    )
    out, _ = await proc.communicate()
    run = Run(output=out.decode(errors="replace"))
    (report / "output.txt").write_text(run.output)
    _read_cassette(report / "vcr.yaml", run)
    _read_report(report / "report.json", run)
    return run


def _summary(name: str, run: Run) -> str:
    checks = sorted(set(run.failed_requests) | set(run.unique_failures))
    counts = (
        "; ".join(
            f"{c} {run.failed_requests[c]} requests ({run.unique_failures[c]} distinct)" for c in checks
        )
        or "none"
    )
    share = run.positive_refusals / max(1, run.requests)
    return (
        f"{name}: {run.requests} requests; failures per check: {counts}; "
        f"positive-data refusals {run.positive_refusals} ({share:.1%}); errors: {run.errors or 'none'}"
    )


async def served_document(url: str) -> dict[str, Any]:
    """The OpenAPI document as the daemon serves it (the one Schemathesis ran)."""
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        assert r.status == 200
        document: dict[str, Any] = await r.json()
        return document


def bare_answers(document: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Every (path, method, status) of a 2xx answer whose body is described only as a bare
    object (``{}`` or ``{"type": "object"}``): such an answer is not checked by Schemathesis'
    response conformance."""
    bare: list[tuple[str, str, str]] = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, answer in operation.get("responses", {}).items():
                media = answer.get("content", {}).values()
                if status.startswith("2") and any(m.get("schema") in ({}, {"type": "object"}) for m in media):
                    bare.append((path, method, status))
    return bare


@pytest.mark.timeout(int(os.environ.get("SCHEMATHESIS_TIMEOUT_S", "300")))
@pytest.mark.parametrize("name", list(DOCUMENTS))
async def test_the_document_matches_the_server(daemon: Daemon, name: str, tmp_path: Path) -> None:
    kept = os.environ.get("SCHEMATHESIS_REPORT")
    report = Path(kept) / name if kept else tmp_path
    examples = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "3"))
    run = await schemathesis(daemon.base_url, DOCUMENTS[name], report, examples)
    print("\n" + _summary(name, run))
    for check, found in run.examples.items():
        print(f"  {check}: {found}")
    assert run.requests > 0, run.output[-3000:]
    assert bare_answers(await served_document(daemon.base_url + DOCUMENTS[name])) == []
    assert not run.errors, f"the document is not usable as it is: {run.errors}\n{run.output[-3000:]}"
    failed = {
        check: (run.failed_requests[check], run.unique_failures[check])
        for check in REQUIRED_CHECKS
        if run.failed_requests[check] or run.unique_failures[check]
    }
    assert not failed, f"{_summary(name, run)}\n{run.output[-6000:]}"
    share = run.positive_refusals / run.requests
    assert share <= POSITIVE_REFUSALS_AT_MOST, _summary(name, run)
