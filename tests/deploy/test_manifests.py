"""The Kubernetes manifests of deploy/kustomize, offline: the example overlay rendered without
kustomize (tests/deploy/kustomize.py), every object validated against the Kubernetes 1.30
schemas (kubernetes-validate, strict: no unknown fields), the Prometheus Operator objects
checked by structure, and what the relayer needs checked against the code: security contexts,
probes and ports, settings names, commands, secret references, and no key in the files."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import kubernetes_validate
import pytest
import yaml

from relayer.__main__ import main as relayer_cli
from relayer.app import STOP_GRACE_S, rate_limit_of
from relayer.chain.types import Contracts
from relayer.config import ENV_PREFIX, SECRETS_DIR, Settings
from tests.deploy.kustomize import containers, pod_specs, render, split_image

ROOT: Final = Path(__file__).resolve().parents[2]
DEPLOY: Final = ROOT / "deploy"
OVERLAY: Final = DEPLOY / "kustomize" / "overlays" / "example"
KUBERNETES_VERSION: Final = "1.30.0"
CRD_KINDS: Final = frozenset({"ServiceMonitor", "PrometheusRule"})
EXTERNAL_SECRETS: Final = frozenset({"relayer-secrets"})
"""Secrets the manifests reference but never define: the operator creates them."""
UID: Final = 10001
API_PORT: Final = 8402
OPS_PORT: Final = 9402
Resource = dict[str, Any]


@pytest.fixture(scope="module")
def rendered() -> list[Resource]:
    return render(OVERLAY)


def one(resources: list[Resource], kind: str, name: str) -> Resource:
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads(resources: list[Resource]) -> Iterator[Resource]:
    return (r for r in resources if pod_specs(r))


def test_every_object_is_valid_for_kubernetes(rendered: list[Resource]) -> None:
    checked = set()
    for resource in rendered:
        if resource["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{resource['kind']} {resource['metadata']['name']}: {where}: {exc.message}")
        checked.add(resource["kind"])
    assert {
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "Service",
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Job",
        "NetworkPolicy",
        "Ingress",
    } <= checked
    assert {r["kind"] for r in rendered} <= checked | CRD_KINDS


def test_the_base_alone_is_valid_too() -> None:
    for resource in render(DEPLOY / "kustomize" / "base"):
        if resource["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_the_renderer_agrees_with_kubectl_kustomize() -> None:
    """The renderer under test is itself checked against kustomize where kubectl exists
    (it does not in CI: there the renderer's refusals of anything unknown stand guard)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl: cannot compare with kubectl kustomize")
    for directory in (OVERLAY, DEPLOY / "kustomize" / "base"):
        out = subprocess.run(
            [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True, timeout=60
        ).stdout
        theirs = [doc for doc in yaml.safe_load_all(out) if doc]

        def key(r: Resource) -> tuple[str, str]:
            return r["kind"], r["metadata"]["name"]

        assert sorted(render(directory), key=key) == sorted(theirs, key=key)


def test_service_monitors_select_a_service_port_that_serves_metrics(rendered: list[Resource]) -> None:
    monitors = [r for r in rendered if r["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"relayer-api", "relayer-jobs"}
    services = [r for r in rendered if r["kind"] == "Service"]
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"]  # kube-prometheus-stack selects by it
        wanted = monitor["spec"]["selector"]["matchLabels"]
        selected = [s for s in services if wanted.items() <= s["metadata"]["labels"].items()]
        assert [s["metadata"]["name"] for s in selected] == [monitor["metadata"]["name"]]
        ports = {p["name"]: p for p in selected[0]["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
            assert endpoint["port"] in ports
            assert endpoint["path"] == "/metrics"
        assert set(monitor["spec"]) == {"selector", "endpoints"}


def test_prometheus_rule_is_well_formed(rendered: list[Resource]) -> None:
    rule = one(rendered, "PrometheusRule", "relayer")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(rule["spec"]) == {"groups"}
    assert rule["metadata"]["labels"]["release"]
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"}
        for item in group["rules"]:
            assert set(item) <= {"alert", "record", "expr", "for", "labels", "annotations"}


def test_pods_run_unprivileged_and_read_only(rendered: list[Resource]) -> None:
    for resource in workloads(rendered):
        name = f"{resource['kind']} {resource['metadata']['name']}"
        for spec in pod_specs(resource):
            assert spec["automountServiceAccountToken"] is False, name
            assert spec["serviceAccountName"] == "relayer", name
            pod = spec["securityContext"]
            assert pod["runAsNonRoot"] is True, name
            assert pod["runAsUser"] == UID and pod["runAsGroup"] == UID and pod["fsGroup"] == UID, name
            assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert not spec.get("hostNetwork") and not spec.get("hostPID"), name
        for container in containers(resource):
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context.get("privileged", False) is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{name}: a read-only root needs a writable /tmp"
            resources = container["resources"]
            assert set(resources["requests"]) == {"cpu", "memory"}, name
            assert set(resources["limits"]) == {"cpu", "memory"}, name


def test_images_are_pinned(rendered: list[Resource]) -> None:
    for resource in workloads(rendered):
        for container in containers(resource):
            _, tag, digest = split_image(container["image"])
            assert digest or (tag and tag != "latest"), container["image"]
            assert container["image"].startswith("registry.example.com/relayer")


def port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(number)


def probes(container: dict[str, Any]) -> dict[str, tuple[str, int]]:
    return {
        kind: (container[kind]["httpGet"]["path"], port_number(container, container[kind]["httpGet"]["port"]))
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }


def test_api_deployment(rendered: list[Resource]) -> None:
    api = one(rendered, "Deployment", "relayer-api")
    (container,) = containers(api)
    assert container["args"] == ["serve"]
    assert probes(container) == {
        "startupProbe": ("/healthz", API_PORT),
        "livenessProbe": ("/healthz", API_PORT),
        "readinessProbe": ("/readyz", API_PORT),
    }
    assert Settings.model_fields["http_port"].default == API_PORT
    assert "replicas" not in api["spec"], "the HPA owns the API's replica count"
    assert api["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # the preStop pause, then the requests in flight's grace, then the workers' and closing
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "/bin/sleep"
    shutdown_grace = float(
        env_variables(rendered).get(
            "RELAYER_SHUTDOWN_GRACE_S", Settings.model_fields["shutdown_grace_s"].default
        )
    )
    grace = api["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= int(pre_stop[1]) + shutdown_grace + STOP_GRACE_S + 5

    hpa = one(rendered, "HorizontalPodAutoscaler", "relayer-api")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "relayer-api",
    }
    assert hpa["spec"]["minReplicas"] >= 3
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]

    pdb = one(rendered, "PodDisruptionBudget", "relayer-api")
    labels = api["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"]


def test_jobs_deployment(rendered: list[Resource]) -> None:
    jobs = one(rendered, "Deployment", "relayer-jobs")
    (container,) = containers(jobs)
    assert container["args"] == ["work"]
    assert probes(container) == {
        "startupProbe": ("/healthz", OPS_PORT),
        "livenessProbe": ("/healthz", OPS_PORT),
        "readinessProbe": ("/readyz", OPS_PORT),
    }
    assert Settings.model_fields["ops_port"].default == OPS_PORT  # RELAYER_OPS_PORT: the workers' own
    assert jobs["spec"]["strategy"] == {"type": "Recreate"}
    assert jobs["spec"]["replicas"] == 1
    assert jobs["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= STOP_GRACE_S + 15
    assert not any(
        r["kind"] == "HorizontalPodAutoscaler" and r["spec"]["scaleTargetRef"]["name"] == "relayer-jobs"
        for r in rendered
    )


def test_migration_job_runs_migrate_then_catalogue_load(rendered: list[Resource]) -> None:
    job = one(rendered, "Job", "relayer-migrate")
    (container,) = containers(job)
    assert container["command"] == ["/bin/sh", "-c"]
    assert container["args"] == ["relayer migrate && relayer catalogue load"]
    assert "migrate" in relayer_cli.commands
    assert "load" in relayer_cli.commands["catalogue"].commands
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] >= 1 and job["spec"]["ttlSecondsAfterFinished"] > 0
    (secrets,) = [v for v in spec["volumes"] if "secret" in v]
    assert [item["key"] for item in secrets["secret"]["items"]] == ["database_url"]


def test_services_route_to_the_pods_and_their_ports(rendered: list[Resource]) -> None:
    expected = {"relayer-api": ("relayer-api", API_PORT), "relayer-jobs": ("relayer-jobs", OPS_PORT)}
    services = [r for r in rendered if r["kind"] == "Service"]
    assert {s["metadata"]["name"] for s in services} == set(expected)
    for service in services:
        deployment_name, port = expected[service["metadata"]["name"]]
        deployment = one(rendered, "Deployment", deployment_name)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        (container,) = containers(deployment)
        (service_port,) = service["spec"]["ports"]
        assert service_port["port"] == port
        assert port_number(container, service_port["targetPort"]) == port


def env_variables(rendered: list[Resource]) -> dict[str, str]:
    """Every environment variable the pods get: the ConfigMaps they load, their env."""
    variables: dict[str, str] = {}
    configmaps = {r["metadata"]["name"]: r for r in rendered if r["kind"] == "ConfigMap"}
    for resource in workloads(rendered):
        for container in containers(resource):
            for source in container.get("envFrom", []):
                assert "configMapRef" in source, "secrets come as files, never as environment"
                variables.update(configmaps[source["configMapRef"]["name"]]["data"])
            for variable in container.get("env", []):
                assert "secretKeyRef" not in variable.get("valueFrom", {})
                variables[variable["name"]] = variable.get("value", "")
    return variables


def test_every_setting_the_manifests_set_exists(rendered: list[Resource]) -> None:
    variables = env_variables(rendered)
    unknown = [
        v
        for v in variables
        if not v.startswith(ENV_PREFIX) or v.removeprefix(ENV_PREFIX).lower() not in Settings.model_fields
    ]
    assert not unknown, f"not relayer settings: {unknown}"
    secret_fields = {n for n, f in Settings.model_fields.items() if "SecretStr" in str(f.annotation)}
    assert not {v.removeprefix(ENV_PREFIX).lower() for v in variables} & secret_fields
    assert variables["RELAYER_HTTP_HOST"] == "0.0.0.0"
    assert variables["RELAYER_HTTP_PORT"] == str(API_PORT)
    assert int(variables["RELAYER_CHAIN_ID"]) == 8453
    # the values parse as the settings' types (model_validate reads no environment)
    Settings.model_validate({k.removeprefix(ENV_PREFIX).lower(): v for k, v in variables.items()})


def test_the_deployment_file_is_mounted_where_the_setting_points(rendered: list[Resource]) -> None:
    path = Path(env_variables(rendered)["RELAYER_DEPLOYMENT_FILE"])
    configmaps = {r["metadata"]["name"]: r for r in rendered if r["kind"] == "ConfigMap"}
    for name in ("relayer-api", "relayer-jobs"):
        deployment = one(rendered, "Deployment", name)
        (spec,) = pod_specs(deployment)
        (container,) = containers(deployment)
        volumes = {v["name"]: v for v in spec["volumes"]}
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent)]
        configmap = configmaps[volumes[mount["name"]]["configMap"]["name"]]
        deployment_json = json.loads(configmap["data"][path.name])
        Contracts.from_deployment(deployment_json["contracts"])


def test_secrets_are_files_of_an_external_secret(rendered: list[Resource]) -> None:
    defined = {r["metadata"]["name"] for r in rendered if r["kind"] == "Secret"}
    for resource in workloads(rendered):
        (spec,) = pod_specs(resource)
        secret_volumes = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
        for volume in secret_volumes.values():
            assert volume["secretName"] in defined | EXTERNAL_SECRETS
            assert volume["defaultMode"] == 0o440
            for item in volume.get("items", []):
                assert item["key"] == item["path"] and item["key"] in Settings.model_fields
        for container in containers(resource):
            mounts = [m for m in container["volumeMounts"] if m["name"] in secret_volumes]
            assert [(m["mountPath"], m["readOnly"]) for m in mounts] == [(SECRETS_DIR, True)]


def test_configmap_references_resolve(rendered: list[Resource]) -> None:
    configmaps = {r["metadata"]["name"] for r in rendered if r["kind"] == "ConfigMap"}
    for resource in workloads(rendered):
        for spec in pod_specs(resource):
            for volume in spec["volumes"]:
                if "configMap" in volume:
                    assert volume["configMap"]["name"] in configmaps
        for container in containers(resource):
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] in configmaps


def test_network_policies(rendered: list[Resource]) -> None:
    policies = {r["metadata"]["name"]: r["spec"] for r in rendered if r["kind"] == "NetworkPolicy"}
    deny = policies["relayer-default-deny"]
    assert deny["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny and "egress" not in deny

    def sources(spec: dict[str, Any]) -> set[tuple[str, int]]:
        return {
            (peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], port["port"])
            for rule in spec["ingress"]
            for peer in rule["from"]
            for port in rule["ports"]
        }

    assert sources(policies["relayer-api-ingress"]) == {("ingress-nginx", API_PORT), ("monitoring", API_PORT)}
    assert sources(policies["relayer-jobs-ingress"]) == {("monitoring", OPS_PORT)}
    egress = {
        (p["port"], p["protocol"]) for rule in policies["relayer-egress"]["egress"] for p in rule["ports"]
    }
    assert egress == {(53, "UDP"), (53, "TCP"), (5432, "TCP"), (443, "TCP")}
    (https,) = [r for r in policies["relayer-egress"]["egress"] if r["ports"][0]["port"] == 443]
    assert "169.254.0.0/16" in https["to"][0]["ipBlock"]["except"]  # no cloud metadata service
    pods = {
        name: one(rendered, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        for name in ("relayer-api", "relayer-jobs")
    }
    assert (
        policies["relayer-api-ingress"]["podSelector"]["matchLabels"].items() <= pods["relayer-api"].items()
    )
    assert (
        policies["relayer-jobs-ingress"]["podSelector"]["matchLabels"].items() <= pods["relayer-jobs"].items()
    )


def test_namespace_enforces_the_restricted_pod_security_standard(rendered: list[Resource]) -> None:
    namespace = one(rendered, "Namespace", "relayer")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {r["metadata"].get("namespace") for r in rendered if r["kind"] != "Namespace"} == {"relayer"}


# 64 hex digits (an secp256k1 key), optionally 0x-prefixed, not part of a longer hex run and
# not an image digest (sha256:...).
KEY_LIKE: Final = re.compile(r"(?<![0-9A-Fa-f:])(?<!sha256:)(0x)?[0-9A-Fa-f]{64}(?![0-9A-Fa-f])")


def test_no_file_under_deploy_holds_a_key(rendered: list[Resource]) -> None:
    assert KEY_LIKE.search("x: 0x" + "ab" * 32)
    assert not KEY_LIKE.search("python@sha256:" + "ab" * 32)
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        found = KEY_LIKE.search(path.read_bytes().decode(errors="replace"))
        assert found is None, f"{path.relative_to(ROOT)}: something that looks like a key"
    for secret in (r for r in rendered if r["kind"] == "Secret"):
        for value in secret.get("data", {}).values():
            assert not KEY_LIKE.search(base64.b64decode(value).decode())


@pytest.mark.parametrize("tree", [OVERLAY, DEPLOY / "kustomize" / "base"])
def test_the_rate_limit_is_per_client_behind_the_ingress(tree: Path) -> None:
    """Behind the ingress every peer is the ingress controller: the base keys the limit on
    the address it appends to X-Forwarded-For (one trusted hop), so one client exhausting
    its budget leaves another's untouched, and an entry a client wrote itself counts for
    nothing."""
    variables = env_variables(render(tree))
    settings = Settings.model_validate({k.removeprefix(ENV_PREFIX).lower(): v for k, v in variables.items()})
    limit = rate_limit_of(settings)
    ingress = "10.244.1.7"  # the ingress controller pod: the peer of every request
    assert limit.client_of(ingress, ["203.0.113.7"]) == "203.0.113.7"
    assert limit.client_of(ingress, ["1.1.1.1, 203.0.113.7"]) == "203.0.113.7"  # spoofed entry ignored
    assert limit.client_of(ingress, []) == ingress  # no header: the peer
    per_second = min(item.amount for item in limit.items)
    first = [limit.hit(limit.client_of(ingress, ["203.0.113.7"])) for _ in range(per_second + 1)]
    assert first[:-1] == [None] * per_second and first[-1] is not None  # that client is limited
    assert limit.hit(limit.client_of(ingress, ["198.51.100.9"])) is None  # another is not
