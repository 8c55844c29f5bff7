"""Turns to run work on the engine, shared by analyst rather than by arrival.

A server runs several queries at once (`slots`), at most `per_analyst` of one analyst's, and when a slot frees it
goes to the analysts waiting in turn (round robin): one analyst's 64 connections asking at once get at most
`per_analyst` slots, and a second analyst's query, asked after all 64, is next in turn when a slot frees, not
after them. An analyst's own queries run in the order asked.

Everything here runs on the event loop: no locks. A turn that is cancelled while it waits leaves the queue; one
granted just as it was cancelled is given back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator


class FairScheduler:
    def __init__(self, slots: int, per_analyst: int) -> None:
        if slots < 1 or per_analyst < 1:
            raise ValueError("a scheduler needs at least one slot, and one per analyst")
        self.slots = slots
        self.per_analyst = per_analyst
        self._running: dict[str, int] = {}  # analyst -> turns held
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()  # in turn order

    @property
    def running(self) -> int:
        return sum(self._running.values())

    @contextlib.asynccontextmanager
    async def turn(self, analyst: str) -> AsyncIterator[None]:
        """Wait for a turn of `analyst`'s, and hold it for the with-block."""
        await self.acquire(analyst)
        try:
            yield
        finally:
            self.release(analyst)

    async def acquire(self, analyst: str) -> None:
        """Wait for a turn of `analyst`'s; release() gives it back."""
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(analyst, deque()).append(granted)
        self._grant()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(analyst)  # granted as the wait was cancelled: the turn goes to the next
            else:
                self._forget(analyst, granted)
            raise

    def release(self, analyst: str) -> None:
        held = self._running[analyst] - 1
        if held:
            self._running[analyst] = held
        else:
            del self._running[analyst]
        self._grant()

    def _grant(self) -> None:
        """Give free slots to the waiting analysts in turn, each analyst within its own limit."""
        while self.running < self.slots:
            analyst = next((a for a in self._waiting if self._running.get(a, 0) < self.per_analyst), None)
            if analyst is None:
                return
            queue = self._waiting[analyst]
            granted = queue.popleft()
            if queue:
                self._waiting.move_to_end(analyst)  # its next query waits for the others' turns
            else:
                del self._waiting[analyst]
            if granted.done():  # cancelled while it waited, its task not yet told
                continue
            self._running[analyst] = self._running.get(analyst, 0) + 1
            granted.set_result(None)

    def _forget(self, analyst: str, granted: asyncio.Future[None]) -> None:
        queue = self._waiting.get(analyst)
        if queue is not None and granted in queue:
            queue.remove(granted)
            if not queue:
                del self._waiting[analyst]
