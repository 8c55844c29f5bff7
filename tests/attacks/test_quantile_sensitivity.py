"""The quantile's bucket query and the per-group bounds, against one unit's removal on generated awkward datasets
(benchmarks/attacks/quantile_sensitivity.py: every measurement, quantile counts included, within its bound)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.attacks import quantile_sensitivity
from dpsql.planning.measurements import MeasurementKind


def test_one_unit_moves_every_measurement_within_its_bound(tmp_path: Path) -> None:
    checked, failures, worst = quantile_sensitivity.run(6, 11, tmp_path)
    assert checked > 0 and failures == []
    assert worst > 0  # the datasets do move the measurements: the check can fail


def test_the_check_sees_a_quantile_count_beyond_m() -> None:
    """changes() must count every bucket of every group: a fake plan whose quantile moved by m + 1 fails."""
    from types import SimpleNamespace

    from dpsql.dp.quantile import grid_for
    grid = grid_for(0, 3, True)
    spec = SimpleNamespace(kind=MeasurementKind.QUANTILE, grid=grid)
    plan = SimpleNamespace(query=SimpleNamespace(keys=[SimpleNamespace(domain=None)]),
                           measurements=[SimpleNamespace(spec=spec, mechanism=SimpleNamespace(max_rows=2))])
    full = [("a", {0: 2}), ("b", {3: 1})]
    without = [("a", {})]
    (_label, change, bound), = quantile_sensitivity.changes(plan, full, without)
    assert (change, bound) == (3.0, 2) and change > bound
