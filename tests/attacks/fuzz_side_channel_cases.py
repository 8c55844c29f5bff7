"""Expressions that error on one row, found by the differential fuzzer (benchmarks/attacks/differential.py) or by
hand, minimised: the checker must refuse each of them from the text (issue 7, the type and totality check).

Each case is (query over the fuzzer's table `f`, the adversarial row theme that makes it fail, why). Queries are
written for the fuzzer's policy (differential.TABLE). tests/attacks/test_differential.py runs them: a case passes
when the query is refused for free, or answered on every world without an error.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExpectedRefusal:
    sql: str
    theme: str  # the adversarial row (differential.ADVERSARIAL_ROWS) that makes it fail, or "base"
    reason: str


CASES: tuple[ExpectedRefusal, ...] = (
    ExpectedRefusal("SELECT COUNT(*) FROM f WHERE s LIKE 'a' ESCAPE 'ü'", "base",
                    "a multi-byte ESCAPE raises 'Invalid escape string' per row, a SyntaxException TRY does not "
                    "catch (benchmarks/attacks/error_oracle.py)"),
)
