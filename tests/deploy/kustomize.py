"""Render a kustomization without the kustomize binary: the subset deploy/kustomize uses,
read with PyYAML. Anything outside that subset (a key, a patch kind, a target field it does
not know) raises :class:`Unsupported` rather than render something kustomize would not, and
tests/deploy/test_manifests.py compares the result with ``kubectl kustomize`` wherever kubectl
is installed.

Supported: ``resources`` (YAML files, and directories holding a kustomization), ``namespace``,
``configMapGenerator`` and ``secretGenerator`` (``literals``, ``files``; ``behavior`` create,
merge or replace; ``options`` and ``generatorOptions``: labels, annotations,
``disableNameSuffixHash``), ``images`` (``newName``, ``newTag``, ``digest``), ``replicas``,
and ``patches`` holding JSON 6902 operations (add, replace, remove) with a ``target`` of kind,
name, group and version. Generated names get kustomize's content hash suffix, and references
to them from pod templates (volumes, ``envFrom``, ``env.valueFrom``) are rewritten.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Final

import yaml

Resource = dict[str, Any]

KUSTOMIZATION_KEYS: Final = frozenset(
    {
        "apiVersion",
        "kind",
        "resources",
        "namespace",
        "configMapGenerator",
        "secretGenerator",
        "generatorOptions",
        "images",
        "replicas",
        "patches",
    }
)
GENERATOR_KEYS: Final = frozenset({"name", "behavior", "literals", "files", "options", "type"})
OPTION_KEYS: Final = frozenset({"labels", "annotations", "disableNameSuffixHash"})
TARGET_KEYS: Final = frozenset({"kind", "name", "group", "version"})
CLUSTER_SCOPED: Final = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "PriorityClass",
        "StorageClass",
        "PersistentVolume",
        "IngressClass",
    }
)
POD_TEMPLATE_KINDS: Final = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"})
GENERATED: Final = "__generated__"  # marker key on generated resources, removed before returning


class Unsupported(ValueError):
    """The kustomization uses something this renderer does not implement."""


def render(directory: Path) -> list[Resource]:
    """The resources ``kustomize build directory`` produces (order aside)."""
    resources = _build(directory.resolve())
    _finish_generated(resources)
    return resources


def _build(directory: Path) -> list[Resource]:
    path = directory / "kustomization.yaml"
    spec = yaml.safe_load(path.read_text())
    unknown = set(spec) - KUSTOMIZATION_KEYS
    if unknown:
        raise Unsupported(f"{path}: unsupported keys {sorted(unknown)}")
    if spec.get("kind", "Kustomization") != "Kustomization":
        raise Unsupported(f"{path}: kind {spec['kind']}")

    resources: list[Resource] = []
    for entry in spec.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            resources += _build(target)
        else:
            if directory not in target.parents:
                raise Unsupported(f"{path}: file {entry} outside the kustomization's root")
            resources += [doc for doc in yaml.safe_load_all(target.read_text()) if doc]

    defaults = spec.get("generatorOptions", {})
    for generator in spec.get("configMapGenerator", []):
        _generate(resources, directory, generator, defaults, "ConfigMap")
    for generator in spec.get("secretGenerator", []):
        _generate(resources, directory, generator, defaults, "Secret")

    for patch in spec.get("patches", []):
        _patch(resources, directory, patch)
    if "namespace" in spec:
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource["metadata"]["namespace"] = spec["namespace"]
    for image in spec.get("images", []):
        _set_image(resources, image)
    for replica in spec.get("replicas", []):
        matched = [
            r for r in resources if r["metadata"]["name"] == replica["name"] and "replicas" in r["spec"]
        ]
        if not matched:
            raise Unsupported(f"{path}: replicas names {replica['name']}, which has none")
        for resource in matched:
            resource["spec"]["replicas"] = replica["count"]
    return resources


def _generate(
    resources: list[Resource], directory: Path, generator: dict[str, Any], defaults: dict[str, Any], kind: str
) -> None:
    unknown = set(generator) - GENERATOR_KEYS
    options = {**defaults, **generator.get("options", {})}
    unknown |= set(options) - OPTION_KEYS
    if unknown:
        raise Unsupported(f"{kind} generator {generator['name']}: unsupported keys {sorted(unknown)}")
    data: dict[str, str] = {}
    for literal in generator.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    for entry in generator.get("files", []):
        key, _, source = entry.rpartition("=")
        data[key or Path(source).name] = (directory / source).read_text()

    existing = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == generator["name"]]
    behavior = generator.get("behavior", "create")
    if behavior == "create":
        if existing:
            raise Unsupported(f"{kind} {generator['name']} generated twice (behavior create)")
        metadata: dict[str, Any] = {"name": generator["name"]}
        resource: Resource = {"apiVersion": "v1", "kind": kind, "metadata": metadata}
        if kind == "Secret":
            resource["type"] = generator.get("type", "Opaque")
        resources.append(resource)
    elif behavior in ("merge", "replace"):
        if len(existing) != 1:
            raise Unsupported(f"{kind} {generator['name']}: behavior {behavior} needs exactly one base")
        resource = existing[0]
        metadata = resource["metadata"]
        if behavior == "replace":
            resource.pop("data", None)
    else:
        raise Unsupported(f"{kind} {generator['name']}: behavior {behavior}")
    if kind == "Secret":
        data = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    resource["data"] = {**resource.get("data", {}), **data}
    for field in ("labels", "annotations"):
        if options.get(field):
            metadata[field] = {**metadata.get(field, {}), **options[field]}
    if behavior == "create":
        resource[GENERATED] = {"hash": not options.get("disableNameSuffixHash", False)}


def _patch(resources: list[Resource], directory: Path, patch: dict[str, Any]) -> None:
    if set(patch) - {"path", "target"}:
        raise Unsupported(f"patch {patch}: only path and target are supported")
    target = patch.get("target", {})
    if not target or set(target) - TARGET_KEYS:
        raise Unsupported(f"patch {patch['path']}: target needs kind, name, group or version only")
    operations = yaml.safe_load((directory / patch["path"]).read_text())
    if not isinstance(operations, list):
        raise Unsupported(f"patch {patch['path']}: only JSON 6902 patches (a list of operations)")
    matched = [r for r in resources if _matches(r, target)]
    if not matched:
        raise Unsupported(f"patch {patch['path']}: its target matches nothing")
    for resource in matched:
        for operation in operations:
            _apply(resource, operation)


def _matches(resource: Resource, target: dict[str, str]) -> bool:
    group, _, version = resource["apiVersion"].rpartition("/")
    return (
        target.get("kind", resource["kind"]) == resource["kind"]
        and target.get("name", resource["metadata"]["name"]) == resource["metadata"]["name"]
        and target.get("group", group) == group
        and target.get("version", version) == version
    )


def _apply(document: Resource, operation: dict[str, Any]) -> None:
    """One JSON 6902 operation (RFC 6902: add, replace, remove), in place."""
    op = operation["op"]
    if op not in ("add", "replace", "remove"):
        raise Unsupported(f"JSON patch operation {op}")
    keys = [k.replace("~1", "/").replace("~0", "~") for k in operation["path"].split("/")[1:]]
    parent: Any = document
    for key in keys[:-1]:
        parent = parent[int(key)] if isinstance(parent, list) else parent[key]
    last = keys[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if op == "add":
            parent.insert(index, copy.deepcopy(operation["value"]))
        elif op == "replace":
            parent[index] = copy.deepcopy(operation["value"])
        else:
            del parent[index]
    elif op != "add" and last not in parent:
        raise Unsupported(f"JSON patch {op} of the missing {operation['path']}")
    elif op == "remove":
        del parent[last]
    else:
        parent[last] = copy.deepcopy(operation["value"])


def pod_specs(resource: Resource) -> list[dict[str, Any]]:
    """The pod specs of a workload (its template's), else none."""
    if resource["kind"] in POD_TEMPLATE_KINDS:
        return [resource["spec"]["template"]["spec"]]
    return []


def containers(resource: Resource) -> list[dict[str, Any]]:
    """Every container and init container of a workload."""
    return [c for spec in pod_specs(resource) for c in spec.get("initContainers", []) + spec["containers"]]


def _set_image(resources: list[Resource], image: dict[str, str]) -> None:
    if set(image) - {"name", "newName", "newTag", "digest"}:
        raise Unsupported(f"images entry {image}")
    for resource in resources:
        for container in containers(resource):
            name, tag, digest = split_image(container["image"])
            if name != image["name"]:
                continue
            name = image.get("newName", name)
            if "digest" in image:
                container["image"] = f"{name}@{image['digest']}"
            elif "newTag" in image:
                container["image"] = f"{name}:{image['newTag']}"
            else:
                container["image"] = name + (f"@{digest}" if digest else f":{tag}" if tag else "")


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """``name[:tag][@digest]`` -> (name, tag, digest); a registry's port is not a tag."""
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :], digest or None
    return name, None, digest or None


def _finish_generated(resources: list[Resource]) -> None:
    """Suffix generated names with kustomize's content hash and rewrite the references."""
    renamed: dict[tuple[str, str], str] = {}
    for resource in resources:
        generated = resource.pop(GENERATED, None)
        if generated is None or not generated["hash"]:
            continue
        name = resource["metadata"]["name"]
        resource["metadata"]["name"] = f"{name}-{content_hash(resource)}"
        renamed[(resource["kind"], name)] = resource["metadata"]["name"]
    for resource in resources:
        for spec in pod_specs(resource):
            for volume in spec.get("volumes", []):
                if "configMap" in volume:
                    _rename(volume["configMap"], "name", "ConfigMap", renamed)
                if "secret" in volume:
                    _rename(volume["secret"], "secretName", "Secret", renamed)
            for container in spec.get("initContainers", []) + spec["containers"]:
                for source in container.get("envFrom", []):
                    if "configMapRef" in source:
                        _rename(source["configMapRef"], "name", "ConfigMap", renamed)
                    if "secretRef" in source:
                        _rename(source["secretRef"], "name", "Secret", renamed)
                for variable in container.get("env", []):
                    reference = variable.get("valueFrom", {})
                    if "configMapKeyRef" in reference:
                        _rename(reference["configMapKeyRef"], "name", "ConfigMap", renamed)
                    if "secretKeyRef" in reference:
                        _rename(reference["secretKeyRef"], "name", "Secret", renamed)


def _rename(holder: dict[str, Any], field: str, kind: str, renamed: dict[tuple[str, str], str]) -> None:
    holder[field] = renamed.get((kind, holder[field]), holder[field])


def content_hash(resource: Resource) -> str:
    """kustomize's name suffix of a generated ConfigMap or Secret (api/hasher): the SHA-256
    of the JSON of kind, name, data (and a Secret's type) with sorted keys as Go encodes it,
    the first ten hex digits with 0, 1, 3, a and e replaced by g, h, k, m and t. The name is
    encoded empty: kustomize 5 looks it up as the single field "metadata/name", which no
    resource has (checked against kubectl kustomize, kustomize v5.5.0)."""
    encoded: dict[str, Any] = {"kind": resource["kind"], "name": "", "data": resource.get("data", {})}
    if resource["kind"] == "Secret":
        encoded["type"] = resource.get("type", "Opaque")
    text = json.dumps(encoded, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))
