"""Execute untrusted programs under bubblewrap and judge them from outside.

Every execution is a fresh ``bwrap`` process running ``runner.py`` on the standard library's
interpreter (``python -I -S``), with:

* no network (its own empty network namespace: even 127.0.0.1 is unreachable), its own PID,
  IPC and UTS namespaces, and a new session; it dies with its parent;
* a read-only view of ``/usr`` and the interpreter's own folder only: no project, no home
  directory, no ``/etc``; a private, size-capped ``/tmp`` is the only writable place, and it
  vanishes with the sandbox;
* a cleared environment;
* resource limits set before the candidate runs (CPU seconds, address space, processes, file
  size, open files); when started as root the runner drops to a user id of its own per
  concurrent slot, so the process limit counts that sandbox's processes only;
* a wall-clock deadline after which the whole sandbox is killed (its PID namespace goes with
  its first process, daemons included), and a cap on the bytes read back.

The verdict is computed in the calling process by a trusted ``check`` function that calls the
candidate through a proxy: arguments go in, plain data comes back (``runner.decode``), so the
candidate never sees the expected results and cannot return objects that lie about equality.
A test passes only when ``check`` returns and the sandbox stayed healthy throughout.

Where bubblewrap cannot run, ``CodeRunner`` refuses to start unless ``isolation="none"``
(the loudly named opt-out ``task.unsafe_no_sandbox``): then the runner is a plain
subprocess with the same limits, environment and working folder, but it sees the machine's
files and network.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from es_llm.errors import BadInput
from es_llm.sandbox import runner

ISOLATIONS = ("bwrap", "none")
# The user ids sandboxes run under when started as root: one block of 64 per calling
# process, one id per concurrent slot, far above ordinary accounts.
_UID_BASE = 2_000_000
_STDERR_KEEP = 2000


@dataclass(frozen=True)
class SandboxLimits:
    """What one execution may use."""

    # Wall clock for the whole execution (start, load, every call), in seconds.
    timeout_s: float = 10.0
    # CPU seconds per process (RLIMIT_CPU).
    cpu_s: int = 10
    # Address space per process (RLIMIT_AS), in MiB.
    memory_mb: int = 1024
    # Processes and threads of the sandbox's user (RLIMIT_NPROC), the runner included.
    processes: int = 16
    # Largest file it may write (RLIMIT_FSIZE), and the size of its /tmp, in MiB.
    file_size_mb: int = 8
    tmp_mb: int = 32
    # Open file descriptors (RLIMIT_NOFILE).
    open_files: int = 64
    # Bytes of replies read back before the execution counts as failed, in KiB.
    output_kb: int = 1024

    def __post_init__(self):
        for name in ("cpu_s", "memory_mb", "processes", "file_size_mb", "tmp_mb", "open_files",
                     "output_kb"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise BadInput(f"sandbox limit {name} must be a positive integer, got {value!r}.")
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s < 3600):
            raise BadInput(f"sandbox timeout_s must be a number of seconds in (0, 3600), got "
                           f"{self.timeout_s!r}.")


@dataclass(frozen=True)
class Job:
    """One program to judge: its source, the function to call, and the trusted test.

    ``check(candidate)`` calls ``candidate(*args)`` (plain data in, plain data out) and
    raises on failure; what it returns becomes ``Verdict.detail``.
    """

    source: str
    entry_point: str
    check: Callable[[Callable[..., Any]], Any]


@dataclass(frozen=True)
class Verdict:
    passed: bool
    # The program ran to the end and defined the entry point.
    loaded: bool
    error: str | None = None
    calls: int = 0
    seconds: float = 0.0
    detail: Any = None


class CandidateError(Exception):
    """A call of the candidate raised, or returned something other than builtin data."""


class _SandboxEnded(BaseException):
    """The sandbox died, timed out or said too much. A BaseException, so that a test's
    ``except Exception`` cannot turn a dead candidate into a pass."""


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------

def _interpreter() -> Path:
    """The base interpreter (a venv's python is only a link to it), which needs no site
    packages: the runner and HumanEval's solutions use the standard library alone."""
    return Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))


def _bwrap_args(limits: SandboxLimits, program: list[str]) -> list[str]:
    """The bwrap command line that runs ``program`` (argv, the interpreter first)."""
    python, prefix = _interpreter(), Path(sys.base_prefix).resolve()
    args = ["bwrap", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    for folder in (prefix, python.parent):
        if folder.is_relative_to("/usr") or (folder != prefix and folder.is_relative_to(prefix)):
            continue
        # Parents that bwrap would create are private (0700) and would lock the dropped
        # user out; create them world-readable first.
        for parent in reversed(folder.parents[:-1]):
            args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", str(folder), str(folder)]
    args += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "01777", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
             "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
             "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
             "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
             "--chdir", "/tmp"]
    if os.getuid() == 0:
        # Only so the runner can drop to its slot's user before the candidate runs.
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user"]
    return args + ["--", *program]


_RUNNER_SOURCE = Path(runner.__file__).read_text()


def _python(code: str) -> list[str]:
    return [str(_interpreter()), "-I", "-S", "-c", code]


def _rlimits(limits: SandboxLimits, processes_now: int) -> dict[str, int]:
    return {"RLIMIT_CPU": limits.cpu_s, "RLIMIT_AS": limits.memory_mb << 20,
            "RLIMIT_NPROC": processes_now + limits.processes,
            "RLIMIT_FSIZE": limits.file_size_mb << 20, "RLIMIT_NOFILE": limits.open_files,
            "RLIMIT_CORE": 0}


def _processes_of(uid: int, threads: bool = False) -> int:
    """How many processes (or, with ``threads``, threads) ``uid`` runs now. The process limit
    counts every thread of the user, so a sandbox not started as root may add
    ``limits.processes`` on top of the caller's own threads."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task")) if threads else 1
            except OSError:
                pass
    return count


def _slot_uid(slot: int) -> int | None:
    """The user id of a sandbox slot when running as root (None otherwise)."""
    if os.getuid() != 0:
        return None
    return _UID_BASE + (os.getpid() % 100_000) * 64 + slot


def _wait_gone(uid: int, limit_s: float = 10.0) -> None:
    """Wait until the killed sandbox's last process has exited, so a slot is handed on only
    empty and its next user's process count starts from zero."""
    end = time.monotonic() + limit_s
    while _processes_of(uid) and time.monotonic() < end:
        time.sleep(0.005)


def bubblewrap_problem(limits: SandboxLimits | None = None) -> str | None:
    """None when a bubblewrap sandbox runs here, else what went wrong and how to fix it."""
    how = ("install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; scripts/setup.sh "
           "does it where it can) on a kernel that allows user namespaces, or, only for "
           "trusted code, set task.unsafe_no_sandbox=true to run programs without isolation")
    if shutil.which("bwrap") is None:
        return f"the `bwrap` command (bubblewrap) is not installed; {how}."
    limits = limits or SandboxLimits()
    try:
        proc = subprocess.run(_bwrap_args(limits, _python("print(6 * 7)")),
                              capture_output=True, text=True, timeout=30,
                              env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not start a sandbox ({exc}); {how}."
    if proc.returncode != 0 or proc.stdout.strip() != "42":
        return (f"bubblewrap is installed but could not start a sandbox (exit {proc.returncode}: "
                f"{proc.stderr.strip()[:200]}); {how}.")
    return None


# ---------------------------------------------------------------------------------------------
# One execution
# ---------------------------------------------------------------------------------------------

class _Session:
    """A running sandbox and the request/reply channel to it, under one deadline."""

    def __init__(self, command: list[str], cwd: str | None, limits: SandboxLimits):
        self.limits = limits
        self.deadline = time.monotonic() + limits.timeout_s
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=cwd, start_new_session=True,
                                     env={"PATH": "/usr/bin:/bin"})
        # The deadline holds even while a write blocks on a candidate that stopped reading.
        self._timer = threading.Timer(limits.timeout_s, self.kill)
        self._timer.daemon = True
        self._timer.start()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self._selector.register(self.proc.stderr, selectors.EVENT_READ)
        self._out, self._err = b"", b""
        self._read_total = 0
        self.ended: str | None = None
        self.calls = 0

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        self._timer.cancel()
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        self.proc.wait()
        self._selector.close()

    def _gone(self) -> str:
        """Why the program stopped answering: it exited, or the deadline killed it."""
        if time.monotonic() < self.deadline:
            return "the program exited early"
        return f"timed out after {self.limits.timeout_s:g} s"

    def _end(self, why: str):
        if self.ended is None:
            self.ended = why
        tail = self._err.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise _SandboxEnded(why + (f" ({' | '.join(tail)})" if tail else ""))

    def send(self, message: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self._end(self._gone())

    def receive(self, nonce: str) -> dict:
        """The next reply, which must echo ``nonce``."""
        while b"\n" not in self._out:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.kill()
                self._end(f"timed out after {self.limits.timeout_s:g} s")
            events = self._selector.select(timeout=left)
            for key, _ in events:
                chunk = os.read(key.fd, 65536)
                if key.fileobj is self.proc.stderr:
                    self._err = (self._err + chunk)[-_STDERR_KEEP:]
                    if not chunk:
                        self._selector.unregister(key.fileobj)
                    continue
                if not chunk:
                    self._end(self._gone())
                self._out += chunk
                self._read_total += len(chunk)
                if self._read_total > self.limits.output_kb << 10:
                    self.kill()
                    self._end(f"replies exceeded {self.limits.output_kb} KiB")
        line, self._out = self._out.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            self._end("sent a malformed reply")
        if not isinstance(message, dict) or message.get("n") != nonce:
            self._end("sent a reply that does not answer the request")
        return message

    def call(self, *args):
        """The proxy ``check`` calls: the candidate's answer as plain data."""
        nonce = secrets.token_hex(8)
        try:
            encoded = [runner.encode(a) for a in args]
        except (TypeError, ValueError) as exc:
            raise CandidateError(f"the test passed an argument the sandbox cannot carry: {exc}")
        self.send({"n": nonce, "args": encoded})
        self.calls += 1
        message = self.receive(nonce)
        if message.get("ok") is not True:
            raise CandidateError(str(message.get("err"))[:300])
        try:
            return runner.decode(message.get("v"))
        except (ValueError, RecursionError, OverflowError) as exc:
            self._end(f"returned malformed data ({exc})")


# ---------------------------------------------------------------------------------------------
# The pool
# ---------------------------------------------------------------------------------------------

class CodeRunner:
    """Judge many programs in parallel, each in its own sandbox.

    ``workers`` executions run at once (threads here, one sandbox process each); a crash,
    hang or blow-up in one costs only its own verdict.
    """

    def __init__(self, limits: SandboxLimits | None = None, workers: int = 0,
                 isolation: str = "bwrap"):
        if isolation not in ISOLATIONS:
            raise BadInput(f"unknown sandbox isolation {isolation!r}; valid choices are: "
                           f"{', '.join(ISOLATIONS)}.")
        self.limits = limits or SandboxLimits()
        self.workers = min(64, workers or 2 * (os.cpu_count() or 1))
        self.isolation = isolation
        if isolation == "bwrap":
            problem = bubblewrap_problem(self.limits)
            if problem:
                raise BadInput(f"code tasks run model-written programs in a bubblewrap sandbox, "
                               f"but {problem}")
        else:
            warnings.warn("UNSAFE: model-written code runs WITHOUT a sandbox "
                          "(task.unsafe_no_sandbox=true); it can read and write your files "
                          "and reach the network.", stacklevel=2)
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(self.workers):
            self._slots.put(slot)
        self._pool: ThreadPoolExecutor | None = None

    def _start(self, slot: int, source: str, entry: str) -> tuple[_Session, str | None, str]:
        if self.isolation == "bwrap":
            command, cwd = _bwrap_args(self.limits, _python(_RUNNER_SOURCE)), None
            uid = _slot_uid(slot)
        else:
            command = _python(_RUNNER_SOURCE)
            cwd, uid = tempfile.mkdtemp(prefix="es-llm-unsafe-"), None
        processes_now = 0 if uid is not None else _processes_of(os.getuid(), threads=True)
        session = _Session(command, cwd, self.limits)
        nonce = secrets.token_hex(8)
        session.send({"source": source, "entry": entry, "nonce": nonce, "uid": uid,
                      "limits": _rlimits(self.limits, processes_now)})
        return session, cwd, nonce

    def run(self, job: Job) -> Verdict:
        """The verdict on one program (never raises for anything the program does)."""
        t0 = time.monotonic()
        slot = self._slots.get()
        session, cwd, loaded = None, None, False
        try:
            session, cwd, nonce = self._start(slot, job.source, job.entry_point)
            hello = session.receive(nonce)
            if hello.get("loaded") is not True:
                return Verdict(False, False, f"load failed: {str(hello.get('err'))[:300]}",
                               seconds=time.monotonic() - t0)
            loaded = True
            detail = job.check(session.call)
            if session.ended:
                raise _SandboxEnded(session.ended)
            return Verdict(True, True, None, session.calls, time.monotonic() - t0, detail)
        except _SandboxEnded as exc:
            return Verdict(False, loaded, str(exc)[:400], session.calls if session else 0,
                           time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001 - a failed test, whatever it raised
            return Verdict(False, loaded, f"{type(exc).__name__}: {exc}"[:400],
                           session.calls if session else 0, time.monotonic() - t0)
        finally:
            if session is not None:
                session.close()
            if cwd is not None:
                shutil.rmtree(cwd, ignore_errors=True)
            if self.isolation == "bwrap" and _slot_uid(slot) is not None:
                _wait_gone(_slot_uid(slot))
            self._slots.put(slot)

    def run_many(self, jobs: Sequence[Job]) -> list[Verdict]:
        """Verdicts in the order of ``jobs``, ``workers`` at a time."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
        return list(self._pool.map(self.run, jobs))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def io_check(cases: Sequence[tuple[Sequence, Any]]) -> Callable[[Callable], list]:
    """A check that calls the candidate on every ``(args, expected)`` case and requires each
    answer to equal ``expected`` exactly: same builtin types (``True`` is not ``1``), same
    values. All cases run; the answers (or error names) are the verdict's detail."""

    def check(candidate: Callable) -> list:
        answers, failed = [], None
        for args, expected in cases:
            call = f"({', '.join(repr(a) for a in args)})"[:80]
            try:
                answer = candidate(*args)
            except CandidateError as exc:
                answers.append(f"error: {str(exc).split(':')[0]}")
                failed = failed or f"the call {call} raised {exc}"
                continue
            answers.append(answer)
            if not same_data(answer, expected) and failed is None:
                failed = f"the call {call} returned {answer!r:.80}, expected {expected!r:.80}"
        if failed:
            raise AssertionError(failed)
        return answers

    return check


def same_data(a, b) -> bool:
    """Equality of plain data that also requires equal types at every level."""
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same_data(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same_data(a[k], b[k]) for k in a)
    return a == b
