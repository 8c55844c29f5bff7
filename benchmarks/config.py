"""How big each benchmark is: the full run (sized for a shared 2-core machine, ~30 minutes) and --quick."""

from __future__ import annotations

from dataclasses import dataclass

# Seeds dpsql's noise in accuracy runs only (dpsql.dp.noise.InsecureSeededRandomForTests), so that a rerun draws the
# same noise. Speed and overhead runs use dpsql's default SecureRandom, as production does. The peers draw their
# own (unseeded) noise.
ACCURACY_SEED = 20261121


@dataclass(frozen=True)
class AccuracyConfig:
    epsilons: tuple[float, ...]
    runs: int  # dpsql: noisy releases per query and epsilon
    peer_runs: int  # SmartNoise and OpenDP: runs per query and epsilon
    visits_rows: int  # size of the synthetic accuracy table
    queries_per_dataset: int | None  # None: the whole workload
    peer_timeout_s: float


@dataclass(frozen=True)
class SpeedConfig:
    sizes: tuple[int, ...]  # rows of the synthetic table
    reps: int  # timed runs of dpsql and DuckDB per size (after one warm-up)
    peer_reps: int
    peer_timeout_s: float
    # A peer is tried at a size only if its time at the previous size, scaled by rows, is within this.
    peer_budget_s: float


@dataclass(frozen=True)
class OverheadConfig:
    reps: int
    ledger_sizes: tuple[int, ...]  # prior charges at which one ledger charge is timed
    ledger_reps: int


@dataclass(frozen=True)
class BenchConfig:
    name: str
    accuracy: AccuracyConfig
    speed: SpeedConfig
    overhead: OverheadConfig


FULL = BenchConfig(
    name="full",
    accuracy=AccuracyConfig(epsilons=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0), runs=200, peer_runs=100,
                            visits_rows=100_000, queries_per_dataset=None, peer_timeout_s=1800),
    speed=SpeedConfig(sizes=(1_000_000, 10_000_000), reps=11, peer_reps=3, peer_timeout_s=900, peer_budget_s=420),
    overhead=OverheadConfig(reps=200, ledger_sizes=(0, 1_000, 10_000, 100_000), ledger_reps=5),
)

QUICK = BenchConfig(
    name="quick",
    accuracy=AccuracyConfig(epsilons=(0.3, 3.0), runs=60, peer_runs=20, visits_rows=3_000,
                            queries_per_dataset=2, peer_timeout_s=300),
    # peer_budget_s: OpenDP (~4 s a query here) is tried at the small size only, and reported skipped at the other.
    speed=SpeedConfig(sizes=(5_000, 20_000), reps=3, peer_reps=1, peer_timeout_s=120, peer_budget_s=10),
    overhead=OverheadConfig(reps=20, ledger_sizes=(0, 300), ledger_reps=3),
)
