"""`rsprof -p PID` tracks the heap of a process started WITHOUT the shim: the shim is loaded
with ptrace and the allocator calls redirected through the GOT (collector/heapattach.py,
native/inject.c, heapshim.c "injected mode"). Exact bytes per call site while attached,
the program unchanged (output, exit code) by attach and detach, clear refusals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    PYTHONS,
    TARGETS,
    _read_ring_head,
    build_target,
    heap_rings,
    profile_meta,
    python_binary,
    rsprof_env,
    top_json,
)

THREADS, BLOCK = 4, 4000
# How long rsprof may take to start recording, and a recording to end, here: on the shared
# 2-core machine at load average 42 (four hogs of ours, others' tests and hogs) rsprof -p
# had not begun recording 20 s after the command ('rsprof: interrupted'), and a -d 1s
# refusal took more than 60 s. (Time to the first heap event is measured by
# bench/bench_heap_attach.py, 0.35 s on a quiet machine; not a bound on what is recorded.)
SLOW_S = 120
INJECT_NAME = "librsprof_heap_inject.so"

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64",
                                reason="heap injection is x86_64 only")


class Program:
    """tests/targets/attach_alloc.c driven through its stdin, one command at a time."""

    def __init__(self, binary: Path, wrapper: tuple[str, ...] = ()) -> None:
        self.wrapped = bool(wrapper)
        self.proc = subprocess.Popen([*wrapper, str(binary)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.lines = [self._line()]
        assert self.lines[0] == "ready\n"

    @property
    def pid(self) -> int:
        if not self.wrapped:
            return self.proc.pid
        # Under a wrapper (strace): the program is its child.
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return int(children.split()[0])

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def command(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        self.lines.append(self._line())

    def quit(self) -> tuple[str, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        rest = self.proc.stdout.read()
        return "".join(self.lines) + rest, self.proc.wait(30)


def plain_run(binary: Path, commands: list[str]) -> tuple[str, int]:
    run = subprocess.run([str(binary)], input="".join(c + "\n" for c in [*commands, "quit"]),
                         capture_output=True, text=True, timeout=60)
    return run.stdout, run.returncode


def start_attach(pid: int, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "rsprof", "-p", str(pid), "-q", "-o", str(out), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=rsprof_env())


def stop_attach(recorder: subprocess.Popen[str]) -> str:
    """Ends a recording started without -d as Ctrl-C does, once the program has done what
    it was asked (a duration could end it before a slow injection's ring was read)."""
    recorder.send_signal(signal.SIGINT)
    _stdout, stderr = recorder.communicate(timeout=SLOW_S)
    assert recorder.returncode == 0, stderr
    return stderr


def wait_for_ring(pid: int, recorder: subprocess.Popen[str], timeout: float = SLOW_S) -> float:
    """Seconds until the injected shim's ring exists (the first heap event can follow)."""
    start = time.monotonic()
    while not heap_rings(pid):
        assert recorder.poll() is None, recorder.communicate()
        if time.monotonic() - start >= timeout:
            recorder.send_signal(signal.SIGINT)  # what it said, and where it was
            try:
                _, said = recorder.communicate(timeout=SLOW_S)
            except subprocess.TimeoutExpired:
                recorder.kill()
                _, said = recorder.communicate()
            raise AssertionError(f"no heap ring appeared in {timeout} s; rsprof said: {said}")
        time.sleep(0.005)
    return time.monotonic() - start


def rings_of_session(session: int) -> list[Path]:
    """Rings in /dev/shm whose header names `session` as their reader (offset 156)."""
    found = []
    for path in Path("/dev/shm").glob("rsprof-heap.*"):
        head = _read_ring_head(path, 160)  # never blocks on a FIFO under a ring's name
        if head is not None and len(head) == 160 and int.from_bytes(head[156:160],
                                                                    "little") == session:
            found.append(path)
    return found


def shim_mapped(pid: int) -> bool:
    return INJECT_NAME in Path(f"/proc/{pid}/maps").read_text()


def heap_top(profile: Path) -> list[dict[str, Any]]:
    """`rsprof top heap FILE --json -n 0`, run in this process (the same command; a Python
    start-up and rsprof's imports less per check: the 20x tests check every recording)."""
    from click.testing import CliRunner

    from rsprof.cli import cli

    result = CliRunner().invoke(cli, ["top", "heap", str(profile), "--json", "-n", "0"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def sites(profile: Path) -> dict[str, dict[str, Any]]:
    # By plain name: a C++ build's functions read attach_keep_site().
    return {str(s["function"]).split("(")[0]: s for s in heap_top(profile)}


@pytest.fixture(scope="module")
def alloc_binary() -> Path:
    return build_target("attach_alloc.c")


def test_attach_tracks_every_block_at_its_call_site(alloc_binary: Path, tmp_path: Path) -> None:
    """Started without rsprof, allocating 4000-byte blocks in four threads, attached for
    ~4 s: every block allocated in that window is at its call site to the byte; blocks
    allocated before are unknown (their frees counted, live bytes never negative); the
    program ends exactly as a plain run, and no ring is left behind."""
    commands = ["alloc 50", "alloc 1000", "free", "alloc 300", "alloc 10", "free"]
    program = Program(alloc_binary)
    program.command(commands[0])  # before the attach: 200 blocks nobody saw allocated
    out = tmp_path / "attach.db"
    recorder = start_attach(program.pid, out)
    wait_for_ring(program.pid, recorder)
    for command in commands[1:4]:  # while attached
        program.command(command)
    time.sleep(3)  # attached ~4 s, the threads churning all along
    stderr = stop_attach(recorder)
    assert "heap since attach at" in stderr
    assert not heap_rings(program.pid)  # removed at detach
    program.command(commands[4])  # after the detach: pass-through
    program.command(commands[5])
    output, status = program.quit()
    assert (output, status) == plain_run(alloc_binary, commands)
    assert status == 7

    found = sites(out)
    keep, churn = found["attach_keep_site"], found["attach_churn_site"]
    kept = (1000 + 300) * THREADS
    assert (keep["alloc_count"], keep["total_alloc_bytes"]) == (kept, kept * BLOCK)
    assert (keep["free_count"], keep["live_bytes"]) == (1000 * THREADS, 300 * THREADS * BLOCK)
    assert (churn["alloc_count"], churn["free_count"]) == (kept, kept)
    assert (churn["total_alloc_bytes"], churn["live_bytes"]) == (kept * BLOCK, 0)
    spin = found["attach_spin_site"]
    assert spin["total_alloc_bytes"] == spin["alloc_count"] * BLOCK > 0
    assert 0 <= spin["live_bytes"] <= THREADS * BLOCK  # blocks in flight at the detach
    assert all(s["live_bytes"] >= 0 for s in found.values())
    meta = profile_meta(out)
    assert meta["heap_since"] == "attach" and meta["heap_mode"] == "full"
    # Freed by "free", unknown; and a churning thread's block allocated just before the
    # attach and freed just after is one too (at most one per thread: 201 in one CI run).
    assert 50 * THREADS <= int(meta["heap_unknown_frees"]) <= 50 * THREADS + THREADS
    # Full stacks in threads that were running before the shim came: the call site's
    # caller and the thread's start are in them, not the direct caller only.
    traces = subprocess.run(
        [sys.executable, "-P", "-m", "rsprof", "traces", str(out), "--kind", "heap", "--json"],
        capture_output=True, text=True, env=rsprof_env(), check=True)
    keep_stacks = [t for t in json.loads(traces.stdout)
                   if "attach_keep_site" in json.dumps(t)]
    assert keep_stacks and all('"run"' in json.dumps(t) and "start_thread" in json.dumps(t)
                               for t in keep_stacks), keep_stacks[:1]


def test_attach_when_the_only_stoppable_thread_waits_on_a_condition_variable(
        tmp_path: Path) -> None:
    """Shaped like `xz -T2` (whose attach was refused): the worker blocks every signal, so
    the injected call may only run on the main thread, which waits in
    pthread_cond_timedwait. glibc 2.36 lists a compatibility pthread_cond_timedwait before
    the default one in .dynsym; known by its first entry alone, the default one was "an
    internal libc function" and no thread was ever at a safe point. Attached, the worker's
    blocks are at their site, exactly, and the program ends as a plain run does."""
    binary = build_target("attach_condwait.c")
    program = Program(binary)
    out = tmp_path / "condwait.db"
    recorder = start_attach(program.pid, out)
    wait_for_ring(program.pid, recorder)
    program.command("alloc 250")
    stderr = stop_attach(recorder)
    assert "heap since attach" in stderr and "heap tracking off" not in stderr, stderr
    output, status = program.quit()
    assert (output, status) == plain_run(binary, ["alloc 250"])
    assert status == 5
    site = sites(out)["condwait_site"]
    assert (site["alloc_count"], site["total_alloc_bytes"]) == (250, 250 * 3000), site
    assert int(profile_meta(out)["heap_attach_tries"]) <= 5


def test_attach_needs_no_pyelftools(alloc_binary: Path, tmp_path: Path) -> None:
    """pyelftools is not a dependency of rsprof (only of its tests): with `elftools`
    unimportable, rsprof and its ptrace helper attach and record exactly. (The helper read
    libc's symbols with pyelftools: in a plain install it failed to import it, and heap
    attach was off for every process.)"""
    blocked = tmp_path / "blocked"
    (blocked / "elftools").mkdir(parents=True)
    (blocked / "elftools" / "__init__.py").write_text(
        "raise ImportError('pyelftools is not installed here')\n")
    env = rsprof_env()
    env["PYTHONPATH"] = f"{blocked}{os.pathsep}{env['PYTHONPATH']}"
    program = Program(alloc_binary)
    out = tmp_path / "plain.db"
    recorder = subprocess.Popen(
        [sys.executable, "-P", "-m", "rsprof", "-p", str(program.pid), "-q", "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=env)
    wait_for_ring(program.pid, recorder)
    program.command("alloc 10")
    stderr = stop_attach(recorder)
    assert "heap since attach at" in stderr and "heap off" not in stderr, stderr
    keep = sites(out)["attach_keep_site"]
    assert (keep["alloc_count"], keep["total_alloc_bytes"]) == (10 * THREADS, 10 * THREADS * BLOCK)
    program.quit()


def test_no_heap_loads_nothing(alloc_binary: Path, tmp_path: Path) -> None:
    program = Program(alloc_binary)
    out = tmp_path / "cpu.db"
    recorder = start_attach(program.pid, out, "-d", "1s", "--no-heap")
    _stdout, stderr = recorder.communicate(timeout=SLOW_S)
    assert recorder.returncode == 0, stderr
    assert not shim_mapped(program.pid) and not heap_rings(program.pid)
    assert "heap since attach" not in stderr
    program.quit()
    assert profile_meta(out)["heap_mode"] == "none"


def _refused(pid: int, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "rsprof", "-p", str(pid), "-q", "-d", "1s", "-o", str(out),
         *extra], capture_output=True, text=True, env=rsprof_env(), timeout=SLOW_S,
        stdin=subprocess.DEVNULL)


def _assert_refusal(result: subprocess.CompletedProcess[str], reason: str, out: Path) -> None:
    warnings = [line for line in result.stderr.splitlines() if "heap tracking off" in line]
    assert len(warnings) == 1 and reason in warnings[0], result.stderr
    assert "Traceback" not in result.stderr
    meta = profile_meta(out)  # the CPU profile was recorded all the same
    assert reason in meta["heap_off_reason"] and meta["heap_mode"] == "none"
    assert f"heap off: {meta['heap_off_reason']}" in result.stderr


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_refused_under_another_tracer(alloc_binary: Path, tmp_path: Path) -> None:
    program = Program(alloc_binary, ("strace", "-f", "-o", "/dev/null"))
    try:
        result = _refused(program.pid, tmp_path / "a.db")
        assert result.returncode == 0, result.stderr
        _assert_refusal(result, "ptrace refused: it is traced by PID", tmp_path / "a.db")
        assert "(strace)" in result.stderr
        # Asked for explicitly with --heap: the same, and status 5 at the end.
        explicit = _refused(program.pid, tmp_path / "b.db", "--heap")
        assert explicit.returncode == 5, explicit.stderr
        _assert_refusal(explicit, "ptrace refused", tmp_path / "b.db")
        assert not shim_mapped(program.pid)
    finally:
        output, status = program.quit()
    assert (output, status) == plain_run(alloc_binary, [])


def test_refused_under_a_seccomp_filter(alloc_binary: Path, tmp_path: Path) -> None:
    """rsprof in a container whose seccomp profile denies ptrace: heap attach is refused in
    one line (what to check is in it), the CPU profile is recorded, the target unharmed."""
    wrapper = build_target("no_ptrace.c")
    program = Program(alloc_binary)
    out = tmp_path / "sc.db"
    try:
        result = subprocess.run(
            [str(wrapper), sys.executable, "-P", "-m", "rsprof", "-p", str(program.pid), "-q",
             "-d", "1s", "-o", str(out)], capture_output=True, text=True, env=rsprof_env(),
            timeout=SLOW_S, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stderr
        _assert_refusal(result, "ptrace refused (Operation not permitted)", out)
        assert "seccomp" in result.stderr
        assert not shim_mapped(program.pid)
        program.command("alloc 10")
    finally:
        output, status = program.quit()
    assert (output, status) == plain_run(alloc_binary, ["alloc 10"])


@pytest.mark.skipif(shutil.which("musl-gcc") is None, reason="needs musl-tools")
def test_refused_for_a_musl_program(tmp_path: Path) -> None:
    """A program on musl libc (the injected shim is built for glibc): refused in one line."""
    binary = tmp_path / "musl_alloc"
    subprocess.run(["musl-gcc", "-O1", "-pthread", "-o", str(binary),
                    str(TARGETS / "attach_alloc.c")], check=True)
    program = Program(binary)
    try:
        result = _refused(program.pid, tmp_path / "m.db")
        assert result.returncode == 0, result.stderr
        _assert_refusal(result, "it uses musl libc", tmp_path / "m.db")
        assert not shim_mapped(program.pid)
    finally:
        output, status = program.quit()
    assert (output, status) == plain_run(binary, [])


def test_refused_for_a_static_binary(tmp_path: Path) -> None:
    source = TARGETS / "attach_alloc.c"
    binary = tmp_path / "static_alloc"
    build = subprocess.run(["gcc", "-static", "-O1", "-pthread", "-o", str(binary), str(source)],
                           capture_output=True, text=True)
    if build.returncode != 0:
        pytest.skip(f"no static libc to link with: {build.stderr.strip()[:200]}")
    program = Program(binary)
    try:
        result = _refused(program.pid, tmp_path / "s.db")
        assert result.returncode == 0, result.stderr
        _assert_refusal(result, "it is a static binary", tmp_path / "s.db")
    finally:
        output, status = program.quit()
    assert (output, status) == plain_run(binary, [])


def test_rsprof_killed_the_shim_stops_by_itself(alloc_binary: Path, tmp_path: Path) -> None:
    """rsprof killed with -9 never calls stop: the shim sees its recorder gone at its next
    check (every 256 events of a thread, at most every 200 ms) and stops recording: ring
    removed, GOT entries back. A later attach then records exactly again."""
    program = Program(alloc_binary)
    recorder = start_attach(program.pid, tmp_path / "killed.db")
    wait_for_ring(program.pid, recorder)
    program.command("alloc 100")
    recorder.kill()
    recorder.wait()  # reaped: a zombie would still look alive to the shim
    deadline = time.monotonic() + 10
    while heap_rings(program.pid):  # the spinning threads allocate all the time
        assert time.monotonic() < deadline, "the shim kept its ring after rsprof died"
        time.sleep(0.05)
    out = tmp_path / "again.db"
    again = start_attach(program.pid, out)
    wait_for_ring(program.pid, again)
    program.command("alloc 25")
    stop_attach(again)
    keep = sites(out)["attach_keep_site"]
    assert (keep["alloc_count"], keep["total_alloc_bytes"]) == (100, 100 * BLOCK)
    output, status = program.quit()
    assert (output, status) == plain_run(alloc_binary, ["alloc 100", "alloc 25"])


CYCLES = 20


@pytest.fixture(scope="module")
def cxx_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """attach_alloc.c built as C++: 8 threads, new[] and delete[] through libstdc++."""
    out = tmp_path_factory.mktemp("cxx") / "attach_alloc_cxx"
    subprocess.run(["g++", "-x", "c++", "-O1", "-g", "-fno-omit-frame-pointer", "-pthread",
                    "-o", str(out), str(TARGETS / "attach_alloc.c")],
                   check=True)
    return out


# 20 recordings each, a bound for the worst case only. A cycle (rsprof -p's start, the
# helper's inject, the program's commands, SIGINT, the helper's stop, the check) takes
# 0.45-0.5 s on a quiet machine (C 9.5 s, C++ 9.0 s, Python 6.6-7.4 s, sqlite3 16.5 s for 20;
# the whole file 79.6 s). With four hogs of ours and twelve of other sessions (load average
# 16-36) the C++ case took 427 s, ~21 s a cycle, the whole file 799 s: the bound is kept.
TWENTY_CYCLES_S = 1200


@pytest.mark.slow
@pytest.mark.timeout(TWENTY_CYCLES_S)
@pytest.mark.parametrize("language", ["c", "c++"])
def test_attach_detach_20_times(language: str, alloc_binary: Path, cxx_binary: Path,
                                tmp_path: Path) -> None:
    """20 attaches and detaches in a row of the C program (4 threads, malloc/free) and of
    its C++ build (8 threads, new[]/delete[]), forking while its threads allocate: each
    recording exact, the shim reused (loaded once), no ring left (the children's shims
    record nothing), the program's output and status those of a plain run."""
    binary, threads = (alloc_binary, THREADS) if language == "c" else (cxx_binary, 8)
    program = Program(binary)
    commands = []
    stopped = []
    for cycle in range(CYCLES):
        out = tmp_path / f"c{cycle}.db"
        recorder = start_attach(program.pid, out)
        wait_for_ring(program.pid, recorder)
        for command in (f"alloc {cycle + 1}", "fork 2", "free"):
            program.command(command)
            commands.append(command)
        stderr = stop_attach(recorder)
        assert not heap_rings(program.pid)
        assert not rings_of_session(recorder.pid)  # none of the forked children's
        found = sites(out)
        assert "attach_keep_site" in found, (cycle, stderr, found)
        keep = found["attach_keep_site"]
        n = (cycle + 1) * threads
        assert (keep["alloc_count"], keep["free_count"], keep["live_bytes"]) == (n, n, 0), cycle
        stopped.append(float(profile_meta(out)["heap_attach_stopped_ms"]))
    assert Path(f"/proc/{program.pid}/maps").read_text().count(INJECT_NAME) >= 1
    output, status = program.quit()
    assert (output, status) == plain_run(binary, commands)
    print(f"injecting thread stopped: median {sorted(stopped)[CYCLES // 2]:.2f} ms,"
          f" max {max(stopped):.2f} ms")


def _sqlite_chunk(k: int, rows: int) -> str:
    return (
        f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows})"
        f" INSERT INTO t(b, c) SELECT printf('%040d', x * {k + 1}), x % 97 FROM c;\n"
        "CREATE INDEX IF NOT EXISTS tc ON t(c);\n"
        f"SELECT {k}, count(*), sum(length(b)), sum(c) FROM t;\n"
        "DELETE FROM t WHERE a % 3 = 0;\n"
        "SELECT c, count(*) FROM t GROUP BY c ORDER BY 2 DESC, 1 LIMIT 3;\n"
    )


@pytest.mark.slow
@pytest.mark.timeout(TWENTY_CYCLES_S)
@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="needs sqlite3")
def test_attach_detach_20_times_sqlite3(tmp_path: Path) -> None:
    """sqlite3 :memory: fed a script while it is attached and detached 20 times (injected
    while busy allocating and while waiting on its stdin): its output and status those of
    a plain run fed the same script, no ring left."""
    head = "CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c INTEGER);\n"
    script = [head]
    proc = subprocess.Popen(["sqlite3", ":memory:"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None

    def feed(text: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(text)
        proc.stdin.flush()
        script.append(text)

    feed("")
    proc.stdin.write(head)
    heap_seen = 0
    for cycle in range(CYCLES):
        out = tmp_path / f"s{cycle}.db"
        # Busy while rsprof starts and injects (~0.2 s alone here), then a small chunk
        # while attached: every allocation it makes is a heap event to read and resolve (the
        # bigger chunks of before made this test 28 s, 6 s of it the plain run alone).
        feed(_sqlite_chunk(2 * cycle, 30000))
        recorder = start_attach(proc.pid, out)
        wait_for_ring(proc.pid, recorder)
        feed(_sqlite_chunk(2 * cycle + 1, 2000 + 100 * cycle))  # at it or waiting at the stop
        stderr = stop_attach(recorder)
        assert "heap since attach" in stderr, stderr
        assert not heap_rings(proc.pid)
        heap_seen += sum(s["alloc_count"] for s in sites(out).values())
    stdout, stderr = proc.communicate(timeout=120)
    plain = subprocess.run(["sqlite3", ":memory:"], input="".join(script), capture_output=True,
                           text=True, timeout=120)
    assert (stdout, stderr, proc.returncode) == (plain.stdout, plain.stderr, plain.returncode)
    assert stdout.count("\n") == CYCLES * 2 * 4
    assert heap_seen > 0


@pytest.mark.parametrize("python", list(PYTHONS))
def test_attach_python_allocations_at_their_lines(python: str, tmp_path: Path) -> None:
    """A CPython program started without rsprof (Debian's 3.11, pyenv's 3.12 and 3.13):
    its allocations since the attach are charged to the Python lines that made them, as
    under `rsprof run`."""
    binary = python_binary(python)
    script = TARGETS / "attach_py.py"
    proc = subprocess.Popen([str(binary), str(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    lines = [proc.stdout.readline()]

    def ask(n: int) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{n}\n")
        proc.stdin.flush()
        lines.append(proc.stdout.readline())

    ask(100)  # before: unknown
    out = tmp_path / "py.db"
    recorder = start_attach(proc.pid, out)
    wait_for_ring(proc.pid, recorder)
    ask(500)
    stop_attach(recorder)
    ask(7)
    proc.stdin.close()
    assert proc.wait(30) == 0
    assert "".join(lines) == "ready\ndone 100 100\ndone 500 600\ndone 7 607\n"
    by_line = {(str(s["function"]), s["line"]): s for s in top_json(out, "heap")}
    leak = by_line[("leak_line", 11)]
    assert 500 * 5001 <= leak["live_bytes"] < 500 * 5001 + 65536  # + the list's growth
    churned = next(s for (function, line), s in by_line.items() if line == 15)
    assert churned["alloc_count"] == churned["free_count"] == 500 * 10
    assert churned["total_alloc_bytes"] == 500 * 10 * 3001  # a bytearray ends in a NUL


@pytest.mark.slow
@pytest.mark.timeout(TWENTY_CYCLES_S)
@pytest.mark.parametrize("python", list(PYTHONS))
def test_attach_detach_20_times_python(python: str, tmp_path: Path) -> None:
    """A CPython program (Debian's 3.11, pyenv's 3.12 and 3.13) attached and detached 20
    times in a row: each recording charges exactly the blocks made at the churn line while
    it was attached, and the program's output and status are those of a plain run."""
    binary = python_binary(python)
    script = TARGETS / "attach_py.py"
    proc = subprocess.Popen([str(binary), str(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    lines = [proc.stdout.readline()]
    asked = []
    for cycle in range(CYCLES):
        out = tmp_path / f"p{cycle}.db"
        recorder = start_attach(proc.pid, out)
        wait_for_ring(proc.pid, recorder)
        n = cycle + 1
        proc.stdin.write(f"{n}\n")
        proc.stdin.flush()
        lines.append(proc.stdout.readline())
        asked.append(f"{n}\n")
        stop_attach(recorder)
        assert not heap_rings(proc.pid)
        by_line = {(str(s["function"]), s["line"]): s for s in heap_top(out)}
        churned = next(s for (_, line), s in by_line.items() if line == 15)
        assert (churned["alloc_count"], churned["free_count"]) == (10 * n, 10 * n), cycle
        assert churned["total_alloc_bytes"] == 10 * n * 3001, cycle
        assert by_line[("leak_line", 11)]["live_bytes"] >= n * 5001, cycle
    proc.stdin.close()
    status = proc.wait(30)
    plain = subprocess.run([str(binary), str(script)], input="".join(asked),
                           capture_output=True, text=True, timeout=60)
    assert ("".join(lines) + proc.stdout.read(), status) == (plain.stdout, plain.returncode)


def test_rsprof_killed_at_any_moment_of_the_attach(alloc_binary: Path, tmp_path: Path) -> None:
    """rsprof killed with -9 at 10 moments from its start to well after the injection: the
    ptrace work runs in a helper of its own session that finishes its calls (a tracer dying
    mid-call would leave the thread returning to address 0), and the shim stops by itself:
    the program never notices."""
    program = Program(alloc_binary)
    for n, delay in enumerate(0.05 + 0.1 * k for k in range(10)):
        recorder = start_attach(program.pid, tmp_path / f"k{n}.db")
        time.sleep(delay)
        recorder.kill()
        recorder.wait()
        program.command("alloc 5")
    deadline = time.monotonic() + 15
    while heap_rings(program.pid):  # a helper may inject after its rsprof died: stopped too
        assert time.monotonic() < deadline, "a ring outlived its rsprof"
        time.sleep(0.05)
    program.command("free")
    output, status = program.quit()
    assert (output, status) == plain_run(alloc_binary, ["alloc 5"] * 10 + ["free"])


@pytest.mark.parametrize("allocator", ["own", "jemalloc-static"])
def test_refused_for_a_program_with_its_own_malloc(allocator: str, tmp_path: Path) -> None:
    """An executable defining malloc (its own, or jemalloc linked statically): every module
    calls it, not libc's, so the injected shim would see nothing. Refused in one line, CPU
    recorded."""
    targets = TARGETS
    binary = tmp_path / f"{allocator}_alloc"
    if allocator == "own":
        sources = [str(targets / "attach_alloc.c"), str(targets / "attach_ownmalloc.c")]
    else:
        archive = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.a")
        if not archive.exists():
            pytest.skip("needs libjemalloc-dev's libjemalloc.a")
        sources = [str(targets / "attach_alloc.c"), str(archive), "-ldl", "-lm"]
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(binary), *sources], check=True)
    program = Program(binary)
    try:
        result = _refused(program.pid, tmp_path / "own.db")
        assert result.returncode == 0, result.stderr
        _assert_refusal(result, "its malloc is not libc's", tmp_path / "own.db")
        assert not shim_mapped(program.pid)  # refused before anything was loaded
        program.command("alloc 10")
        program.command("free")
    finally:
        output, status = program.quit()
    assert (output, status) == plain_run(binary, ["alloc 10", "free"])


@pytest.mark.parametrize("blocked_in", ["read", "nanosleep"])
def test_no_system_call_of_the_target_fails_with_eintr(blocked_in: str, tmp_path: Path) -> None:
    """The injecting thread is stopped with PTRACE_INTERRUPT while it is blocked in a
    system call: read(2) on its stdin (the program's only thread) or nanosleep(2) (a
    sleeper thread, tried first). The kernel restarts the call once the thread is let go
    (ERESTARTSYS, ERESTART_RESTARTBLOCK): the program, which counts EINTRs instead of
    retrying, sees none in 5 attaches and detaches, and records exactly."""
    binary = build_target("attach_eintr.c")
    args = ["sleeper"] if blocked_in == "nanosleep" else []
    proc = subprocess.Popen([str(binary), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    blocked = {"read": 0, "nanosleep": 230}[blocked_in]  # read, clock_nanosleep
    tids = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task"))
    tid = tids[-1] if blocked_in == "nanosleep" else proc.pid

    def in_call() -> bool:  # the thread is blocked in it (almost always: retried)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            call = Path(f"/proc/{proc.pid}/task/{tid}/syscall").read_text().split()[0]
            if call == str(blocked):
                return True
            time.sleep(0.001)
        return False

    for cycle in range(5):
        assert in_call()
        out = tmp_path / f"e{cycle}.db"
        recorder = start_attach(proc.pid, out)
        wait_for_ring(proc.pid, recorder)
        proc.stdin.write(f"alloc {cycle + 1}\nfree\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == f"done alloc {cycle + 1}\n"
        assert proc.stdout.readline() == "done free\n"
        stop_attach(recorder)
        keep = sites(out)["eintr_keep_site"]
        assert (keep["alloc_count"], keep["free_count"]) == (cycle + 1, cycle + 1), cycle
        assert int(profile_meta(out)["heap_attach_tries"]) >= 1
    proc.stdin.write("quit\n")
    proc.stdin.close()
    assert proc.stdout.read() == "eintr read 0 sleep 0\n"
    assert proc.wait(30) == 0


def test_a_slow_ptrace_helper_is_never_killed(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper that has not answered in time may be in the middle of a call in the target
    (whose thread then returns to address 0 unless the helper puts it back): rsprof stops
    waiting for it, says so, and lets it finish. Killed by a timeout, as it once was, the
    target died of SIGSEGV."""
    from rsprof.collector import heapattach

    slow = tmp_path / "slow-helper"
    slow.write_text("#!/bin/sh\nsleep 1\necho '{\"injected\": null}'\n")
    slow.chmod(0o755)
    monkeypatch.setattr(heapattach.sys, "executable", str(slow))
    monkeypatch.setattr(heapattach, "HELPER_TIMEOUT_S", 0.2)
    answer = heapattach._helper("inject", "1", "2")
    assert "did not answer in 0.2 s" in str(answer.get("refused")), answer
    helper = heapattach._abandoned[-1]
    assert helper.poll() is None  # still running: not killed
    assert helper.wait(30) == 0  # and it finished its work
