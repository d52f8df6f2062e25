"""The settings reference of ``docs/configuration.md``, generated from the settings class
(:class:`relayer.config.Settings`): one table row per setting with its environment variable,
type (and bounds), default, unit and description. ``python -m relayer_dev config-doc`` (or
``make docs``) writes it between the markers of that file; ``tests/unit/test_docs.py`` fails
when the committed table differs from what this module generates."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any, Final, Union, get_args, get_origin

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from relayer.__main__ import DAEMON_SETTINGS
from relayer.config import SECRETS_DIR, Settings, env_name

REGENERATE: Final = "make docs (python -m relayer_dev config-doc)"
"""The command that rewrites the reference, named wherever it is found stale."""
BEGIN: Final = (
    f"<!-- BEGIN settings reference: generated from relayer/config.py by `{REGENERATE}`; do not edit -->"
)
END: Final = "<!-- END settings reference -->"
DOC_FILE: Final = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

_SUFFIX_UNITS: Final = (
    ("_wei_per_day", "wei per UTC day"),
    ("_wei", "wei"),
    ("_bps", "basis points (1/10,000)"),
    ("_ms", "milliseconds"),
    ("_s", "seconds"),
    ("_bytes", "bytes"),
    ("_usdc", "USDC atomic units (10⁻⁶ USDC)"),
)
"""A setting's unit from the end of its name; ``json_schema_extra={"unit": …}`` overrides it."""
_TYPE_NAMES: Final[dict[Any, str]] = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    Path: "file path",
    SecretStr: "secret string",
}
_BOUNDS: Final = (
    (annotated_types.Ge, "ge", "≥"),
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Le, "le", "≤"),
    (annotated_types.Lt, "lt", "<"),
)


class DocError(Exception):
    """The documentation file lacks the reference's markers."""


def type_text(annotation: Any) -> str:
    """A setting's type in words: ``int | None`` -> ``integer``, ``list[IndexChain]`` ->
    ``JSON list of IndexChain``, ``SecretStr`` -> ``secret string`` (None is left out: an
    unset optional setting shows as its default)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join(type_text(arg) for arg in get_args(annotation) if arg is not type(None))
    if origin is list:
        (item,) = get_args(annotation)
        return f"JSON list of {getattr(item, '__name__', item)}"
    return _TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds_text(field: FieldInfo) -> str:
    """The field's numeric bounds, e.g. ``≥ 1`` or ``> 0`` (empty without any)."""
    found = []
    for meta in field.metadata:
        for kind, attr, sign in _BOUNDS:
            if isinstance(meta, kind):
                found.append(f"{sign} {_value_text(getattr(meta, attr))}")
    return ", ".join(found)


def default_text(name: str, field: FieldInfo) -> str:
    """The default as it would be written in the environment, or what stands in for it: a
    required setting says so, an unset optional one says ``unset``."""
    if field.default_factory is not None:
        return f"`{_value_text(field.default_factory())}`"  # type: ignore[call-arg]
    if field.default is None or field.default is PydanticUndefined:
        return "required ¹" if name in DAEMON_SETTINGS else "unset"
    gloss = _gloss(field.default, unit_text(name, field))
    return f"`{_value_text(field.default)}`" + (f" ({gloss})" if gloss else "")


def _gloss(value: Any, unit: str) -> str:
    """A large default in a readable unit: wei as ETH or gwei, seconds as hours or days,
    bytes as KiB; empty when the number reads well as it is."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return ""
    if unit.startswith("wei"):
        if value >= 10**15:
            return f"{value / 10**18:g} ETH"
        return f"{value / 10**9:g} gwei" if value >= 10**8 else ""
    if unit.startswith("USDC atomic"):
        return f"{value / 10**6:g} USDC"
    if unit == "seconds" and value >= 3600:
        days, hours = value / 86_400, value / 3600
        return f"{days:g} days" if days >= 1 and days.is_integer() else f"{hours:g} h"
    if unit == "bytes" and value >= 1024 and value % 1024 == 0:
        return f"{value // 1024} KiB"
    return ""


def unit_text(name: str, field: FieldInfo) -> str:
    """The unit: the field's ``json_schema_extra["unit"]``, else from its name's suffix
    (``_s`` seconds, ``_wei`` wei, …), else ``—``."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("unit"), str):
        return str(extra["unit"])
    return next((unit for suffix, unit in _SUFFIX_UNITS if name.endswith(suffix)), "—")


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _cell(text: str) -> str:
    """Table-safe: pipes escaped, whitespace collapsed."""
    return " ".join(text.split()).replace("|", "\\|")


def missing_descriptions() -> list[str]:
    """Settings without a description (the reference needs one for each)."""
    return [name for name, field in Settings.model_fields.items() if not (field.description or "").strip()]


def settings_reference() -> str:
    """The reference: a Markdown table of every setting in the class's order, and its notes.

    Raises:
        DocError: a setting has no description.
    """
    if missing := missing_descriptions():
        raise DocError(f"settings without a description in relayer/config.py: {', '.join(missing)}")
    rows = ["| variable | type | default | unit | description |", "|---|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        kind = type_text(field.annotation)
        if bounds := bounds_text(field):
            kind += f" ({bounds})"
        description = field.description or ""
        cells = (f"`{env_name(name)}`", kind, default_text(name, field), unit_text(name, field), description)
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    required = ", ".join(f"`{env_name(n)}`" for n in DAEMON_SETTINGS)
    notes = [
        "",
        f"{len(Settings.model_fields)} settings. ¹ Required by `relayer serve`, `work` and `all` "
        f"({required}; the executor key may come from the keystore instead); `relayer migrate`, "
        "`status`, `ledger`, `catalogue load` and `apikey create` need only the database URL.",
        "",
        "Every setting is read from the environment first, then from a secret file under "
        f"`{SECRETS_DIR}` (when that directory exists) named as the setting (`executor_private_key`) "
        "or as its variable. An empty value counts as unset.",
    ]
    return "\n".join(rows + notes) + "\n"


def render(text: str) -> str:
    """``text`` (the documentation file) with the reference between its markers replaced by
    the generated one.

    Raises:
        DocError: a marker is missing, or they are out of order.
    """
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise DocError(f"the settings reference markers are missing: add {BEGIN!r} and {END!r}")
    return text[: start + len(BEGIN)] + "\n\n" + settings_reference() + "\n" + text[end:]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DocError(f"{path} cannot be read ({type(exc).__name__})") from None


def stale(path: Path = DOC_FILE) -> bool:
    """Whether the committed reference in ``path`` differs from the generated one.

    Raises:
        DocError: the file cannot be read or lacks the markers.
    """
    text = _read(path)
    return render(text) != text


def write(path: Path = DOC_FILE) -> bool:
    """Rewrite the reference in ``path``; whether anything changed.

    Raises:
        DocError: the file cannot be read or lacks the markers.
    """
    text = _read(path)
    new = render(text)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text
