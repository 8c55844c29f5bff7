"""summary.md: the headline figures and issue 4's targets, rebuilt from the CSVs in the results folder.

Everything here is read back from the CSVs (never from memory), so the summary always describes the files next
to it, and one part can be rerun without losing the others.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.overhead import TOTAL, LedgerTiming, StageSummary
from benchmarks.peers_env import PEERS
from benchmarks.records import DPSQL, DUCKDB, Cost, Skipped, read_rows
from benchmarks.speed import SpeedPoint
from benchmarks.stats import THEORY, CellRatio, CellStat, common_medians

LABELS = {DPSQL: "dpsql", DUCKDB: "DuckDB (plain, not private)", **{p.name: p.label for p in PEERS}}
KINDS = ("count", "sum", "avg", "var", "stddev")
COVERAGE_TARGET = (0.94, 0.96)
HEADLINE_EPSILON = 1.0


@dataclass(frozen=True)
class Target:
    text: str
    measured: str
    met: bool | None  # None: not measured in this run
    note: str = ""


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def _g(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}g}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


class Summary:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.cells = read_rows(out / "accuracy_cells.csv", CellStat)
        self.ratios = read_rows(out / "accuracy_ratios.csv", CellRatio)
        self.best = read_rows(out / "accuracy_best_peer.csv", CellRatio)
        self.costs = read_rows(out / "accuracy_costs.csv", Cost)
        self.speed = read_rows(out / "speed_summary.csv", SpeedPoint)
        self.overhead = read_rows(out / "overhead_summary.csv", StageSummary)
        self.ledger = read_rows(out / "overhead_ledger.csv", LedgerTiming)
        self.skipped = [s for part in ("accuracy", "speed", "overhead")
                        for s in read_rows(out / f"skipped_{part}.csv", Skipped)]
        self.info = {p.stem[4:]: json.loads(p.read_text()) for p in sorted(out.glob("run_*.json"))}

    # --- speed -------------------------------------------------------------------------------------------------
    def _point(self, system: str, rows: int) -> SpeedPoint | None:
        return next((p for p in self.speed if p.system == system and p.rows == rows), None)

    def speed_targets(self) -> list[Target]:
        if not self.speed:
            return [Target("speed targets", "speed benchmark not run", None)]
        sizes = sorted({p.rows for p in self.speed})
        small, large = sizes[0], sizes[-1]
        mine = self._point(DPSQL, large)
        targets = [Target(f"dpsql's grouped query at {large:,} rows within 1.5x of plain DuckDB",
                          f"{mine.ratio_to_duckdb:.2f}x", mine.ratio_to_duckdb <= 1.5,
                          _margin(mine.ratio_to_duckdb, 1.5, "x DuckDB"))]
        sn = self._point("smartnoise", small)
        targets.append(Target(f"at least 20x faster than SmartNoise SQL end to end at {small:,} rows",
                              f"{sn.dpsql_speedup:.1f}x" if sn else "SmartNoise not run",
                              sn.dpsql_speedup >= 20 if sn else None, _at_least(sn.dpsql_speedup, 20) if sn else ""))
        peers = [p for p in self.speed if p.rows == small and p.system not in (DPSQL, DUCKDB)]
        fastest = min(peers, key=lambda p: p.median_s, default=None)
        targets.append(Target(f"at least 25x faster end to end than the fastest peer at {small:,} rows",
                              f"{fastest.dpsql_speedup:.1f}x ({LABELS[fastest.system]})" if fastest else "no peer run",
                              fastest.dpsql_speedup >= 25 if fastest else None,
                              _at_least(fastest.dpsql_speedup, 25) if fastest else ""))
        return targets

    def speed_section(self) -> list[str]:
        if not self.speed:
            return []
        rows = []
        for p in sorted(self.speed, key=lambda p: (p.rows, p.median_s)):
            rows.append([f"{p.rows:,}", LABELS[p.system], f"{p.median_s * 1000:.1f}", _g(p.ratio_to_duckdb),
                         _g(p.dpsql_speedup), f"{p.load_s:.2f}", f"{p.peak_rss_mb:.0f}", p.reps])
        return ["## Speed: the grouped query (GROUP BY department: COUNT, SUM, AVG), ε = 1", "",
                "Median of the timed runs, end to end per query. dpsql's ×DuckDB is the median of run-by-run ratios "
                "(the two alternate in one process); a peer's ×DuckDB and dpsql's speed-up over it divide medians "
                "of the same benchmark run. Load time is separate. Peak memory: the peak resident set size "
                "(`resource.getrusage(...).ru_maxrss`) of a fresh process per system and size, after loading and "
                "querying (dpsql's is read before plain DuckDB loads its copy in the paired process; Tumult's is "
                "its Python driver's plus Spark's JVM's).", "",
                *_table(["rows", "system", "median ms", "× DuckDB", "dpsql speed-up", "load s", "peak RSS MiB",
                         "runs"], rows)]

    # --- overhead ----------------------------------------------------------------------------------------------
    def overhead_target(self) -> Target:
        total = next((s for s in self.overhead if s.stage == TOTAL), None)
        if total is None:
            return Target("per-query overhead on a tiny table under 10 ms", "overhead benchmark not run", None)
        return Target("per-query overhead on a tiny table under 10 ms", f"{total.median_ms:.1f} ms",
                      total.median_ms < 10, _margin(total.median_ms, 10, " ms"))

    def overhead_section(self) -> list[str]:
        if not self.overhead:
            return []
        rows = [[s.stage, f"{s.median_ms:.2f}", _g(s.p95_ms)] for s in self.overhead]
        return ["## Per-query overhead on a tiny table (PUMS, 1,000 rows)", "",
                "`execute` end to end (GROUP BY sex: COUNT, SUM, AVG of income, secure noise) on a SQL text it has "
                "not seen before (every stage runs: the target's figure) and on the same text again (dpsql may "
                "reuse its prepared plan), and each stage timed on its own in the order execute runs them.", "",
                *_table(["stage", "median ms", "p95 ms"], rows),
                *self._ledger_table()]

    def _ledger_table(self) -> list[str]:
        if not self.ledger:
            return []
        sizes = sorted({t.prior for t in self.ledger})
        rows = [[f"{n:,}", f"{statistics.median(t.ms for t in self.ledger if t.prior == n):.1f}"] for n in sizes]
        return ["One ledger charge against the number of charges already recorded (a charge must stay cheap "
                "however long the ledger grows):", "",
                *_table(["charges already recorded", "median ms per charge"], rows)]

    # --- accuracy ----------------------------------------------------------------------------------------------
    def accuracy_targets(self) -> list[Target]:
        if not self.cells:
            return [Target("accuracy targets", "accuracy benchmark not run", None)]
        targets = []
        by_kind = self._ratio_by_kind("smartnoise")
        if by_kind:
            worst = max(by_kind.items(), key=lambda kv: kv[1])
            informative = self._ratio_by_kind("smartnoise", informative=True)
            targets.append(Target(
                "median relative error at most 0.5x SmartNoise's for every aggregate kind",
                ", ".join(f"{k} {v:.2f}x" for k, v in by_kind.items()), worst[1] <= 0.5,
                _margin(worst[1], 0.5, f"x (worst: {worst[0]})") + "; leaving out the points where both "
                "medians are >= 1 (both answers pure noise): " +
                ", ".join(f"{k} {v:.2f}x" for k, v in informative.items())))
        grouped = [r.ratio for r in self.best if r.grouped and r.basic]
        if grouped:
            value = statistics.median(grouped)
            targets.append(Target("at most 0.7x the best peer's on the grouped COUNT/SUM/AVG workload",
                                  f"{value:.2f}x (median over {len(grouped)} cells x ε)", value <= 0.7,
                                  _margin(value, 0.7, "x")))
        if self.ratios:
            worse = [r for r in self.ratios if r.significantly_worse]
            above = sum(1 for r in self.ratios if r.ratio > 1)
            targets.append(Target(
                "never worse than any peer on any cell", f"{len(worse)} of {len(self.ratios)} cell comparisons "
                f"significantly worse ({above} with ratio > 1)", not worse, _worst_cells(worse)))
        coverage = self._coverage(lambda c: True)
        low, high = COVERAGE_TARGET
        per_kind = {k: self._coverage(lambda c, k=k: c.kind == k) for k in KINDS}
        spread = [v for v in per_kind.values() if v is not None]
        per_cell = {(d, k): self._coverage(lambda c, d=d, k=k: (c.dataset, c.kind) == (d, k))
                    for d in sorted({c.dataset for c in self.cells}) for k in KINDS}
        outside = {key: v for key, v in per_cell.items() if v is not None and not low <= v <= high}
        targets.append(Target("95% intervals cover between 94% and 96% (checked per data set and kind)",
                              f"{_pct(coverage)} pooled; by kind {_pct(min(spread))}–{_pct(max(spread))}",
                              low <= coverage <= high and not outside,
                              "; ".join(f"{k} {_pct(v)}" for k, v in per_kind.items() if v is not None) +
                              "".join(f"; outside: {d} {k} {_pct(v)}" for (d, k), v in outside.items())))
        return targets

    def _ratio_by_kind(self, peer: str, informative: bool = False) -> dict[str, float]:
        grouped: dict[str, list[float]] = defaultdict(list)
        for r in self.ratios:
            if r.peer == peer and not (informative and min(r.dpsql_median_rel, r.peer_median_rel) >= 1):
                grouped[r.kind].append(r.ratio)
        return {k: statistics.median(grouped[k]) for k in KINDS if grouped[k]}

    def _coverage(self, keep: Callable[[CellStat], bool]) -> float | None:
        cells = [c for c in self.cells if c.system == DPSQL and c.coverage is not None and keep(c)]
        runs = sum(c.runs for c in cells)
        return sum(c.coverage * c.runs for c in cells) / runs if runs else None

    def accuracy_section(self) -> list[str]:
        if not self.cells:
            return []
        return [*self._cost_section(), *self._error_table(), *self._ratio_table(), *self._coverage_table(),
                *self._raw_table()]

    def _cost_section(self) -> list[str]:
        rows = []
        how = {DPSQL: "ε for the query, split across its measurements (shared by the aggregates: a pair of sums of "
                      "x − lo and hi − x, or a count and midpoint-normalised sums)",
               "smartnoise": "ε / k, k = epsilons its odometer (get_privacy_cost) charges per query at ε = 1",
               "opendp": "ε as the query's privacy_loss (split over its aggregates); cost = the measurement's map",
               "tumult": "ε / k over its k one-aggregate queries (AVG = SUM/COUNT, STDDEV = √VAR); cost = the sum of "
                         "the compiled measurements' privacy functions"}
        for system in (DPSQL, *(p.name for p in PEERS)):
            costs = [c for c in self.costs if c.system == system]
            if not costs:
                continue
            deviation = max(abs(c.cost - c.epsilon) / c.epsilon for c in costs)
            ks = sorted({c.mechanisms for c in costs})
            rows.append([LABELS[system], how[system], f"{_g(ks[0])}–{_g(ks[-1])}", f"{deviation:.1e}"])
        return ["## Accuracy versus ε", "", self._accuracy_method(), "",
                "### Equal total privacy cost per query", "",
                *_table(["system", "given", "mechanisms per query", "max |reported cost − ε| / ε"], rows)]

    def _accuracy_method(self) -> str:
        info = self.info.get("accuracy", {})
        return (f"Workload: COUNT, SUM, AVG, VAR_POP, STDDEV_POP, with and without GROUP BY, with WHERE, small "
                f"(< 3% of the rows) and large (≥ 10%) cells, on PUMS (1,000 people) and the synthetic visits table "
                f"({info.get('datasets', {}).get('visits', '?'):,} rows, 1-5 per patient, "
                f"max_rows_per_unit = 5); ε in {info.get('epsilons')}; {info.get('runs')} dpsql runs and "
                f"{info.get('peer_runs')} runs per peer per query and ε. dpsql: {info.get('dpsql_method')}, "
                f"noise seeded for repeatability; peers: their own unseeded noise. Relative error is "
                f"|released − truth| / |truth| against the *bounded truth* (dpsql's exact answer after contribution "
                f"bounding and clamping, which is where every system's noise is centred: the cap of 5 rows per "
                f"patient never binds here, so all systems bound the same rows) unless marked raw. "
                f"A cell is one (query, aggregate, group).")

    def _error_table(self) -> list[str]:
        rows = []
        for dataset in sorted({c.dataset for c in self.cells}):
            for kind in KINDS:
                everything = [c.median_rel for c in self.cells if (c.dataset, c.kind, c.epsilon, c.system) ==
                              (dataset, kind, HEADLINE_EPSILON, DPSQL)]
                medians, common = common_medians(self.cells, dataset, kind, HEADLINE_EPSILON)
                if not everything:
                    continue
                rows.append([dataset, kind, _g(statistics.median(everything)), common,
                             *(_g(medians.get(s)) for s in (DPSQL, THEORY, *(p.name for p in PEERS)))])
        header = ["data", "kind", "dpsql, all cells", "common cells", "dpsql", "dpsql theory",
                  *(p.label for p in PEERS)]
        return [f"### Median relative error at ε = {HEADLINE_EPSILON:g}", "",
                "Median over cells of each cell's median. \"All cells\": every cell dpsql answered; the other "
                "columns use only the cells that every system with a number in the row answered (the peers skip "
                "VAR/STDDEV or refuse some points), so they compare like with like.", "",
                *_table(header, rows)]

    def _ratio_table(self) -> list[str]:
        rows = []
        for peer in PEERS:
            for kind in KINDS:
                cells = [r for r in self.ratios if r.peer == peer.name and r.kind == kind]
                if not cells:
                    continue
                at_one = [r.ratio for r in cells if r.epsilon == HEADLINE_EPSILON]
                rows.append([peer.label, kind, f"{statistics.median(r.ratio for r in cells):.2f}",
                             _g(statistics.median(at_one)) if at_one else "–",
                             f"{max(r.ratio for r in cells):.2f}", sum(r.significantly_worse for r in cells),
                             len(cells)])
        best = [r.ratio for r in self.best if r.grouped and r.basic]
        note = (f"Against the best peer per cell on the grouped COUNT/SUM/AVG queries: median "
                f"{statistics.median(best):.2f}x over {len(best)} cells x ε.") if best else ""
        return ["### dpsql's median relative error ÷ the peer's, per cell and ε (equal total cost)", "",
                "Significantly worse: dpsql's 95% confidence interval of its median lies wholly above the peer's.", "",
                *_table(["peer", "kind", "median ratio", "at ε = 1", "worst ratio", "significantly worse",
                         "cells x ε"], rows), note, ""]

    def _coverage_table(self) -> list[str]:
        rows = []
        for dataset in sorted({c.dataset for c in self.cells}):
            for kind in KINDS:
                cells = [c for c in self.cells if c.system == DPSQL and c.dataset == dataset and c.kind == kind]
                if not cells:
                    continue
                per_eps = [self._coverage(lambda c, d=dataset, k=kind, e=e: (c.dataset, c.kind, c.epsilon) == (d, k, e))
                           for e in sorted({c.epsilon for c in cells})]
                rows.append([dataset, kind, _pct(self._coverage(lambda c, d=dataset, k=kind: (c.dataset, c.kind) ==
                                                                (d, k))),
                             f"{_pct(min(per_eps))}–{_pct(max(per_eps))}", sum(c.runs for c in cells)])
        return ["### Coverage of dpsql's 95% intervals (of the bounded truth)", "",
                *_table(["data", "kind", "coverage", "range over ε", "intervals"], rows)]

    def _raw_table(self) -> list[str]:
        rows = []
        for dataset in sorted({c.dataset for c in self.cells}):
            for kind in KINDS:
                cells = [c for c in self.cells if c.system == DPSQL and c.dataset == dataset and c.kind == kind
                         and c.epsilon == HEADLINE_EPSILON and c.median_rel_raw is not None]
                if cells:
                    rows.append([dataset, kind, _g(statistics.median(c.median_rel for c in cells)),
                                 _g(statistics.median(c.median_rel_raw for c in cells))])
        return [f"### dpsql at ε = {HEADLINE_EPSILON:g}: error against the bounded and the raw truth", "",
                "The raw truth is the plain SQL answer without clamping (visits: cost is clamped to 0-5000, "
                "which moves the oncology and overall sums, averages and variances).", "",
                *_table(["data", "kind", "median rel. error (bounded)", "median rel. error (raw)"], rows)]

    # --- all ---------------------------------------------------------------------------------------------------
    def markdown(self) -> str:
        targets = [*self.speed_targets(), self.overhead_target(), *self.accuracy_targets()]
        target_rows = [[t.text, t.measured, {True: "met", False: "**not met**", None: "not run"}[t.met], t.note]
                       for t in targets]
        configs = sorted({i.get("config", "?") for i in self.info.values()})
        sources = sorted({f"{i['dpsql']['commit']} (sources sha256 {i['dpsql']['sources_sha256']})"
                          for i in self.info.values() if "dpsql" in i})
        lines = ["# dpsql benchmarks: summary", "",
                 f"Built {time.strftime('%Y-%m-%d %H:%M')} from the CSVs in this folder (configuration: "
                 f"{', '.join(configs)}). Reproduce with `python -m benchmarks setup-peers` (once, needs the "
                 f"package registry) and `python -m benchmarks all`; see benchmarks/README.md. dpsql measured: "
                 f"{'; '.join(sources) or 'not recorded'}.", "",
                 "## Targets of issue 4", "", *_table(["target", "measured", "status", "by how much / detail"],
                                                      target_rows),
                 *self.speed_section(), *self.overhead_section(), *self.accuracy_section()]
        if self.skipped:
            lines += ["## Skipped", "", "Refusals are grouped per query (the first reason is shown; all are in "
                      "the skipped_*.csv files).", "",
                      *_table(["part", "system", "what", "reason"], _grouped_skips(self.skipped))]
        return "\n".join(lines).rstrip() + "\n"


def _margin(value: float, limit: float, unit: str) -> str:
    """How far a value is from its limit (value <= limit is the goal)."""
    if value <= limit:
        return f"within by {limit / value:.2f}x" if value > 0 else "within"
    return f"misses by {value / limit:.2f}x ({_g(value)} vs {_g(limit)}{unit})"


def _grouped_skips(skipped: Sequence[Skipped]) -> list[list[str]]:
    """One row per part, system and query: "q at ε = 0.01", "q at ε = 0.03" ... become "q at ε = 0.01, 0.03"."""
    groups: dict[tuple[str, str, str], tuple[list[str], str]] = {}
    for s in skipped:
        what, _, epsilon = s.what.partition(" at ε = ")
        epsilons, _ = groups.setdefault((s.part, s.system, what), ([], s.reason))
        if epsilon:
            epsilons.append(epsilon)
    return [[part, LABELS.get(system, system), f"{what} at ε = {', '.join(eps)}" if eps else what,
             reason.replace("|", "/")] for (part, system, what), (eps, reason) in groups.items()]


def _at_least(speedup: float, goal: float) -> str:
    if speedup >= goal:
        return f"exceeds by {speedup / goal:.2f}x"
    return f"misses: {speedup:.1f}x of the {goal:g}x asked ({goal / speedup:.2f}x short)"


def _worst_cells(worse: Sequence[CellRatio]) -> str:
    top = sorted(worse, key=lambda r: -r.ratio)[:3]
    return "; ".join(f"{r.dataset}/{r.query} {r.aggregate} [{r.group}] ε={r.epsilon:g} vs {r.peer}: {r.ratio:.2f}x"
                     for r in top)


def write_summary(out: Path) -> Path:
    path = out / "summary.md"
    path.write_text(Summary(out).markdown())
    return path
