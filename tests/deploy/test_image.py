"""deploy/Dockerfile, read (no Docker daemon here): a base image pinned by version and digest
for both stages, the wheel built in the builder and installed alone into a venv in the
runtime, a non-root user, the product's command as the entry point; and a .dockerignore that
lets exactly the wheel's sources into the build context."""

from __future__ import annotations

import itertools
import json
import re
import tomllib
from pathlib import Path
from typing import Final

from packaging.specifiers import SpecifierSet

ROOT: Final = Path(__file__).resolve().parents[2]
DOCKERFILE: Final = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE: Final = ROOT / ".dockerignore"
PINNED_BASE: Final = re.compile(
    r"python:(?P<version>3\.\d+\.\d+)-slim-(?P<debian>bookworm|trixie)@sha256:[0-9a-f]{64}"
)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> dict[str, list[tuple[str, str]]]:
    """The instructions of each named stage."""
    named: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for word, rest in instructions():
        if word == "FROM":
            image, _, name = rest.partition(" AS ")
            assert image == "${PYTHON_IMAGE}", "every stage starts from the one pinned base"
            current = named.setdefault(name.strip(), [])
        elif current is not None:
            current.append((word, rest))
    return named


def test_the_base_image_is_pinned_by_version_and_digest() -> None:
    head = itertools.takewhile(lambda instruction: instruction[0] != "FROM", instructions())
    (arg,) = [rest for word, rest in head if word == "ARG" and rest.startswith("PYTHON_IMAGE=")]
    pinned = PINNED_BASE.fullmatch(arg.removeprefix("PYTHON_IMAGE="))
    assert pinned, arg
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert pinned["version"] in SpecifierSet(project["requires-python"])


def test_two_stages_and_the_runtime_is_the_last() -> None:
    assert list(stages()) == ["builder", "runtime"]


def test_the_builder_builds_the_wheel_from_binary_dependencies() -> None:
    runs = " ".join(rest for word, rest in stages()["builder"] if word == "RUN")
    assert "pip wheel" in runs and "--only-binary=:all:" in runs
    assert "apt-get" not in runs


def test_the_runtime_installs_only_the_wheel_into_a_venv_as_a_non_root_user() -> None:
    runtime = stages()["runtime"]
    runs = " ".join(rest for word, rest in runtime if word == "RUN")
    assert "venv --without-pip /opt/relayer" in runs
    assert "--no-index --find-links /wheels relayer" in runs
    assert "--mount=type=bind,from=builder,source=/wheels" in runs  # the wheels stay out of the image
    for tool in ("apt-get", "gcc", "build-essential"):
        assert tool not in runs
    assert not [rest for word, rest in runtime if word == "COPY"], "nothing but the installed wheel"
    users = [rest for word, rest in runtime if word == "USER"]
    assert users == ["10001:10001"]
    assert ("ENTRYPOINT", '["relayer"]') in runtime
    assert ("CMD", '["serve"]') in runtime
    (expose,) = [rest for word, rest in runtime if word == "EXPOSE"]
    assert expose.split() == ["8402", "9402"]
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    assert "PATH=/opt/relayer/bin:$PATH" in env and "RELAYER_HTTP_HOST=0.0.0.0" in env
    healthcheck = [rest for word, rest in runtime if word == "HEALTHCHECK"]
    assert len(healthcheck) == 1 and "/healthz" in healthcheck[0]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["relayer"] == "relayer.__main__:main"


def test_the_build_context_is_exactly_the_wheel_sources() -> None:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", ".dockerignore is an allowlist"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set()
    for word, rest in stages()["builder"]:
        if word == "COPY":
            *sources, _ = json.loads(rest) if rest.startswith("[") else rest.split()
            copied |= set(sources)
    assert copied == allowed
    # the package data the wheel ships through symlinks into the top-level directories
    links = {p.readlink().name for p in (ROOT / "relayer").iterdir() if p.is_symlink()}
    assert links == {"contracts_abi", "migrations", "data"}
    assert links <= copied
    for secret_place in (".venv", ".devdata", "node_modules", ".git", "tests"):
        assert secret_place not in allowed
