"""Python frames read at sample time by the BPF sampler (native/bpf/pyperf.bpf.c, issue 21):
real CPython processes under `rsprof run`, checked against what they were running at the
sampled instant. Skipped, with the reason, where BPF is not available (an install without
clang and libbpf-dev, or not permitted); the fallback's own checks run everywhere."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import profile_meta, python_binary, run_rsprof

import rsprof
from rsprof._native import PerfSampler

BPF_OBJECT = Path(rsprof.__file__).parent / "lib" / "pyperf.bpf.o"

# Two functions alternating every ~0.1 ms, one in zlib's C code, one in hashlib's.
ALTERNATING = """\
import hashlib, sys, time, zlib
data = bytes(range(256)) * 8
def compressing():
    end = time.perf_counter() + 0.0001
    while time.perf_counter() < end:
        zlib.compress(data, 6)
def hashing():
    end = time.perf_counter() + 0.0001
    while time.perf_counter() < end:
        hashlib.sha256(data).digest()
stop = time.monotonic() + float(sys.argv[1])
while time.monotonic() < stop:
    compressing()
    hashing()
"""
FIB = """\
import sys, time
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
stop = time.monotonic() + float(sys.argv[1])
while time.monotonic() < stop:
    fib(20)
"""
# light() and heavy() at 30:70 of the work, each reached through C calling back into
# Python (map() drives light, sum() drives the generator that calls heavy), for argv[1] CPU
# seconds (not wall seconds: the sample count stays ~500 per second whatever the load).
# Random round lengths so that rounds do not alias with the sampling period.
SPLIT = """\
import random, sys, time
def light(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def heavy(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def main(cpu_seconds):
    end = time.process_time() + cpu_seconds
    while time.process_time() < end:
        unit = 1000 + int(random.random() * 2000)
        sum(map(light, (3 * unit,)))
        sum(heavy(7 * unit) for _ in range(1))
main(float(sys.argv[1]))
"""
# C -> Python entries as fast as a loop makes them: a generator resumed by sum(), a function
# called by map(), each a few instructions long, for argv[1] CPU seconds.
ENTRIES = """\
import sys, time
def f(x):
    return x
def g(n):
    return sum(x for x in range(n))
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    for _ in range(1000):
        g(2)
        list(map(f, (1, 2)))
"""
# Code objects that run for ~50 us and die; each one's memory goes straight to a twin made
# from it (code.replace: the same size, so pymalloc hands it the freed block) that never
# runs, for argv[1] seconds. Prints how many twins took their original's address.
CODE_REUSE = """\
import sys, time, types
def template():
    s = 0
    for k in range(2000):
        s += k
    return s
code = template.__code__
end = time.monotonic() + float(sys.argv[1])
rounds = same = 0
while time.monotonic() < end:
    name = f"work_{rounds % 1000:03}"
    work = code.replace(co_name=name, co_qualname=name)
    address = id(work)
    types.FunctionType(work, {"range": range})()
    del work
    twin = f"never_{rounds % 1000:03}"
    decoy = code.replace(co_name=twin, co_qualname=twin)
    same += id(decoy) == address
    rounds += 1
print(f"{same} of {rounds} at the same address", file=sys.stderr)
"""
INTERPRETERS = ["debian-3.11", "pyenv-3.12", "pyenv-3.13"]


def _bpf_unavailable() -> str | None:
    """Why the BPF sampler cannot run here, None when it can."""
    if not BPF_OBJECT.exists():
        return ("rsprof was installed without its BPF program (clang and libbpf-dev were"
                " missing at install)")
    with PerfSampler(os.getpid(), bpf_object=str(BPF_OBJECT)) as sampler:
        stats = sampler.python_stats()
    return None if stats["mode"] == "bpf" else str(stats["bpf_error"])


@pytest.fixture(scope="module")
def bpf() -> None:
    reason = _bpf_unavailable()
    if reason is not None:
        pytest.skip(f"BPF sampler not available: {reason}")


@pytest.fixture
def hogs() -> Iterator[None]:
    """Four busy loops on the 2 cores, killed (by PID) after the test."""
    started = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(4)]
    try:
        yield
    finally:
        for hog in started:
            hog.kill()
            hog.wait()


Frame = tuple[str, str]  # function, module path (a Python frame's: its source file)


def _stacks(profile: Path, table: str = "cpu_stack_samples",
            count: str = "count") -> list[tuple[int, list[Frame]]]:
    """(samples, frames leaf first) of every stack of `table` (off-CPU: `switches`)."""
    conn = sqlite3.connect(f"file:{profile}?mode=ro", uri=True)
    try:
        frames: dict[int, list[Frame]] = {}
        for stack_id, function, module in conn.execute(
            "SELECT sf.stack_id, l.function, COALESCE(m.path, '') FROM stack_frames sf"
            " JOIN frame_locations fl ON fl.frame_id = sf.frame_id AND fl.inline_depth = 0"
            " JOIN locations l ON l.id = fl.location_id"
            " JOIN frames f ON f.id = sf.frame_id LEFT JOIN modules m ON m.id = f.module_id"
            " ORDER BY sf.stack_id, sf.position"
        ):
            frames.setdefault(stack_id, []).append((function, module))
        return [(n, frames.get(stack_id, [])) for stack_id, n in conn.execute(
            f"SELECT stack_id, SUM({count}) FROM {table} GROUP BY stack_id")]
    finally:
        conn.close()


def _under(stacks: list[tuple[int, list[Frame]]], script: Path) -> dict[str, dict[str, int]]:
    """Samples with zlib's / hashlib's C frames under compressing() / hashing()."""
    under = {"zlib": {"compressing": 0, "hashing": 0}, "hash": {"compressing": 0, "hashing": 0}}
    for count, frames in stacks:
        python = {function for function, module in frames if module == str(script)}
        modules = {Path(module).name for _, module in frames}
        kinds = set()
        if any(m.startswith(("libz.", "zlib.")) for m in modules):
            kinds.add("zlib")
        if any(m.startswith(("libcrypto", "_hashlib", "_sha2", "_sha256")) for m in modules):
            kinds.add("hash")
        for kind in kinds:
            for function in python & {"compressing", "hashing"}:
                under[kind][function] += count
    return under


def _record(python: Path, script: Path, seconds: str, out: Path, *extra: str) -> Path:
    result = run_rsprof("run", "-q", "--no-heap", "--cpu-freq", "499", "-o", str(out), *extra,
                        "--", str(python), str(script), seconds, timeout=180)
    assert result.returncode == 0, result.stderr
    meta = profile_meta(out)
    if meta.get("python_mode") != "bpf" and "--python=drain" not in extra:
        pytest.skip(f"BPF sampler not used: {meta.get('python_bpf_error')}")
    return out


@pytest.mark.parametrize("name", INTERPRETERS)
def test_native_frames_sit_under_the_python_function_running_then(
        name: str, tmp_path: Path, bpf: None) -> None:
    """compressing() and hashing() alternate every ~0.1 ms: zlib's C frames are never
    under hashing, hashlib's never under compressing (a read after the sample, paired with
    it, put them there when the thread had moved on).

    Drain-time reads put hundreds here (465 in one recording). With the BPF program Debian's
    3.11 still had 1-2 samples of ~1,900 in about half of the recordings until 2026-11-27:
    samples taken before the program was configured for the process, drained after, were
    read at drain time (zlib's `deflateInit2_` under hashing, in the first milliseconds of
    the loop); they keep their native frames now (meta python_before_reader)."""
    script = tmp_path / "alternating.py"
    script.write_text(ALTERNATING)
    profile = _record(python_binary(name), script, "4", tmp_path / "alt.db")
    under = _under(_stacks(profile), script)
    assert under["zlib"]["compressing"] >= 50 and under["hash"]["hashing"] >= 50, under
    assert under["zlib"]["hashing"] + under["hash"]["compressing"] == 0, under


@pytest.mark.parametrize("name", INTERPRETERS)
def test_off_cpu_samples_sit_under_the_python_function_switched_out(
        name: str, tmp_path: Path, bpf: None, hogs: None) -> None:
    """The same alternating script beside four CPU hogs, so that it is preempted hundreds of
    times: each off-CPU sample's Python frames are read at the switch-out by the program's
    sched_switch part, and none puts zlib under hashing or hashlib under compressing (read
    at drain time, 40-60 % of them did: the preempted thread had run on)."""
    script = tmp_path / "alternating.py"
    script.write_text(ALTERNATING)
    profile = _record(python_binary(name), script, "3", tmp_path / "alt.db")
    meta = profile_meta(profile)
    assert meta["python_offcpu_mode"] == "bpf", meta
    under = _under(_stacks(profile, "offcpu_stack_samples", "switches"), script)
    right = under["zlib"]["compressing"] + under["hash"]["hashing"]
    assert right >= 20, (under, meta)
    assert under["zlib"]["hashing"] + under["hash"]["compressing"] == 0, under
    assert int(meta["python_offcpu_bpf_attached"]) >= right, meta


def test_drain_reads_leave_preempted_off_cpu_samples_native(
        tmp_path: Path, hogs: None) -> None:
    """--python=drain (as where BPF is not available): an off-CPU sample of a preempted
    thread is not read at drain time (the thread has likely run on since), nor one of a
    thread the drain's records show running again, so they keep their native frames and
    meta counts them. A thread waking between the drain's staging and its read can still be
    read at another moment: 1 sample under the wrong function in 1 of 33 recordings here
    (docs/native.md), so a few are allowed (2, or 5 % of those read); read at drain time
    before, 40-60 % were wrong."""
    script = tmp_path / "alternating.py"
    script.write_text(ALTERNATING)
    profile = _record(python_binary("debian-3.11"), script, "2", tmp_path / "drain.db",
                      "--python=drain")
    meta = profile_meta(profile)
    assert meta["python_offcpu_mode"] == "drain", meta
    assert int(meta["python_offcpu_unread_preempted"]) >= 20, meta
    under = _under(_stacks(profile, "offcpu_stack_samples", "switches"), script)
    wrong = under["zlib"]["hashing"] + under["hash"]["compressing"]
    right = under["zlib"]["compressing"] + under["hash"]["hashing"]
    assert wrong <= max(2, (right + wrong) // 20), under


@pytest.mark.parametrize("name", INTERPRETERS)
def test_recursion_keeps_its_python_frames_under_load(
        name: str, tmp_path: Path, bpf: None, hogs: None) -> None:
    """A recursive fib with four CPU hogs on the two cores: at most 2 % of the samples in
    the evaluator lack their Python frames (drain-time reads lost 20-60 % here: the chain
    changed under the read). A recording typically loses 0-6 of ~1,000 (24 recordings of
    the three interpreters, 2026-11-27); the project's CI, with the rest of the suite
    around it, lost 19 of 1,003 and 15 of 1,032 on 3.13 in two of three runs (8 and 3 of
    them start-up; the one stack each failure printed was in a collection the eval breaker
    started, `_Py_HandlePending` -> gc), which the 1 % this test once allowed did not.

    Samples taken before rsprof found the interpreter (it looks once libpython is mapped,
    at the first drain after the exec) can have no frames: under load that can be all of
    start-up (the project's CI: 12 of 1008, every one under pymain_init), and so can
    samples read at drain time before the BPF program was attached (a CI run at load 42:
    12 of 986, under `exec_code_in_module`). The profile counts them (meta
    python_before_reader, python_late, python_dropped) and the bound allows them, no
    more."""
    script = tmp_path / "fib.py"
    script.write_text(FIB)
    profile = _record(python_binary(name), script, "5", tmp_path / "fib.db")
    evaluating = lost = 0
    lost_stacks = []
    for count, frames in _stacks(profile):
        # any Python frame: the script's, or the start-up's (`<frozen importlib._bootstrap>`,
        # site.py), which are as much the evaluator's frames as fib's
        python = any(module.endswith(".py") or module.startswith("<frozen")
                     for _, module in frames)
        native_eval = any(function == "_PyEval_EvalFrameDefault" for function, _ in frames)
        if python or native_eval:
            evaluating += count
            if not python:
                lost += count
                lost_stacks.append((count, " <- ".join(f for f, _ in frames)))
    meta = profile_meta(profile)
    assert evaluating >= 200, (evaluating, meta)
    before_reader = int(meta["python_before_reader"])
    # a count of samples (once garbage: realloc'd counters that were never zeroed)
    assert before_reader <= sum(count for count, _ in _stacks(profile)), meta
    # start-up before the BPF program read the frames: drained before rsprof found the
    # interpreter, or read at drain time and too late (as test_c_to_python_entries counts)
    startup = before_reader + int(meta["python_late"]) + int(meta["python_dropped"])
    assert lost <= 0.02 * evaluating + startup, (
        lost, evaluating, startup, lost_stacks[:5],
        {key: value for key, value in meta.items() if key.startswith("python")})
    assert int(meta["python_bpf_attached"]) >= 0.95 * evaluating, meta
    # A record near the sample at another ip is the thread's other sample, not a wrong
    # pairing (pairs need the same ip): cpu-clock samples a thread every 2 ms of its CPU
    # time, but a timer cancelled at a switch-out can fire early after the switch-in (perf
    # record beside four hogs: one gap of 448 us in 1,091); 1 in one CI run on 3.11.
    assert int(meta["python_bpf_ip_mismatch"]) <= 0.01 * evaluating, meta


@pytest.mark.parametrize("name", INTERPRETERS)
def test_python_shares_are_the_work_split_under_load(
        name: str, tmp_path: Path, bpf: None, hogs: None) -> None:
    """The accuracy claim, guarded cheaply: light() does 30 % of the work and heavy() 70 %,
    each called from C (map(), a generator driven by sum()), with four CPU hogs on the two
    cores. Each function's self share of the evaluator's samples (the innermost Python
    frame's; samples that lost their Python frames count in the whole) is its share of the
    work within 5 points (3.4 standard deviations at ~1000 samples). Measured here on 3.12
    and 3.13 (load average 14 besides the hogs): light 0.304-0.306, heavy 0.683-0.684;
    with `--python=drain` (3.11-3.13, load 14-26) 0.269-0.295 and 0.673-0.688,
    inside the bound too at that load: the drain-time reads' losses are what
    test_recursion_keeps_its_python_frames_under_load catches, this one catches the
    shares, C re-entry included, moving away from the work (bench/bench_pyaccuracy.py
    compares whole profiles with py-spy's)."""
    script = tmp_path / "split.py"
    script.write_text(SPLIT)
    profile = _record(python_binary(name), script, "2", tmp_path / "split.db")
    self_samples = {"light": 0, "heavy": 0}
    evaluating = without_python = 0
    for count, frames in _stacks(profile):
        if any(function == "pymain_init" for function, _ in frames):
            continue  # before rsprof found the interpreter: see the recursion test
        python = [function for function, module in frames
                  if module.endswith(".py") or module.startswith("<frozen")]
        if python or any(function == "_PyEval_EvalFrameDefault" for function, _ in frames):
            evaluating += count
            without_python += 0 if python else count
            if python and python[0] in self_samples:
                self_samples[python[0]] += count
    meta = profile_meta(profile)
    assert evaluating >= 400, (evaluating, meta)
    # Samples taken before the BPF program was configured for the process keep their native
    # frames (meta python_before_reader; under load the loop's first tens of ms: a CI run
    # had heavy at 0.644 of a whole that counted them): not in the whole, as the recursion
    # test leaves them out of its bound.
    evaluating -= min(int(meta.get("python_before_reader") or 0), without_python)
    shares = {function: n / evaluating for function, n in self_samples.items()}
    assert abs(shares["light"] - 0.30) <= 0.05 and abs(shares["heavy"] - 0.70) <= 0.05, (
        shares, evaluating, meta)


@pytest.mark.parametrize("name", INTERPRETERS)
def test_c_to_python_entries_keep_their_python_frames(
        name: str, tmp_path: Path, bpf: None) -> None:
    """A sample taken while C enters Python keeps the Python frames of the evaluators
    around it. In 3.11/3.12 the entry sets tstate->cframe to its new _PyCFrame before that
    one's current_frame, so the read at sample time followed stack garbage: it faulted
    (`bpf_fault`) and the sample kept native frames only, about 1 % of this program's
    samples on 3.12 (4-10 of ~1000 in bench_pyaccuracy's reentry workload). The program now
    checks that the innermost group links to the caller's _PyCFrame and otherwise reads
    from that one (`python_bpf_outer`): 10 of ~1000 samples here on 3.12, 1 on 3.11, none
    lost. At most 0.3 % may fault, and 1 % (issue 21's bound) lack Python frames (start-up
    before rsprof found the interpreter excepted)."""
    script = tmp_path / "entries.py"
    script.write_text(ENTRIES)
    profile = _record(python_binary(name), script, "2", tmp_path / "entries.db")
    evaluating = lost = 0
    lost_stacks = []
    for count, frames in _stacks(profile):
        if any(function == "pymain_init" for function, _ in frames):
            continue
        python = any(module.endswith(".py") or module.startswith("<frozen")
                     for _, module in frames)
        if python or any(function == "_PyEval_EvalFrameDefault" for function, _ in frames):
            evaluating += count
            lost += 0 if python else count
            if not python:
                lost_stacks.append((count, " <- ".join(f for f, _ in frames[:8])))
    meta = {key: value for key, value in profile_meta(profile).items()
            if key.startswith("python")}
    # start-up, before the program knew the process (on Debian's 3.11, whose pymain_init
    # has no symbol, these are not told apart above): drained before rsprof found the
    # interpreter, or read at drain time and too late
    startup = (int(meta["python_before_reader"]) + int(meta["python_late"])
               + int(meta["python_dropped"]))
    assert int(meta["python_before_reader"]) <= sum(count for count, _ in _stacks(profile))
    assert evaluating >= 400, (evaluating, meta)
    assert int(meta["python_bpf_fault"]) <= 0.003 * evaluating, (evaluating, meta)
    # issue 21's bound, 1 %: a CI run at load ~28 (other suites with hogs beside it) lost 4
    # of 1008 on 3.12 beyond start-up, quieter runs 0-2 (this test allowed 0.3 % while the
    # start-up counter was garbage and hid them)
    assert lost - startup <= 0.01 * evaluating, (lost, startup, evaluating, lost_stacks,
                                                 meta)
    assert "python_bpf_outer" in meta, meta


@pytest.mark.parametrize("name", INTERPRETERS)
def test_a_code_object_made_where_the_sampled_one_was_never_names_its_frame(
        name: str, tmp_path: Path, bpf: None) -> None:
    """The program reads code object addresses at sample time; the drain names them later.
    A code object freed in between and another made at its address (pymalloc reuses the
    block) named the frame after code that never ran: CI's pysplit.py profile once showed
    a `<genexpr>` of the script's that never runs, where a module's code run by an import
    had been. Each frame now carries a tag of its code object read at the sample (its
    pointers and the start of its name: a twin made by code.replace shares every other
    pointer), and the drain names a frame only when the object still carries it: 21 of 273
    such samples named a twin here before, none now (`python_bpf_replaced` counts them). The
    tag has 32 bits: this program replaces hundreds of sampled objects per run, and with 16
    one in 65,536 passed (a `never_` frame on 3.12 in one run of ~12)."""
    script = tmp_path / "code_reuse.py"
    script.write_text(CODE_REUSE)
    profile = _record(python_binary(name), script, "3", tmp_path / "reuse.db")
    named = {function for _, frames in _stacks(profile) for function, _ in frames}
    never = sorted(function for function in named if function.startswith("never_"))
    meta = {key: value for key, value in profile_meta(profile).items()
            if key.startswith("python")}
    assert not never, (never, meta)
    assert any(function.startswith("work_") for function in named), sorted(named)
    assert int(meta["python_bpf_replaced"]) > 0, meta


def test_unloadable_program_falls_back_to_drain_reads() -> None:
    """A program that cannot be loaded (here: no such file; elsewhere: no clang at install,
    EPERM) leaves the sampler reading at drain time, and it says why."""
    with PerfSampler(os.getpid(), bpf_object="/nonexistent/pyperf.bpf.o") as sampler:
        stats = sampler.python_stats()
    assert stats["mode"] == "drain"
    assert "/nonexistent/pyperf.bpf.o" in stats["bpf_error"], stats["bpf_error"]


def test_python_drain_reads_at_drain_time(tmp_path: Path) -> None:
    """--python=drain: the reads from outside, and meta says so."""
    script = tmp_path / "fib.py"
    script.write_text(FIB)
    profile = _record(python_binary("debian-3.11"), script, "1", tmp_path / "drain.db",
                      "--python=drain")
    meta = profile_meta(profile)
    assert meta["python_mode"] == "drain", meta
    assert meta["python_bpf_attached"] == "0" and int(meta["python_walks"]) > 0, meta


def test_bpf_not_permitted_falls_back_to_drain_reads(tmp_path: Path) -> None:
    """In a user namespace (root there, no CAP_BPF on the host) loading the program fails
    with EPERM: the recording reads at drain time and meta says why."""
    import shutil
    import sys

    from conftest import rsprof_env

    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--user", "--map-root-user", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("no user namespaces here (unshare --user --map-root-user)")
    script = tmp_path / "fib.py"
    script.write_text(FIB)
    out = tmp_path / "eperm.db"
    result = subprocess.run(
        [unshare, "--user", "--map-root-user", sys.executable, "-P", "-m", "rsprof", "run", "-q",
         "--no-heap", "--cpu-freq", "499", "-o", str(out), "--",
         str(python_binary("debian-3.11")), str(script), "1"],
        capture_output=True, text=True, timeout=120, env=rsprof_env())
    if result.returncode == 4:
        pytest.skip(f"perf_event_open not permitted in a user namespace: {result.stderr}")
    assert result.returncode == 0, result.stderr
    meta = profile_meta(out)
    assert meta["python_mode"] == "drain", meta
    assert "Operation not permitted" in meta["python_bpf_error"], meta
