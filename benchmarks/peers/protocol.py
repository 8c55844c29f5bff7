"""What the peer runners share: a JSON job on stdin, JSON lines on stdout.

The runners execute inside each peer's own virtualenv (benchmarks/.venvs/<peer>), which has neither dpsql nor
the benchmarks package installed, so this module uses the standard library only. A runner prints one JSON object
per line as results become ready; the parent reads them as they come (for its progress bar) and treats a
non-zero exit as "peer failed", with stderr as the reason.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable
from typing import Any


def read_job() -> dict[str, Any]:
    return json.load(sys.stdin)


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record, default=_plain), flush=True)


def _plain(value: Any) -> Any:
    """numpy scalars and the like, as plain Python numbers or strings."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def peak_rss_mb() -> float:
    """The process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def number(value: Any) -> float | None:
    """A released value as a float; None when the peer released nothing usable."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def refused(query: str, epsilon: float, error: Exception) -> None:
    """The peer would not answer this query at this epsilon (e.g. SmartNoise refuses noise scales above 1e7)."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    emit({"kind": "refused", "query": query, "epsilon": epsilon, "reason": f"{type(error).__name__}: {reason}"})


def speed_record(load_s: float, times: list[float], **extra: Any) -> dict[str, Any]:
    return {"kind": "speed", "load_s": load_s, "times": times, "peak_rss_mb": peak_rss_mb(), **extra}


def run(handlers: dict[str, Callable[[dict[str, Any]], None]]) -> None:
    """Dispatch the job on its mode ("accuracy" or "speed")."""
    job = read_job()
    handlers[job["mode"]](job)
