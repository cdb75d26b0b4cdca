"""PerfSampler (native/perf.c) against real processes: no mocks.

The target is tests/targets/perf_target.c; it prints "ready <pid>" and waits for a line on
stdin, so every test attaches before the interesting part starts.
"""

from __future__ import annotations

import bisect
import collections
import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import run_rsprof

from rsprof._native import PerfBatch, PerfMmap, PerfSampler

if TYPE_CHECKING:
    from rsprof._native import ProcessEvent

TARGETS = Path(__file__).parent.parent / "targets"


class Target:
    """A running perf_target plus the sampler attached to all its current threads."""

    def __init__(self, binary: Path, *args: str, **sampler_kw: Any) -> None:
        self.binary = binary
        self.proc = subprocess.Popen(
            [str(binary), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["ready"], line
        self.pid = self.proc.pid
        self.sampler = PerfSampler(self.pid, **sampler_kw)
        for tid in sorted(int(t) for t in os.listdir(f"/proc/{self.pid}/task")):
            self.sampler.add_thread(tid)
        self.sampler.enable()

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def close(self) -> None:
        self.sampler.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Batch:
    """Accumulates take() results."""

    def __init__(self) -> None:
        self.stacks: dict[int, tuple[int, ...]] = {}
        self.counts: collections.Counter[tuple[int, int]] = collections.Counter()
        self.samples = 0
        self.lost = 0
        self.new_threads: list[int] = []
        self.exited: list[int] = []
        self.comms: list[tuple[int, str]] = []
        self.mmaps: list[PerfMmap] = []
        self.processes: list[ProcessEvent] = []
        self.target_exited = False

    def add(self, d: PerfBatch) -> None:
        for sid, _image, ips in d.new_stacks:
            assert sid not in self.stacks, "stack ids are assigned once"
            self.stacks[sid] = ips
        for sid, tid, n in d.counts:
            assert sid in self.stacks, "counts only name stacks already announced"
            self.counts[sid, tid] += n
        self.samples += d.samples
        self.lost += d.lost
        self.new_threads += [tid for _pid, tid in d.new_threads]
        self.exited += d.exited_threads
        self.comms += d.comms
        self.mmaps += d.mmaps
        self.processes += d.processes
        self.target_exited |= d.target_exited

    def per_tid(self) -> collections.Counter[int]:
        out: collections.Counter[int] = collections.Counter()
        for (_, tid), n in self.counts.items():
            out[tid] += n
        return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (a zombie's too), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def collect(t: Target, seconds: float, batch: Batch | None = None, until=None) -> Batch:
    batch = batch or Batch()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t.sampler.poll(50)
        batch.add(t.sampler.take())
        if until is not None and until(batch):
            break
    return batch


class Symbolizer:
    """Test-local resolution: nm symbols of the binary + the mapping from /proc/PID/maps.

    Enough for a PIE built by gcc/ld, whose segments have vaddr == file offset."""

    def __init__(self, binary: Path, pid: int) -> None:
        out = subprocess.run(
            ["nm", "-S", "--defined-only", str(binary)], check=True, capture_output=True, text=True
        ).stdout
        syms = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[2] in "tT":
                syms.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
        syms.sort()
        self.syms = syms
        self.starts = [s[0] for s in syms]
        real = os.path.realpath(binary)
        self.maps = []
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            f = line.split()
            if len(f) >= 6 and f[5] == real and "x" in f[1]:
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                self.maps.append((lo, hi, int(f[2], 16)))
        assert self.maps, "binary mapping not found"

    def name(self, ip: int) -> str | None:
        for lo, hi, off in self.maps:
            if lo <= ip < hi:
                addr = ip - lo + off
                i = bisect.bisect_right(self.starts, addr) - 1
                if i >= 0:
                    start, size, name = self.syms[i]
                    if start <= addr < start + size:
                        return name
        return None

    def frames(self, ips: tuple[int, ...]) -> list[str | None]:
        # Non-leaf entries are return addresses: look up the call instruction (ip - 1).
        return [self.name(ip if i == 0 else ip - 1) for i, ip in enumerate(ips)]


@pytest.fixture
def perf_target(target_binary):
    return target_binary("perf_target.c")


@pytest.fixture
def run_target(perf_target):
    started: list[Target] = []

    def start(*args: str, **kw: int) -> Target:
        t = Target(perf_target, *args, **kw)
        started.append(t)
        return t

    yield start
    for t in started:
        t.close()


def test_split_three_to_one_with_caller_frames(run_target):
    t = run_target("split", "2.2", freq_hz=999)
    sym = Symbolizer(t.binary, t.pid)
    cpu_before = cpu_seconds(t.pid)
    t.go()
    b = collect(t, 2.0)
    t.sampler.poll(0)
    cpu_used = cpu_seconds(t.pid) - cpu_before
    b.add(t.sampler.take())
    # The oracle for the rate: the CPU time the kernel charged the target in the window.
    # cpu-clock at 999 Hz is one sample per ms of it, however busy the machine.
    assert 0.75 * cpu_used * 999 <= b.samples <= 1.1 * cpu_used * 999 + 20, (b.samples, cpu_used)
    # Floors low enough for a loaded machine (cpu-clock counts the target's CPU time, which
    # shrinks when it competes for the cores); the share below is what is being tested.
    assert b.samples > 100, b.samples
    leaf: collections.Counter[str] = collections.Counter()
    with_caller = 0
    for (sid, tid), n in b.counts.items():
        assert tid == t.pid
        frames = sym.frames(b.stacks[sid])
        if frames[0] in ("heavy", "light"):
            leaf[frames[0]] += n
            if len(frames) > 1 and frames[1] == "caller" and "main" in frames[2:]:
                with_caller += n
    total = leaf["heavy"] + leaf["light"]
    assert total > 0.8 * b.samples, (leaf, b.samples)
    share = 100.0 * leaf["heavy"] / total
    assert abs(share - 75.0) <= 7.0, share
    # Frame-pointer chains: caller() right above the leaf, main() further up.
    assert with_caller >= 0.95 * total, (with_caller, total)


def test_two_threads_existing_at_attach_and_background_poll(run_target):
    t = run_target("twothreads", "1.2", freq_hz=499)
    tids = sorted(int(x) for x in os.listdir(f"/proc/{t.pid}/task"))
    assert len(tids) == 2 and sorted(t.sampler.threads()) == tids
    t.sampler.add_thread(tids[1])  # already tracked: no-op
    assert sorted(t.sampler.threads()) == tids

    # The collector's pattern: poll() on a background thread, take() on this one.
    stop = threading.Event()

    def poller() -> None:
        while not stop.is_set():
            t.sampler.poll(20)

    th = threading.Thread(target=poller)
    th.start()
    t.go()
    b = Batch()
    try:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            time.sleep(0.05)
            b.add(t.sampler.take())
    finally:
        stop.set()
        th.join()
    t.sampler.poll(0)
    b.add(t.sampler.take())
    per_tid = b.per_tid()
    for tid in tids:
        assert per_tid[tid] > 30, per_tid
    assert sum(per_tid.values()) <= b.samples


def test_thread_created_after_attach_is_followed(run_target):
    t = run_target("latethread", "0.6", freq_hz=999)
    sym = Symbolizer(t.binary, t.pid)
    t.go()
    late_tid = int(t.readline().split()[1])  # printed by the new thread once it runs
    b = collect(t, 3.0, until=lambda b: b.target_exited)
    assert late_tid in b.new_threads
    assert b.per_tid()[late_tid] > 40, b.per_tid()
    assert any("late_worker" in sym.frames(b.stacks[s]) for s, tid in b.counts if tid == late_tid)
    assert (late_tid, "perf-late") in b.comms
    assert late_tid in b.exited and t.pid in b.exited
    assert b.target_exited
    assert t.sampler.threads() == []


def test_dead_pid_is_esrch(perf_target):
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(ProcessLookupError) as e:
        PerfSampler(proc.pid)
    assert e.value.errno == errno.ESRCH
    # A live sampler asked for a thread that is gone: same errno.
    with PerfSampler(os.getpid()) as s, pytest.raises(OSError) as e2:
        s.add_thread(proc.pid)
    assert e2.value.errno == errno.ESRCH


def test_target_exit_is_reported(run_target):
    t = run_target("exit", "0.3", freq_hz=199)
    t.go()
    b = collect(t, 5.0, until=lambda b: b.target_exited)
    assert b.target_exited
    assert t.pid in b.exited
    assert b.samples > 0
    assert t.sampler.threads() == []
    assert t.sampler.poll(0) == 0  # nothing left to watch: cheap and empty


def test_dlopen_after_attach_reports_mapping(run_target, tmp_path):
    lib = tmp_path / "libperftest.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,--build-id", "-o", str(lib), str(TARGETS / "perf_lib.c")],
        check=True,
    )
    t = run_target("dlopen", str(lib), freq_hz=99)
    t.go()
    assert t.readline().strip() == "loaded"
    b = collect(t, 0.2)
    ours = [m for m in b.mmaps if m[3] == str(lib)]
    assert len(ours) == 1, b.mmaps
    start, length, pgoff, build_id = ours[0].start, ours[0].length, ours[0].pgoff, ours[0].build_id
    assert start > 0 and length > 0 and pgoff >= 0
    lines = Path(f"/proc/{t.pid}/maps").read_text().splitlines()
    assert any(line.startswith(f"{start:x}-") and line.endswith(str(lib)) for line in lines)
    if build_id is not None:  # None only if the kernel could not read the note
        notes = subprocess.run(
            ["readelf", "-n", str(lib)], check=True, capture_output=True, text=True
        ).stdout
        assert build_id.hex() in notes


def test_small_ring_counts_lost(run_target):
    t = run_target("split", "1.5", freq_hz=9999, ring_kib=8)
    t.go()
    time.sleep(0.5)  # nobody drains: the 8 KiB ring overflows within milliseconds
    t.sampler.poll(0)  # frees room: the kernel writes PERF_RECORD_LOST with the next record
    time.sleep(0.1)
    t.sampler.poll(0)
    d = t.sampler.take()
    assert d.lost > 0, d.lost
    assert d.samples > 0
    assert d.first_time_ns <= d.last_time_ns <= time.monotonic_ns()


def test_argument_validation(perf_target):
    with pytest.raises(ValueError):
        PerfSampler(os.getpid(), ring_kib=12)  # three pages: not a power of two
    with pytest.raises(ValueError):
        PerfSampler(os.getpid(), freq_hz=0)
    s = PerfSampler(os.getpid())
    s.close()
    s.close()  # idempotent
    with pytest.raises(ValueError):
        s.add_thread(os.getpid())
    d = s.take()
    assert d.samples == 0 and d.new_stacks == [] and d.first_time_ns == 0


# Run under tests/targets/perf_refuse_enable.c (LD_PRELOAD): PERF_EVENT_IOC_ENABLE refused
# with EACCES once RSPROF_TEST_ENABLE_OK of them went through. Prints one JSON object.
REFUSED_ENABLE = r"""
import json, os, sys, threading, time
from rsprof._native import PerfSampler

def burn(sampler, seconds=0.3):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    sampler.poll(0)
    return sampler.take().samples

def refused(call):
    try:
        call()
    except OSError as error:
        return [error.errno, type(error).__name__, str(error)]
    return None

out = {}
me = threading.get_native_id()
if sys.argv[1] == "enable":
    # Two threads' events, the first enabled, the second refused: enable() raises and
    # leaves none enabled; once allowed, enable() works.
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    with PerfSampler(os.getpid(), freq_hz=999) as s:
        s.add_thread(me)
        s.add_thread(other.native_id)
        out["enable"] = refused(s.enable)
        out["samples_refused"] = burn(s)
        del os.environ["RSPROF_TEST_ENABLE_OK"]
        out["enable_again"] = refused(s.enable)
        out["samples"] = burn(s)
    stop.set()
    other.join()
else:
    # enable() before any event; the thread added after it cannot start: add_thread raises
    # and keeps nothing (no event, no ring); once allowed, the same thread is added.
    with PerfSampler(os.getpid(), freq_hz=999) as s:
        s.enable()
        out["add"] = refused(lambda: s.add_thread(me))
        out["threads_refused"] = s.threads()
        del os.environ["RSPROF_TEST_ENABLE_OK"]
        out["add_again"] = refused(lambda: s.add_thread(me))
        out["threads"] = s.threads()
        out["samples"] = burn(s)
out["me"] = me
print(json.dumps(out))
"""


def _refused_enable(target_binary, mode: str, allowed: int) -> dict[str, Any]:
    lib = target_binary("perf_refuse_enable.c", ("-shared", "-fPIC"))
    env = dict(os.environ, LD_PRELOAD=str(lib), RSPROF_TEST_ENABLE_OK=str(allowed))
    result = subprocess.run([sys.executable, "-P", "-c", REFUSED_ENABLE, mode], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_enable_refused_by_the_kernel_raises(target_binary):
    """PERF_EVENT_IOC_ENABLE's result was ignored: a refused event never sampled and
    enable() said nothing. Now it raises the errno (PermissionError for EACCES), and the
    events it did enable are disabled again."""
    out = _refused_enable(target_binary, "enable", 1)
    assert out["enable"] is not None, "enable() succeeded though the kernel refused"
    err, kind, message = out["enable"]
    assert err == errno.EACCES and kind == "PermissionError"
    assert "PERF_EVENT_IOC_ENABLE" in message
    assert out["samples_refused"] == 0
    assert out["enable_again"] is None
    assert out["samples"] > 0


def test_refused_enable_is_a_permission_error_of_the_cli(target_binary, tmp_path):
    """The recorder's enable() refused (EACCES, as from a security module): one line that
    names the fix and exit 4, like a refused perf_event_open; it was exit 1 (internal)."""
    lib = target_binary("perf_refuse_enable.c", ("-shared", "-fPIC"))
    target = subprocess.Popen(["sleep", "30"])
    try:
        result = run_rsprof("-p", str(target.pid), "-q", "-d", "1s", "-o", str(tmp_path / "p.db"),
                            timeout=60,
                            extra_env={"LD_PRELOAD": str(lib), "RSPROF_TEST_ENABLE_OK": "0"})
    finally:
        target.kill()
        target.wait()
    assert result.returncode == 4, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "could not be started: permission denied" in lines[0], lines
    assert "Traceback" not in result.stderr


def test_thread_whose_event_cannot_start_is_an_add_thread_error(target_binary):
    """add_thread after enable(): an event the kernel opened but refused to enable was kept,
    silently, and the thread counted as sampled. Now add_thread raises as for a refused
    perf_event_open, keeps no event (nor the ring it mapped), and a later try works."""
    out = _refused_enable(target_binary, "add", 0)
    assert out["add"] is not None, "add_thread succeeded though the kernel refused"
    err, kind, message = out["add"]
    assert err == errno.EACCES and kind == "PermissionError"
    assert f"perf_event_open(tid={out['me']})" in message
    assert out["threads_refused"] == []
    assert out["add_again"] is None
    assert out["threads"] == [out["me"]]
    assert out["samples"] > 0
