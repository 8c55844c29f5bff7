"""SecureRandom buffers os.urandom in 16 KiB blocks. A process that forks after drawing (a pre-forking server, a
multiprocessing pool with the fork start method, an application that made its PrivateSession before forking)
hands the unread rest of the block to the child: parent and child then draw the SAME noise, and two answers noised
with the same draw differ by exactly the difference of their true values (the noise cancels)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from dpsql.dp.noise import SecureRandom
from tests.forking import in_forked_child

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _draws_in_child(source: SecureRandom, count: int) -> list[int]:
    payload = in_forked_child(lambda: ",".join(str(source.randbelow(1 << 30)) for _ in range(count)).encode())
    return [int(x) for x in payload.decode().split(",")]


def test_a_forked_child_does_not_repeat_the_parents_noise() -> None:
    source = SecureRandom()
    source.randbelow(2)  # fills the buffer
    count = 50
    child = _draws_in_child(source, count)
    parent = [source.randbelow(1 << 30) for _ in range(count)]
    # Independent uniform draws below 2**30 agree by chance with probability 50 / 2**30 at most.
    assert sum(a == b for a, b in zip(parent, child, strict=True)) == 0


def test_a_lock_held_at_fork_does_not_hang_the_child() -> None:
    """A fork while another thread holds the lock leaves the child's copy locked forever (its owner does not
    exist there): the child must get a fresh lock with its fresh buffer."""
    source = SecureRandom()
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with source._lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait()
    try:
        answer = in_forked_child(lambda: b"1" if source._lock.acquire(blocking=False) else b"0")
    finally:
        release.set()
        thread.join()
    assert answer == b"1"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
