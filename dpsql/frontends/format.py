"""Stage 8: render a private result as a table, CSV or JSON, with or without its intervals."""

from __future__ import annotations

import csv
import datetime
import decimal
import io
import json
import math
from collections.abc import Sequence
from typing import Any

from dpsql.session import PrivateResult

FORMATS = ("table", "csv", "json")


def render(result: PrivateResult, fmt: str = "table", with_ci: bool = False) -> str:
    if fmt == "csv":
        return _csv(result, with_ci)
    if fmt == "json":
        return _json(result, with_ci)
    return _table(result, with_ci)


def summary(result: PrivateResult, analyst: str) -> str:
    """One line on what the query cost and what is left, for stderr."""
    cost, left = result.cost, result.spending
    delta = f", delta {float(cost.delta):g}" if cost.delta else ""
    how = f" ({result.note})" if result.note else ""
    return (f"cost: epsilon {float(cost.epsilon):g}{delta}{how}; {analyst} has epsilon {left.epsilon_remaining:g} "
            f"of {left.epsilon_total:g} left; 95% intervals shown with --ci")


def why_no_rows(result: PrivateResult) -> str | None:
    """For stderr: why a grouped answer came back empty, from the plan and the released answer only."""
    if result.rows or result.plan is None:
        return None
    selection = result.plan.selection
    if selection is not None and result.released_groups == 0:
        keys = ", ".join(k.text for k in result.plan.query.keys)
        return (f"no rows: every group of {keys} has a noisy row count below the partition-selection threshold "
                f"{selection.threshold}, so none was released. Declare the public values of the keys in the policy "
                "(values = [...]) to release every group, or spend more epsilon to lower the threshold.")
    if result.released_groups:
        return f"no rows: {result.released_groups} group(s) were released, and HAVING, LIMIT or OFFSET removed them all"
    return None


def headers(names: Sequence[str], noisy: Sequence[bool], with_ci: bool) -> list[str]:
    """The released columns' names, each noisy one followed by its interval's ends if asked (CLI --ci, the
    server's dpsql.intervals)."""
    named = []
    for name, flag in zip(names, noisy, strict=True):
        named.append(name)
        if with_ci and flag:
            named += [f"{name}_ci_low", f"{name}_ci_high"]
    return named


def _headers(result: PrivateResult, with_ci: bool) -> list[str]:
    return headers([c.name for c in result.columns], [c.noisy for c in result.columns], with_ci)


def records(result: PrivateResult, with_ci: bool) -> list[list[Any]]:
    """The rows, each noisy value followed by its interval's ends (None where it has none) if asked."""
    records = []
    for row, intervals in zip(result.rows, result.intervals, strict=True):
        record = []
        for column, value, interval in zip(result.columns, row, intervals, strict=True):
            record.append(value)
            if with_ci and column.noisy:
                record += list(interval) if interval is not None else [None, None]
        records.append(record)
    return records


def _table(result: PrivateResult, with_ci: bool) -> str:
    headers = [c.name for c in result.columns]
    lines = []
    for row, intervals in zip(result.rows, result.intervals, strict=True):
        cells = []
        for column, value, interval in zip(result.columns, row, intervals, strict=True):
            text = _display(value)
            if with_ci and column.noisy and interval is not None:
                text += f" [{_display(interval[0])}, {_display(interval[1])}]"
            cells.append(text)
        lines.append(cells)
    widths = [max([len(h)] + [len(line[i]) for line in lines]) for i, h in enumerate(headers)]
    numeric = [all(_is_number(row[i]) for row in result.rows) for i in range(len(headers))]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric, strict=True))

    out = [fmt(headers), "  ".join("-" * w for w in widths), *[fmt(line) for line in lines]]
    if not result.rows:
        out.append("(no rows)")
    return "\n".join(line.rstrip() for line in out)


def _csv(result: PrivateResult, with_ci: bool) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_headers(result, with_ci))
    for record in records(result, with_ci):
        writer.writerow([_csv_cell(v) for v in record])
    return buffer.getvalue().rstrip("\n")


def _json(result: PrivateResult, with_ci: bool) -> str:
    rows = [dict(zip(_headers(result, with_ci), [_plain(v) for v in r], strict=True))
            for r in records(result, with_ci)]
    document = {
        "columns": [{"name": c.name, "type": c.type, "noisy": c.noisy} for c in result.columns],
        "rows": rows,
        "cost": {"epsilon": float(result.cost.epsilon), "delta": float(result.cost.delta)},
        "budget": {"epsilon_spent": result.spending.epsilon_spent, "epsilon_total": result.spending.epsilon_total,
                   "epsilon_remaining": result.spending.epsilon_remaining,
                   "delta_spent": result.spending.delta_spent, "delta_total": result.spending.delta_total},
    }
    return json.dumps(document, indent=2)


def _csv_cell(value: Any) -> Any:
    """NULL is an empty field; a non-finite number is a value, written as DuckDB and pandas write and read it
    (inf, -inf, nan), so the two never look alike."""
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return _plain(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | decimal.Decimal) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.date | datetime.datetime):
        return value.isoformat()
    return value


def _display(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if abs(value) >= 1000 or value == int(value):
            return f"{value:.0f}"
        return f"{value:.4g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)
