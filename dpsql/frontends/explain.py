"""`dpsql explain`: what a query would run and release, and what it would cost, without running it."""

from __future__ import annotations

import math
from dataclasses import replace

from sqlglot import exp

from dpsql.analysis.person_work import PersonWork
from dpsql.dp.quantile import zcdp_epsilon
from dpsql.dp.quantile_interval import INTERVAL_SHARE
from dpsql.planning.aggregates import LEVEL, aggregate
from dpsql.planning.aggregates.base import LinearAggregate, number
from dpsql.planning.contribution import contribution
from dpsql.planning.measurements import Measurement, MeasurementKind, OutputRecipe
from dpsql.planning.plan import QueryPlan
from dpsql.policy import Accounting, MechanismKind
from dpsql.rewrite.passes import pretty, pretty_buckets
from dpsql.sql import names
from dpsql.sql.parse import DIALECT


def explain(query_plan: QueryPlan, listed: bool = True) -> str:
    query = query_plan.query
    table = query.table
    lines = [f"Cost: {_cost(query_plan)}"]
    if query_plan.budget.accounting is Accounting.ZCDP:
        lines += _zcdp_guarantee(query_plan)
    unit = "each row is its own unit (row privacy)" if table.row_privacy else f"privacy unit '{table.privacy_unit}'"
    lines.append(f"Contribution bound: at most {query_plan.max_rows} row(s) per unit in this query; {unit}")
    bound = contribution(query)
    if bound.per_group_enforced:
        lines.append(f"  and at most {bound.groups} group(s) per unit, {bound.rows_per_group} row(s) in each (by the "
                     f"secret row hash): one unit moves the cells' row counts by at most {bound.l1} in L1 and "
                     f"{math.sqrt(bound.l2_squared):.4g} in L2")
    if query.relation is not None:
        lines += [f"  {n}. {step}" for n, step in enumerate(query.relation.steps, 1)]
    if query.work is not None:
        lines += _work(query.work)
    lines.append(_groups(query_plan))
    share = "epsilon" if query_plan.budget.accounting is Accounting.PURE else "rho"
    lines += ["", f"Measurements ({share} split to minimise the summed squared relative error of the outputs, "
                  "assuming values spread over their bounds):"]
    header = ("", "measures", "mechanism", "sensitivity", share, "noise scale", f"{LEVEL:.0%} +/-")
    combination = query_plan.combination
    now = range(len(query_plan.measurements)) if combination is None else combination.measured
    rows = [header] + [_measurement_row(i, query_plan.measurements[i]) for i in now]
    if combination is not None and not combination.measured:
        lines.append("  none measured now: every measurement is estimated from released ones (below); the data is "
                     "not read and nothing is charged")
    elif query_plan.measurements:
        lines += _table(rows)
    else:
        lines.append("  none: the answer is the keys' declared public values; the data is not read and nothing is "
                     "charged")
    lines += _shared_shares(query_plan)
    if combination is not None:
        lines += _reused(query_plan)
    lines += ["", "Outputs (post-processing of the measurements, free):"]
    for recipe in query_plan.recipes:
        lines.append(f"  {recipe.call.text} = {_output(query_plan, recipe)}")
    if _post_processes(query_plan):
        lines += ["", f"Then, on the noisy cells only: {_readable_outer(query_plan)}"]
    if combination is not None:
        if not combination.measured:
            return "\n".join(lines)
        query_plan = replace(query_plan, measurements=tuple(query_plan.measurements[j] for j in combination.measured))
    lines += ["", "Rewritten SQL (runs on the data, enforces the bounds):", _indent(pretty(query_plan, listed=listed))]
    for indices, sql in pretty_buckets(query_plan, listed=listed):
        read_by = ", ".join(f"m{i}" for i in indices)
        lines += ["", f"Rows per candidate for {read_by} (a query of its own over the same bounded rows):",
                  _indent(sql)]
    return "\n".join(lines)


def _output(query_plan: QueryPlan, recipe: OutputRecipe) -> str:
    """How an output follows from the measurements; over estimates, a linear output's interval is their law's."""
    kind = aggregate(recipe.call)
    if query_plan.combination is None or not isinstance(kind, LinearAggregate):
        return kind.explain(recipe, query_plan.measurements)
    value = kind.formula(recipe, query_plan.measurements)[0]
    width = kind.width(recipe, query_plan.measurements, query_plan.combination)
    return f"{value}; {LEVEL:.0%} interval +/-{number(width)} (the law of the combined released noises)"


def _reused(query_plan: QueryPlan) -> list[str]:
    """How each measurement is estimated from released ones and those measured now (planning/reuse.py)."""
    combination = query_plan.combination
    assert combination is not None
    lines = ["", "Estimated from released measurements of the same rows (their noise already paid for: free; each the "
                 "least-variance unbiased combination, its interval from the exact law of its summed noises):"]
    steps = [m.spec.step for m in query_plan.measurements]
    for j, estimate in enumerate(combination.estimates):
        parts = " + ".join(f"{number(float(c))} x [{combination.sources[s].name}]" for c, s in estimate)
        width = combination.law(((1.0, j),), steps).half_width(LEVEL)
        lines.append(f"  m{j} {query_plan.measurements[j].spec.label} = {parts}; {LEVEL:.0%} +/-{number(width)}")
    return lines


def _work(work: PersonWork) -> list[str]:
    """What one person's rows can cost (analysis/person_work.py): the bound, and its largest parts."""
    lines = [f"Work per person: {work.describe()}, so that the query's time says little about any one person"]
    if work.examined is not None:
        lines.append(f"  the filter reads at most {work.examined:,} row(s) of each person (the cap keeps the first "
                     f"that pass)")
    if work.passes > 1:
        lines.append(f"  the rows are read {work.passes} times (once more for each quantile's argument)")
    largest = sorted((*work.terms, *work.release), key=lambda term: term.total, reverse=True)[:3]
    lines += [f"  {term.total:,} units: {term.what}, on up to {term.rows:,} row(s) of one person at {term.units:,} "
              "each" for term in largest]
    return lines


def _post_processes(query_plan: QueryPlan) -> bool:
    """Whether the outer query does more than list the keys and aggregates."""
    outer = query_plan.query.outer
    return any(outer.args.get(c) for c in ("where", "order", "limit", "offset")) or not all(
        isinstance(item.this, exp.Column) for item in outer.expressions)


def _readable_outer(query_plan: QueryPlan) -> str:
    """The post-processing query with its internal column names replaced by what they stand for."""
    query = query_plan.query
    written = {names.key(i): k.text for i, k in enumerate(query.keys)}
    written |= {names.aggregate(j): a.text for j, a in enumerate(query.aggregates)}
    written |= {names.output(i): name for i, name in enumerate(query.output_names)}

    outer = query.outer.copy()
    for node in list(outer.find_all(exp.Column)):
        if node.name in written:
            node.replace(exp.column(exp.to_identifier(written[node.name], quoted=True)))
    for node in list(outer.find_all(exp.Alias)):
        if node.alias in written:
            node.set("alias", exp.to_identifier(written[node.alias], quoted=True))
    outer.set("from_", None)
    return outer.sql(DIALECT)


def _cost(query_plan: QueryPlan) -> str:
    cost = query_plan.cost
    text = f"epsilon {float(cost.epsilon):g}, delta {float(cost.delta):g}"
    if query_plan.combination is not None:
        text += " (derived from released measurements, no charge)" if not cost.epsilon else \
            " (what is missing, measured now and combined with released measurements)"
    if query_plan.budget.accounting is Accounting.ZCDP:
        text += f" (zCDP: rho {float(cost.rho):g})"
    return text + f"; mechanism {query_plan.budget.mechanism.value}"


_QUANTILE_FACTOR = zcdp_epsilon(1, INTERVAL_SHARE) ** 2  # a quantile with its interval: epsilon^2 per unit of rho


def _zcdp_guarantee(query_plan: QueryPlan) -> list[str]:
    """Under zCDP accounting the epsilon shown is nominal (sqrt(2 rho)): say what is charged, and what holds for
    this query alone."""
    cost = query_plan.cost
    rho = float(cost.rho)
    selection = f", delta {float(cost.delta):g} for partition selection" if cost.delta else ""
    lines = [f"Charged: rho {rho:g} (zCDP accounting: the ledger adds up rho and converts the total to (epsilon, "
             f"delta)); the epsilon {float(cost.epsilon):g} above is nominal, sqrt(2 rho)."]
    if query_plan.budget.mechanism is MechanismKind.GAUSSIAN:
        lines.append(f"On its own: {rho:g}-zCDP{selection}; Gaussian noise has no pure-DP guarantee.")
        return lines
    # Measurements of one budget item (disjoint counts, a pair) spend its share once.
    epsilons = list({m.spec.budget_item: float(m.mechanism.epsilon) for m in query_plan.measurements
                     if m.sensitivity}.values())
    lines.append(f"On its own: epsilon {number(sum(epsilons))} pure DP{selection}: the sum over its {len(epsilons)} "
                 f"Laplace measurement(s) of sqrt(2 rho_j) (a quantile with its interval: sqrt({_QUANTILE_FACTOR:g} "
                 "rho_j), its value's and interval's parts costing rho_j together), more than sqrt(2 rho) when there "
                 "are several "
                 "(measurements that share a share, disjoint counts or a pair's sums, are one here).")
    return lines


def _groups(query_plan: QueryPlan) -> str:
    keys = query_plan.query.keys
    if not keys:
        return "Groups: none (one cell)"
    if query_plan.query.groupings:
        listed = ", ".join("(" + ", ".join(keys[i].text for i in grouping) + ")"
                           for grouping in query_plan.query.groupings)
        count = len(query_plan.query.groupings)
        public = len(query_plan.public_keys())
        how = (f"{public} public group(s) released whatever the data (empty ones as noisy zeros)" +
               (f"; the others chosen by DP partition selection (noisy row count at least "
                f"{query_plan.selection.threshold}, delta {query_plan.selection.delta:g})"
                if query_plan.selection is not None else ""))
        return (f"Groups: {count} groupings released together, {listed}: each row counts once in each, so one unit "
                f"is {count} x {query_plan.max_rows} rows for the sensitivity (at most {query_plan.max_rows} in any "
                f"one group), and every measurement spends the query's whole epsilon at that sensitivity: the noise "
                f"of {count} equal shares at {query_plan.max_rows} rows each (sequential composition: the groupings "
                f"share their rows); {how}")
    if query_plan.domains is not None:
        count = 1
        for domain in query_plan.domains:
            count *= len(domain)
        return (f"Groups: {', '.join(k.text for k in keys)}: public values, all {count} groups released "
                "(empty ones as noisy zeros)")
    selection = query_plan.selection
    return (f"Groups: {', '.join(k.text for k in keys)}: chosen by DP partition selection: a group is released when "
            f"its noisy row count is at least {selection.threshold} (delta {selection.delta:g})")


def _shared_shares(query_plan: QueryPlan) -> list[str]:
    """Say which measurements count disjoint rows and so spend one share together."""
    items: dict[tuple, list[int]] = {}
    for i, m in enumerate(query_plan.measurements):
        items.setdefault(m.spec.budget_item, []).append(i)
    return [f"  {' and '.join(f'm{i}' for i in indices)} {_why_shared(query_plan.measurements[indices[0]])}"
            for indices in items.values() if len(indices) > 1]


def _why_shared(first: Measurement) -> str:
    if first.spec.paired:
        return (f"split each row's hi - lo = {number(first.spec.value_point.width)} between them (x - lo, hi - x, or a "
                "NULL row's whole): one row moves them by hi - lo together, so they spend one share together")
    return "count disjoint rows (each row is in exactly one): they spend one share together (parallel composition)"


def _measurement_row(index: int, m: Measurement) -> tuple[str, ...]:
    step = float(m.spec.step)
    # A quantile's mechanism works in rows of rank (its sensitivity m max(q, 1 - q), its tail a rank error).
    unit = " rows" if m.spec.kind is MeasurementKind.QUANTILE else ""
    return (f"m{index}", m.spec.label, m.mechanism.name, number(m.mechanism.sensitivity * step) + unit,
            number(m.share), number(float(m.mechanism.scale) * step) + unit,
            number(m.mechanism.half_width(LEVEL) * step) + unit)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())

