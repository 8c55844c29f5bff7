"""Expressions that error on one row, found by the differential fuzzer (benchmarks/attacks/differential.py) and
by probing around what it found, minimised: the checker must refuse each of them from the text (issue 7, the type
and totality check refuses them all).

Each case is a query over the fuzzer's table `f` (differential.TABLE), the adversarial row theme
(differential.ADVERSARIAL_ROWS) on which it fails, and why. tests/attacks/test_differential.py runs them: a case
passes when the query is refused for free, or answered on that world without an error.
"""

from __future__ import annotations

from dataclasses import dataclass

_ENDS_IN_ESCAPE = ("a LIKE/ILIKE pattern that ends in its ESCAPE character raises 'Like pattern must not end with "
                   "escape character' on the rows whose value makes matching reach the end of the pattern; TRY does "
                   "not catch it. Here the 10,000-character row starting with 'ab' reaches it, the others do not")


@dataclass(frozen=True)
class ExpectedRefusal:
    sql: str
    theme: str  # the adversarial row that makes it fail, or "base"
    reason: str


CASES: tuple[ExpectedRefusal, ...] = (
    ExpectedRefusal("SELECT COUNT(*) FROM f WHERE s LIKE 'a' ESCAPE 'ü'", "base",
                    "a multi-byte ESCAPE raises 'Invalid escape string' per row, a SyntaxException TRY does not "
                    "catch (benchmarks/attacks/error_oracle.py)"),
    ExpectedRefusal("SELECT COUNT(*) FROM f WHERE s LIKE 'ab%\\' ESCAPE '\\'", "largest", _ENDS_IN_ESCAPE),
    ExpectedRefusal("SELECT COUNT(*) FROM f WHERE s ILIKE 'AB%\\' ESCAPE '\\'", "largest", _ENDS_IN_ESCAPE),
    ExpectedRefusal("SELECT COUNT(*) FROM f WHERE s NOT LIKE 'ab%\\' ESCAPE '\\'", "largest", _ENDS_IN_ESCAPE),
    ExpectedRefusal("SELECT COUNT(CASE WHEN s LIKE 'ab%\\' ESCAPE '\\' THEN 1 END) FROM f", "largest",
                    _ENDS_IN_ESCAPE),
    ExpectedRefusal("SELECT s LIKE 'ab%\\' ESCAPE '\\' AS k, COUNT(*) FROM f GROUP BY k", "largest",
                    _ENDS_IN_ESCAPE),
    ExpectedRefusal("SELECT COUNT(*) FROM f WHERE CASE WHEN i = 9223372036854775807 THEN s LIKE 'a\\' ESCAPE '\\' "
                    "ELSE false END", "largest", _ENDS_IN_ESCAPE + " (a CASE picks the one row)"),
    ExpectedRefusal("SELECT COUNT(*) FROM f WHERE s LIKE '%#' ESCAPE '#'", "base",
                    _ENDS_IN_ESCAPE + " (every row reaches it after a leading %)"),
)
