"""The alerting rules (deploy/prometheus) and the Grafana dashboard (deploy/grafana): promtool
checks and unit-tests the rules; every metric they query is one the relayer exports; the
PrometheusRule holds exactly the groups of rules.yml. Policy for promtool (Debian's
``prometheus`` package): without it these tests are skipped on a developer's machine but fail
when ``CI`` is set, so CI can never pass by silently skipping them (``.ci/run`` installs it)."""

from __future__ import annotations

import functools
import json
import re
import runpy
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from relayer.metrics import Metrics
from tests.browser import in_ci
from tests.helpers.docs import anchors

ROOT: Final = Path(__file__).resolve().parents[2]
RUNBOOKS: Final = anchors((ROOT / "docs" / "operations.md").read_text(encoding="utf-8"))
"""The headings of docs/operations.md: each alert's runbook_url points at its own."""
PROMETHEUS: Final = ROOT / "deploy" / "prometheus"
RULES: Final = PROMETHEUS / "rules.yml"
RULES_TEST: Final = PROMETHEUS / "rules_test.yml"
PROMETHEUS_RULE: Final = PROMETHEUS / "relayer-rules.yaml"
DASHBOARD: Final = ROOT / "deploy" / "grafana" / "relayer-dashboard.json"

METRICS: Final = frozenset(
    {
        "relayer_http_server_requests_total",
        "relayer_http_server_request_duration_seconds",
        "relayer_http_error_responses_total",
        "relayer_http_unhandled_errors_total",
        "relayer_x402_challenges_total",
        "relayer_authorizations_total",
        "relayer_rate_limited_total",
        "relayer_executor_balance_wei",
        "relayer_executor_covered_retirements",
        "relayer_executor_drained",
        "relayer_executor_nonce_lag",
        "relayer_indexer_lag_blocks",
        "relayer_relay_jobs",
        "relayer_relay_oldest_job_age_seconds",
        "relayer_relay_stage_duration_seconds",
        "relayer_rpc_errors_total",
        "relayer_worker_restarts_total",
        "relayer_reorgs_total",
        "relayer_broadcasts_total",
        "relayer_db_pool_connections",
        "relayer_chain_identity_mismatch",
        "relayer_deep_reorg",
        "relayer_executor_nonce_gap",
        "relayer_halted_steps_total",
    }
)
"""The operator metrics the rules and the dashboard may query (docs/operations.md, Metrics)."""
HISTOGRAMS: Final = frozenset(
    {"relayer_http_server_request_duration_seconds", "relayer_relay_stage_duration_seconds"}
)
ALERTS: Final = frozenset(
    {
        "ExecutorBalanceLow",
        "ExecutorDrained",
        "RelayJobsStuck",
        "IndexerLag",
        "HTTP5xxRising",
        "UnhandledErrors",
        "RpcErrorsRising",
        "NonceLag",
        "WorkerRestarting",
        "RelayerDown",
        "ChainIdentityMismatch",
        "DeepReorg",
        "NonceGap",
    }
)
METRIC_NAME: Final = re.compile(r"\brelayer_[a-z0-9_]+")  # x402: digits too
TARGET_LABELS: Final = frozenset({"job", "instance", "namespace", "pod", "service", "container", "endpoint"})
"""Labels Prometheus (and the Prometheus Operator) put on every scraped series."""


def metric_names(expr: str) -> set[str]:
    """The relayer metrics an expression reads (a histogram's _bucket, _sum, _count as the
    histogram)."""
    names = set()
    for name in METRIC_NAME.findall(expr):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        names.add(base if base in HISTOGRAMS else name)
    return names


def groups() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return data


def alerts() -> Iterator[dict[str, Any]]:
    return (rule for group in groups() for rule in group["rules"] if "alert" in rule)


def promtool() -> str:
    """The promtool executable; without it the test is skipped, or fails when CI is set."""
    path = shutil.which("promtool")
    if path is None:
        msg = "no promtool; Debian: apt-get install prometheus"
        if in_ci():
            pytest.fail(f"{msg} (CI is set: the rules' checks may not be skipped)", pytrace=False)
        pytest.skip(msg)
    return path


def run_promtool(*args: str, cwd: Path = PROMETHEUS) -> str:
    result = subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_the_listed_metrics_are_what_the_relayer_exports() -> None:
    exported = {family.name for family in Metrics().registry.collect()}
    # prometheus_client names a counter's family without _total
    missing = {m for m in METRICS if m not in exported and m.removesuffix("_total") not in exported}
    assert not missing, f"not exported by relayer.metrics: {sorted(missing)}"


@functools.cache
def exported_labels() -> dict[str, set[str]]:
    """Each relayer metric's label names (a histogram's also ``le``)."""
    registry = Metrics().registry
    labels: dict[str, set[str]] = {}
    for family in registry.collect():
        collector = registry._names_to_collectors[
            family.name if family.type != "counter" else family.name + "_total"
        ]
        names = set(getattr(collector, "_labelnames", ()))
        labels[family.name + ("_total" if family.type == "counter" else "")] = names | (
            {"le"} if family.type == "histogram" else set()
        )
    return labels


def labels_used(expr: str, legend: str = "") -> set[str]:
    """The label names an expression groups by or selects on, and a legend shows."""
    used = set()
    for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        used |= {name.strip() for name in clause.split(",") if name.strip()}
    for selector in re.findall(r"\{([^}]*)\}", expr):
        used |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector))
    return used | set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))


def check_labels(where: str, expr: str, legend: str = "") -> None:
    known = exported_labels()
    allowed = set(TARGET_LABELS)
    for name in metric_names(expr):
        allowed |= known[name]
    unknown = labels_used(expr, legend) - allowed
    assert not unknown, f"{where}: labels {sorted(unknown)} are on none of {sorted(metric_names(expr))}"


def test_promtool_check_rules() -> None:
    assert "SUCCESS: 13 rules found" in run_promtool("check", "rules", RULES.name)


def test_promtool_test_rules() -> None:
    assert "SUCCESS" in run_promtool("test", "rules", RULES_TEST.name)


def test_the_alerts() -> None:
    found = [rule["alert"] for rule in alerts()]
    assert sorted(found) == sorted(ALERTS)
    for rule in alerts():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, name
        assert rule["annotations"]["runbook_url"].endswith(f"/docs/operations.md#{name.lower()}"), name
        assert name.lower() in RUNBOOKS, f"{name}: no runbook heading in docs/operations.md"
        names = metric_names(rule["expr"])
        assert names <= METRICS, f"{name}: unknown metrics {sorted(names - METRICS)}"
        check_labels(name, rule["expr"])
        assert names or "up{" in rule["expr"], name


def test_every_alert_has_a_test_that_fires_it_and_one_that_does_not() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fires == ALERTS
    assert quiet == ALERTS


def test_the_prometheus_rule_embeds_rules_yml() -> None:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == groups(), "run python3 deploy/prometheus/sync_rule.py"
    sync = runpy.run_path(str(PROMETHEUS / "sync_rule.py"))
    assert PROMETHEUS_RULE.read_text() == sync["render"](RULES.read_text())


def dashboard_targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner, target


def test_the_dashboard_queries_the_relayer_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] == "relayer"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    queried: set[str] = set()
    for panel, target in dashboard_targets(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert target["datasource"] == panel["datasource"], panel["title"]
        names = metric_names(target["expr"])
        assert names <= METRICS, f"{panel['title']}: unknown metrics {sorted(names - METRICS)}"
        check_labels(panel["title"], target["expr"], target["legendFormat"])
        queried |= names
    for variable in variables.values():
        assert metric_names(variable.get("definition", "")) <= METRICS, variable["name"]
    # request rate, latency, error codes, jobs, ages, stages, balance, covered retirements,
    # nonce lag, indexer lag, RPC errors, the pool, rate limiting: every listed metric
    assert queried == METRICS


def test_the_dashboard_queries_parse(tmp_path: Path) -> None:
    """Each query, with Grafana's variables filled in, as a recording rule promtool checks."""
    dashboard = json.loads(DASHBOARD.read_text())
    rules = []
    for index, (_, target) in enumerate(dashboard_targets(dashboard)):
        expr = target["expr"].replace("$__rate_interval", "5m").replace("$namespace", ".*")
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{index}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in run_promtool("check", "rules", str(path), cwd=tmp_path)
