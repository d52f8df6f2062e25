"""The one strict base of the pydantic models that validate what comes in (request bodies,
queries, settings' JSON values): an unknown key is an error and a validated model is immutable.
A model adds its own options (``str_strip_whitespace``, ``populate_by_name``) on top.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """``extra="forbid"`` (unknown keys are validation errors) and ``frozen=True``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
