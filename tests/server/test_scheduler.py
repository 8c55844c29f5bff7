"""The server's scheduler on its own: who gets the next turn, in what order, and what a cancelled wait gives back."""

from __future__ import annotations

import asyncio

import pytest

from dpsql.frontends.server.scheduler import FairScheduler


async def _order(scheduler: FairScheduler, asks: list[str], holders: int) -> list[str]:
    """The order in which `asks` (analysts' names, in the order asked) get a turn, while `holders` turns are held
    by others until every ask waits; each turn is given back as soon as it is got."""
    got: list[str] = []
    for i in range(holders):
        await scheduler.acquire(f"holder{i}")

    async def ask(analyst: str) -> None:
        async with scheduler.turn(analyst):
            got.append(analyst)
            await asyncio.sleep(0)

    tasks = []
    for analyst in asks:
        tasks.append(asyncio.create_task(ask(analyst)))
        await asyncio.sleep(0)  # queued in this order
    for i in range(holders):
        scheduler.release(f"holder{i}")
    await asyncio.gather(*tasks)
    return got


def test_a_second_analyst_is_next_in_turn_after_another_analysts_flood() -> None:
    scheduler = FairScheduler(slots=1, per_analyst=1)
    got = asyncio.run(_order(scheduler, ["alice"] * 8 + ["bob"], holders=1))
    assert got.index("bob") <= 1, got  # at most the one of alice's already next in turn
    assert got.count("alice") == 8


def test_analysts_take_turns_round_robin() -> None:
    scheduler = FairScheduler(slots=1, per_analyst=1)
    got = asyncio.run(_order(scheduler, ["alice"] * 3 + ["bob"] * 3 + ["carol"] * 3, holders=1))
    assert got == ["alice", "bob", "carol"] * 3


def test_no_analyst_holds_more_than_its_share_of_the_turns() -> None:
    async def run() -> tuple[int, int]:
        scheduler = FairScheduler(slots=4, per_analyst=2)
        waiting = [asyncio.create_task(scheduler.acquire("alice")) for _ in range(5)]
        await asyncio.sleep(0)
        alice = sum(task.done() for task in waiting)
        await scheduler.acquire("bob")  # a slot is still free for another analyst
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return alice, scheduler.running
    alice, running = asyncio.run(run())
    assert alice == 2
    assert running == 3  # alice's two and bob's one: the cancelled waits took nothing


def test_a_wait_cancelled_leaves_its_place_to_the_next() -> None:
    async def run() -> list[str]:
        scheduler = FairScheduler(slots=1, per_analyst=1)
        await scheduler.acquire("holder")
        got: list[str] = []

        async def ask(analyst: str) -> None:
            async with scheduler.turn(analyst):
                got.append(analyst)
        cancelled = asyncio.create_task(ask("alice"))
        await asyncio.sleep(0)
        later = asyncio.create_task(ask("bob"))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        scheduler.release("holder")
        await later
        return [*got, str(scheduler.running)]
    assert asyncio.run(run()) == ["bob", "0"]


def test_a_scheduler_needs_a_slot() -> None:
    with pytest.raises(ValueError):
        FairScheduler(slots=0, per_analyst=1)
