"""The benchmark data sets and the dpsql policies over them.

Each data set starts from a policy that ships with dpsql (sample_data/pums/pums.toml, sample_data/visits.toml),
so the bounds, public group values and contribution bound are the steward's, not the benchmark's. The benchmark
only points the table at its own data file and gives the policy a huge budget and a throw-away ledger: every
execute() is charged, and a benchmark runs thousands.

The synthetic table is made by sample_data/generate_visits.py (deterministic for its seed). Rows whose cost is
missing (about 1%) are dropped once, here, so that every system reads exactly the same rows: OpenDP's Polars
mean has no "skip NULLs" form, and SmartNoise and dpsql count non-NULL values differently. The benchmark's
policy then declares the aggregated columns (age, cost, length_of_stay) `nullable = false`, as a steward would
for columns that are never missing (checked on the file), and the peers are told the same. (With a nullable
column dpsql must measure COUNT(column) apart from COUNT(*), which splits the budget three ways, as SmartNoise
always does.)
"""

from __future__ import annotations

import math
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import duckdb

from benchmarks.support import write_policy

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"
DATA_DIR = Path(__file__).resolve().parent / "data"

# generate_visits.py draws 1..max_visits visits with weights 0.55**k: the mean is 1.957 rows per patient at
# max_visits = 5, so 1M rows need ~511k patients.
MAX_VISITS = 5
_MEAN_VISITS = sum((k + 1) * 0.55**k for k in range(MAX_VISITS)) / sum(0.55**k for k in range(MAX_VISITS))
BENCH_BUDGET = 1e9  # no benchmark may run out of budget
# The aggregated columns of the benchmark's visits file, none of them ever NULL there (checked when it is made).
NOT_NULL = ("age", "cost", "length_of_stay")


@dataclass(frozen=True)
class Dataset:
    name: str
    table: str  # the table name in dpsql's policy
    data_path: Path
    base_policy: Path  # the shipped policy this one copies its table declaration from
    smartnoise_table: str  # schema.table in SmartNoise's metadata
    smartnoise_yaml: Path | None = None  # shipped SmartNoise metadata, if there is one
    not_null: tuple[str, ...] = ()  # columns the benchmark's data file guarantees to be non-NULL

    @cached_property
    def declaration(self) -> dict[str, Any]:
        """The shipped table declaration, with the columns this data file never leaves NULL declared so."""
        table = tomllib.loads(self.base_policy.read_text())["tables"][self.table]
        for name in self.not_null:
            table["columns"][name] = {**table["columns"][name], "nullable": False}
        return table

    @property
    def columns(self) -> dict[str, dict[str, Any]]:
        return self.declaration["columns"]

    @property
    def unit(self) -> str:
        return self.declaration["privacy_unit"]

    @property
    def max_rows(self) -> int:
        return int(self.declaration["max_rows_per_unit"])

    @cached_property
    def rows(self) -> int:
        return count_rows(self.data_path)

    def write_policy(self, folder: Path) -> Path:
        """A copy of the shipped policy over this data file, with a huge budget and a ledger in `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        table = {**self.declaration, "source": str(self.data_path)}
        table.pop("format", None)
        budget = {"epsilon": BENCH_BUDGET, "delta": 1e-6, "query_epsilon": 1.0,
                  "ledger": str(folder / f"{self.name}.ledger.sqlite")}
        return write_policy(folder / f"{self.name}.toml", {self.table: table}, budget)

    def peer_spec(self) -> dict[str, Any]:
        """What a peer runner needs to load the same rows with the same bounds (JSON)."""
        return {
            "name": self.name,
            "path": str(self.data_path),
            "rows": self.rows,
            "unit": self.unit,
            "max_rows": self.max_rows,
            "columns": self.columns,
            "smartnoise_table": self.smartnoise_table,
            "smartnoise_yaml": str(self.smartnoise_yaml) if self.smartnoise_yaml else None,
        }


def pums() -> Dataset:
    folder = SAMPLE / "pums"
    return Dataset("pums", "pums", folder / "PUMS_pid.csv", folder / "pums.toml", "PUMS.PUMS",
                   folder / "PUMS_pid.smartnoise.yaml")


def visits(rows: int, data_dir: Path = DATA_DIR) -> Dataset:
    """The synthetic visits table with about `rows` rows, generated on first use."""
    patients = max(1, math.ceil(rows / _MEAN_VISITS))
    path = data_dir / f"visits_{patients}p.parquet"
    if not path.exists():
        generate_visits(patients, path)
    return Dataset("visits", "visits", path, SAMPLE / "visits.toml", "bench.visits", not_null=NOT_NULL)


def generate_visits(patients: int, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.with_suffix(".raw.parquet")
    subprocess.run([sys.executable, str(SAMPLE / "generate_visits.py"), "--patients", str(patients),
                    "--max-visits", str(MAX_VISITS), "--out", str(raw), "--visits-only"], check=True,
                   capture_output=True)
    con = duckdb.connect()
    try:
        con.execute(f"COPY (SELECT * FROM read_parquet('{raw}') WHERE cost IS NOT NULL) TO '{out}' (FORMAT PARQUET)")
        nulls = con.execute(f"SELECT {', '.join(f'count(*) - count({c})' for c in NOT_NULL)} "
                            f"FROM read_parquet('{out}')").fetchone()
        if any(nulls):
            out.unlink()
            raise RuntimeError(f"the generated visits have NULLs in {NOT_NULL}: {nulls}")
    finally:
        con.close()
        raw.unlink()


def source_sql(path: Path) -> str:
    """A DuckDB table function reading a data file."""
    reader = "read_parquet" if path.suffix == ".parquet" else "read_csv"
    return f"{reader}('{path}')"


def count_rows(path: Path) -> int:
    con = duckdb.connect()
    try:
        return int(con.execute(f"SELECT count(*) FROM {source_sql(path)}").fetchone()[0])
    finally:
        con.close()
