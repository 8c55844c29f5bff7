"""Tumult Analytics on a benchmark job, run with benchmarks/.venvs/tumult/bin/python (PySpark, local, Java 17).

Same rows, same bounds: the table is a private source with `AddRowsWithID(id_column=<dpsql's unit>)`, every query
enforces `MaxRowsPerID(<dpsql's max_rows_per_unit>)` after the row filter (as dpsql caps after filtering), sums
and variances clamp to dpsql's declared bounds, and grouped queries use `KeySet.from_dict` over the public values
dpsql's policy declares, so neither system spends anything on choosing groups. Pure DP (`PureDPBudget`).

Tumult answers one aggregate per query, so a workload query becomes several Tumult measurements that split the
query's epsilon evenly; the runner reports their summed privacy cost (each compiled measurement's own privacy
function at the session's neighbouring distance). The configuration is the most accurate one for Tumult:
- COUNT, SUM, AVG of x (x never NULL in the benchmark data): COUNT(*) and SUM(x) at epsilon/2 each, and AVG as
  their ratio (post-processing, free). The alternative, Tumult's own `average` beside COUNT and SUM at epsilon/3
  each, is less accurate on every aggregate by Tumult's own noise information (`Session._noise_info`): on visits'
  cost in [0, 5000] with 5 rows per patient at epsilon 1, its average adds Laplace noise of scale 75,000 to a
  midpoint-shifted sum and of scale 30 to a count, where the derived AVG divides a sum with scale 50,000 by a count
  with geometric noise of parameter 10 (and COUNT and SUM themselves get epsilon/2 rather than epsilon/3).
  `AVG_FROM_COUNT_AND_SUM = False` restores Tumult's own average.
- VAR_POP and STDDEV_POP of x: Tumult's `variance` at the whole epsilon, and STDDEV as its square root
  (post-processing), rather than `variance` and `stdev` at epsilon/2 each.
- COUNT alone, SUM alone: the one measurement at the whole epsilon.

Many runs per point, each with fresh noise (see `Compiled`): the Spark session is started once per job, each
measurement is compiled once per query and epsilon (`Session._compile_and_get_info`, the first half of
`evaluate`); COUNT and SUM then add a fresh draw of Tumult's noise to Tumult's exact aggregate per run, and VAR
(and Tumult's own average, if chosen) runs its compiled measurement in Spark per run. The session's own budget is
infinite; each point's cost is read from its compiled measurements.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from protocol import emit, number, refused, run, speed_record, timed
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from tmlt.analytics import (
    AddRowsWithID,
    KeySet,
    MaxRowsPerID,
    PureDPBudget,
    QueryBuilder,
    Session,
)
from tmlt.core.domains.numpy_domains import NumpyFloatDomain
from tmlt.core.measurements.noise_mechanisms import AddGeometricNoise, AddLaplaceNoise
from tmlt.core.utils.exact_number import ExactNumber

AVG_FROM_COUNT_AND_SUM = True
SOURCE = "data"


def spark() -> SparkSession:
    """Spark, local on the machine's cores, few shuffle partitions (the tables are at most 10M rows), no progress
    bars on the console (stdout carries the JSON lines), and its warehouse (where Tumult writes its intermediate
    tables) in a scratch folder removed at exit rather than in the working directory."""
    # Spark's Python workers must be this virtualenv's interpreter (not the one it links to), to import tmlt.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    warehouse = tempfile.mkdtemp(prefix="dpsql-bench-tumult-")
    atexit.register(shutil.rmtree, warehouse, ignore_errors=True)
    return (SparkSession.builder.master("local[*]").appName("dpsql-bench-tumult")
            .config("spark.sql.warehouse.dir", warehouse)
            .config("spark.driver.memory", "12g")
            .config("spark.sql.shuffle.partitions", str(os.cpu_count() or 2))
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .getOrCreate())


def _needed(data: dict[str, Any], queries: list[dict[str, Any]]) -> list[str]:
    """The unit and every column a query reads: Tumult needs no others (and has no type for bool columns)."""
    names = {data["unit"]}
    for query in queries:
        names.update(a["column"] for a in query["aggregates"] if a["column"])
        if query["group_by"]:
            names.add(query["group_by"])
        if query["where"]:
            names.add(query["where"]["column"])
    return [n for n in data["columns"] if n in names]


_SPARK_TYPES = {"int": T.LongType(), "float": T.DoubleType(), "text": T.StringType()}


def load_frame(session: SparkSession, data: dict[str, Any], queries: list[dict[str, Any]]) -> Any:
    path = data["path"]
    reader = session.read
    frame = reader.parquet(path) if path.endswith(".parquet") else reader.option("header", True).csv(path)
    columns = data["columns"]
    frame = frame.select([F.col(n).cast(_SPARK_TYPES[columns[n]["type"]]).alias(n)
                          for n in _needed(data, queries)])
    return frame.cache()


def tumult_session(frame: Any, data: dict[str, Any]) -> Session:
    return Session.from_dataframe(privacy_budget=PureDPBudget(float("inf")), source_id=SOURCE, dataframe=frame,
                                  protected_change=AddRowsWithID(id_column=data["unit"]))


def _bounds(column: dict[str, Any]) -> tuple[Any, Any]:
    kind = int if column["type"] == "int" else float
    return kind(column["lower"]), kind(column["upper"])


def _where(where: dict[str, Any]) -> str:
    value = where["value"]
    literal = "'" + value.replace("'", "''") + "'" if isinstance(value, str) else repr(value)
    return f"{where['column']} {where['op']} {literal}"


def _base(data: dict[str, Any], query: dict[str, Any]) -> Any:
    """The rows one person may add: filtered, then capped at max_rows per unit, grouped by public keys."""
    builder = QueryBuilder(SOURCE)
    if query["where"]:
        builder = builder.filter(_where(query["where"]))
    builder = builder.enforce(MaxRowsPerID(int(data["max_rows"])))
    key = query["group_by"]
    if key:
        column = data["columns"][key]
        cast = int if column["type"] == "int" else str
        builder = builder.groupby(KeySet.from_dict({key: [cast(v) for v in column["values"]]}))
    return builder


def measurements(data: dict[str, Any], query: dict[str, Any]) -> dict[str, Any]:
    """The Tumult queries measured for one workload query, by output name (see the module docstring)."""
    kinds = {a["kind"]: a["column"] for a in query["aggregates"]}
    columns = data["columns"]
    out: dict[str, Any] = {}
    if "count" in kinds or ("avg" in kinds and AVG_FROM_COUNT_AND_SUM):
        out["count"] = _base(data, query).count(name="count")
    for kind in ("sum", "avg"):
        if kind in kinds or (kind == "sum" and "avg" in kinds and AVG_FROM_COUNT_AND_SUM):
            name = kinds.get(kind) or kinds["avg"]
            low, high = _bounds(columns[name])
            if kind == "sum":
                out["sum"] = _base(data, query).sum(name, low, high, name="sum")
            elif not AVG_FROM_COUNT_AND_SUM:
                out["avg"] = _base(data, query).average(name, low, high, name="avg")
    if "var" in kinds or "stddev" in kinds:
        name = kinds.get("var") or kinds["stddev"]
        low, high = _bounds(columns[name])
        out["var"] = _base(data, query).variance(name, low, high, name="var")
    return out


def _derived(kind: str, measured: dict[str, float | None]) -> float | None:
    if kind in measured:
        return measured[kind]
    if kind == "avg":
        count, total = measured["count"], measured["sum"]
        if count is None or total is None:
            return None
        return total / count if count != 0 else math.nan
    if kind == "stddev":
        variance = measured["var"]
        return None if variance is None else math.sqrt(max(variance, 0.0))
    raise SystemExit(f"Tumult runner: no way to answer {kind}")


# Tumult's variance is a post-processing of three noisy sums computed in Spark: it is measured for real every run,
# which takes 10-20 s on the shared 2-core benchmark machine, so VAR/STDDEV are measured at one epsilon only (the
# job's nearest to 1, the summary's headline; the others are reported refused, with this reason), with this many
# runs instead of the job's.
REAL_RUNS = 3


class Compiled:
    """One workload query at one epsilon: its Tumult measurements, compiled once, released once per run.

    COUNT and SUM: Tumult releases its exact (truncated, clamped, grouped) aggregate plus one draw of the noise its
    compiler chose (`Session._noise_info`: the mechanism and its parameter). The exact table is Tumult's own answer
    at an infinite budget (computed once per query, as SmartNoise's exact aggregates are); each run adds a fresh
    draw from tmlt.core's own noise measurement (AddGeometricNoise for integers, AddLaplaceNoise for floats).
    Truncation would vary from run to run only if the cap bound, which it never does in this workload.
    VAR (and Tumult's own AVG): the compiled measurement itself, on the truncated table (computed once per query),
    every run.
    """

    def __init__(self, session: Session, data: dict[str, Any], query: dict[str, Any], epsilon: float,
                 cache: dict[tuple[str, str], Any]) -> None:
        self.session = session
        self.query = query
        built = measurements(data, query)
        share = PureDPBudget(epsilon / len(built))
        d_in = session._accountant.d_in
        self.noisy_sums: dict[str, tuple[dict[str, Any], Any]] = {}  # name -> (exact values, noise)
        self.spark_measured: dict[str, tuple[Any, Any]] = {}  # name -> (measurement, truncated input)
        self.cost = 0.0
        for name, tumult_query in built.items():
            measurement, _, noise_info = session._compile_and_get_info(tumult_query._query_expr, share)
            self.cost += measurement.privacy_function(d_in).to_float(round_up=True)
            if name in ("var", "avg"):  # several noisy sums, post-processed in Spark
                if (query["name"], name) not in cache:
                    truncated = measurement._transformation(session._accountant._queryable._data)
                    cache[(query["name"], name)] = truncated.cache()
                self.spark_measured[name] = (measurement, cache[(query["name"], name)])
            else:
                if (query["name"], name) not in cache:
                    exact = session.evaluate(tumult_query, PureDPBudget(float("inf")))
                    cache[(query["name"], name)] = self._table(exact, name)
                self.noisy_sums[name] = (cache[(query["name"], name)], _noise(noise_info))
        self.mechanisms = float(len(built))
        self.system_epsilon = epsilon / len(built)
        self.runs_cap = REAL_RUNS if self.spark_measured else None

    def _table(self, frame: Any, name: str) -> dict[str, Any]:
        """A released table as {group: value} (group '' when ungrouped)."""
        key = self.query["group_by"]
        return {(str(row[key]) if key else ""): row[name] for row in frame.collect()}

    def _release(self) -> dict[str, dict[str, float | None]]:
        released = {name: {group: number(noise(value)) for group, value in exact.items()}
                    for name, (exact, noise) in self.noisy_sums.items()}
        for name, (measurement, truncated) in self.spark_measured.items():
            released[name] = {g: number(v) for g, v in self._table(measurement._measurement(truncated), name).items()}
        return released

    def rows(self) -> list[list[Any]]:
        released = self._release()
        key = self.query["group_by"]
        out = []
        for group in sorted(next(iter(released.values()))):
            measured = {name: values[group] for name, values in released.items()}
            values = [_derived(a["kind"], measured) for a in self.query["aggregates"]]
            out.append(([group] if key else []) + values)
        return out


def _noise(noise_info: Any) -> Any:
    """tmlt.core's noise measurement for a COUNT or SUM, from the compiler's own noise information (the mechanism
    and its parameter; the parameter comes as a float, rounded up to the exact number tmlt.core takes, which
    differs from the compiled one by at most one unit in the last place)."""
    (info,) = list(iter(noise_info))
    mechanism, parameter = info["noise_mechanism"], ExactNumber.from_float(info["noise_parameter"], round_up=True)
    if mechanism.name == "GEOMETRIC":
        return AddGeometricNoise(alpha=parameter)
    if mechanism.name == "LAPLACE":
        return AddLaplaceNoise(input_domain=NumpyFloatDomain(), scale=parameter)
    raise SystemExit(f"Tumult runner: unexpected noise mechanism {mechanism}")


def accuracy(job: dict[str, Any]) -> None:
    data = job["dataset"]
    spark_session = spark()
    frame = load_frame(spark_session, data, job["queries"])
    session = tumult_session(frame, data)
    cache: dict[tuple[str, str], Any] = {}
    headline = min(job["epsilons"], key=lambda e: abs(math.log(e)))
    for query in job["queries"]:
        for epsilon in job["epsilons"]:
            if "var" in measurements(data, query) and epsilon != headline:
                refused(query["name"], epsilon, TimeoutError(
                    f"not run: Tumult's variance takes 10-20 s per run in Spark here; measured at ε = {headline:g} "
                    f"only, {REAL_RUNS} runs"))
                continue
            try:
                compiled = Compiled(session, data, query, epsilon, cache)
            except (ValueError, RuntimeError) as exc:
                refused(query["name"], epsilon, exc)
                continue
            runs = [compiled.rows() for _ in range(min(job["runs"], compiled.runs_cap or job["runs"]))]
            emit({"kind": "accuracy", "query": query["name"], "epsilon": epsilon, "mechanisms": compiled.mechanisms,
                  "system_epsilon": compiled.system_epsilon, "cost": compiled.cost, "runs": runs})


def speed(job: dict[str, Any]) -> None:
    data = job["dataset"]
    query = job["query"]
    spark_session = spark()

    def load() -> Any:
        frame = load_frame(spark_session, data, [query])
        frame.count()  # materialise the cache: loading is timed apart from the query
        return tumult_session(frame, data)

    load_s, session = timed(load)

    def end_to_end() -> Any:
        """What an analyst runs: build each Tumult query, evaluate it, collect its rows."""
        built = measurements(data, query)
        share = PureDPBudget(job["epsilon"] / len(built))
        return [session.evaluate(q, share).collect() for q in built.values()]

    times = [timed(end_to_end)[0] for _ in range(job["reps"])]
    compiled = Compiled(session, data, query, job["epsilon"], {})
    record = speed_record(load_s, times, mechanisms=compiled.mechanisms, system_epsilon=compiled.system_epsilon,
                          cost=compiled.cost)
    record["peak_rss_mb"] += _children_peak_rss_mb()
    emit(record)


def _children_peak_rss_mb() -> float:
    """The peak resident set size of this process's children (Spark's JVM, which holds the data), read from
    /proc while they still run: the parent's ru_maxrss does not include them."""
    total = 0.0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) == os.getpid() and "VmHWM" in fields:
            total += int(fields["VmHWM"].split()[0]) / 1024  # kB
    return total


if __name__ == "__main__":
    run({"accuracy": accuracy, "speed": speed})
