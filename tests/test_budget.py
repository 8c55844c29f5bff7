"""The budget ledger: charged before release, never overspent, persistent across processes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import mpmath
import pytest

from benchmarks.support import create_ledger, seeded, write_csv, write_policy
from dpsql.errors import BudgetExhausted, LedgerError
from dpsql.frontends.explain import explain
from dpsql.session import PrivateSession
from dpsql.store.ledger import epsilon_of_rho, rho_budget

COUNT = "SELECT COUNT(*) FROM t"


def _policy(tmp_path: Path, **budget) -> Path:
    write_csv(tmp_path / "t.csv", ["pid", "x"], [(i, i % 7) for i in range(1, 50)])
    return create_ledger(write_policy(tmp_path / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 1,
        "columns": {"pid": {"type": "int"}, "x": {"type": "int", "lower": 0, "upper": 6}}}},
        {"epsilon": 1.0, "delta": 1e-6, **budget}))


def test_ten_queries_of_a_tenth_spend_exactly_one(tmp_path: Path) -> None:
    session = PrivateSession(_policy(tmp_path), "ann", rng=seeded(1))
    for _ in range(10):
        session.execute(COUNT, epsilon=0.1)
    with pytest.raises(BudgetExhausted, match="would overspend the total budget"):
        session.execute(COUNT, epsilon=0.1)
    assert session.history()[-1].epsilon == Fraction(1, 10) and len(session.history()) == 10
    assert session.spending().epsilon_spent == 1.0 and session.spending().epsilon_remaining == 0.0


def test_each_analyst_has_a_share_and_all_share_the_total(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    text = policy.read_text() + "\n[budget.analysts.bob]\nepsilon = 0.3\n"
    policy.write_text(text.replace("[tables.t]", "[tables.t]", 1))
    # [budget.analysts.bob] must sit in the budget table: rewrite the file in TOML order
    lines = policy.read_text().split("\n")
    analysts = lines[-3:-1]
    body = lines[:-3]
    at = body.index("[tables.t]")
    policy.write_text("\n".join(body[:at] + analysts + [""] + body[at:]))
    bob = PrivateSession(policy, "bob", rng=seeded(1))
    bob.execute(COUNT, epsilon=0.3)
    with pytest.raises(BudgetExhausted, match="analyst 'bob'"):
        bob.execute(COUNT, epsilon=0.01)
    ann = PrivateSession(policy, "ann", rng=seeded(2))
    ann.execute(COUNT, epsilon=0.7)
    with pytest.raises(BudgetExhausted, match="the total budget"):
        ann.execute(COUNT, epsilon=0.01)  # ann's own share (the total) is not used up, the total is


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpsql", *args], capture_output=True, text=True,
                          env={**os.environ, "DPSQL_ANALYST": "cli"}, timeout=120)


def test_the_budget_persists_across_processes(tmp_path: Path) -> None:
    policy = str(_policy(tmp_path))
    first = _cli("query", COUNT, "--policy", policy, "--epsilon", "0.6")
    assert first.returncode == 0, first.stderr
    second = _cli("query", COUNT, "--policy", policy, "--epsilon", "0.6")
    assert second.returncode == 3 and "would overspend" in second.stderr and second.stdout == ""
    third = _cli("query", COUNT, "--policy", policy, "--epsilon", "0.4")
    assert third.returncode == 0, third.stderr
    shown = _cli("budget", "--policy", policy)
    assert "epsilon 1 spent of 1, 0 left" in shown.stdout and shown.stdout.count("SELECT COUNT(*) FROM t") == 2


def test_no_ledger_no_answer(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    policy.write_text(policy.read_text().replace("[budget]", f"[budget]\nledger = \"{tmp_path / 'gone' / 'l.db'}\""))
    with pytest.raises(LedgerError, match="does not exist; refusing to answer"):
        PrivateSession(policy, "x")


@pytest.mark.parametrize("damage", ["directory", "garbage"])
def test_an_unusable_ledger_refuses_to_answer(tmp_path: Path, damage: str) -> None:
    """Whatever stops the ledger from recording a charge (here: its path is a folder, or not a database; the
    fault suite covers read-only files) stops the answer: nothing is released for free."""
    policy = _policy(tmp_path)
    session = PrivateSession(policy, "x", rng=seeded(0))
    session.execute(COUNT, epsilon=0.1)
    ledger = tmp_path / "p.ledger.sqlite"
    for leftover in tmp_path.glob("p.ledger.sqlite*"):
        leftover.unlink()
    if damage == "directory":
        ledger.mkdir()
    else:
        ledger.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LedgerError, match="refusing to answer|cannot be"):
        session.execute(COUNT, epsilon=0.1)


def test_a_ledger_cannot_change_accounting(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    PrivateSession(policy, "x").close()
    policy.write_text(policy.read_text().replace("[budget]", "[budget]\naccounting = \"zcdp\""))
    with pytest.raises(LedgerError, match="started with pure accounting"):
        PrivateSession(policy, "x")


def test_zcdp_accounting_with_gaussian_noise(tmp_path: Path) -> None:
    """rho = epsilon^2 / 2 per query adds up: many small queries fit where pure DP would allow fewer."""
    policy = _policy(tmp_path, epsilon=10.0, accounting="zcdp", mechanism="gaussian")
    session = PrivateSession(policy, "z", rng=seeded(4))
    result = session.execute("SELECT COUNT(*), AVG(x) FROM t", epsilon=0.1)
    assert {m.mechanism.name for m in result.plan.measurements} == {"discrete Gaussian"}
    assert result.cost.rho == Fraction(1, 200)  # epsilon^2 / 2
    half_delta = Fraction(1, 2 * 10**6)  # half the delta converts rho to epsilon, half is for selection
    cap = rho_budget(Fraction(10), half_delta)
    answered = 1
    while True:
        try:
            session.execute(COUNT, epsilon=0.1)
            answered += 1
        except BudgetExhausted:
            break
    assert answered == int(cap / Fraction(1, 200))
    assert answered > 100  # pure DP would stop at 10 / 0.1 = 100
    assert epsilon_of_rho(Fraction(answered, 200), half_delta) <= 10.0 < epsilon_of_rho(
        Fraction(answered + 1, 200), half_delta)


def _mp(value: Fraction) -> mpmath.mpf:
    return mpmath.mpf(value.numerator) / value.denominator


@pytest.mark.parametrize("epsilon", [1e-9, 1.4e-9, 3.3e-9, 1e-6, 1e-3, 0.5, 1.0, 10.0, 1000.0])
def test_the_zcdp_cap_never_converts_to_more_than_the_budget(epsilon: float) -> None:
    """rho + 2 sqrt(rho ln(1/delta)) at the cap, in 60-digit arithmetic, is at most epsilon and within 1e-12 of it.

    Written as (sqrt(L + e) - sqrt(L))^2 the cap lost about log10(L/e) digits to cancellation: at e near 1e-9 it
    overshot the budget in 910 of 1990 (e, delta) pairs, by up to 1.6e-5 relative, far beyond its 1e-12 margin."""
    mpmath.mp.dps = 60
    budget = Fraction(repr(epsilon))
    for k in range(3, 31):
        for delta in (Fraction(1, 10**k), Fraction(1, 2 * 10**k), Fraction(3, 10**k)):
            rho = _mp(rho_budget(budget, delta))
            converted = rho + 2 * mpmath.sqrt(rho * -mpmath.log(_mp(delta)))
            assert converted <= _mp(budget), (epsilon, delta)
            assert converted >= _mp(budget) * (1 - mpmath.mpf("1e-12")), (epsilon, delta)


def test_explain_says_what_zcdp_charges_and_what_a_query_guarantees_on_its_own(tmp_path: Path) -> None:
    """With zCDP accounting and Laplace noise a query is charged rho = epsilon^2/2, but alone it is only
    (sum_j sqrt(2 rho_j))-DP over its budget items j: about 1.7 for the three below at a nominal epsilon of 1 (x is
    nullable, so COUNT(*) is the sum of two counts of disjoint rows, which spend one share: four measurements)."""
    session = PrivateSession(_policy(tmp_path, accounting="zcdp"), "z")
    several = session.prepare("SELECT COUNT(*), AVG(x), STDDEV(x) FROM t", epsilon=1.0).plan
    shares = {m.spec.budget_item: m.share for m in several.measurements}
    pure = sum(math.sqrt(2 * share) for share in shares.values())
    assert len(several.measurements) == 4 and len(shares) == 3 and 1.6 < pure < 1.8
    text = explain(several)
    assert "Charged: rho 0.5 (zCDP accounting" in text and "the epsilon 1 above is nominal" in text
    assert f"On its own: epsilon {pure:.4g} pure DP: the sum over its 3 Laplace measurement(s)" in text
    lone = explain(session.prepare(COUNT, epsilon=1.0).plan)
    assert "On its own: epsilon 1 pure DP: the sum over its 1 Laplace measurement(s)" in lone
    session.close()


def test_explain_under_zcdp_with_gaussian_noise_and_under_pure_dp(tmp_path: Path) -> None:
    gaussian = PrivateSession(_policy(tmp_path, accounting="zcdp", mechanism="gaussian"), "g")
    text = explain(gaussian.prepare(COUNT, epsilon=0.1).plan)
    assert "Charged: rho 0.005" in text and "On its own: 0.005-zCDP; Gaussian noise has no pure-DP guarantee" in text
    gaussian.close()
    (tmp_path / "pure").mkdir()
    pure = PrivateSession(_policy(tmp_path / "pure"), "p")
    text = explain(pure.prepare(COUNT, epsilon=0.1).plan)
    assert text.startswith("Cost: epsilon 0.1, delta 0; mechanism laplace\n") and "Charged" not in text
    pure.close()
