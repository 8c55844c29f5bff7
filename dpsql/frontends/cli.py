"""The `dpsql` command line. Errors are one line on stderr and an exit code, never a traceback.

Exit codes: 0 answered; 1 a broken policy, ledger or engine failure; 2 a usage error (click's convention: a missing
argument or option, a bad option value such as an --epsilon that is no number); 3 a query refused for lack of
budget; 4 a query that cannot be answered (malformed, rejected, bad parameters, an epsilon the budget cannot take);
70 an internal error (a bug: please report). Each error class carries its own code (`dpsql.errors`).
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import click

from dpsql.errors import BudgetExhausted, Error, ProgrammingError
from dpsql.frontends.explain import explain
from dpsql.frontends.format import FORMATS, render, summary, why_no_rows
from dpsql.frontends.skeleton import skeleton
from dpsql.policy import load_policy
from dpsql.session import PrivateSession
from dpsql.sql.parse import TextParameter
from dpsql.store.ledger import BudgetLedger, exact


def _fail(message: str, code: int) -> None:
    click.echo(f"dpsql: {message}", err=True)
    sys.exit(code)


def _errors_as_messages(command: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BudgetExhausted as exc:  # its message says it all ("refused: ... would overspend")
            _fail(str(exc), exc.exit_code)
        except Error as exc:
            _fail(f"{exc.label}: {exc}", exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as exc:  # a bug: say so in one line unless asked for the traceback
            if os.environ.get("DPSQL_DEBUG"):
                raise
            _fail(f"internal error ({type(exc).__name__}: {exc}); set DPSQL_DEBUG=1 for details", 70)
    return wrapper


_policy_option = click.option("--policy", "policy", envvar="DPSQL_POLICY", required=True,
                              type=click.Path(dir_okay=False, path_type=Path),
                              help="The steward's policy file (or $DPSQL_POLICY).")
_analyst_option = click.option("--analyst", envvar="DPSQL_ANALYST", default=None,
                               help="Whose budget to spend (default: the login name, or $DPSQL_ANALYST).")
class EpsilonType(click.ParamType):
    """--epsilon as the exact rational the user typed (0.1 is 1/10, not the nearest float). Text that is no number
    is a usage error; a number the budget cannot take (0, inf, more than the budget) is refused by the session."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Fraction | float:
        if isinstance(value, Fraction | float):
            return value
        try:
            number = float(value)
        except ValueError:
            self.fail(f"{value!r} is not a number", param, ctx)
        return exact(value.strip()) if math.isfinite(number) else number


_epsilon_option = click.option("--epsilon", type=EpsilonType(), default=None,
                               help="The privacy cost of this query (default: the policy's query_epsilon).")
_param_option = click.option("--param", "-p", "params", multiple=True,
                             help="A query parameter: VALUE for ? placeholders (in order), NAME=VALUE for :name.")


def _parameters(params: tuple[str, ...]) -> list[TextParameter] | dict[str, TextParameter] | None:
    """Command-line values are text: each becomes the type its place in the query needs
    (dpsql.analysis.text_parameters)."""
    if not params:
        return None
    named = [p for p in params if "=" in p and p.split("=", 1)[0].isidentifier()]
    if named and len(named) != len(params):
        raise ProgrammingError("give all parameters as NAME=VALUE or none of them")
    if named:
        return {p.split("=", 1)[0]: TextParameter(p.split("=", 1)[1]) for p in params}
    return [TextParameter(p) for p in params]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dpsql")
def main() -> None:
    """Ask ordinary SQL of sensitive tables and get differentially private answers with error bars."""


@main.command()
@click.argument("sql")
@_policy_option
@_epsilon_option
@_analyst_option
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("--ci", is_flag=True, help="Show each noisy value's 95% confidence interval.")
@_param_option
@_errors_as_messages
def query(sql: str, policy: Path, epsilon: Fraction | float | None, analyst: str | None, fmt: str, ci: bool,
          params: tuple[str, ...]) -> None:
    """Run SQL privately: charge the budget, add calibrated noise, print the answer."""
    session = PrivateSession(policy, analyst)
    try:
        result = session.execute(sql, _parameters(params), epsilon=epsilon)
        click.echo(render(result, fmt, ci))
        reason = why_no_rows(result)
        if reason is not None:
            click.echo(reason, err=True)
        click.echo(summary(result, session.analyst), err=True)
    finally:
        session.close()


@main.command(name="explain")
@click.argument("sql")
@_policy_option
@_epsilon_option
@_param_option
@_errors_as_messages
def explain_command(sql: str, policy: Path, epsilon: Fraction | float | None, params: tuple[str, ...]) -> None:
    """Show the rewritten SQL, each cell's mechanism, noise and interval, and the cost. Spends nothing."""
    session = PrivateSession(policy)
    try:
        click.echo(explain(session.prepare(sql, _parameters(params), epsilon=epsilon).plan))
    finally:
        session.close()


@main.command()
@_policy_option
@_analyst_option
@click.option("--history/--no-history", default=True, show_default=True, help="List every charge.")
@click.option("--init", is_flag=True, help="Create the ledger if it does not exist yet (the steward, once).")
@_errors_as_messages
def budget(policy: Path, analyst: str | None, history: bool, init: bool) -> None:
    """Show the total budget, what is spent and what remains, and the history of charges."""
    loaded = load_policy(policy)
    existed = loaded.budget.ledger.exists()
    ledger = BudgetLedger(loaded.budget.ledger, loaded.budget, create=init)
    if init:
        click.echo(f"ledger {'exists' if existed else 'created'}: {loaded.budget.ledger}", err=True)
    total = ledger.spending()
    click.echo(f"ledger: {loaded.budget.ledger}  (accounting: {total.accounting.value})")
    click.echo(f"total:     epsilon {total.epsilon_spent:g} spent of {total.epsilon_total:g}, "
               f"{total.epsilon_remaining:g} left; delta {total.delta_spent:g} of {total.delta_total:g}; "
               f"{total.queries} queries")
    analysts = sorted({c.analyst for c in ledger.history()} | ({analyst} if analyst else set()))
    for name in analysts if analyst is None else [analyst]:
        mine = ledger.spending(name)
        click.echo(f"{name}: epsilon {mine.epsilon_spent:g} spent of {mine.epsilon_total:g}, "
                   f"{mine.epsilon_remaining:g} left; {mine.queries} queries")
    if history:
        click.echo("history:")
        for charge in ledger.history(analyst):
            click.echo(f"  #{charge.id}  {charge.at}  {charge.analyst}  epsilon {float(charge.epsilon):g}  "
                       f"delta {float(charge.delta):g}  {' '.join(charge.query.split())}")


@main.command()
@click.argument("data_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--table", default=None, help="The table name (default: from the file name).")
@click.option("--unit", default=None, help="The column that identifies a person.")
@click.option("--row-privacy", is_flag=True, help="Every row belongs to a different person.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the skeleton here instead of printing it.")
@_errors_as_messages
def init(data_file: Path, table: str | None, unit: str | None, row_privacy: bool, output: Path | None) -> None:
    """Write a policy skeleton from a CSV or Parquet file's schema (names and types only)."""
    if unit and row_privacy:
        raise ProgrammingError("choose --unit or --row-privacy, not both")
    text = skeleton(data_file, table, unit, row_privacy, output.parent if output else Path.cwd())
    if output is None:
        click.echo(text, nl=False)
    elif output.exists():
        raise ProgrammingError(f"{output} exists already; not overwriting it")
    else:
        output.write_text(text)
        click.echo(f"wrote {output}: fill in its TODOs, then run: dpsql policy check {output}", err=True)


@main.group()
def policy() -> None:
    """Work with policy files."""


@policy.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_errors_as_messages
def check(file: Path) -> None:
    """Check a policy and load its tables: every problem is named with its table and key."""
    from dpsql.engines.duckdb_engine import DuckDBEngine

    loaded = load_policy(file)
    DuckDBEngine(loaded).close()
    for table in loaded.tables.values():
        bounded = [c.name for c in table.columns.values() if c.bounded]
        public = [c.name for c in table.columns.values() if c.values is not None]
        unit = "row privacy" if table.row_privacy else f"unit {table.privacy_unit}"
        click.echo(f"table {table.name}: {len(table.columns)} columns, {unit}, at most {table.bound.max_rows} "
                   f"rows per unit; bounded: {', '.join(bounded) or '-'}; public values: {', '.join(public) or '-'}")
    budget = loaded.budget
    click.echo(f"budget: epsilon {budget.epsilon:g}, delta {budget.delta:g}, {budget.accounting.value} accounting, "
               f"{budget.mechanism.value} noise")
    if budget.ledger.exists():
        spent = BudgetLedger(budget.ledger, budget).spending()
        click.echo(f"ledger: {budget.ledger}: {spent.queries} queries, epsilon {spent.epsilon_spent:g} spent")
    else:
        click.echo(f"ledger: {budget.ledger} does not exist yet: create it with `dpsql budget --init --policy {file}`")
    click.echo("ok")
