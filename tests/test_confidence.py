"""Half-widths and fiducial intervals (dpsql/dp/confidence.py), checked by simulation and against closed forms.

Coverage is counted over draws from a fixed seed; the tolerance is the binomial distribution's: a correct
half-width fails a check with probability below ALPHA. The few-tenths-of-a-percent widening the module applies
to keep its partial fractions well conditioned is far inside that tolerance.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import binom, norm

from dpsql.dp.confidence import fiducial_interval, gaussian_sum_half_width, laplace_sum_half_width

ALPHA = 1e-6
DRAWS = 200_000
LEVELS = [0.5, 0.9, 0.95, 0.99]


def assert_coverage(covered: int, draws: int, level: float) -> None:
    low, high = binom.interval(1 - ALPHA, draws, level)
    assert low <= covered <= high, f"{covered / draws:.5f} of {draws} covered at level {level}"


@pytest.mark.parametrize("level", LEVELS)
def test_a_single_laplace_term_has_the_closed_form_half_width(level: float) -> None:
    """P(|Laplace(b)| <= t) = 1 - exp(-t / b), so t = -b ln(1 - level)."""
    scales = np.array([[1.0], [0.25], [40.0]])
    assert laplace_sum_half_width(scales, level) == pytest.approx(-scales[:, 0] * np.log(1 - level), rel=1e-9)


LAPLACE_SUMS = [[1.0, 1.0], [1.0, 2.0, 0.5], [3.0, 0.0], [1e-3, 1.0], [2.0, 2.001, 1.999], [0.7] * 5]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("scales", LAPLACE_SUMS, ids=str)
def test_a_laplace_sum_half_width_covers_its_level(scales: list[float], level: float) -> None:
    rng = np.random.default_rng(20261123)
    noise = rng.laplace(0.0, scales, size=(DRAWS, len(scales))).sum(axis=1)
    half_width = laplace_sum_half_width(np.array([scales]), level)[0]
    assert_coverage(int((np.abs(noise) <= half_width).sum()), DRAWS, level)


def test_laplace_half_widths_grow_with_the_level_and_the_scales() -> None:
    scales = np.array([[1.0, 2.0], [1.0, 3.0], [2.0, 4.0]])
    widths = np.array([laplace_sum_half_width(scales, level) for level in LEVELS])
    assert (np.diff(widths, axis=0) > 0).all()  # wider at a higher level, for every cell
    assert (widths[:, 0] < widths[:, 1]).all()  # a larger scale, a wider interval
    assert widths[:, 2] == pytest.approx(2 * widths[:, 0])  # the half-width scales with the noise


@pytest.mark.parametrize("level", LEVELS)
def test_a_gaussian_sum_half_width_is_the_normal_quantile_and_covers_its_level(level: float) -> None:
    stds = np.array([1.0, 2.0, 2.0])  # the sum has standard deviation 3
    half_width = gaussian_sum_half_width(np.array([stds]), level)[0]
    assert half_width == pytest.approx(3.0 * norm.ppf((1 + level) / 2), rel=1e-12)
    rng = np.random.default_rng(7)
    noise = rng.normal(0.0, stds, size=(DRAWS, len(stds))).sum(axis=1)
    assert_coverage(int((np.abs(noise) <= half_width).sum()), DRAWS, level)


CELLS = 20_000


@pytest.mark.parametrize("gaussian", [False, True], ids=["laplace", "gaussian"])
def test_the_fiducial_interval_of_a_linear_output_covers_its_level(gaussian: bool) -> None:
    """For output = m1 + 2 m2 the candidates are exactly the observed value minus the noise, so the interval
    covers the truth at its level, up to the 2048 points the quantiles are read from."""
    rng = np.random.default_rng(11)
    scales = [1.5, 0.5]
    truth = rng.uniform(-100, 100, size=(2, CELLS))
    draw = rng.normal if gaussian else rng.laplace
    observed = [truth[i] + draw(0.0, scales[i], size=CELLS) for i in range(2)]
    low, high, _ = fiducial_interval(observed, scales, gaussian, 0.95, lambda m1, m2: m1 + 2 * m2)
    target = truth[0] + 2 * truth[1]
    assert_coverage(int(((low <= target) & (target <= high)).sum()), CELLS, 0.95)


def test_the_fiducial_interval_widens_with_the_level() -> None:
    """Nested intervals: a higher level never gives a shorter interval, on either side, for every cell."""
    rng = np.random.default_rng(3)
    sums, counts = rng.uniform(-50, 500, size=40), rng.uniform(1, 80, size=40)

    def mean(total, count):
        return total / np.maximum(count, 1.0)

    for gaussian in (False, True):
        intervals = [fiducial_interval([sums, counts], [4.0, 2.0], gaussian, level, mean)[:2] for level in LEVELS]
        for (low, high), (wider_low, wider_high) in itertools.pairwise(intervals):
            assert (wider_low <= low).all() and (high <= wider_high).all()
            assert (wider_high - wider_low > high - low).any()


def test_the_fiducial_interval_is_deterministic_and_per_cell() -> None:
    """No random generator: the same inputs give the same interval, and a cell's interval does not depend on
    the other cells (the chunking of 256 cells is invisible)."""
    rng = np.random.default_rng(5)
    values = rng.uniform(0, 10, size=600)
    once = fiducial_interval([values], [1.0], False, 0.9, np.square)
    again = fiducial_interval([values], [1.0], False, 0.9, np.square)
    alone = fiducial_interval([values[300:301]], [1.0], False, 0.9, np.square)
    assert all((a == b).all() for a, b in zip(once, again, strict=True))
    assert [part[300] for part in once] == pytest.approx([part[0] for part in alone])


def _reference_fiducial(observed, scales, gaussian, level, output):
    """The fiducial interval as first written (points x cells, np.quantile, std over axis 0): the faster layout
    must give the same intervals."""
    from dpsql.dp.confidence import _standard_noise

    noise = _standard_noise(len(observed), gaussian).T
    truths = [obs[None, :] - scale * noise[:, i][:, None]
              for i, (obs, scale) in enumerate(zip(observed, scales, strict=True))]
    candidates = output(*truths)
    tail = (1 - level) / 2
    low, high = np.quantile(candidates, [tail, 1 - tail], axis=0)
    return low, high, candidates.std(axis=0)


def _average(count, total):
    return np.clip(500 + total / np.maximum(count, 1.0), 0, 1000)


def _spread(count, total, squares):
    n = np.maximum(count, 1.0)
    return np.sqrt(np.clip(squares / n - (total / n) ** 2, 0.0, 1e6))


def _poisoned(count, total):
    """An output with NaN and infinite candidates in some cells, to follow numpy's handling of both."""
    return np.where(count < 1000, np.nan, np.where(count > 2500, np.inf, total / count))


@pytest.mark.parametrize("level", [0.5, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("gaussian", [False, True])
@pytest.mark.parametrize("output, scales", [(_average, [5.0, 4000.0]), (_spread, [3.0, 100.0, 9000.0]),
                                            (_poisoned, [10.0, 50.0])], ids=["avg", "stddev", "nan"])
def test_the_fiducial_interval_is_value_for_value_the_reference_one(output, scales, gaussian: bool,
                                                                    level: float) -> None:
    rng = np.random.default_rng(7)
    cells = 300  # more than one chunk of 256
    observed = [rng.uniform(-50, 3000, cells)] + [rng.uniform(-1e6, 1e6, cells) for _ in scales[1:]]
    observed[0][5:8] = [0.0, -3.0, 1e-300]
    with np.errstate(invalid="ignore"):  # inf - inf among the poisoned candidates
        low, high, std = fiducial_interval(observed, scales, gaussian, level, output)
        ref_low, ref_high, ref_std = _reference_fiducial(observed, scales, gaussian, level, output)
    np.testing.assert_array_equal(low, ref_low)
    np.testing.assert_array_equal(high, ref_high)
    # The std sums along the other axis now (numpy sums pairwise along a contiguous axis): the last bit may move.
    np.testing.assert_allclose(std, ref_std, rtol=1e-12, atol=0)
