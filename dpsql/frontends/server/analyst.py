"""What a connection asks of its analyst's private session, in the wire's terms (Answers, column lists, text).

Two implementations: `LocalSession` runs a PrivateSession in the calling thread (the server's own process, or a
worker process, workers.py), and workers.RemoteSession asks a worker process to. The connection does not know
which: both take the same calls, raise the same dpsql errors and return the same values.

`interrupt(thread)` stops the query on the data that the call made from `thread` runs (a client's CancelRequest);
a call that is not on the data is not affected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from dpsql.frontends.explain import explain
from dpsql.frontends.server.commands import Answer
from dpsql.frontends.server.released import private_answer, released_columns
from dpsql.session import PrivateSession
from dpsql.store.ledger import Spending

Columns = tuple[tuple[str, str], ...]
Parameters = Sequence[Any] | None


class AnalystSession(Protocol):
    def answer(self, sql: str, parameters: Parameters, costs: Mapping[str, Any], with_ci: bool) -> Answer: ...

    def columns(self, sql: str, parameters: Parameters, costs: Mapping[str, Any], with_ci: bool) -> Columns: ...

    def explain(self, sql: str, parameters: Parameters, costs: Mapping[str, Any]) -> str: ...

    def reads_public_only(self, sql: str, parameters: Parameters) -> bool: ...

    def known_public_only(self, sql: str, parameters: Parameters) -> bool | None: ...

    def spending(self) -> Spending: ...

    def interrupt(self, thread: int) -> None: ...

    def close(self) -> None: ...


class LocalSession:
    """A PrivateSession of the analyst's, run in this process."""

    def __init__(self, session: PrivateSession) -> None:
        self.session = session

    def answer(self, sql: str, parameters: Parameters, costs: Mapping[str, Any], with_ci: bool) -> Answer:
        """The query's answer, charged once (by the session, in the ledger)."""
        result = self.session.execute(sql, parameters, **costs)
        return private_answer(result, with_ci, self.session.analyst)

    def columns(self, sql: str, parameters: Parameters, costs: Mapping[str, Any], with_ci: bool) -> Columns:
        """The columns the query returns, from its rehearsal on empty tables: no data, no charge."""
        found = self.session.describe(sql, parameters, **costs)
        return released_columns([c.name for c in found], [c.type for c in found], [c.noisy for c in found], with_ci)

    def explain(self, sql: str, parameters: Parameters, costs: Mapping[str, Any]) -> str:
        return explain(self.session.plan_for(sql, parameters, **costs), listed=self.session.engine.lists_earlier_rows)

    def reads_public_only(self, sql: str, parameters: Parameters) -> bool:
        return self.session.reads_public_only(sql, parameters)

    def known_public_only(self, sql: str, parameters: Parameters) -> bool | None:
        return self.session.known_public_only(sql, parameters)

    def spending(self) -> Spending:
        return self.session.spending(self.session.analyst)

    def interrupt(self, thread: int) -> None:
        self.session.engine.interrupt(thread)

    def close(self) -> None:
        self.session.close()
