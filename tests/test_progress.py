"""The command line in a terminal, and progress on stderr.

In a terminal (a pseudo-terminal here, as a steward's shell gives) building a prepared store used to exit 70:
DuckDB 2.0 refuses `enable_progress_bar` as a startup option. Progress is now dpsql's own, on stderr: a live line on
a terminal, plain lines otherwise, nothing with --quiet; the steward's commands show how far each step has gone and
each table's row count, an analyst's query its elapsed time only.
"""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pytest

from dpsql.engines.progress import SILENT, Progress
from dpsql.frontends import progress as shown
from dpsql.frontends.progress import ShownProgress, for_stream
from tests.conftest import ROOT
from tests.test_cli import run

STORED = "\n[engine]\nstore = true\n"


def in_terminal(*args: str, cwd: Path) -> tuple[int, str]:
    """Run `dpsql ARGS` with a pseudo-terminal as its stdin, stdout and stderr: its exit code and what it wrote."""
    controller, terminal = pty.openpty()
    env = {**os.environ, "DPSQL_ANALYST": "tty", "TERM": "xterm", "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "dpsql", *args], stdin=terminal, stdout=terminal,
                               stderr=terminal, cwd=cwd, env=env, close_fds=True)
    os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO: every end of the terminal is closed
            break
        if not chunk:
            break
        output += chunk
    os.close(controller)
    return process.wait(), output.decode(errors="replace")


@pytest.fixture
def stored_policy(visits_policy: Path) -> Path:
    """The sample policy with `[engine] store = true`: its store is missing until something builds it."""
    visits_policy.write_text(visits_policy.read_text().replace("[tables.visits]\n", f"{STORED}\n[tables.visits]\n",
                                                               1))
    return visits_policy


@pytest.mark.parametrize("command", [
    ("prepare", "--policy", "{policy}"),
    ("query", "SELECT COUNT(*) FROM visits", "--policy", "{policy}"),
    ("policy", "check", "{policy}"),
])
def test_building_a_store_in_a_terminal_works(stored_policy: Path, command: tuple[str, ...]) -> None:
    store = stored_policy.parent / "visits.store.duckdb"
    code, output = in_terminal(*(part.format(policy=stored_policy) for part in command), cwd=stored_policy.parent)
    assert code == 0, output
    assert "internal error" not in output and store.exists()


def test_the_steward_sees_each_table_and_its_rows(stored_policy: Path) -> None:
    code, out, err = run("prepare", "--policy", str(stored_policy))
    assert code == 0, err
    assert "prepared store" in out and "built" in out
    lines = err.splitlines()
    for table, rows in (("visits", 4208), ("patients", 2000), ("departments", 8), ("regions", 5)):
        assert any(f"into table {table}: done in " in line and line.endswith(f", {rows:,} rows") for line in lines), err
    (stored_policy.parent / "visits.store.duckdb").unlink()
    code, out, err = run("prepare", "--policy", str(stored_policy), "--quiet")
    assert code == 0 and "built" in out and err == ""


def test_an_analysts_query_shows_elapsed_time_only(visits_policy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step shown at once (as a long one would be): a query shows its steps and their time, never a row
    count or how far a scan has gone."""
    monkeypatch.setattr(shown, "_PLAIN_EVERY", 0.0)
    code, _out, err = run("query", "SELECT COUNT(*) FROM visits", "--policy", str(visits_policy))
    assert code == 0, err
    steps = [line for line in err.splitlines() if line.startswith("dpsql: ")]
    assert any(line.startswith("dpsql: loading the tables, ") for line in steps), err
    assert any(line.startswith("dpsql: running the query: done in ") for line in steps), err
    assert not any("rows" in line or "%" in line for line in steps), err
    code, _out, err = run("query", "SELECT COUNT(*) FROM visits", "--policy", str(visits_policy), "-q")
    assert code == 0 and not any(line.startswith("dpsql: ") for line in err.splitlines())


class _Lines(io.StringIO):
    """A stream that says when it has been written to `wanted` times."""

    def __init__(self, wanted: int) -> None:
        super().__init__()
        self.wanted = wanted
        self.enough = threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.getvalue().count("dpsql: ") >= self.wanted:
            self.enough.set()
        return written


def test_plain_lines_say_the_step_how_far_and_how_long() -> None:
    stream = _Lines(2)
    reporter = ShownProgress(stream, live=False, detailed=True, after=0.0, every=0.001)
    with reporter.step("reading big.csv into table big", lambda: 42.4) as step:
        assert stream.enough.wait()
        step.result = "8,000,000 rows"
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("dpsql: reading big.csv into table big: 42%, ") and lines[0].endswith(" s")
    assert lines[-1].startswith("dpsql: reading big.csv into table big: done in ")
    assert lines[-1].endswith(" s, 8,000,000 rows") and "\r" not in stream.getvalue()


def test_a_live_line_is_redrawn_in_place_and_cleared() -> None:
    stream = _Lines(2)
    reporter = ShownProgress(stream, live=True, detailed=True, after=0.0, every=0.001)
    with reporter.step("writing the prepared store", lambda: None):
        assert stream.enough.wait()
    text = stream.getvalue()
    assert text.startswith("\r\x1b[Kdpsql: writing the prepared store, ")
    assert "\n" not in text.rsplit("\r\x1b[K", 1)[0]  # one line, redrawn: no line feed until the step is done
    assert text.endswith("\r\x1b[Kdpsql: writing the prepared store: done in " + text.rsplit("done in ", 1)[1])


def test_a_reporter_for_analysts_never_asks_the_data() -> None:
    asked: list[int] = []
    stream = _Lines(2)
    reporter = ShownProgress(stream, live=False, detailed=False, after=0.0, every=0.001)
    with reporter.step("running the query", lambda: asked.append(1) or 50.0) as step:
        assert stream.enough.wait()
        step.result = "4,208 rows"
    assert asked == [] and "%" not in stream.getvalue() and "rows" not in stream.getvalue()


def test_quiet_and_pipes_choose_their_reporter() -> None:
    assert for_stream(io.StringIO(), quiet=True, detailed=True) is SILENT
    plain = for_stream(io.StringIO(), quiet=False, detailed=True)
    assert isinstance(plain, ShownProgress) and not plain.live and plain.detailed
    assert not Progress.detailed  # engines report nothing unless given a reporter


def test_the_engine_is_locked_after_a_load_with_progress(visits_policy: Path) -> None:
    """The progress bar is switched on for the load alone, before the sandbox locks the configuration: afterwards
    it is off, and nothing can switch it (or anything else) back on."""
    from dpsql.engines.duckdb_engine import DuckDBEngine
    from dpsql.policy import load_policy

    asked = ShownProgress(io.StringIO(), live=False, detailed=True)
    engine = DuckDBEngine(load_policy(visits_policy), progress=asked)
    try:
        con = engine._con
        assert con.execute("SELECT current_setting('enable_progress_bar'), "
                           "current_setting('lock_configuration')").fetchone() == (False, True)
        with pytest.raises(duckdb.Error, match="locked"):
            con.execute("SET enable_progress_bar = true")
    finally:
        engine.close()
