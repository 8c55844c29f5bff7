"""OpenDP's Polars API on a benchmark job, run with benchmarks/.venvs/opendp/bin/python.

Same rows, same bounds: the privacy unit is dpsql's unit column (one identifier added or removed), each unit's
rows are truncated to dpsql's max_rows_per_unit after the row filter (as dpsql caps after filtering), values are
bounded by dpsql's declared bounds, and the group keys are joined against their public values (dpsql's policy
declares them), so no partition selection is spent on either side.

Equal total cost: an OpenDP query's privacy_loss is the whole query (its aggregates split it), so it gets the
same epsilon as dpsql; the runner reports the resolved measurement's own privacy map at one unit as the cost.
OpenDP has no variance aggregate in the Polars API: the parent sends only COUNT/SUM/AVG queries.

Many runs per point: the measurement is resolved once per query and epsilon (OpenDP's binary search for the
noise scale takes seconds) and then invoked on the data once per run, which repeats its truncation, aggregation
and noise.
"""

from __future__ import annotations

from typing import Any

import opendp.prelude as dp
import polars as pl
from protocol import emit, number, refused, run, speed_record, timed

dp.enable_features("contrib")

_FILTERS = {"=": lambda c, v: c == v, ">=": lambda c, v: c >= v, "<": lambda c, v: c < v}


def load_frame(data: dict[str, Any]) -> pl.LazyFrame:
    path = data["path"]
    frame = pl.read_parquet(path) if path.endswith(".parquet") else pl.read_csv(path)
    casts = {"int": pl.Int64, "float": pl.Float64}
    frame = frame.with_columns([pl.col(n).cast(casts[c["type"]]) for n, c in data["columns"].items()
                                if c["type"] in casts])
    return frame.lazy()


def _bounds(column: dict[str, Any]) -> tuple[float, float] | tuple[int, int]:
    kind = int if column["type"] == "int" else float
    return kind(column["lower"]), kind(column["upper"])


def _aggregate(aggregate: dict[str, Any], columns: dict[str, Any], alias: str) -> pl.Expr:
    kind, name = aggregate["kind"], aggregate["column"]
    if kind == "count":
        return pl.len().dp.noise().alias(alias)
    column = pl.col(name)
    if kind == "sum":
        return column.dp.sum(_bounds(columns[name])).alias(alias)
    if kind == "avg":
        return column.dp.mean(_bounds(columns[name])).alias(alias)
    raise SystemExit(f"OpenDP's Polars API has no {kind} aggregate")


def query_for(frame: pl.LazyFrame, data: dict[str, Any], query: dict[str, Any], epsilon: float) -> Any:
    key = query["group_by"]
    columns = data["columns"]
    margins = [dp.polars.Margin(by=[], max_length=data["rows"])]
    if key:
        margins.append(dp.polars.Margin(by=[key], invariant="keys", max_length=data["rows"],
                                        max_groups=len(columns[key]["values"])))
    context = dp.Context.compositor(
        data=frame,
        privacy_unit=dp.unit_of(contributions=1, identifier=data["unit"]),
        privacy_loss=dp.loss_of(epsilon=epsilon),
        split_evenly_over=1,
        margins=margins,
    )
    plan = context.query()
    where = query["where"]
    if where:
        plan = plan.filter(_FILTERS[where["op"]](pl.col(where["column"]), where["value"]))
    plan = plan.truncate_per_group(data["max_rows"])
    aggregates = [_aggregate(a, columns, f"a{i}") for i, a in enumerate(query["aggregates"])]
    if not key:
        return plan.select(aggregates)
    keys = pl.LazyFrame({key: columns[key]["values"]}).with_columns(pl.col(key).cast(frame.collect_schema()[key]))
    return plan.group_by(key).agg(aggregates).with_keys(keys)


def _rows(frame: pl.DataFrame, query: dict[str, Any]) -> list[list[Any]]:
    names = ([query["group_by"]] if query["group_by"] else []) + [f"a{i}" for i in range(len(query["aggregates"]))]
    return [[str(v) if i == 0 and query["group_by"] else number(v) for i, v in enumerate(row)]
            for row in frame.select(names).iter_rows()]


def accuracy(job: dict[str, Any]) -> None:
    data = job["dataset"]
    frame = load_frame(data)
    for query in job["queries"]:
        for epsilon in job["epsilons"]:
            try:
                measurement = query_for(frame, data, query, epsilon).resolve()
            except dp.OpenDPException as exc:
                refused(query["name"], epsilon, exc)
                continue
            runs = [_rows(measurement(frame).collect(), query) for _ in range(job["runs"])]
            emit({"kind": "accuracy", "query": query["name"], "epsilon": epsilon, "mechanisms": 1.0,
                  "system_epsilon": epsilon, "cost": float(measurement.map(1)), "runs": runs})


def speed(job: dict[str, Any]) -> None:
    data = job["dataset"]
    load_s, frame = timed(lambda: load_frame(data).collect().lazy())
    query = job["query"]

    def end_to_end() -> Any:
        return query_for(frame, data, query, job["epsilon"]).release().collect()

    times = [timed(end_to_end)[0] for _ in range(job["reps"])]
    cost = float(query_for(frame, data, query, job["epsilon"]).resolve().map(1))
    emit(speed_record(load_s, times, mechanisms=1.0, system_epsilon=job["epsilon"], cost=cost))


if __name__ == "__main__":
    run({"accuracy": accuracy, "speed": speed})
