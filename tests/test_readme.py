"""Every example in the README runs as written, in a fresh copy of the sample data, in the README's order.

A new user copies them verbatim from a fresh clone: the ledger does not exist yet, no environment variable is set.
Each fenced block is one of:
- a shell block (```sh, or commands shown after `$ `): run with bash from the copy's root; where the README shows
  the output, its header and first column (the group keys) must come back, and all of it for an exact answer;
- a Python block: run with this interpreter from the copy's root;
- an SQL block: a query for `dpsql query ... --policy sample_data/visits.toml`;
- a TOML block: a policy (or a part of one, added to the sample policy) that must load;
- the server's blocks: the steward's commands, then psql and psycopg against a `dpsql serve` this test starts (on a
  free port: the examples' 5433 is the one thing changed);
- or listed in SKIPPED with the reason it cannot run here (a synopsis, installing packages, running the tests).
A block that is none of these fails the test: a new example must be made runnable, or listed with its reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpsql.policy import load_policy
from tests.conftest import ROOT

README = ROOT / "README.md"
# What a fresh clone needs before the first example: a virtualenv with dpsql installed. The tests run in one, so the
# first example's setup is this prefix, checked to be there word for word and not run again.
SETUP = "python3 -m venv .venv && . .venv/bin/activate && pip install . && "
# Blocks that cannot run here, by their first line, each with its reason.
SKIPPED = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test,spark]' && pytest":
        "runs this very test suite",
    "dpsql query SQL --policy FILE [--epsilon E]": "a synopsis of the commands (FILE, SQL are placeholders)",
    "pip install 'dpsql[spark]'": "installs packages",
}
EXAMPLE_PORT = "5433"


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence
    language: str
    text: str

    @property
    def first(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def blocks() -> list[Block]:
    found, lines = [], README.read_text().splitlines()
    index = 0
    while index < len(lines):
        if lines[index].startswith("```"):
            end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
            found.append(Block(index + 1, lines[index][3:].strip(), "\n".join(lines[index + 1:end])))
            index = end
        index += 1
    return found


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """What a fresh clone holds for the examples: the sample data, without any ledger, store or users file."""
    shutil.copytree(ROOT / "sample_data", tmp_path / "sample_data",
                    ignore=shutil.ignore_patterns("*.sqlite*", "*.store*", "*.users.json", "*.spill"))
    return tmp_path


def _environment() -> dict[str, str]:
    """This interpreter's virtualenv first on PATH (its `dpsql` and `python3`), no DPSQL_* set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPSQL_", "PG"))}
    bin_dir = str(Path(sys.executable).parent)
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(Path(bin_dir).parent)}


def _bash(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=_environment(), capture_output=True, text=True)
    assert done.returncode == 0, f"{command}\n{done.stderr}"
    return done


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=_environment(), capture_output=True, text=True)
    assert done.returncode == 0, f"{code}\n{done.stderr}"
    return done


def _prompted(block: Block) -> tuple[str, list[str]]:
    """A `$ command` block: the command (its continuation lines are indented) and the output shown after it."""
    lines = block.text.splitlines()
    command = [lines[0].removeprefix("$ ")]
    rest = lines[1:]
    while rest and rest[0].startswith(" "):
        command.append(rest.pop(0))
    return "\n".join(command), rest


def _check_shown_output(shown: list[str], printed: str, exact: bool) -> None:
    """The answer's header, its number of rows and its first column (the group keys) as the README shows them; all
    of it for an exact answer (a query of public tables). Noisy values differ from run to run."""
    shown = [line for line in shown if not line.startswith("cost: ")]  # stderr, the analyst's name in it
    got = printed.splitlines()
    if exact:
        assert got == shown
        return
    # The header's names and the rule under it, not their widths: a column widens with its noisy values (an AVG
    # that comes out below 1 prints 0.8584).
    assert got[0].split() == shown[0].split() and len(got[1].split()) == len(shown[1].split())
    assert len(got) == len(shown)
    assert [line.split()[0] for line in got[2:]] == [line.split()[0] for line in shown[2:]]


@pytest.mark.slow  # about 15 commands, a server, psql: half a minute
def test_every_readme_example_runs_as_written(clone: Path) -> None:
    handled: list[int] = []
    commands: list[str] = []  # the `$ dpsql` commands run so far
    server_blocks: list[Block] = []
    for block in blocks():
        if block.first in SKIPPED or any(block.first.startswith(k) for k in SKIPPED):
            handled.append(block.line)
        elif block.language == "sh":
            assert block.text.startswith(SETUP), block.line
            _bash(block.text.removeprefix(SETUP), clone)
            handled.append(block.line)
        elif block.first.startswith("$ dpsql"):
            command, shown = _prompted(block)
            printed = _bash(command, clone).stdout
            if shown:
                _check_shown_output(shown, printed, exact="FROM regions" in command)
            commands.append(command)
            handled.append(block.line)
        elif block.first.startswith("Contribution bound:"):  # `dpsql explain` of the example joining its tables
            tables = re.findall(r"table '(\w+)'", block.text)
            command = next(c for c in reversed(commands) if all(f"JOIN {t}" in c or f"FROM {t}" in c for t in tables))
            explained = _bash(command.replace("dpsql query", "dpsql explain", 1), clone).stdout
            assert block.text in explained
            handled.append(block.line)
        elif block.language == "toml":
            _load_toml_example(block, clone)
            handled.append(block.line)
        elif block.language == "sql":
            _bash(f'dpsql query "{block.text}" --policy sample_data/visits.toml', clone)
            handled.append(block.line)
        elif block.language == "python" and "psycopg" not in block.text:
            _python(block.text, clone)
            handled.append(block.line)
        elif block.first.startswith(("dpsql budget --init", "PGPASSWORD=")) or "psycopg" in block.text:
            server_blocks.append(block)
            handled.append(block.line)
    _run_server_examples(server_blocks, clone)
    unhandled = [b.line for b in blocks() if b.line not in handled]
    assert not unhandled, f"README blocks at lines {unhandled} are not run by this test: make them runnable here"


def _load_toml_example(block: Block, clone: Path) -> None:
    """The policy example loads beside the sample data; a part of one (Spark's [engine]) loads added to the sample
    policy."""
    folder = clone / "sample_data"
    if block.text.lstrip().startswith("[budget]"):
        (folder / "example.toml").write_text(block.text + "\n")
    else:
        (folder / "example.toml").write_text((folder / "visits.toml").read_text() + "\n" + block.text + "\n")
    load_policy(folder / "example.toml")


def _run_server_examples(found: list[Block], clone: Path) -> None:
    """The steward's commands (all but `user remove`, run last, and the `serve` synopsis, which this test runs on
    a free port), then psql and psycopg as shown."""
    steward, psql, client = found
    commands = [line.split("  #")[0] for line in steward.text.splitlines() if line.startswith("dpsql ")]
    assert commands[-1].startswith("dpsql serve") and commands[-2].startswith("dpsql user remove alice")
    for command in commands[:-2]:
        _bash(command, clone)
    server = subprocess.Popen(["dpsql", "serve", "--policy", "sample_data/visits.toml", "--port", "0", "--quiet"],
                              cwd=clone, env=_environment(), stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in server.stderr:
            found_port = re.search(r"serving \S+ on [\d.]+:(\d+)", line)
            if found_port:
                port = found_port.group(1)
                break
        assert port is not None, "the server did not start"
        command = "\n".join(line for line in psql.text.splitlines() if not line.startswith("NOTICE:"))
        done = _bash(command.replace(f"-p {EXAMPLE_PORT}", f"-p {port}"), clone)
        notice = next(line for line in psql.text.splitlines() if line.startswith("NOTICE:"))
        shown = re.escape(notice).replace("49", r"[\d.]+")  # what alice has left depends on the examples before
        assert re.fullmatch(shown, done.stderr.strip()), done.stderr
        assert done.stdout.strip().splitlines()[-1] == "(5 rows)"  # one row per region
        printed = _python(client.text.replace(f"port={EXAMPLE_PORT}", f"port={port}"), clone).stdout
        assert printed.startswith("dpsql: this query cost epsilon 0.5; alice has epsilon"), printed
    finally:
        server.terminate()
        server.wait()
        server.stderr.close()
    _bash(commands[-2], clone)
