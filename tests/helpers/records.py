"""The catalogue's record of one carbon project, as the pure tests of the catalogue use it."""

from __future__ import annotations

import copy
from typing import Any

_RECORD: dict[str, Any] = {
    "key": "VCS-10",
    "registry": "VCS",
    "projectID": "10",
    "name": "BAESA Project",
    "country": "Brazil",
    "region": "",
    "methodologies": [],
    "category": "Renewable Energy",
    "vintages": [],
    "latitude": None,
    "longitude": None,
    "url": "",
    "sdgs": [],
    "description": "",
    "source": "test",
}


def project_record(**changes: Any) -> dict[str, Any]:
    """A fresh copy of the project record of VCS-10 (BAESA Project, Renewable Energy, Brazil;
    no methodologies, vintages, url or SDGs, source ``test``) with ``changes`` applied (its
    keys in the catalogue's order, a new key last)."""
    return {**copy.deepcopy(_RECORD), **changes}
