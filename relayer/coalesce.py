"""Work that callers ask for one item at a time, done in batches without a timer: the first
caller starts a batch at once, and the callers that come while it runs go together in the next
(at most ``max_batch`` a batch). Used for the relay's simulations (one ``eth_call`` a batch) and
for the move of simulated jobs (one statement a batch): under load a retirement shares them;
alone, it waits for nothing."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    """``await coalescer(item)``: ``run``'s result for ``item``, from the batch it joined.

    ``run`` is given the batch's items in the order they came and returns one result each, in
    that order; when it raises, every caller of that batch gets its exception. A caller that
    is cancelled leaves its batch running for the others; when the batch task itself is
    cancelled (the process stops), every caller waiting is cancelled.
    """

    def __init__(self, run: Callable[[Sequence[T]], Awaitable[Sequence[R]]], max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run = run
        self.max_batch = max_batch
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._running: list[tuple[T, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, item: T) -> R:
        """Raises: what ``run`` raised for this item's batch."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._task is None or self._task.done():
            # A context of its own: a batch's lines are no one request's.
            self._task = asyncio.create_task(self._drain(), context=contextvars.Context())
            self._task.add_done_callback(self._ended)
        return await future

    async def _drain(self) -> None:
        while self._waiting:
            self._running = self._waiting[: self.max_batch]
            del self._waiting[: len(self._running)]
            await self._one(self._running)
        self._running = []

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A batch task cancelled (even before it ran) or broken: the callers of its batch,
        and the ones waiting unless a newer task takes them, are cancelled: none is left
        waiting for ever. (A newer task has not run yet: its batch is not ``_running``.)"""
        if task.cancelled() or task.exception() is not None:
            ended = [*self._running, *(self._waiting if task is self._task else [])]
            for _item, future in ended:
                future.cancel()
            self._running = []
            if task is self._task:
                self._waiting = []

    async def _one(self, batch: Sequence[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run([item for item, _future in batch])
        except Exception as exc:  # every caller of the batch is told
            for _item, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_item, future), result in zip(batch, results, strict=True):
            if not future.done():  # its caller may have gone
                future.set_result(result)
