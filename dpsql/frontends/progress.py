"""Progress on stderr, the way command-line tools show it: a live line on a terminal, plain lines in a log.

On a terminal a step's line appears once it has run for a second and is redrawn in place (`dpsql: reading
visits.csv into table visits: 42%, 12 s`); without one (a pipe, a log file, cron) a plain line is written every few
seconds instead, so that a log shows the work is alive without being flooded. `--quiet` shows nothing.

What is shown depends on who is asking (engines/progress.py): the steward's commands (`prepare`, `policy check`,
`serve`) are detailed, with how far DuckDB's statement has gone and, at the end of each step, its result (a
table's row count); an analyst's query is shown its elapsed time only, never a figure read from the data.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from dpsql.engines.progress import SILENT, Percent, Progress, Step

_LIVE_AFTER = 1.0  # seconds before a terminal shows a step: quick work stays quiet
_LIVE_EVERY = 0.25  # seconds between redraws of the live line
_PLAIN_EVERY = 5.0  # seconds between plain lines (and before the first)


class ShownProgress(Progress):
    """Steps shown on `stream`: redrawn in place when `live` (a terminal), else as a plain line every `every`
    seconds. A step that was shown, or that has a result to say (detailed reporters), ends with a line saying it is
    done."""

    def __init__(self, stream: TextIO, *, live: bool, detailed: bool, after: float | None = None,
                 every: float | None = None) -> None:
        self.stream = stream
        self.live = live
        self.detailed = detailed
        self.after = after if after is not None else (_LIVE_AFTER if live else _PLAIN_EVERY)
        self.every = every if every is not None else (_LIVE_EVERY if live else _PLAIN_EVERY)

    @contextlib.contextmanager
    def step(self, what: str, percent: Percent | None = None) -> Iterator[Step]:
        step = Step()
        started = time.monotonic()
        stop = threading.Event()
        shown = threading.Event()
        ticker = threading.Thread(target=self._tick, args=(what, percent if self.detailed else None, started,
                                                           stop, shown), name="dpsql-progress", daemon=True)
        ticker.start()
        try:
            yield step
        finally:  # failed or not, the live line goes: the error is said on a line of its own
            stop.set()
            ticker.join()
            if self.live and shown.is_set():
                self._write("\r\x1b[K")
        result = step.result if self.detailed else None
        if shown.is_set() or result:
            self._write(f"dpsql: {what}: done in {time.monotonic() - started:.1f} s" + (f", {result}\n" if result
                                                                                        else "\n"))

    def _tick(self, what: str, percent: Percent | None, started: float, stop: threading.Event,
              shown: threading.Event) -> None:
        wait = self.after
        while not stop.wait(wait):
            done = percent() if percent is not None else None
            line = f"dpsql: {what}" + (f": {done:.0f}%" if done is not None else "") + \
                   f", {time.monotonic() - started:.0f} s"
            if self.live:
                width = shutil.get_terminal_size().columns
                self._write("\r\x1b[K" + line[:max(width - 1, 1)])
            else:
                self._write(line + "\n")
            shown.set()
            wait = self.every

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stderr must not fail the work
            self.stream.write(text)
            self.stream.flush()


def for_stream(stream: TextIO, *, quiet: bool, detailed: bool) -> Progress:
    """The reporter a command uses on `stream`: silent with --quiet, live on a terminal, plain lines otherwise."""
    if quiet:
        return SILENT
    return ShownProgress(stream, live=_is_terminal(stream), detailed=detailed)


def _is_terminal(stream: TextIO) -> bool:
    """A terminal that can redraw a line (not TERM=dumb, as in an editor's shell buffer)."""
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False
