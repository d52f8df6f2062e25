"""The one strict base of the pydantic models that validate what comes in (request bodies,
queries, settings' JSON values): an unknown key is an error and a validated model is immutable.
A model adds its own options (``str_strip_whitespace``, ``populate_by_name``) on top; a
refusal names each field and the rule it broke (:func:`field_problems`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError
from pydantic_core import ErrorDetails

IsoDate = Annotated[str, StringConstraints(pattern=r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$")]
"""A date ``YYYY-MM-DD`` (months 01-12, days 01-31): the consumption period's ends, on the x402
surface and the marketplace's orders alike."""
CountryCode = Annotated[str, StringConstraints(pattern=r"^[A-Z]{2}$")]
"""An ISO 3166-1 alpha-2 country code (two capitals)."""


class StrictModel(BaseModel):
    """``extra="forbid"`` (unknown keys are validation errors) and ``frozen=True``."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _child(here: Any, part: str | int) -> tuple[bool, Any]:
    """``here[part]`` when ``here`` (a JSON object or array) has it."""
    if isinstance(here, Mapping) and part in here:
        return True, here[part]
    if isinstance(here, list) and isinstance(part, int) and 0 <= part < len(here):
        return True, here[part]
    return False, None


def _field_path(data: Any, loc: tuple[str | int, ...], last_is_field: bool) -> tuple[str | int, ...]:
    """The part of a pydantic ``loc`` that names the input's keys and indexes: pydantic adds a
    union member's tag (``constrained-str``, ``int``, ``function-after[...]``) to ``loc``,
    which is no field of the request and is dropped; a missing field's name is kept."""
    path: list[str | int] = []
    here = data
    for n, part in enumerate(loc):
        found, child = _child(here, part)
        if found:
            here = child
        elif not (last_is_field and n == len(loc) - 1):
            continue
        path.append(part)
    return tuple(path)


def _rule(error: ErrorDetails) -> str:
    """The broken rule in words: a validator's own message without pydantic's prefix."""
    if error["type"] in ("value_error", "assertion_error") and "ctx" in error:
        return str(error["ctx"].get("error", error["msg"]))
    return error["msg"]


def field_problems(exc: ValidationError, data: Any) -> list[tuple[tuple[str | int, ...], str]]:
    """``exc`` as one ``(path, rule)`` per field of ``data`` that broke a rule (the rules of
    a union's members joined with "; or "), in the order pydantic found them; unknown keys
    are reported one each with the rule "unrecognized key". Paths name the input's own keys
    and list indexes only, never pydantic's internal tags; values are never echoed."""
    found: dict[tuple[str | int, ...], list[str]] = {}
    for error in exc.errors(include_url=False):
        missing = error["type"] in ("missing", "extra_forbidden")
        path = _field_path(data, tuple(error["loc"]), missing)
        rule = "unrecognized key" if error["type"] == "extra_forbidden" else _rule(error)
        rules = found.setdefault(path, [])
        if rule not in rules:
            rules.append(rule)
    return [(path, "; or ".join(rules)) for path, rules in found.items()]
