"""How a query's privacy cost is split between its measurements.

Each measurement j carries a weight W_j: how much its noise variance, per unit of budget, adds to the summed
squared relative error of the outputs that use it (the planner derives W_j). The split minimises that sum:

- pure DP (Laplace): the variance of j is proportional to 1/epsilon_j**2, and minimising sum W_j/epsilon_j**2
  subject to sum epsilon_j = epsilon gives epsilon_j proportional to W_j**(1/3);
- zCDP (rho adds up): the variance of a Gaussian is proportional to 1/rho_j, and minimising sum W_j/rho_j
  subject to sum rho_j = rho gives rho_j proportional to W_j**(1/2).

The Lagrange conditions give both closed forms; the minimum is (sum W_j**(1/3))**3 / epsilon**2 and
(sum W_j**(1/2))**2 / rho respectively, which `objective` returns so that candidate plans can be compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

_SHRINK = 1 - 1e-12  # far below any effect on the noise, far above the rounding of a float division


def _power(zcdp: bool) -> float:
    return 0.5 if zcdp else 1 / 3


def split(total: Fraction, weights: Sequence[float], zcdp: bool) -> list[float]:
    """The shares of `total` that minimise the weighted error; a zero weight gets a zero share.

    The noise is calibrated to each share as an exact rational, and the ledger charges `total`, so the exact
    sum of the shares must not exceed `total`: they are shrunk by a factor 1 - 1e-12 and the sum is verified.
    """
    if any(w < 0 for w in weights):
        raise ValueError("weights must not be negative")
    if not weights:
        return []
    roots = [w ** _power(zcdp) for w in weights]
    norm = sum(roots)
    fractions = [r / norm for r in roots] if norm > 0 else [1 / len(weights)] * len(weights)
    shares = [float(total) * f * _SHRINK for f in fractions]
    if sum(Fraction(s) for s in shares) > total:
        raise ArithmeticError("the budget split exceeds the query's cost")
    return shares


def objective(weights: Sequence[float], zcdp: bool) -> float:
    """The minimal weighted error for a unit budget (up to a constant factor): lower is better."""
    return sum(w ** _power(zcdp) for w in weights) ** (1 / _power(zcdp))
