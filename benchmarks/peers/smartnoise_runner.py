"""SmartNoise SQL on a benchmark job, run with benchmarks/.venvs/smartnoise/bin/python.

Same rows, same bounds: the metadata comes from the shipped SmartNoise YAML (PUMS, checked against the job's
bounds) or is built from dpsql's policy (visits). Options that make the comparison like for like:
- max_ids = dpsql's max_rows_per_unit, reservoir sampling on, values clamped to the declared bounds;
- censor_dims = False: dpsql's group keys have public values, so neither system spends anything on choosing
  which groups to show (SmartNoise has no way to declare public values; without this it would threshold groups
  and need delta);
- equal total cost per query: SmartNoise charges epsilon per mechanism, so the runner asks its odometer
  (get_privacy_cost) how many epsilons one query costs (k), runs at epsilon/k, and reports what the odometer
  then says the query costs (epsilon, checked in accuracy_costs.csv). SmartNoise refuses any mechanism whose
  noise scale would exceed 1e7; such points are reported as refused.

Many runs per point: SmartNoise's rewrite (which searches each mechanism's scale, ~0.1 s) is deterministic for a
query and a privacy setting, so it is computed once per epsilon and reused; the exact aggregates are computed
once per query with SmartNoise's own reader and passed back through execute's documented `pre_aggregated`.
Each run then repeats SmartNoise's noise and post-processing only.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import snsql
import yaml
from protocol import emit, number, refused, run, speed_record, timed
from snsql import Privacy

_TYPES = {"int": "int", "float": "float", "text": "string", "bool": "boolean", "date": "datetime",
          "timestamp": "datetime"}


def load_frame(data: dict[str, Any]) -> pd.DataFrame:
    path = data["path"]
    frame = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
    for name, column in data["columns"].items():
        if column["type"] == "int":
            frame[name] = frame[name].astype("int64")
    return frame


def metadata(data: dict[str, Any]) -> dict[str, Any]:
    schema, table = data["smartnoise_table"].split(".")
    if data["smartnoise_yaml"]:
        with open(data["smartnoise_yaml"]) as handle:
            meta = yaml.safe_load(handle)
        columns = meta[""][schema][table]
        for name, column in data["columns"].items():
            if not column.get("nullable", True):
                columns[name]["nullable"] = False
            if "lower" in column and (columns[name]["lower"], columns[name]["upper"]) != (column["lower"],
                                                                                          column["upper"]):
                raise SystemExit(f"SmartNoise metadata bounds for {name} differ from dpsql's policy")
    else:
        columns = {}
        for name, column in data["columns"].items():
            entry: dict[str, Any] = {"type": _TYPES[column["type"]]}
            if "lower" in column:
                entry.update(lower=column["lower"], upper=column["upper"])
            if not column.get("nullable", True):
                entry["nullable"] = False
            columns[name] = entry
        columns[data["unit"]]["private_id"] = True
        meta = {"": {schema: {table: columns}}}
    columns.update(rows=data["rows"], max_ids=data["max_rows"], row_privacy=False, censor_dims=False,
                   sample_max_ids=True, clamp_counts=True, clamp_columns=True)
    return meta


def reader_for(frame: pd.DataFrame, data: dict[str, Any]) -> Any:
    return snsql.from_df(frame, privacy=Privacy(epsilon=1.0, delta=0.0), metadata=metadata(data))


# SmartNoise refuses a mechanism whose noise scale would exceed 1e7; the number of mechanisms a query charges
# does not depend on epsilon, so it is counted at an epsilon large enough never to be refused.
_COUNTING_EPSILON = 100.0


def mechanisms(reader: Any, sql: str) -> float:
    """How many epsilons one query costs: SmartNoise's own odometer estimate, divided by its epsilon."""
    reader.privacy = Privacy(epsilon=_COUNTING_EPSILON, delta=0.0)
    return float(reader.get_privacy_cost(sql)[0]) / _COUNTING_EPSILON


def at_equal_cost(reader: Any, sql: str, epsilon: float, k: float) -> dict[str, float]:
    reader.privacy = Privacy(epsilon=epsilon / k, delta=0.0)
    return {"mechanisms": k, "system_epsilon": epsilon / k, "cost": float(reader.get_privacy_cost(sql)[0])}


def exact_aggregates(reader: Any, rewritten: Any) -> Any:
    """The exact answers of SmartNoise's own rewritten inner query, run by its own reader."""
    subquery, _ = rewritten
    return reader._get_reader(subquery)._execute_ast(subquery)


def accuracy(job: dict[str, Any]) -> None:
    data = job["dataset"]
    reader = reader_for(load_frame(data), data)
    for query in job["queries"]:
        sql = query["sql"]
        ast = reader.parse_query_string(sql)
        exact = None  # computed at the first epsilon SmartNoise accepts: the inner query does not depend on it
        try:
            k = mechanisms(reader, sql)
        except ValueError as exc:
            for epsilon in job["epsilons"]:
                refused(query["name"], epsilon, ValueError(f"refused even at ε = {_COUNTING_EPSILON:g}: {exc}"))
            continue
        for epsilon in job["epsilons"]:
            try:
                cost = at_equal_cost(reader, sql, epsilon, k)
                rewritten = reader._rewrite_ast(ast)
            except ValueError as exc:
                refused(query["name"], epsilon, exc)
                continue
            if exact is None:
                exact = exact_aggregates(reader, rewritten)
            reader._rewrite_ast = lambda _query, rewritten=rewritten: rewritten
            try:
                runs = [[[_cell(v) for v in row] for row in reader._execute_ast(ast, pre_aggregated=exact)[1:]]
                        for _ in range(job["runs"])]
            finally:
                del reader._rewrite_ast  # back to the class's method
            emit({"kind": "accuracy", "query": query["name"], "epsilon": epsilon, **cost, "runs": runs})


def _cell(value: Any) -> Any:
    return value if isinstance(value, str) else number(value)


def speed(job: dict[str, Any]) -> None:
    data = job["dataset"]
    load_s, reader = timed(lambda: reader_for(load_frame(data), data))
    cost = at_equal_cost(reader, job["sql"], job["epsilon"], mechanisms(reader, job["sql"]))
    times = [timed(lambda: reader.execute(job["sql"]))[0] for _ in range(job["reps"])]
    emit(speed_record(load_s, times, **cost))


if __name__ == "__main__":
    run({"accuracy": accuracy, "speed": speed})
