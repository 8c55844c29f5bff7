"""PNG plots from the CSVs: error versus epsilon per aggregate kind, and time versus rows.

matplotlib is the optional `bench` extra (pip install -e '.[bench]'); without it the plots are skipped with a
message and everything else still runs.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from benchmarks.records import DPSQL, read_rows
from benchmarks.report import KINDS, LABELS
from benchmarks.speed import SpeedPoint
from benchmarks.stats import THEORY, CellStat, common_medians

_STYLE = {DPSQL: ("tab:blue", "o"), "smartnoise": ("tab:red", "s"), "opendp": ("tab:green", "^"),
          "tumult": ("tab:purple", "v"), "duckdb": ("tab:gray", "D")}


def write_plots(out: Path) -> str:
    try:
        import matplotlib
    except ImportError:
        return "plots skipped: matplotlib is not installed (pip install -e '.[bench]')"
    matplotlib.use("Agg")  # files only, no display
    written = [*_accuracy_plots(out), *_speed_plot(out)]
    return f"wrote {len(written)} plots: " + ", ".join(p.name for p in written) if written else "no data to plot"


def _accuracy_plots(out: Path) -> list[Path]:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    cells = read_rows(out / "accuracy_cells.csv", CellStat)
    datasets = sorted({c.dataset for c in cells})
    written = []
    for kind in KINDS:
        chosen = [c for c in cells if c.kind == kind]
        if not chosen:
            continue
        figure, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4.2), squeeze=False)
        for axis, dataset in zip(axes[0], datasets, strict=True):
            curves: dict[str, dict[float, float]] = defaultdict(dict)
            for epsilon in sorted({c.epsilon for c in chosen}):
                medians, _ = common_medians(cells, dataset, kind, epsilon)
                for system, value in medians.items():
                    curves[system][epsilon] = value
            for system, points in curves.items():
                eps = sorted(points)
                # A median error of exactly 0 (discrete noise that is mostly 0) has no place on a log axis.
                values = [points[e] if points[e] > 0 else float("nan") for e in eps]
                if system == THEORY:
                    axis.plot(eps, values, "k--", label="dpsql theory (Laplace)")
                else:
                    color, marker = _STYLE[system]
                    axis.plot(eps, values, color=color, marker=marker, label=LABELS[system])
            axis.set(xscale="log", yscale="log", xlabel="ε (total per query)", title=f"{kind.upper()} on {dataset}",
                     ylabel="median relative error (median over common cells)")
            ticks = sorted({c.epsilon for c in chosen})
            axis.set_xticks(ticks, [f"{e:g}" for e in ticks])
            axis.xaxis.set_minor_formatter(NullFormatter())
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize=8)
        figure.tight_layout()
        path = out / f"error_vs_epsilon_{kind}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


def _speed_plot(out: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    points = read_rows(out / "speed_summary.csv", SpeedPoint)
    if not points:
        return []
    figure, axis = plt.subplots(figsize=(6, 4.2))
    for system in sorted({p.system for p in points}):
        mine = sorted((p for p in points if p.system == system), key=lambda p: p.rows)
        color, marker = _STYLE[system]
        axis.plot([p.rows for p in mine], [p.median_s for p in mine], color=color, marker=marker,
                  label=LABELS[system])
    axis.set(xscale="log", yscale="log", xlabel="rows", ylabel="median seconds per query (end to end)",
             title="Grouped COUNT/SUM/AVG: time versus rows")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    path = out / "time_vs_rows.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return [path]
