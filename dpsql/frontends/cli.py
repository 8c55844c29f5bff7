"""The `dpsql` command line. Errors are one line on stderr and an exit code, never a traceback.

Exit codes: 0 answered; 1 a broken policy, ledger or engine failure (and an aborted prompt); 2 a usage error
(click's convention: a missing argument or option, a bad option value such as an --epsilon that is no number); 3 a
query refused for lack of budget; 4 a query that cannot be answered (malformed, rejected, bad parameters, an epsilon
the budget cannot take); from sysexits: 66 no terminal to ask a password on (`user add` without --password-stdin),
69 the server cannot listen on its address (port in use, no privilege, unknown host), 78 the server's TLS
certificate or key cannot be used; 70 an internal error (a bug: please report); 130 interrupted. Each error class
carries its own code (`dpsql.errors`).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import click

from dpsql.engines.progress import Progress
from dpsql.errors import BudgetExhausted, DataError, Error, NoTerminal, PolicyError, ProgrammingError, first_line
from dpsql.frontends.explain import explain
from dpsql.frontends.format import FORMATS, render, summary, why_no_rows
from dpsql.frontends.progress import for_stream
from dpsql.frontends.skeleton import skeleton, todos_left
from dpsql.planning.targets import Accuracy, accuracy_of
from dpsql.policy import load_policy
from dpsql.session import PrivateSession
from dpsql.sql.parse import TextParameter
from dpsql.store.ledger import BudgetLedger, exact


def _fail(message: str, code: int) -> None:
    """One line on stderr, whatever the message holds (a name the analyst wrote may hold a line break)."""
    click.echo("dpsql: " + " ".join(message.split("\n")), err=True)
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
        except click.Abort:  # end of input at a prompt (Ctrl-D): click's own code
            _fail("aborted", 1)
        except Exception as exc:  # a bug: say so in one line unless asked for the traceback
            if os.environ.get("DPSQL_DEBUG"):
                raise
            _fail(f"internal error ({first_line(exc)}): a bug in dpsql; set DPSQL_DEBUG=1 for the details, and "
                  "please report it", 70)
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
class AccuracyType(click.ParamType):
    """--accuracy: one number for every noisy column, or NAME=VALUE[%] pairs separated by commas, per output column
    (planning/targets.py); malformed text is a usage error."""

    name = "accuracy"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Accuracy:
        if isinstance(value, Accuracy):
            return value
        try:
            return accuracy_of(value if "=" in value else EpsilonType().convert(value, param, ctx))
        except DataError as exc:
            self.fail(str(exc), param, ctx)


_accuracy_option = click.option("--accuracy", type=AccuracyType(), default=None,
                                help="Instead of --epsilon: the largest 95% half-width wanted for every noisy cell, "
                                     "or per column as NAME=VALUE pairs (VALUE% of the column's range for AVG, VAR, "
                                     "STDDEV); dpsql charges the least epsilon that gives it (AVG, VAR, STDDEV in "
                                     "two stages: the count, then the rest).")
_ci_option = click.option("--ci", is_flag=True,
                          help="Show each noisy value's 95% confidence interval. A quantile (MEDIAN, MIN, ...) then "
                               "spends a quarter of its epsilon on its interval; without --ci its value has all.")
_quiet_option = click.option("--quiet", "-q", is_flag=True,
                             help="Show no progress on stderr (by default long steps are shown as they run).")
_param_option = click.option("--param", "-p", "params", multiple=True,
                             help="A query parameter: VALUE for ? placeholders (in order), NAME=VALUE for :name.")


def _analyst_progress(quiet: bool) -> Progress:
    """An analyst's command shows elapsed time only: how far a scan of the private data has gone, or how many rows a
    table has, is not theirs to see (frontends/progress.py)."""
    return for_stream(sys.stderr, quiet=quiet, detailed=False)


def _steward_progress(quiet: bool) -> Progress:
    """The steward's commands (prepare, policy check, serve) show row counts and how far each step has gone."""
    return for_stream(sys.stderr, quiet=quiet, detailed=True)


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
@_accuracy_option
@_analyst_option
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@_ci_option
@_param_option
@_quiet_option
@_errors_as_messages
def query(sql: str, policy: Path, epsilon: Fraction | float | None, accuracy: Accuracy | None,
          analyst: str | None, fmt: str, ci: bool, params: tuple[str, ...], quiet: bool) -> None:
    """Run SQL privately: charge the budget, add calibrated noise, print the answer."""
    progress = _analyst_progress(quiet)
    with progress.step("loading the tables"):
        session = PrivateSession(policy, analyst, reuse=True)
    try:
        # A quantile's interval costs a quarter of its epsilon: measured only when it is shown.
        with progress.step("running the query"):
            result = session.execute(sql, _parameters(params), epsilon=epsilon, accuracy=accuracy,
                                     quantile_intervals=ci)
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
@_accuracy_option
@_analyst_option
@_ci_option
@_param_option
@_quiet_option
@_errors_as_messages
def explain_command(sql: str, policy: Path, epsilon: Fraction | float | None, accuracy: Accuracy | None,
                    analyst: str | None, ci: bool, params: tuple[str, ...], quiet: bool) -> None:
    """Show the rewritten SQL, each cell's mechanism, noise and interval, and the cost (with the released
    measurements it would derive from). Spends nothing."""
    with _analyst_progress(quiet).step("loading the tables"):
        session = PrivateSession(policy, analyst, reuse=True)
    try:
        plan = session.plan_for(sql, _parameters(params), epsilon=epsilon, accuracy=accuracy, quantile_intervals=ci)
        click.echo(explain(plan, listed=session.engine.lists_earlier_rows))
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
@_policy_option
@_quiet_option
@_errors_as_messages
def prepare(policy: Path, quiet: bool) -> None:
    """Build the policy's prepared store ([engine] store) if it is missing or stale: queries then attach it instead
    of loading every source again. The steward runs it after the data change (a query would otherwise build it)."""
    from dpsql.session import build_engine

    loaded = load_policy(policy)
    if loaded.store is None:
        raise PolicyError(f"policy {loaded.path.name}: key '[engine] store': not set, so every query loads the "
                          f"sources itself; set `store = true` (beside the ledger) or a file name to prepare them")
    started = time.monotonic()
    # DuckDB's store file, or Spark's folder of Parquet ([engine] kind)
    engine = build_engine(loaded, progress=_steward_progress(quiet))
    engine.close()
    done = "built" if engine.store_built else "ready (already built for these sources and this policy)"
    click.echo(f"prepared store {loaded.store}: {done}" + (f" in {time.monotonic() - started:.1f} s"
                                                          if engine.store_built else ""))


@main.command()
@click.argument("data_file")
@click.option("--table", default=None, help="The table name (default: from the file name); for a database, the "
                                            "table to read (name or schema.name).")
@click.option("--unit", default=None, help="The column that identifies a person.")
@click.option("--row-privacy", is_flag=True, help="Every row belongs to a different person.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the skeleton here instead of printing it.")
@_errors_as_messages
def init(data_file: str, table: str | None, unit: str | None, row_privacy: bool, output: Path | None) -> None:
    """Write a policy skeleton from a CSV or Parquet file's schema, or a database table's (DATA_FILE a URI:
    postgresql://host/db or sqlite:file.db, without a password), names and types only."""
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
@_quiet_option
@_errors_as_messages
def check(file: Path, quiet: bool) -> None:
    """Check a policy and load its tables: every problem is named with its table and key, and every TODO that
    `dpsql init` left in it is a warning."""
    from dpsql.session import build_engine

    try:
        todos = todos_left(file.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        todos = []  # load_policy says why it cannot be read
    for line, asked in todos:
        click.echo(f"dpsql: warning: {file.name}, line {line}: a TODO is left: {asked}", err=True)
    loaded = load_policy(file)
    build_engine(loaded, progress=_steward_progress(quiet)).close()
    for table in loaded.tables.values():
        bounded = [c.name for c in table.columns.values() if c.bounded]
        public = [c.name for c in table.columns.values() if c.values is not None]
        if table.public:  # no unit, no bound: read as it is
            click.echo(f"table {table.name}: {len(table.columns)} columns, public")
            continue
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
    click.echo(f"loads, but is not finished: {len(todos)} TODO(s) left (see the warnings)" if todos else "ok")


@main.command()
@_policy_option
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", default=5433, show_default=True, type=click.IntRange(0, 65535))
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="The server's TLS certificate (PEM); with --tls-key, clients may ask for TLS.")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="The private key of --tls-cert (PEM).")
@click.option("--require-tls", is_flag=True, help="Refuse connections that do not use TLS.")
@click.option("--max-connections", default=64, show_default=True, type=click.IntRange(1))
@click.option("--max-message", default=1 << 20, show_default=True, type=click.IntRange(1024),
              help="The largest message a client may send, in bytes.")
@click.option("--login-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds from connecting to logged in.")
@click.option("--idle-timeout", default=3600.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds a client may stay silent (0: no limit).")
@click.option("--query-slots", default=0, show_default=True, type=click.IntRange(0),
              help="Queries on the data at once (0: two per core).")
@click.option("--analyst-queries", default=2, show_default=True, type=click.IntRange(1),
              help="Of them, one analyst's at most.")
@click.option("--workers", default=None, type=click.IntRange(0),
              help="Worker processes holding the analysts' sessions, each with its own engine on the data "
                   "(default: one per core; 0: the sessions run in the server's own process).")
@_quiet_option
@_errors_as_messages
def serve(policy: Path, host: str, port: int, tls_cert: Path | None, tls_key: Path | None, require_tls: bool,
          max_connections: int, max_message: int, login_timeout: float, idle_timeout: float, query_slots: int,
          analyst_queries: int, workers: int | None, quiet: bool) -> None:
    """Serve the policy's tables over the PostgreSQL protocol: psql, drivers and BI tools log in as analysts."""
    import asyncio
    import logging

    from dpsql.frontends.server.server import DpsqlServer, ServerConfig, load_tls

    if (tls_cert is None) != (tls_key is None):
        raise ProgrammingError("give --tls-cert and --tls-key together")
    if require_tls and tls_cert is None:
        raise ProgrammingError("--require-tls needs --tls-cert and --tls-key")
    tls = load_tls(tls_cert, tls_key) if tls_cert is not None and tls_key is not None else None
    config = ServerConfig(host, port, tls, require_tls, max_connections, max_message, login_timeout, idle_timeout,
                          query_slots, analyst_queries, workers=(os.cpu_count() or 1) if workers is None else workers)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def run() -> None:
        server = DpsqlServer(load_policy(policy), config, progress=_steward_progress(quiet))
        await server.start()
        workers = f", {len(server.workers.workers)} worker processes" if server.workers is not None else ""
        click.echo(f"dpsql: serving {policy} on {host}:{server.port}{' (TLS)' if tls else ''}{workers}", err=True)
        try:
            await server.serve_forever()
        finally:
            await server.close()

    asyncio.run(run())


@main.group()
def user() -> None:
    """The analysts who may log in to `dpsql serve` (SCRAM-SHA-256 verifiers, never passwords)."""


@user.command(name="add")
@click.argument("name")
@_policy_option
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
@_errors_as_messages
def user_add(name: str, policy: Path, password_stdin: bool) -> None:
    """Add an analyst, or set a new password for one."""
    from dpsql.frontends.server.users import UserStore, users_path

    path = users_path(load_policy(policy))
    store = UserStore.load(path, create=True)
    if password_stdin:
        password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    elif not sys.stdin.isatty():
        raise NoTerminal(f"no terminal to ask the password of {name} on: give it on the first line of stdin with "
                         "--password-stdin")
    else:
        password = click.prompt(f"password for {name}", hide_input=True, confirmation_prompt=True)
    new = store.add(name, password)
    store.save()
    click.echo(f"{'added' if new else 'changed the password of'} {name} in {path}", err=True)


@user.command(name="list")
@_policy_option
@_errors_as_messages
def user_list(policy: Path) -> None:
    """List the analysts who may log in."""
    from dpsql.frontends.server.users import UserStore, users_path

    path = users_path(load_policy(policy))
    for name in sorted(UserStore.load(path, create=True).verifiers):
        click.echo(name)


@user.command(name="remove")
@click.argument("name")
@_policy_option
@_errors_as_messages
def user_remove(name: str, policy: Path) -> None:
    """Remove an analyst: they can no longer log in (their charges stay in the ledger)."""
    from dpsql.frontends.server.users import UserStore, users_path

    path = users_path(load_policy(policy))
    store = UserStore.load(path)
    store.remove(name)
    store.save()
    click.echo(f"removed {name} from {path}", err=True)
