"""A private session's result as the wire sends it: the released columns (each noisy one followed by its interval's
ends if asked), the rows, the command tag and the notices naming the charge and what is left.

One function for both places a query runs: in the server's own process, and in a worker process (workers.py),
which sends the Answer, not the session's result with its plan, back over its pipe.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpsql.frontends.format import headers, records, why_no_rows
from dpsql.frontends.server.commands import Answer
from dpsql.session import PrivateResult


def released_columns(names: Sequence[str], types: Sequence[str], noisy: Sequence[bool],
                     with_ci: bool) -> tuple[tuple[str, str], ...]:
    """The released columns' names and types, each noisy one followed by its interval's ends (DOUBLE) if asked."""
    kinds: list[str] = []
    for kind, flag in zip(types, noisy, strict=True):
        kinds += [kind, "DOUBLE", "DOUBLE"] if with_ci and flag else [kind]
    return tuple(zip(headers(names, noisy, with_ci), kinds, strict=True))


def private_answer(result: PrivateResult, with_ci: bool, user: str) -> Answer:
    """The Answer of `user`'s query: its rows, and for a charged (or cached) answer the notices of its cost."""
    noisy = [c.noisy for c in result.columns]
    columns = released_columns([c.name for c in result.columns], [c.type for c in result.columns], noisy, with_ci)
    rows = records(result, with_ci) if with_ci else result.rows
    cost, left = result.cost, result.spending
    if result.plan is None and not cost.epsilon:  # public tables or a probe: nothing was measured or charged
        return Answer(columns, rows, f"SELECT {len(result.rows)}")
    delta = f", delta {float(cost.delta):g}" if cost.delta else ""
    spent = f"this query cost epsilon {float(cost.epsilon):g}{delta}" if result.cached_at is None else \
        f"the same answer as released at {result.cached_at} UTC, at no cost"
    if result.note and result.cached_at is None:
        spent += f" ({result.note})"
    notice = f"dpsql: {spent}; {user} has epsilon {left.epsilon_remaining:g} of {left.epsilon_total:g} left"
    empty = why_no_rows(result)  # from the released answer only, as the CLI says it
    notices = (notice,) if empty is None else (notice, f"dpsql: {empty}")
    return Answer(columns, rows, f"SELECT {len(result.rows)}", notices=notices)
