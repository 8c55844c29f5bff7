"""Issue 7, class 5: one row must not be able to make a query much slower than any other row does.

Before the cost model, `benchmarks/attacks/timing.py` read the target's bit from the clock: seven nested
`replace(t, 'a', 'aaaaaaaaaa')` reached only by the target's row made a query 55x-150x slower, and the attacker won
31/32 and 32/32 rounds at epsilon 0.01. Text that grows at each level is now refused from the text, whatever the
data, the same way in both worlds and at no cost. What stays admitted is bounded by the checker's static row cost
(tests/attacks/test_differential.py holds every generated accepted expression to it). No clock is read here.
"""

from __future__ import annotations

import pytest

from benchmarks.attacks.people import send_in_each_world, write_worlds
from benchmarks.attacks.timing import EPSILON, slow_query


def _like_over_grown(levels: int) -> str:
    grown = "CAST(tag AS TEXT)"
    for _ in range(levels):
        grown = f"replace({grown}, '0', '0000000000')"
    return (f"SELECT COUNT(*) FROM people WHERE CASE WHEN tag = 0 AND smoker THEN {grown} ILIKE '%{'_%' * 200}' "
            "ELSE false END")


GROWING = {
    **{f"nested replace x{levels}": slow_query(levels) for levels in (5, 7)},
    "nested replace x4 inside concat": slow_query(4).replace("length(", "length(concat('x', ", 1).replace(
        ") > 0", ")) > 0", 1),
    "ILIKE with a long pattern over grown text": _like_over_grown(4),
}


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory):
    return write_worlds(tmp_path_factory.mktemp("timing"), 40, 23, tagged=True)


@pytest.mark.parametrize("name", list(GROWING))
def test_text_that_grows_per_row_is_refused_from_the_text_in_both_worlds_at_no_cost(worlds, name: str) -> None:
    sent = send_in_each_world(worlds, GROWING[name], EPSILON, seed=23)
    assert all(s.refusal is not None and s.charged == 0 for s in sent), sent
    assert sent[0].refusal == sent[1].refusal
