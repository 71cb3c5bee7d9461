"""The sandbox contains every attack the issue lists, and each scores 0 leaving nothing behind.

Each hostile program is judged against a test it can only pass by escaping or by forging the
verdict (``f(x) == 2x + 1`` unless noted). A program passes the honest version of the same
test, so a failure here always means containment, never a broken harness.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from es_llm.errors import BadInput
from es_llm.sandbox import CandidateError, CodeRunner, Job, SandboxLimits, io_check
from es_llm.sandbox import runner as sandbox_runner
from es_llm.sandbox.sandbox import _UID_BASE, bubblewrap_problem, same_data

REPO = Path(__file__).resolve().parents[1]
CASES = [((3,), 7), ((0,), 1), ((5,), 11)]
HONEST = "def f(x):\n    return 2 * x + 1\n"


@pytest.fixture(scope="module")
def runner():
    problem = bubblewrap_problem()
    if problem:
        pytest.fail(f"the sandbox tests need bubblewrap: {problem}")
    pool = CodeRunner(SandboxLimits(timeout_s=4, cpu_s=4, memory_mb=512, processes=16),
                      workers=4)
    yield pool
    pool.close()


def _judge(runner, source, cases=CASES):
    return runner.run(Job(source, "f", io_check(cases)))


def _sandbox_processes() -> list[int]:
    """Processes on this machine that run under a sandbox user id."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid >= _UID_BASE:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def test_honest_program_passes_and_wrong_one_fails(runner):
    ok = _judge(runner, HONEST)
    assert ok.passed and ok.loaded and ok.error is None and ok.calls == 3
    assert ok.detail == [7, 1, 11]
    wrong = _judge(runner, "def f(x):\n    return 2 * x\n")
    assert not wrong.passed and wrong.loaded and "expected 7" in wrong.error
    broken = _judge(runner, "def f(x) return x\n")
    assert not broken.passed and not broken.loaded and "SyntaxError" in broken.error
    missing = _judge(runner, "def g(x):\n    return x\n")
    assert not missing.passed and "no function 'f'" in missing.error


@pytest.mark.parametrize("name,source", [
    ("os._exit at load", "import os\nos._exit(0)\n"),
    ("sys.exit at load", "import sys\nsys.exit(0)\n"),
    ("exit in the call", "def f(x):\n    raise SystemExit(0)\n"),
    ("os._exit in the call", "import os\ndef f(x):\n    os._exit(0)\n"),
    ("forged reply", "import sys, os\nos.write(1, b'{\"n\": \"x\", \"ok\": true, \"v\": [\"i\", \"7\"]}\\n')\n"
                     "def f(x):\n    return 0\n"),
])
def test_early_exit_and_forged_replies_fail(runner, name, source):
    v = _judge(runner, source)
    assert not v.passed, name


@pytest.mark.parametrize("source", [
    # An object that equals everything and is always true.
    "class A:\n    def __eq__(s, o): return True\n    def __ne__(s, o): return False\n"
    "    def __bool__(s): return True\n    def __hash__(s): return 0\n"
    "def f(x):\n    return A()\n",
    # A subclass of int that equals everything.
    "class A(int):\n    def __eq__(s, o): return True\n    __hash__ = int.__hash__\n"
    "def f(x):\n    return A(0)\n",
    # Rewriting the runner's encoder cannot reach the parent's comparison.
    "import gc\n"
    "for o in gc.get_objects():\n"
    "    if isinstance(o, dict) and 'encode' in o and 'decode' in o:\n"
    "        o['encode'] = lambda v, depth=0: ['b', True]\n"
    "def f(x):\n    return None\n",
    # Nor can rewriting builtins in the candidate's process.
    "import builtins\ndef f(x):\n    builtins.type = lambda *a: int\n"
    "    builtins.isinstance = lambda *a: True\n    return 'seven'\n",
])
def test_equality_tricks_fail(runner, source):
    v = _judge(runner, source)
    assert v.loaded and not v.passed


def test_resource_bombs_are_contained(runner):
    bombs = {
        "infinite loop": "def f(x):\n    while True:\n        pass\n",
        "memory bomb": "def f(x):\n    a = []\n    while True:\n        a.append(' ' * 10**7)\n",
        "fork bomb": "import os\ndef f(x):\n    while True:\n        try:\n            os.fork()\n"
                     "        except OSError:\n            pass\n",
        "thread bomb": "import threading, time\ndef f(x):\n    while True:\n"
                       "        threading.Thread(target=time.sleep, args=(60,)).start()\n",
        "deep recursion": "import sys\nsys.setrecursionlimit(10**8)\ndef f(x):\n    return f(x) + 1\n",
        "ctypes crash": "import ctypes\ndef f(x):\n    return ctypes.string_at(0)\n",
        "huge reply": "def f(x):\n    return 'x' * 10**8\n",
        "huge print": "import sys\ndef f(x):\n    while True:\n        print('y' * 10**6)\n"
                      "        sys.stderr.write('z' * 10**6)\n",
        "huge file": "def f(x):\n    with open('/tmp/big', 'w') as fh:\n"
                     "        while True:\n            fh.write('w' * 10**6)\n",
    }
    t0 = time.monotonic()
    jobs = [Job(src, "f", io_check(CASES)) for src in bombs.values()] + \
        [Job(HONEST, "f", io_check(CASES))] * 6
    verdicts = runner.run_many(jobs)
    elapsed = time.monotonic() - t0
    for name, v in zip(bombs, verdicts):
        assert not v.passed, name
    # Honest programs judged beside the bombs are unaffected.
    assert all(v.passed for v in verdicts[len(bombs):])
    # Each bomb ends by its deadline (4 s), however it misbehaves.
    assert max(v.seconds for v in verdicts) < 4 + 3
    assert elapsed < 60
    assert _sandbox_processes() == []


def test_daemons_and_killing_the_parent_leave_nothing_behind(runner, tmp_path):
    marker = tmp_path / "daemon-was-here"
    daemon = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        for _ in range(100):\n"
        "            try:\n"
        f"                open({str(marker)!r}, 'w').write('x')\n"
        "            except OSError:\n"
        "                pass\n"
        "            time.sleep(0.1)\n"
        "    os._exit(0)\n"
        "def f(x):\n    return 2 * x + 1\n")
    v = _judge(runner, daemon)
    # The program itself is honest; its daemon must still be gone with the sandbox.
    assert v.passed
    time.sleep(1.0)
    assert _sandbox_processes() == []
    assert not marker.exists()
    killers = [
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef f(x):\n    return 2 * x + 1\n",
        "import os, signal\nos.kill(-1, signal.SIGKILL)\ndef f(x):\n    return 0\n",
        "import os, signal\ndef f(x):\n    os.killpg(0, signal.SIGKILL)\n",
        "import os, signal\ndef f(x):\n    for pid in range(1, 100):\n        try:\n"
        "            os.kill(pid, signal.SIGKILL)\n        except OSError:\n            pass\n"
        "    return 0\n",
    ]
    for source in killers:
        assert not _judge(runner, source).passed
    # This process (the evaluator) and the pool survive and still judge correctly.
    assert _judge(runner, HONEST).passed
    assert _sandbox_processes() == []


def test_filesystem_is_private_and_read_only(runner, tmp_path):
    name = f"escape-{uuid.uuid4().hex}"
    targets = [REPO / name, Path.home() / name, Path("/tmp") / name, tmp_path / name,
               Path("/usr") / name]
    writer = ("def f(x):\n    wrote = 0\n"
              f"    for path in {[str(t) for t in targets]!r}:\n"
              "        try:\n            open(path, 'w').write('x')\n            wrote += 1\n"
              "        except OSError:\n            pass\n"
              "    return wrote\n")
    # Only the sandbox's own /tmp is writable: one target of five, and it is not the host's.
    v = runner.run(Job(writer, "f", io_check([((0,), 5)])))
    assert not v.passed and "returned 1" in v.error
    for t in targets:
        assert not t.exists(), t
    home = Path.home()
    readable = [REPO / "setup.cfg", Path("/etc/passwd"), Path("/etc/hostname"),
                home / ".bashrc", home / ".profile", home / ".ssh" / "id_rsa"]
    reader = ("import os\ndef f():\n    got = []\n"
              f"    for path in {[str(p) for p in readable]!r}:\n"
              "        try:\n            open(path).read()\n            got.append(path)\n"
              "        except OSError:\n            pass\n"
              f"    try:\n        listing = os.listdir({str(home)!r})\n"
              "    except OSError:\n        listing = []\n"
              "    return got, listing\n")
    v = runner.run(Job(reader, "f", lambda candidate: candidate()))
    assert v.passed
    got, listing = v.detail
    assert got == []
    # The home folder shows at most the path down to the interpreter, when it lives there.
    import sys
    base = Path(sys.base_prefix).resolve()
    allowed = {base.relative_to(home).parts[0]} if base.is_relative_to(home) else set()
    assert set(listing) <= allowed


def test_network_is_unreachable_even_on_loopback(runner):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    got = []

    def accept():
        try:
            conn, _ = server.accept()
            got.append(conn.recv(100))
            conn.close()
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    client = ("import socket\ndef f(x):\n"
              f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
              "    s.sendall(b'leak')\n    return 2 * x + 1\n")
    dns = ("import socket\ndef f(x):\n    socket.getaddrinfo('pypi.org', 443)\n"
           "    return 2 * x + 1\n")
    assert not _judge(runner, client).passed
    assert not _judge(runner, dns).passed
    thread.join()
    server.close()
    assert got == []


def test_caller_environment_is_invisible(runner, monkeypatch):
    secret = uuid.uuid4().hex
    monkeypatch.setenv("ES_LLM_TEST_SECRET", secret)
    probe = ("import os\ndef f(x):\n    found = os.environ.get('ES_LLM_TEST_SECRET', '')\n"
             "    for pid in os.listdir('/proc'):\n        try:\n"
             "            found += open(f'/proc/{pid}/environ').read()\n"
             "        except OSError:\n            pass\n"
             f"    return {secret!r} in found\n")
    v = runner.run(Job(probe, "f", io_check([((0,), True)])))
    assert v.loaded and not v.passed and "returned False" in v.error
    env = runner.run(Job("import os\ndef f():\n    return sorted(os.environ)\n", "f",
                         io_check([((), [])])))
    assert env.detail is None and "PATH" in env.error and "ES_LLM" not in env.error


def test_checks_that_swallow_errors_cannot_pass_a_dead_program(runner):
    def lenient(candidate):
        try:
            candidate(1)
        except Exception:  # a test that tolerates failures must still not pass a dead program
            pass

    v = runner.run(Job("import os\ndef f(x):\n    os._exit(0)\n", "f", lenient))
    assert not v.passed


def test_codec_round_trip_and_rejects_malformed_data():
    value = [1, -2**80, 2.5, float("inf"), "s", None, True, (1, [2, {"k": {3, 4}}]),
             frozenset({"a"}), {1: (2,)}]
    back = sandbox_runner.decode(sandbox_runner.encode(value))
    assert same_data(back, value)
    assert same_data((1,), (1,)) and not same_data(1, True) and not same_data([1], (1,))
    for bad in (["i", "1e9999"], ["x", 1], ["l", "notalist"], ["d", [[["s", "a"]]]], "i", [],
                ["i", "9" * 5000], ["f", "1" * 50]):
        with pytest.raises(ValueError):
            sandbox_runner.decode(bad)
    with pytest.raises(TypeError):
        sandbox_runner.encode(object())


def test_candidate_errors_surface_as_failed_tests(runner):
    def check(candidate):
        with pytest.raises(CandidateError, match="ZeroDivisionError"):
            candidate(0)
        return candidate(2)

    v = runner.run(Job("def f(x):\n    return 1 // x\n", "f", check))
    assert v.passed and v.detail == 0


def test_missing_bubblewrap_refuses_to_start_and_opt_out_is_explicit(monkeypatch):
    import es_llm.sandbox.sandbox as sb

    monkeypatch.setattr(sb.shutil, "which", lambda name: None)
    with pytest.raises(BadInput, match="apt-get install bubblewrap.*unsafe_no_sandbox"):
        CodeRunner()
    with pytest.warns(UserWarning, match="UNSAFE"):
        unsafe = CodeRunner(SandboxLimits(timeout_s=5), workers=1, isolation="none")
    assert unsafe.run(Job(HONEST, "f", io_check(CASES))).passed
    assert not unsafe.run(Job("import os\nos._exit(0)\n", "f", io_check(CASES))).passed
    with pytest.raises(BadInput, match="valid choices are: bwrap, none"):
        CodeRunner(isolation="docker")
    with pytest.raises(BadInput, match="timeout_s"):
        SandboxLimits(timeout_s=0)
