"""A done callback for tasks that run ahead of whoever may need their outcome (a read ahead, a
speculation): nobody may await such a task, so its failure is retrieved here, never reported
by asyncio as never retrieved; a caller that does await it still gets the failure."""

from __future__ import annotations

import asyncio
from typing import Any


def retrieved(task: asyncio.Future[Any]) -> None:
    """Retrieve ``task``'s failure, if any (use with ``add_done_callback``)."""
    if not task.cancelled():
        task.exception()
