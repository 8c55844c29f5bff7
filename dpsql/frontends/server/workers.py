"""Worker processes, so that the server uses every core (`dpsql serve --workers N`).

A query's own Python work (parse, check, plan, rewrite, rehearsal, noise, post-processing) holds the interpreter's
lock: in one process, queries of different connections take turns at it, and the server uses about one core
whatever the machine has. So the server's process only speaks the protocol, schedules (scheduler.py) and answers
the catalog, and each analyst's private session lives in a worker process: N processes, each with its own engine
on the data (the prepared store attached read-only when the policy has one; otherwise its own copy of the tables,
loaded at start) and its own answer and measurement stores, the ledger shared (exact across processes: the
budget is charged in one SQLite transaction per answer, store/ledger.py).

An analyst's sessions all live in one worker, chosen at their first login (the one with the fewest analysts) and
kept for the server's life: their measurements (reused by later answers), prepared plans and cached answers stay
in one process. Fairness between analysts is the server's scheduler's, which decides when a query goes to its
worker, whatever the worker.

A worker that stops (killed, crashed) fails the requests it had with a clear error (WorkerStopped) and is
started again; its analysts' sessions open again in the new one at their next statement. A query it was running
was charged or not, in one transaction: never twice, and what was charged stays in the ledger.

Messages are messages.py's, pickled over one pipe per worker: the server's threads send requests (one lock) and
wait, each for its own reply; one thread per worker reads the replies and hands each to its waiter.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from dpsql.errors import Error
from dpsql.frontends.server.analyst import Columns, LocalSession, Parameters
from dpsql.frontends.server.commands import Answer
from dpsql.frontends.server.messages import (
    Call,
    CloseSession,
    ErrorText,
    Failure,
    Interrupt,
    LoadFailed,
    Open,
    Ready,
    Reply,
    SessionRequest,
    Start,
    Stop,
    WorkerFailed,
    WorkerStopped,
    error_text,
    raised,
)
from dpsql.policy import Policy
from dpsql.session import PrivateSession, build_engine, measurement_store
from dpsql.store.answers import AnswerStore
from dpsql.store.ledger import Spending

log = logging.getLogger("dpsql.server.workers")

_METHODS = frozenset({"answer", "columns", "explain", "reads_public_only", "spending"})  # what a Call may ask
_STOPPED = ("the worker process running this statement stopped before it answered (it is being restarted). If "
            "the query had reached the data, its charge stands: SHOW dpsql.budget; ask it again")
_SOURCE = Path(__file__).resolve().parents[3]  # the folder dpsql is imported from: the workers import it too
_KNOWN_TEXTS = 256  # texts a session remembers whether they read public tables only
_STOP_WAIT = 30.0  # seconds a worker has to finish its requests at the server's close before it is killed


# ---- the server's side ---------------------------------------------------------------------------------------

class WorkerPool:
    """`count` worker processes on `policy`'s data. start() blocks until every worker has loaded (raising the
    first load error, as the same dpsql error the server's own load would give); close() stops them."""

    def __init__(self, policy: Policy, count: int, threads: int) -> None:
        if count < 1:
            raise ValueError("a worker pool needs at least one worker")
        self.policy = policy
        self.workers = [_Worker(i, policy, threads) for i in range(count)]
        self._homes: dict[str, int] = {}  # analyst -> the worker their sessions live in
        self._lock = threading.Lock()
        self._sessions = itertools.count(1)

    def start(self) -> None:
        try:
            with ThreadPoolExecutor(len(self.workers)) as starting:
                for started in [starting.submit(worker.launch) for worker in self.workers]:
                    started.result()
        except BaseException:
            self.close()
            raise

    def home(self, analyst: str) -> _Worker:
        """The analyst's worker: where their sessions live, the same for all of them while the server runs."""
        with self._lock:
            index = self._homes.get(analyst)
            if index is None:
                taken = Counter(self._homes.values())
                index = min(range(len(self.workers)), key=lambda i: (taken[i], i))
                self._homes[analyst] = index
        return self.workers[index]

    def session(self, analyst: str, database: str) -> RemoteSession:
        """A private session for `analyst`, opened in their worker (blocks until it is)."""
        remote = RemoteSession(self.home(analyst), next(self._sessions), analyst, database)
        remote.open()
        return remote

    def close(self) -> None:
        for worker in self.workers:  # all told first, so that they finish their requests at the same time
            worker.stop()
        for worker in self.workers:
            worker.wait()


@dataclass
class _Waiting:
    """A request sent, its reply not yet read."""

    done: threading.Event = field(default_factory=threading.Event)
    outcome: Reply | Failure | None = None


class _Worker:
    """One worker process, and the thread that reads its replies (and starts it again if it stops)."""

    def __init__(self, index: int, policy: Policy, threads: int) -> None:
        self.index = index
        self.policy = policy
        self.threads = threads
        self.generation = 0  # how many times it was started: sessions opened in an earlier one open again
        self.pid: int | None = None
        self._process: subprocess.Popen | None = None
        self._pipe: Connection | None = None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # guards what follows, and `alive`
        self._alive = False
        self._stopping = False
        self._waiting: dict[int, _Waiting] = {}
        self._requests: dict[int, tuple[int, int | None]] = {}  # the server's thread -> (request, session) it waits for
        self._running = threading.Event()  # set while a started process serves; cleared while it (re)starts
        self._failure: Error | None = None  # why it could not be started again
        self._ids = itertools.count(1)

    def launch(self) -> None:
        """Start the process and wait for its load: raises its load error, or WorkerFailed if it died loading."""
        # A fresh interpreter (not a fork: the server has threads and an event loop; not multiprocessing's spawn,
        # which runs the server's main module again) running this module, on this dpsql, over a socket pair.
        ours_socket, theirs = socket.socketpair()
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(_SOURCE), *filter(None, [os.environ.get("PYTHONPATH")])])}
        with theirs:
            process = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())],
                                       pass_fds=(theirs.fileno(),), env=environment, stdin=subprocess.DEVNULL)
        ours = Connection(ours_socket.detach())  # only the worker holds its end now: when it dies, our reads end
        try:
            ours.send(Start(self.policy, self.threads))
            first = ours.recv()
        except (EOFError, OSError):
            first = LoadFailed(ErrorText("", f"worker process {self.index} stopped while loading the data"))
        if isinstance(first, LoadFailed):
            ours.close()
            _end(process)
            raise raised(first.error)
        assert isinstance(first, Ready)
        with self._lock:
            self._process, self._pipe, self.pid = process, ours, first.pid
            self.generation += 1
            self._alive = True
            self._failure = None
        self._running.set()
        threading.Thread(target=self._read, args=(ours,), name=f"dpsql-worker-{self.index}-replies",
                         daemon=True).start()

    def current(self) -> int:
        """The generation now serving (waiting while the worker starts again)."""
        self._running.wait()
        return self.generation

    def request(self, make: Any, generation: int | None = None, session: int | None = None) -> Any:
        """Send `make(request id)` and wait for its reply: its value, or its error raised here. While the worker
        starts again, wait for it. `generation`: the request is for that generation's process only (a session's:
        _Moved if another serves now); `session`: the session it is about, which alone a cancel may stop."""
        self._running.wait()
        with self._lock:
            if self._failure is not None:
                raise self._failure
            if generation is not None and generation != self.generation:
                raise _Moved()
            if not self._alive or self._pipe is None:
                raise WorkerStopped(_STOPPED)
            request = next(self._ids)
            waiting = self._waiting[request] = _Waiting()
            self._requests[threading.get_ident()] = (request, session)
            pipe = self._pipe
        try:
            try:
                with self._send_lock:
                    pipe.send(make(request))
            except (OSError, ValueError):
                pass  # the worker is gone: the reader fails every request it had, this one too
            except Exception:  # the request itself cannot be sent (pickled): a bug
                with self._lock:
                    self._waiting.pop(request, None)
                log.exception("a request to worker %s could not be sent", self.index)
                raise WorkerFailed("internal error in the dpsql server") from None
            waiting.done.wait()
        finally:
            with self._lock:
                self._requests.pop(threading.get_ident(), None)
        outcome = waiting.outcome
        if isinstance(outcome, Failure):
            raise raised(outcome.error)
        assert isinstance(outcome, Reply)
        return outcome.value

    def interrupt(self, thread: int, session: int) -> None:
        """Stop the query on the data that the server's thread `thread` waits for here, if it is `session`'s (the
        thread may have moved on to another connection's query since the cancel looked)."""
        with self._lock:
            request, about = self._requests.get(thread, (None, None))
            pipe = self._pipe if self._alive else None
        if request is not None and about == session and pipe is not None:
            with contextlib.suppress(OSError, ValueError), self._send_lock:
                pipe.send(Interrupt(request))

    def _read(self, pipe: Connection) -> None:
        while True:
            try:
                message = pipe.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                waiting = self._waiting.pop(message.request, None)
            if waiting is not None:
                waiting.outcome = message
                waiting.done.set()
        self._lost(pipe)

    def _lost(self, pipe: Connection) -> None:
        """The worker's pipe closed: fail what it had, and start it again unless the server is closing."""
        with self._lock:
            self._alive = False
            failed, self._waiting = self._waiting, {}
            stopping = self._stopping
            if not stopping:
                self._running.clear()
        for waiting in failed.values():
            waiting.outcome = Failure(0, error_text(WorkerStopped(_STOPPED)))
            waiting.done.set()
        pipe.close()
        if self._process is not None:
            _end(self._process)
        if stopping:
            return
        log.error("worker process %s (pid %s) stopped (exit code %s): starting it again", self.index, self.pid,
                  self._process.returncode if self._process is not None else None)
        try:
            self.launch()
        except Error as exc:
            log.error("worker process %s could not be started again: %s", self.index, exc)
            with self._lock:
                self._failure = exc
            self._running.set()

    def stop(self) -> None:
        """Tell the worker to finish its requests and exit (and not to be started again)."""
        with self._lock:
            self._stopping = True
            pipe = self._pipe
        self._running.set()
        if pipe is not None:
            with contextlib.suppress(OSError, ValueError), self._send_lock:
                pipe.send(Stop())

    def wait(self) -> None:
        """Until the stopped worker has exited (killed if it takes too long)."""
        if self._process is not None:
            _end(self._process)


def _end(process: subprocess.Popen) -> None:
    """Wait for a worker to exit (it finishes its requests first), and kill it if it does not."""
    try:
        process.wait(_STOP_WAIT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class _Moved(Exception):
    """The session's worker was started again since it was opened: open it again there."""


class RemoteSession:
    """An analyst's private session in their worker process: the same calls as analyst.LocalSession."""

    def __init__(self, worker: _Worker, session: int, analyst: str, database: str) -> None:
        self.worker = worker
        self.id = session
        self.analyst = analyst
        self.database = database
        self._generation = 0  # the worker's generation the session was opened in
        # Whether a text reads public tables only, as the worker said: which tables a query reads is its text's, not
        # its parameters' (they are values), so asking again with new values skips a round trip. It decides only
        # the query's lane (scheduler.py); the worker's session decides, and charges, on its own.
        self._public: dict[str, bool] = {}

    def open(self) -> None:
        generation = self.worker.generation
        self.worker.request(lambda request: Open(request, self.id, self.analyst, self.database))
        self._generation = generation

    def _call(self, method: str, *args: Any) -> Any:
        for _ in range(2):
            if self._generation != self.worker.current():  # the worker was started again: the session is new there
                self.open()
            try:
                return self.worker.request(lambda request: Call(request, self.id, method, args), self._generation,
                                           self.id)
            except _Moved:
                continue
        raise WorkerStopped(_STOPPED)

    def answer(self, sql: str, parameters: Parameters, costs: dict[str, Any], with_ci: bool) -> Answer:
        return self._call("answer", sql, parameters, costs, with_ci)

    def columns(self, sql: str, parameters: Parameters, costs: dict[str, Any], with_ci: bool) -> Columns:
        return self._call("columns", sql, parameters, costs, with_ci)

    def explain(self, sql: str, parameters: Parameters, costs: dict[str, Any]) -> str:
        return self._call("explain", sql, parameters, costs)

    def reads_public_only(self, sql: str, parameters: Parameters) -> bool:
        public = self._call("reads_public_only", sql, parameters)
        if len(self._public) >= _KNOWN_TEXTS:
            self._public.pop(next(iter(self._public)))
        self._public[sql] = public
        return public

    def known_public_only(self, sql: str, parameters: Parameters) -> bool | None:
        return self._public.get(sql)

    def spending(self) -> Spending:
        return self._call("spending")

    def interrupt(self, thread: int) -> None:
        self.worker.interrupt(thread, self.id)

    def close(self) -> None:
        if self._generation == self.worker.generation:  # else it went with the worker that stopped
            with contextlib.suppress(WorkerStopped):
                self.worker.request(lambda request: CloseSession(request, self.id))


# ---- the worker's side ---------------------------------------------------------------------------------------

def _serve(pipe: Connection) -> None:
    """A worker process's main: told what to load (Start), load the engine, say Ready (or LoadFailed with the
    load's error), then serve requests, each in a thread of its own, until told to stop or the server's end of the
    pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the terminal is the server's to handle
    start = pipe.recv()
    assert isinstance(start, Start)
    policy, threads = start.policy, start.threads
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s %(name)s[worker {os.getpid()}] %(levelname)s "
                                                   "%(message)s")
    try:
        engine = build_engine(policy)
    except BaseException as exc:
        if not isinstance(exc, Error):
            log.exception("the worker could not load the data")
        pipe.send(LoadFailed(error_text(exc)))
        return
    answers = AnswerStore(policy.answers) if policy.answers is not None else None
    measurements = measurement_store(policy, engine)
    serving = _Serving(pipe, policy, engine, answers, measurements)
    pipe.send(Ready(os.getpid()))
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dpsql-worker") as executor:
        while True:
            try:
                message = pipe.recv()
            except (EOFError, OSError):
                break
            if isinstance(message, Stop):
                break
            if isinstance(message, Interrupt):
                serving.interrupt(message.request)
            else:
                executor.submit(serving.handle, message)
    serving.close()


class _Serving:
    """A worker's sessions, by the server's session id, and the requests running in its threads."""

    def __init__(self, pipe: Connection, policy: Policy, engine: Any, answers: AnswerStore | None,
                 measurements: Any) -> None:
        self.pipe = pipe
        self.policy = policy
        self.engine = engine
        self.answers = answers
        self.measurements = measurements
        self.sessions: dict[int, LocalSession] = {}
        self.running: dict[int, int] = {}  # request -> the thread running it
        # Held while a request leaves `running` and while an Interrupt is delivered: an Interrupt reaches its own
        # request's statement, never the next one its thread runs.
        self._running_lock = threading.Lock()
        self._send_lock = threading.Lock()

    def handle(self, message: SessionRequest) -> None:
        self.running[message.request] = threading.get_ident()
        try:
            reply: Reply | Failure = Reply(message.request, self._do(message))
        except BaseException as exc:
            if not isinstance(exc, Error):
                log.exception("a request failed in the worker")
            reply = Failure(message.request, error_text(exc))
        finally:
            with self._running_lock:
                self.running.pop(message.request, None)
        with self._send_lock:
            try:
                self.pipe.send(reply)
            except (OSError, ValueError):
                pass  # the server has gone
            except Exception:  # a value that cannot be pickled: a bug
                log.exception("a reply could not be sent to the server")
                self.pipe.send(Failure(message.request, error_text(RuntimeError())))

    def _do(self, message: SessionRequest) -> Any:
        if isinstance(message, Open):
            self.sessions[message.session] = LocalSession(PrivateSession(
                self.policy, message.analyst, engine=self.engine, answers=self.answers,
                measurements=self.measurements, database=message.database))
            return None
        if isinstance(message, CloseSession):
            session = self.sessions.pop(message.session, None)
            if session is not None:
                session.close()
            return None
        if message.method not in _METHODS:
            raise ValueError(f"no such call: {message.method}")
        return getattr(self.sessions[message.session], message.method)(*message.args)

    def interrupt(self, request: int) -> None:
        with self._running_lock:
            thread = self.running.get(request)
            if thread is not None:
                self.engine.interrupt(thread)

    def close(self) -> None:
        for session in self.sessions.values():
            with contextlib.suppress(Exception):
                session.close()
        self.engine.close()
        if self.answers is not None:
            self.answers.close()
        if self.measurements is not None:
            self.measurements.close()


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
