"""The documentation: the README and the site in docs/ build without a warning, and every code block in them runs.

Each page's blocks run in order, in a fresh copy of the sample data (what a fresh clone holds: no ledger, store or
users file; for the pages in docs/, the sample's ledger created), with this interpreter's virtualenv first on PATH
and no DPSQL_* or PG* variable set. A block is one of:
- a shell block (```sh): run with bash from the copy's root, every line of it; a line `dpsql serve ...` (the last
  of its block) starts the server on a free port instead of the default 5433, which the page's later blocks are
  pointed at;
- a prompted block (```console, first line `$ command`, going on after a backslash or inside quotes): the command
  is run, and the output shown after it checked: a table's header, its number of rows and its first column (the
  group keys), as noisy values differ from run to run; other lines each found among the printed ones, numbers
  taken as any number (`...` stands for lines left out); an error shown (`ERROR:`, `dpsql: error:`) is a
  refusal, and the command must fail; a ```text block titled "output" shows the output of the
  block before it;
- a Python block: run with this interpreter;
- an SQL block: a query for `dpsql query ... --policy sample_data/visits.toml`;
- a TOML block: a policy that must load; with `title="FILE"` written to FILE first (the page's later commands read
  it), without one a whole policy or a part added to the sample policy;
- or marked `<!-- not run: REASON -->` on the line before its fence (installing packages, a GUI's steps, a
  synopsis). The marked blocks are exactly the ones not run: a block that is neither runnable nor marked fails.
A block that runs a system program the `test` extra cannot install (psql, openssl, Java with the JDBC driver) and
that is missing here is not run, nor are the page's blocks after it, and the page's test is skipped naming them, as
tests/server skips its psql and JDBC tests: .ci/run installs them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpsql.policy import load_policy
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<language>[\w-]*)\s*(?P<attributes>.*)$")
EXAMPLE_PORT = "5433"
SAMPLE_POLICY = "sample_data/visits.toml"
RUNNABLE = {"sh", "console", "python", "sql", "toml", "text"}  # text: only a command's output (title="output")
# What a fresh clone needs before the README's first example: a virtualenv with dpsql installed. The tests run in
# one, so that setup is checked to be there word for word and not run again.
SETUP = "python3 -m venv .venv && . .venv/bin/activate && pip install . && "


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    language: str
    title: str | None
    text: str
    not_run: str | None  # the reason, when the block is marked as not run

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, their content dedented (a block inside a list item is indented)."""
    found, lines = [], page.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent = opening["indent"]
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        body = "\n".join(line.removeprefix(indent) for line in lines[index + 1:end])
        title = re.search(r'title="([^"]+)"', opening["attributes"])
        marked = NOT_RUN.search(lines[index - 1]) if index else None
        found.append(Block(page, index + 1, opening["language"], title and title.group(1), body,
                           marked and marked.group(1)))
        index = end + 1
    return found


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# --- fast: every block is runnable or marked, every policy shown loads -----------------------------------------

def test_every_block_is_runnable_or_marked_with_a_reason() -> None:
    unknown = [b.where for page in PAGES for b in blocks(page) if b.not_run is None and (
        b.language not in RUNNABLE or (b.language == "text" and b.title != "output"))]
    assert not unknown, f"blocks of no runnable kind (sh, console, python, sql, toml, an output), not marked: {unknown}"
    prompted = [b.where for page in PAGES for b in blocks(page)
                if b.language == "console" and b.not_run is None and not b.text.startswith("$ ")]
    assert not prompted, f"console blocks that do not start with a `$ ` prompt: {prompted}"


def test_every_block_marked_not_run_is_one_that_cannot_run_here() -> None:
    """A marker is for what cannot run (packages, GUIs, placeholders), not for a runnable example that fails."""
    marked = [b for page in PAGES for b in blocks(page) if b.not_run is not None]
    assert marked, "no block is marked: the marker's pattern no longer matches"
    for block in marked:
        assert len(block.not_run.split()) >= 2, f"{block.where}: say why it cannot run"


def _policies_shown(page: Path) -> list[Block]:
    """TOML blocks that need no earlier step (a titled one is written by the page's steps: the slow test loads it)."""
    return [b for b in blocks(page) if b.language == "toml" and b.not_run is None and b.title is None]


@pytest.mark.parametrize("page", [page for page in PAGES if _policies_shown(page)], ids=_page_id)
def test_every_policy_shown_loads(page: Path, tmp_path: Path) -> None:
    clone = _clone(tmp_path)
    for block in _policies_shown(page):
        _load_toml(block, clone)


def test_the_readme_starts_with_the_private_query_on_a_fresh_machine() -> None:
    """The first command sets up the virtualenv (which the slow test cannot run again), then queries the sample."""
    first = blocks(ROOT / "README.md")[0]
    assert first.language == "sh" and first.text.startswith(SETUP) and "dpsql query" in first.text


def test_the_readme_links_resolve() -> None:
    """The site's build checks the links between its pages; the README is not one of them, so its links into docs/
    (anchors included: a heading of that name) are checked here."""
    from markdown.extensions.toc import slugify

    for target, anchor in re.findall(r"\]\(((?!https?:)[^)#]+)(?:#([^)]+))?\)", (ROOT / "README.md").read_text()):
        path = ROOT / target
        assert path.is_file(), f"README links to {target}, which does not exist"
        if anchor:
            headings = [slugify(line.lstrip("#").strip(), "-") for line in path.read_text().splitlines()
                        if line.startswith("#")]
            assert anchor in headings, f"README links to {target}#{anchor}: no such heading"


# --- slow: the build, and every page's blocks run --------------------------------------------------------------

@pytest.mark.slow  # about 3 s
def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    """Broken links (anchors included), pages missing from the navigation and drift between the policy loader
    and the policy reference are warnings, which strict mode makes fail."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env={**_environment(), "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").read_text().count("dpsql serve") > 0


@pytest.mark.slow  # a few CLI processes per page, a server on some: half a minute for the README
@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_block_of_the_page_runs_as_written(page: Path, tmp_path: Path) -> None:
    runner = PageRunner(_clone(tmp_path))
    if page.name != "README.md":  # the README starts from a fresh clone; the other pages from the sample's ledger
        runner.run(Block(page, 0, "sh", None, f"dpsql budget --init --no-history --policy {SAMPLE_POLICY}", None))
    ran, without = [], []  # blocks run; blocks that need a program this machine lacks
    try:
        for block in blocks(page):
            if block.not_run is not None:
                continue
            missing = _missing_program(block) or (without and "after a block not run")  # later ones may need it
            if missing:
                without.append(f"{block.where} ({missing})")
            elif runner.run(block):
                ran.append(block.where)
    finally:
        runner.close()
    expected = [block.where for block in blocks(page) if block.not_run is None]
    assert ran + [w.split(" ")[0] for w in without] == expected, "the blocks not marked `not run` are the ones run"
    if without:  # as tests/server does: the system's programs are .ci/run's to install
        pytest.skip(f"not installed (.ci/run installs them), so not run: {', '.join(without)}")


# The system's programs the examples run, which the `test` extra cannot install: each with what shows it is there.
PROGRAMS = {"psql": lambda: shutil.which("psql"), "openssl": lambda: shutil.which("openssl"),
            "java": lambda: shutil.which("java") and Path("/usr/share/java/postgresql.jar").exists()}


def _missing_program(block: Block) -> str | None:
    """The first system program the block runs that is not installed (a block that names it as a command)."""
    if block.language not in ("sh", "console"):
        return None
    for program, installed in PROGRAMS.items():
        if re.search(rf"(^|[\s;|&$]){program} ", block.text, re.MULTILINE) and not installed():
            return program
    return None


def _clone(tmp_path: Path) -> Path:
    """What a fresh clone holds for the examples: the sample data, without any ledger, store or users file."""
    shutil.copytree(ROOT / "sample_data", tmp_path / "sample_data",
                    ignore=shutil.ignore_patterns("*.sqlite*", "*.store*", "*.users.json", "*.spill", "__pycache__"))
    return tmp_path


def _environment() -> dict[str, str]:
    """This interpreter's virtualenv first on PATH (its `dpsql` and `python3`), no DPSQL_* or PG* set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPSQL_", "PG"))}
    bin_dir = str(Path(sys.executable).parent)
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(Path(bin_dir).parent)}


def _load_toml(block: Block, clone: Path) -> None:
    """A titled block is the page's file of that name; an untitled one a whole policy beside the sample data, or a
    part of one (Spark's [engine]) added to the sample policy."""
    if block.title is not None:
        (clone / block.title).write_text(block.text + "\n")
        load_policy(clone / block.title)
        return
    folder = clone / "sample_data"
    text = block.text if block.text.lstrip().startswith("[budget]") else (
        (folder / "visits.toml").read_text() + "\n" + block.text)
    (folder / "example.toml").write_text(text + "\n")
    load_policy(folder / "example.toml")


class PageRunner:
    """Runs one page's blocks in order in its own copy of the sample data, with the server its page starts."""

    def __init__(self, clone: Path) -> None:
        self.clone = clone
        self.server: subprocess.Popen[str] | None = None
        self.port = EXAMPLE_PORT
        self.printed: subprocess.CompletedProcess[str] | None = None  # the last command's output

    def run(self, block: Block) -> bool:
        text = block.text.replace(EXAMPLE_PORT, self.port) if self.server else block.text
        if block.language == "toml":
            _load_toml(block, self.clone)
        elif block.language == "text" and block.title == "output":
            assert self.printed is not None, f"{block.where}: an output shown before any command"
            _check_shown_output(text.splitlines(), self.printed.stdout, self.printed.stderr)
        elif block.language == "console":
            self._prompted(text)
        elif block.language == "sh":
            self._shell(text)
        elif block.language == "python":
            self._check(text, [sys.executable, "-c", text])
        elif block.language == "sql":
            self._check(text, ["dpsql", "query", text, "--policy", SAMPLE_POLICY])
        else:
            return False
        return True

    def _check(self, what: str, command: list[str], fails: bool = False) -> subprocess.CompletedProcess[str]:
        if EXAMPLE_PORT in what and self.server is None:
            pytest.fail(f"{what}\nneeds a server: the page must start one (`dpsql serve`) before")
        done = subprocess.run(command, cwd=self.clone, env=_environment(), capture_output=True, text=True)
        assert (done.returncode != 0) == fails, f"{what}\n{done.stdout}\n{done.stderr}"
        self.printed = done
        return done

    def _shell(self, text: str) -> None:
        lines = text.removeprefix(SETUP).splitlines()
        serve = [i for i, line in enumerate(lines) if line.startswith("dpsql serve")]
        assert not serve or serve == [len(lines) - 1], f"{text}\n`dpsql serve` runs until stopped: put it last"
        if serve:
            lines, serve_line = lines[:-1], lines[-1]
        if lines:
            self._check(text, ["bash", "-c", "set -e\n" + "\n".join(lines)])
        if serve:
            self._serve(serve_line)

    def _serve(self, command: str) -> None:
        assert self.server is None, "one server per page"
        command = re.sub(r"\s*--port \d+", "", command.split("  #")[0])
        self.server = subprocess.Popen(["bash", "-c", f"exec {command} --port 0 --quiet"], cwd=self.clone,
                                       env=_environment(), stderr=subprocess.PIPE, text=True)
        for line in self.server.stderr:
            started = re.search(r"serving \S+ on [\d.]+:(\d+)", line)
            if started:
                self.port = started.group(1)
                return
        pytest.fail(f"{command}: the server did not start")

    def _prompted(self, text: str) -> None:
        lines = text.splitlines()
        command = [lines[0].removeprefix("$ ")]
        shown = lines[1:]
        while shown and _continued("\n".join(command)):
            command.append(shown.pop(0))
        fails = any(line.startswith(_ERRORS) for line in shown)  # a refusal, shown as such
        done = self._check(text, ["bash", "-c", "\n".join(command)], fails)
        _check_shown_output(shown, done.stdout, done.stderr)

    def close(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait()
            self.server.stderr.close()


def _continued(command: str) -> bool:
    """Whether a command goes on to the next line: after a backslash, or inside a quoted string."""
    if command.endswith("\\"):
        return True
    try:
        shlex.split(command)
    except ValueError:  # no closing quotation
        return True
    return False


_NUMBER = re.compile(r"-?[\d,]+(\.\d+)?")
_RULE = re.compile(r"^[-+ ]*-[-+ ]*$")  # the line under a table's header: dpsql's and psql's
_STDERR = ("cost: ", "NOTICE: ", "dpsql: ", "ERROR: ", "psql: ")
# psql's and the command line's (each error class's label: dpsql/errors.py): the command fails
_ERRORS = ("ERROR: ", "psql: error: ", "dpsql: error: ", "dpsql: refused: ", "dpsql: rejected: ")


def _check_shown_output(shown: list[str], stdout: str, stderr: str) -> None:
    """A table as the docs show it: its header's names, its number of rows and its first column (the group keys,
    where they are not numbers), as noisy values differ from run to run and a column widens with them. Any other
    line shown (a message, a summary) must be printed, numbers standing for any number and the analyst on a cost
    line for any name (on the command line it is the login name of whoever runs the tests). An answer that cost
    nothing (a query of public tables) is exact: all of it must be printed."""
    table = [line for line in shown if line.strip() and not line.startswith(_STDERR)]
    others = [line for line in shown if line.startswith(_STDERR)]
    rules = [i for i, line in enumerate(table) if i and _RULE.match(line)]
    if rules:  # lines before the header (psql's SET) are checked as any other line
        others += table[:rules[0] - 1]
        table = table[rules[0] - 1:]
        got = [line for line in stdout.splitlines() if line.strip()]
        headers = [i for i, line in enumerate(got) if line.split() == table[0].split()]
        assert headers, f"no header {table[0]!r} among the printed lines:\n{stdout}"
        got = got[headers[0]:]  # after what the commands before the query printed
        assert len(got) == len(table), f"printed {len(got)} lines, the docs show {len(table)}:\n{stdout}"
        if any(line.startswith("cost: epsilon 0;") for line in shown):  # no noise: a query of public tables
            assert [line.split() for line in got] == [line.split() for line in table], stdout
        keys = [(line.split()[0], shown.split()[0]) for line, shown in zip(got[2:], table[2:], strict=True)]
        assert all(got == shown for got, shown in keys if not _NUMBER.fullmatch(shown)), stdout  # a number is noisy
    else:
        others = shown
    printed = (stdout + "\n" + stderr).splitlines()
    for line in others:
        if line.strip() in ("", "..."):
            continue
        pattern = re.sub(r"\\?-?\d[\d,]*(\\\.\d+)?", r"-?[\\d,]+(\\.\\d+)?", re.escape(" ".join(line.split())))
        # The analyst of a cost line: on the command line, the login name of whoever runs the tests.
        pattern = re.sub(r";\\ \S+?\\ has\\ epsilon", lambda _: r";\ \S+\ has\ epsilon", pattern)
        assert any(re.fullmatch(pattern, " ".join(got.split())) for got in printed), \
            f"{line!r} is not among the printed lines:\n{stdout}\n{stderr}"
