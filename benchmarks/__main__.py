"""python -m benchmarks accuracy|speed|overhead|all [--quick] [--out DIR] [--peers/--no-peers]; setup-peers.

Each benchmark writes its CSVs to --out, then the summary (summary.md) and the plots are rebuilt from every CSV
found there, so running one part refreshes its figures and keeps the others'.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import click

import dpsql
from benchmarks import accuracy as accuracy_bench
from benchmarks import overhead as overhead_bench
from benchmarks import speed as speed_bench
from benchmarks.config import FULL, QUICK, BenchConfig
from benchmarks.datasets import DATA_DIR, pums, visits
from benchmarks.peers_env import PEERS, Peer, PeerUnavailable, by_name
from benchmarks.plots import write_plots
from benchmarks.records import Cost, Observation, Skipped, Truth, write_csv
from benchmarks.report import write_summary
from benchmarks.stats import CellRatio, CellStat, best_peer_ratios, cell_stats, ratios
from benchmarks.workload import PUMS_QUERIES, VISITS_QUERIES

RESULTS = Path(__file__).resolve().parent / "results"


class Run:
    """What every benchmark command shares: the configuration, the output folder, the peers and a scratch folder."""

    def __init__(self, quick: bool, out: Path | None, peers: bool, data_dir: Path) -> None:
        self.config: BenchConfig = QUICK if quick else FULL
        self.out = out or (RESULTS / "quick" if quick else RESULTS)
        self.out.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        self.peers, self.unavailable = _peers(peers)
        self.work = Path(tempfile.mkdtemp(prefix="dpsql-bench-"))

    def skipped(self, part: str) -> list[Skipped]:
        return [Skipped(part, peer, "all", reason) for peer, reason in self.unavailable]

    def info(self, part: str, started: float, **extra: object) -> None:
        info = {"part": part, "config": self.config.name, "started": time.strftime("%Y-%m-%d %H:%M:%S",
                                                                                 time.localtime(started)),
                "seconds": round(time.time() - started, 1), "python": sys.version.split()[0],
                "machine": platform.platform(), "peers": [p.name for p in self.peers], "dpsql": dpsql_source(),
                **extra}
        (self.out / f"run_{part}.json").write_text(json.dumps(info, indent=2, default=str) + "\n")


def dpsql_source() -> dict[str, str]:
    """Which dpsql was measured: its folder, a hash of its sources, and the git commit if there is one."""
    folder = Path(dpsql.__file__).resolve().parent
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(folder.glob("*.py")))).hexdigest()[:16]
    source = {"path": str(folder), "sources_sha256": digest}
    git = subprocess.run(["git", "-C", str(folder), "log", "-1", "--format=%H"], capture_output=True, text=True)
    if git.returncode == 0 and git.stdout.strip():
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "."], capture_output=True,
                               text=True).stdout.strip()
        source["commit"] = git.stdout.strip() + (" + uncommitted changes" if dirty else "")
    else:
        source["commit"] = os.environ.get("DPSQL_BENCH_COMMIT", "unknown (not a git checkout)")
    return source


def _peers(wanted: bool) -> tuple[tuple[Peer, ...], list[tuple[str, str]]]:
    if not wanted:
        return (), [(p.name, "not asked for (--no-peers)") for p in PEERS]
    ready, missing = [], []
    for peer in PEERS:
        try:
            peer.check()
            ready.append(peer)
        except PeerUnavailable as exc:
            missing.append((peer.name, str(exc)))
    return tuple(ready), missing


@contextmanager
def _bar(length: int, label: str) -> Iterator[Callable[[int], None]]:
    with click.progressbar(length=length, label=label, show_eta=True, show_pos=True) as bar:
        yield bar.update


def _options(command: Callable) -> Callable:
    command = click.option("--quick", is_flag=True, help="A tiny configuration that runs in under a minute.")(command)
    command = click.option("--out", type=click.Path(path_type=Path), default=None,
                           help="Output folder [default: benchmarks/results, or benchmarks/results/quick].")(command)
    command = click.option("--peers/--no-peers", default=True, help="Run the peers that are set up.")(command)
    return click.option("--data-dir", type=click.Path(path_type=Path), default=DATA_DIR, show_default=True,
                        help="Where generated data is cached.")(command)


@click.group()
def cli() -> None:
    """dpsql's benchmarks: accuracy versus epsilon, speed, per-query overhead, side by side with the peers."""


def _finish(run: Run) -> None:
    summary = write_summary(run.out)
    plots = write_plots(run.out)
    click.echo(f"wrote {summary}")
    click.echo(plots)


def do_accuracy(run: Run) -> None:
    started = time.time()
    config = run.config.accuracy
    limit = config.queries_per_dataset
    workloads = [(pums(), PUMS_QUERIES[:limit]), (visits(config.visits_rows, run.data_dir), VISITS_QUERIES[:limit])]
    with _bar(accuracy_bench.steps(workloads, config, run.peers), "accuracy") as advance:
        result = accuracy_bench.run_accuracy(workloads, config, run.peers, run.work, advance)
    queries = {q.name: q for _, qs in workloads for q in qs}
    stats = cell_stats(result.observations, result.truths, queries)
    cell_ratios = ratios(stats)
    write_csv(run.out / "accuracy_runs.csv.gz", result.observations, Observation)
    write_csv(run.out / "accuracy_truth.csv", result.truths, Truth)
    write_csv(run.out / "accuracy_cells.csv", stats, CellStat)
    write_csv(run.out / "accuracy_costs.csv", result.costs, Cost)
    write_csv(run.out / "accuracy_ratios.csv", cell_ratios, CellRatio)
    write_csv(run.out / "accuracy_best_peer.csv", best_peer_ratios(cell_ratios), CellRatio)
    write_csv(run.out / "skipped_accuracy.csv", run.skipped("accuracy") + result.skipped, Skipped)
    run.info("accuracy", started, datasets={d.name: d.rows for d, _ in workloads},
             dpsql_method="bounded SQL once per query and epsilon, then dpsql.release.cells.release() once per run",
             **asdict(config))


def do_speed(run: Run) -> None:
    started = time.time()
    config = run.config.speed
    with _bar(speed_bench.steps(config, run.peers), "speed") as advance:
        result = speed_bench.run_speed(config, run.peers, run.work, run.data_dir, advance)
    write_csv(run.out / "speed_runs.csv", result.timings, speed_bench.Timing)
    write_csv(run.out / "speed_summary.csv", result.points, speed_bench.SpeedPoint)
    write_csv(run.out / "skipped_speed.csv", run.skipped("speed") + result.skipped, Skipped)
    run.info("speed", started, **asdict(config))


def do_overhead(run: Run) -> None:
    started = time.time()
    config = run.config.overhead
    with _bar(config.reps, "overhead") as advance:
        timings = overhead_bench.run_overhead(config.reps, run.work, advance)
    ledger = overhead_bench.ledger_scaling(config.ledger_sizes, config.ledger_reps, run.work)
    write_csv(run.out / "overhead_runs.csv", timings, overhead_bench.StageTiming)
    write_csv(run.out / "overhead_summary.csv", overhead_bench.summarize(timings), overhead_bench.StageSummary)
    write_csv(run.out / "overhead_ledger.csv", ledger, overhead_bench.LedgerTiming)
    run.info("overhead", started, query=overhead_bench.TINY_QUERY.sql("pums"), **asdict(config))


def _command(name: str, parts: tuple[Callable[[Run], None], ...], help_text: str) -> None:
    @_options
    def command(quick: bool, out: Path | None, peers: bool, data_dir: Path) -> None:
        run = Run(quick, out, peers, data_dir)
        for reason in run.unavailable:
            click.echo(f"skipping {reason[0]}: {reason[1]}", err=True)
        for part in parts:
            part(run)
        _finish(run)

    command.__doc__ = help_text
    cli.command(name)(command)


_command("accuracy", (do_accuracy,), "Accuracy versus epsilon on PUMS and the synthetic visits table.")
_command("speed", (do_speed,), "The grouped query at 1M and 10M rows: DuckDB, dpsql, SmartNoise, OpenDP, Tumult.")
_command("overhead", (do_overhead,), "dpsql's per-query overhead on a tiny table, stage by stage.")
_command("all", (do_overhead, do_speed, do_accuracy), "Overhead, speed and accuracy, then the summary and plots.")


@cli.command("setup-peers")
@click.option("--only", type=click.Choice([p.name for p in PEERS]), multiple=True,
              help="Set up only this peer (repeatable).")
def setup_peers(only: tuple[str, ...]) -> None:
    """Create benchmarks/.venvs/<peer> and pip install the peer (needs the package registry once)."""
    for peer in by_name(list(only)) if only else PEERS:
        peer.setup(click.echo)
        peer.check()
        click.echo(f"{peer.label}: ready ({', '.join(peer.requirements)})")


if __name__ == "__main__":
    cli()
