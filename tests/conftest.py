"""Shared fixtures: real compiled targets, real profile files."""

from __future__ import annotations

import hashlib
import json
import math
import os
import resource
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TARGETS = Path(__file__).parent / "targets"
# Frame pointers everywhere (GCC 12 drops the leaf frame without the second flag).
C_FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-pthread"]
BUILD_DIR = Path(os.environ.get("RSPROF_TEST_BUILD", "/tmp/rsprof-test-targets"))


# The CPython interpreters the Python tests run on: Debian's 3.11, and pyenv's newest 3.12
# and 3.13 when installed (a test parametrized over PYTHONS skips the missing ones).
PYENV = Path.home() / ".pyenv/versions"


def _installed_pythons() -> dict[str, Path | None]:
    found: dict[str, Path | None] = {"debian-3.11": Path("/usr/bin/python3.11")}
    for minor in ("3.12", "3.13"):
        installs = sorted(PYENV.glob(f"{minor}.*/bin/python{minor}"))
        found[f"pyenv-{minor}"] = installs[-1] if installs else None
    return found


PYTHONS = _installed_pythons()


@pytest.fixture(autouse=True)
def _process_limits_restored() -> Iterator[None]:
    """A test that calls the CLI in-process runs Recorder.run, which raises the calling
    thread's priority to nice -10 and its soft fd limit to the hard one. Left so, every
    later target inherits them: 300 spinners at nice -10 starved the recorder, and
    test_follow's `-d 2s` recorded for 4-6 s in the same pytest run."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    files = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield
    if os.getpriority(os.PRIO_PROCESS, 0) != nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    if resource.getrlimit(resource.RLIMIT_NOFILE) != files:
        resource.setrlimit(resource.RLIMIT_NOFILE, files)


def python_binary(name: str) -> Path:
    """The interpreter PYTHONS names, or a skip when it is not installed."""
    binary = PYTHONS[name]
    if binary is None or not binary.exists():
        pytest.skip(f"{name} is not installed")
    return binary


def assert_share(part: float, rest: float, expected: float, *, floor: float = 0.04) -> None:
    """`part / (part + rest)` is `expected` within sampling error: four standard deviations
    of a binomial share over the samples at hand, never tighter than `floor`. Sample counts
    shrink when the machine is busy (cpu-clock counts the target's CPU time, not wall time),
    so a fixed tolerance is either loose on a quiet machine or a false alarm on a busy one."""
    n = part + rest
    assert n >= 20, f"too few samples to judge a share: {part} + {rest}"
    share = part / n
    tolerance = max(floor, 4 * math.sqrt(expected * (1 - expected) / n))
    assert abs(share - expected) <= tolerance, (
        f"share {share:.3f} of {n:.0f} samples, expected {expected:.3f} ± {tolerance:.3f}")


def build_target(source_name: str, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compiles tests/targets/<source_name> (C or C++) once per content and returns the binary."""
    source = TARGETS / source_name
    digest = hashlib.sha256(source.read_bytes() + " ".join(extra_flags).encode()).hexdigest()[:12]
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    binary = BUILD_DIR / f"{source.stem}-{digest}"
    if not binary.exists():
        compiler = "g++" if source.suffix in (".cc", ".cpp") else "gcc"
        tmp = binary.with_suffix(f".tmp{os.getpid()}")
        subprocess.run(
            [compiler, *C_FLAGS, *extra_flags, "-o", str(tmp), str(source)],
            check=True,
        )
        tmp.rename(binary)
    return binary


@pytest.fixture
def target_binary() -> Callable[..., Path]:
    return build_target


def _package_root() -> Path:
    """Where the `rsprof` under test lives (the installed copy, or the source tree). Not
    resolved: a strict editable install's tree is symlinks into the repository, whose
    top-level `rsprof/` is not the whole package."""
    import rsprof

    return Path(rsprof.__file__).absolute().parent.parent


def rsprof_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(_package_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["RSPROF_CACHE_DIR"] = str(BUILD_DIR / "symbol-cache")
    return env


def run_rsprof(*args: str, timeout: float = 120, cwd: Path | None = None,
               input_text: str | None = None,
               extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs the real `rsprof` command line (python -m rsprof) and captures its output;
    `extra_env` is added to rsprof_env()."""
    import sys

    return subprocess.run(
        [sys.executable, "-P", "-m", "rsprof", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**rsprof_env(), **(extra_env or {})},
        input=input_text, stdin=None if input_text is not None else subprocess.DEVNULL,
    )


def start_rsprof(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    import sys

    return subprocess.Popen(
        [sys.executable, "-P", "-m", "rsprof", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=rsprof_env(), cwd=cwd,
    )


def start_target(binary: Path, *args: str) -> subprocess.Popen[str]:
    """Starts a test target and waits for its `ready PID` line."""
    proc = subprocess.Popen([str(binary), *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), f"target did not start: {line!r}"
    return proc


@pytest.fixture
def rsprof() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_rsprof


def top_json(profile: Path, kind: str, *extra: str) -> list[dict[str, Any]]:
    """`rsprof top KIND FILE --json -n 0`: every row, parsed."""
    result = run_rsprof("top", kind, str(profile), "--json", "-n", "0", *extra)
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def profile_meta(profile: Path) -> dict[str, str]:
    """The profile's meta table, read only (a recording may still hold the file)."""
    conn = sqlite3.connect(f"file:{profile}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT key, value FROM meta").fetchall())
    finally:
        conn.close()


def record_pid(pid: int, out: Path, *extra: str,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`rsprof -p PID` headless for 1 s, checkpoints every 250 ms."""
    return run_rsprof("-p", str(pid), "-q", "-d", "1s", "-i", "250ms", "-o", str(out), *extra,
                      timeout=timeout)


def read_pty(primary: int, timeout: float = 60) -> bytes:
    """Everything written to a pty's other side until it closes (EIO); the caller closes
    `primary`. Each read waits at most `timeout` seconds."""
    import select

    said = b""
    while True:
        ready, _, _ = select.select([primary], [], [], timeout)
        assert ready, said
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the other side closed
            return said
        if not chunk:
            return said
        said += chunk


@pytest.fixture
def spinner() -> Iterator[subprocess.Popen[str]]:
    """A CPU-bound target without the heap shim."""
    proc = start_target(build_target("split.c"), "30", "100")
    yield proc
    proc.kill()
    proc.wait()


def checkpoint_count(profile: Path) -> int:
    """Checkpoints committed so far (0 while the file does not exist or has no schema)."""
    try:
        db = sqlite3.connect(f"file:{profile}?mode=ro", uri=True)
        try:
            return int(db.execute("SELECT count(*) FROM checkpoints").fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def wait_until(condition: Callable[[], object], what: str, timeout: float = 20,
               poll: float = 0.02) -> None:
    """Waits until `condition()` is true, checked every `poll` seconds; fails naming `what`
    after `timeout` seconds. For a test that needs something to have happened (a file
    written, a process gone), instead of a sleep sized for an idle machine."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(poll)


def wait_for_checkpoints(profile: Path, count: int, timeout: float = 20) -> None:
    """Waits until a recording in progress has committed `count` checkpoints."""
    wait_until(lambda: profile.exists() and checkpoint_count(profile) >= count,
               f"{profile} reaches {count} checkpoints", timeout, poll=0.1)


def _record_run(out: Path, *args: str) -> Path:
    result = run_rsprof("run", "-q", "-o", str(out), *args, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "target exited with code 0" in result.stderr, result.stderr
    return out


# Profiles recorded once per test session and shared by the export and analysis tests.
SPLIT_SECONDS = 3
LEAKY_TICKS, LEAKY_THREADS = 60, 2


@pytest.fixture(scope="session")
def split_cpu_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """split.c run 3 s at 999 Hz (CPU only): heavy:light work 3:1 under work() on thread
    split-main, other_busy() on split-busy, late_worker() on split-late from 1 s in."""
    out = tmp_path_factory.mktemp("split-cpu") / "split.db"
    return _record_run(out, "--no-heap", "--cpu-freq", "999", "-i", "250ms", "--",
                       str(build_target("split.c")), str(SPLIT_SECONDS), "1000")


@pytest.fixture(scope="session")
def split_cpu_profile_1to1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same program built with heavy:light = 1:1, for diffs against split_cpu_profile."""
    out = tmp_path_factory.mktemp("split-cpu-1to1") / "split11.db"
    binary = build_target("split.c", ("-DHEAVY_UNITS=1",))
    return _record_run(out, "--no-heap", "--cpu-freq", "999", "-i", "250ms", "--",
                       str(binary), str(SPLIT_SECONDS), "1000")


@pytest.fixture(scope="session")
def leaky_heap_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """leaky.c with every allocation traced: per tick leak_site() leaks 4000 B, churn_site()
    allocates and frees 777 B, each of 2 workers' thread_leak() leaks 64 B; keep_site()
    holds 123457 B. 60 ticks of 25 ms."""
    out = tmp_path_factory.mktemp("leaky-heap") / "leaky.db"
    return _record_run(out, "-i", "200ms", "--", str(build_target("leaky.c")),
                       str(LEAKY_TICKS), "25", str(LEAKY_THREADS))


SHM_DIR = Path("/dev/shm")


def _ring_prefix(pid: int) -> str:
    """The start of pid's ring names, "rsprof-heap.<pid>." (native/heapring.h)."""
    from rsprof._native import HEAP_RING_NAME_PREFIX

    return f"{HEAP_RING_NAME_PREFIX}{pid}."


def _read_ring_head(path: Path, size: int) -> bytes | None:
    """The first `size` bytes of a regular file in /dev/shm, None for anything else. A FIFO
    left under a ring's name (test_squatted_ring_names_leave_heap_on plants them; one whose
    cleanup never ran stays, and its pid is reused) blocked a plain open() for good: a 20x
    attach test hung 19 min in heap_rings."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, size)
    finally:
        os.close(fd)


def heap_rings(pid: int) -> list[Path]:
    """pid's heap rings in /dev/shm (rsprof-heap.<pid>.<16 hex digits>, native/heapring.h),
    oldest first (by the header's CLOCK_MONOTONIC creation time)."""
    import struct

    found = []
    for path in SHM_DIR.glob(f"{_ring_prefix(pid)}*"):
        head = _read_ring_head(path, 80)
        if head is None:
            continue
        created = struct.unpack_from("<Q", head, 72)[0] if len(head) >= 80 else 0
        found.append((created, path))
    return [path for _, path in sorted(found)]


def heap_ring_path(pid: int) -> Path:
    """pid's newest ring; when it has none, a name no ring has (so .exists() is False)."""
    rings = heap_rings(pid)
    return rings[-1] if rings else SHM_DIR / f"{_ring_prefix(pid)}none"


def guessed_ring_name(pid: int) -> Path:
    """A well-formed ring name for pid that no shim will draw (64 random bits of suffix)."""
    return SHM_DIR / f"{_ring_prefix(pid)}{os.urandom(8).hex()}"
