"""The documentation against the code and itself: the settings reference of
docs/configuration.md is the one ``make docs`` generates from relayer/config.py (no drift),
every setting has a description, and every relative link (and ``#anchor``) in README.md and
docs/**/*.md resolves to a file inside the repository."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import pytest

from relayer.config import Settings, env_name
from relayer_dev import config_doc
from tests.helpers.docs import FENCE, anchors, slug

ROOT: Final = Path(__file__).resolve().parents[2]
LINK: Final = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
"""An inline Markdown link or image: ``[text](target "title")``; group 1 the target."""
REFERENCE: Final = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s|$)", re.M)
INLINE_CODE: Final = re.compile(r"`[^`\n]*`")
EXTERNAL: Final = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def markdown_files(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code (links there are not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code."""
    prose = _prose(text)
    return LINK.findall(prose) + REFERENCE.findall(prose)


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of ``path`` that do not resolve: a target missing or outside
    ``root``, or an ``#anchor`` no heading of the target Markdown file has."""
    problems = []
    for target in links(path.read_text(encoding="utf-8")):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}: {target}"
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"{where} leaves the repository")
        elif not resolved.exists():
            problems.append(f"{where} does not exist")
        elif (
            anchor
            and resolved.suffix == ".md"
            and anchor not in anchors(resolved.read_text(encoding="utf-8"))
        ):
            problems.append(f"{where}: no heading #{anchor} in {resolved.relative_to(root.resolve())}")
    return problems


# --- the settings reference -------------------------------------------------------------


def test_settings_reference_is_generated_from_the_settings_class() -> None:
    """The committed table is exactly what the generator writes; when not, the message says
    how to regenerate it."""
    assert not config_doc.stale(), (
        "docs/configuration.md's settings reference differs from relayer/config.py: "
        f"run {config_doc.REGENERATE}"
    )


def test_every_setting_is_in_the_reference_with_a_description() -> None:
    assert config_doc.missing_descriptions() == []
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    reference = text.split(config_doc.BEGIN, 1)[1].split(config_doc.END, 1)[0]
    rows = [line for line in reference.splitlines() if line.startswith("| `RELAYER_")]
    assert [row.split("`")[1] for row in rows] == [env_name(n) for n in Settings.model_fields]


def test_drift_is_detected(tmp_path: Path) -> None:
    """A reference edited by hand, or one missing a setting, is stale; writing fixes it."""
    doc = tmp_path / "configuration.md"
    current = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    doc.write_text(current.replace("| `RELAYER_GAS_CAP` |", "| `RELAYER_GAS_CEILING` |"), encoding="utf-8")
    assert config_doc.stale(doc)
    assert config_doc.write(doc) and not config_doc.stale(doc)
    assert doc.read_text(encoding="utf-8") == current


def test_missing_markers_are_an_error(tmp_path: Path) -> None:
    doc = tmp_path / "configuration.md"
    doc.write_text("# Configuration\n", encoding="utf-8")
    with pytest.raises(config_doc.DocError, match="markers"):
        config_doc.stale(doc)


def test_units_types_and_defaults_read_from_the_fields() -> None:
    fields = Settings.model_fields
    assert config_doc.unit_text("settle_wait_s", fields["settle_wait_s"]) == "seconds"
    assert config_doc.unit_text("gas_cap", fields["gas_cap"]) == "gas"  # json_schema_extra
    assert config_doc.type_text(fields["index_chains"].annotation) == "JSON list of IndexChain"
    assert config_doc.bounds_text(fields["gas_cap"]) == "≥ 21000"
    assert config_doc.default_text("rpc_url", fields["rpc_url"]) == "required ¹"
    assert config_doc.default_text("treasury_private_key", fields["treasury_private_key"]) == "unset"
    assert (
        config_doc.default_text("rejected_retention_s", fields["rejected_retention_s"]) == "`604800` (7 days)"
    )


# --- the layout ---------------------------------------------------------------------------


def modules(root: Path = ROOT) -> list[str]:
    """Every Python module of the product, the dev tooling, the benchmarks and the test
    helpers (repository paths; packages' ``__init__.py`` and test files left out), and every
    test file (by name)."""
    found = [
        str(path.relative_to(root))
        for top in ("relayer", "relayer_dev", "bench", "tests")
        for path in sorted((root / top).rglob("*.py"))
        if path.name != "__init__.py" and not path.name.startswith("test_")
    ]
    return found + sorted({p.name for p in (root / "tests").rglob("test_*.py")})


def test_the_layout_names_every_module() -> None:
    """docs/development.md names every module (the README's old Layout missed about 20)."""
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    assert [m for m in modules() if f"`{m}`" not in text] == []


# --- links ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(path: Path) -> None:
    assert broken_links(path) == []


def test_the_docs_have_links_to_check() -> None:
    """The checker sees the README's links into docs/ (a regex that matched nothing would
    pass every file)."""
    readme = links((ROOT / "README.md").read_text(encoding="utf-8"))
    assert "docs/README.md" in readme and len(readme) >= 8


def test_broken_links_are_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## Two words\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md#two-words) [self](#top) [gone](docs/b.md) [out](../elsewhere.md)\n"
        "[anchor](docs/a.md#nowhere) [web](https://example.com/x) `[code](docs/c.md)`\n\n# Top\n",
        encoding="utf-8",
    )
    assert broken_links(page, tmp_path) == [
        "README.md: docs/b.md does not exist",
        "README.md: ../elsewhere.md leaves the repository",
        "README.md: docs/a.md#nowhere: no heading #nowhere in docs/a.md",
    ]


def test_slugs_follow_github() -> None:
    assert slug("The x402 endpoint describes itself") == "the-x402-endpoint-describes-itself"
    assert slug("`relayer status` and the lanes") == "relayer-status-and-the-lanes"
    assert slug("Rotate the executor key (step by step)") == "rotate-the-executor-key-step-by-step"
    assert anchors("# A\n\n## A\n\n```\n# not a heading\n```\n") == {"a", "a-1"}
