"""The peers, each in its own virtualenv under benchmarks/.venvs/, driven through a runner subprocess.

dpsql's own dependencies never see a peer's: `python -m benchmarks setup-peers` creates the virtualenvs with pip
(the only network access the benchmarks need; everything runs offline afterwards), and each benchmark sends the
peer's runner (benchmarks/peers/<peer>_runner.py) a JSON job on stdin and reads JSON lines back. A peer that is
not set up, or that fails or times out, is reported as skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.workload import Kind, Query

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"
RUNNERS = HERE / "peers"


class PeerUnavailable(Exception):
    """The peer cannot run here; the message is the reason reported as "skipped"."""


@dataclass(frozen=True)
class Peer:
    name: str
    label: str  # as shown in tables and plots
    requirements: tuple[str, ...]  # pinned: the versions these benchmarks were written against
    module: str  # what must import in the venv
    kinds: frozenset[Kind] = frozenset(Kind)  # the aggregate kinds it can compute
    missing: str = ""  # why the others are not compared

    def unsupported(self, query: Query) -> str | None:
        """Why this peer cannot run the query, or None if it can."""
        return None if all(a.kind in self.kinds for a in query.aggregates) else self.missing

    @property
    def venv(self) -> Path:
        return VENVS / self.name

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def runner(self) -> Path:
        return RUNNERS / f"{self.name}_runner.py"

    def check(self) -> None:
        """Raise PeerUnavailable with the reason if the peer cannot run."""
        if not self.python.exists():
            raise PeerUnavailable(f"no virtualenv at {self.venv.relative_to(HERE.parent)}: run "
                                  f"`python -m benchmarks setup-peers`")
        probe = subprocess.run([str(self.python), "-c", f"import {self.module}"], capture_output=True, text=True,
                               env=_clean_env())
        if probe.returncode != 0:
            raise PeerUnavailable(f"`import {self.module}` fails in {self.venv.name}'s virtualenv: "
                                  f"{_last_line(probe.stderr)}")

    def setup(self, echo: Callable[[str], None]) -> None:
        if not self.python.exists():
            echo(f"creating {self.venv}")
            subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True, env=_clean_env())
        echo(f"pip install {' '.join(self.requirements)} into {self.venv}")
        subprocess.run([str(self.python), "-m", "pip", "install", "--quiet", *self.requirements], check=True,
                       env=_clean_env())

    def run(self, job: dict[str, Any], on_record: Callable[[dict[str, Any]], None],
            timeout: float | None = None) -> None:
        """Run one job in the peer's virtualenv; see run_job."""
        self.check()
        run_job([str(self.python), str(self.runner)], job, on_record, self.label, timeout, env=_clean_env())


def run_job(command: list[str], job: dict[str, Any], on_record: Callable[[dict[str, Any]], None], label: str,
            timeout: float | None = None, env: dict[str, str] | None = None) -> None:
    """Send `job` as JSON to a subprocess; every JSON line it prints goes to `on_record` as soon as it is printed.

    Raises PeerUnavailable when the process fails (with the last line of its stderr) or runs out of time.
    """
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                   text=True, cwd=HERE.parent, env=env)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            process.kill()

        timer = threading.Timer(timeout, expire) if timeout else None
        if timer:
            timer.start()
        try:
            process.stdin.write(json.dumps(job))
            process.stdin.close()
            for line in process.stdout:
                on_record(json.loads(line))
            code = process.wait()
        finally:
            if timer:
                timer.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
        if expired.is_set():
            raise PeerUnavailable(f"{label} did not finish within {timeout:.0f} s")
        if code != 0:
            errors.seek(0)
            raise PeerUnavailable(f"{label} failed: {_last_line(errors.read())}")


def _clean_env() -> dict[str, str]:
    """The environment without PYTHONPATH: a peer's virtualenv must not see dpsql's packages, nor they its."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no error message"


# pyarrow: pandas needs it to read the parquet files the synthetic data is stored in.
SMARTNOISE = Peer("smartnoise", "SmartNoise SQL", ("smartnoise-sql==1.0.10", "pyarrow==26.0.1"), "snsql, pyarrow")
OPENDP = Peer("opendp", "OpenDP Polars", ("opendp[polars]==0.16.0",), "opendp, polars",
              frozenset({Kind.COUNT, Kind.SUM, Kind.AVG}), "OpenDP's Polars API has no VAR or STDDEV aggregate")
# Tumult Analytics runs on PySpark, which needs Java 17 on the PATH (or JAVA_HOME); pip installs PySpark itself.
TUMULT = Peer("tumult", "Tumult Analytics", ("tmlt.analytics==0.21.0", "tmlt.core==0.19.1", "pyspark==3.5.9"),
              "tmlt.analytics, pyspark")
PEERS = (SMARTNOISE, OPENDP, TUMULT)


def by_name(names: list[str]) -> tuple[Peer, ...]:
    known = {p.name: p for p in PEERS}
    return tuple(known[n] for n in names)
