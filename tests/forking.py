"""Running a piece of a test in a forked child: what a process that forked after dpsql took locks or drew noise
sees."""

from __future__ import annotations

import os
from collections.abc import Callable


def in_forked_child(work: Callable[[], bytes]) -> bytes:
    """Fork, run `work` in the child and return the bytes it gave (the child exits at once, whatever happens)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        try:
            os.close(read)
            os.write(write, work())
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return b"".join(chunks)
