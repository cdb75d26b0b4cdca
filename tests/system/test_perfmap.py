"""JIT code named from /tmp/perf-PID.map: the reader's rules on a file we write, then real
JIT runtimes (node --perf-basic-prof, python3.12 -X perf) recorded through the CLI."""

from __future__ import annotations

import bisect
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from conftest import build_target, rsprof_env, run_rsprof, top_json
from rsprof.collector import perfmap
from rsprof.collector.perfmap import LOOK_BACK, MAX_LINE, PerfMap, is_anonymous, parse_line

TARGETS = Path(__file__).parent.parent / "targets"
NODE = shutil.which("node") or "/usr/bin/node"
PERF_PYTHONS = [Path.home() / ".pyenv/versions/3.12.1/bin/python3.12",
                Path.home() / ".pyenv/versions/3.13.0/bin/python3.13"]


def _map(tmp_path: Path, text: str | bytes) -> tuple[Path, PerfMap]:
    path = tmp_path / "perf-1.map"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path, PerfMap(os.getpid(), path=str(path), uid=os.geteuid())


def test_names_are_parsed_from_v8_python_and_plain_lines() -> None:
    v8 = parse_line(b"7f9fc4006480 1e0 JS:*hotLoopFn /tmp/pf/hot.js:1:19")
    assert v8 is not None
    assert (v8.start, v8.size, v8.function, v8.file, v8.line) == (
        0x7F9FC4006480, 0x1E0, "hotLoopFn", "/tmp/pf/hot.js", 1)
    anonymous = parse_line(b"0x1000 10 JS:~ node:internal/main/run_main_module:1:1")
    assert anonymous is not None and anonymous.function == "(anonymous)"
    assert anonymous.file == "node:internal/main/run_main_module"
    python = parse_line(b"7fac935cc7b1 b py::Outer.hot_py_fn:/tmp/x.py")
    assert python is not None and (python.function, python.file) == ("Outer.hot_py_fn", "/tmp/x.py")
    plain = parse_line(b"400000 20 Builtin:RecordWriteSaveFP")
    assert plain is not None and (plain.function, plain.file) == ("Builtin:RecordWriteSaveFP", "")
    escaped = parse_line(b"400000 20 evil\x1b[2Jname")
    assert escaped is not None and "\x1b" not in escaped.function
    for bad in (b"", b"zz 10 f", b"1000 zz f", b"1000 10", b"1000 0 empty", b"0 10 nul",
                b"ffffffffffffffff 10 wraps", b"1000 10    "):
        assert parse_line(bad) is None, bad
    assert is_anonymous("//anon") and is_anonymous("[anon]") and is_anonymous("[anon:v8]")
    assert is_anonymous("/memfd:jit (deleted)") and not is_anonymous("/usr/bin/node")


def test_map_is_reread_as_it_grows_and_lines_split_across_reads(tmp_path: Path) -> None:
    path, perf_map = _map(tmp_path, "1000 100 first\n2000 10 sec")
    assert perf_map.refresh()
    assert perf_map.lookup(0x1050).function == "first"  # type: ignore[union-attr]
    assert perf_map.lookup(0x2005) is None  # its line is not complete yet
    assert perf_map.lookup(0x1100) is None and perf_map.lookup(0xFFF) is None
    with path.open("ab") as out:
        out.write(b"ond\n3000 10 third\n")
    assert perf_map.refresh()
    assert perf_map.lookup(0x2005).function == "second"  # type: ignore[union-attr]
    assert perf_map.lookup(0x3000).function == "third"  # type: ignore[union-attr]
    assert not perf_map.refresh()  # nothing new
    # A newer entry inside an older, bigger one wins where it lies; the older one elsewhere.
    with path.open("ab") as out:
        out.write(b"1040 10 inner\n")
    perf_map.refresh()
    assert perf_map.lookup(0x1045).function == "inner"  # type: ignore[union-attr]
    assert perf_map.lookup(0x1080).function == "first"  # type: ignore[union-attr]
    # A replaced file (new inode) starts over.
    path.unlink()
    path.write_text("5000 10 fresh\n")
    assert perf_map.refresh()
    assert perf_map.lookup(0x1050) is None and perf_map.lookup(0x5000) is not None


def test_malformed_and_overlong_lines_are_skipped(tmp_path: Path) -> None:
    long_name = b"x" * (MAX_LINE + 10)
    text = (b"garbage line\n1000 10 ok\n2000 10 " + long_name + b"\n3000 10 after\n"
            b"\xff\xfe 10 bin\n4000 10 caf\xc3\xa9\n")
    _, perf_map = _map(tmp_path, text)
    perf_map.refresh()
    assert perf_map.lookup(0x1000).function == "ok"  # type: ignore[union-attr]
    assert perf_map.lookup(0x2000) is None
    assert perf_map.lookup(0x3000).function == "after"  # type: ignore[union-attr]
    assert perf_map.lookup(0x4000).function == "café"  # type: ignore[union-attr]
    assert perf_map.malformed == 3
    # An over-long line still being written is skipped to its end, across reads.
    path, perf_map = _map(tmp_path, b"1000 10 a\n2000 10 " + long_name)
    perf_map.refresh()
    with path.open("ab") as out:
        out.write(b"more of it\n3000 10 b\n")
    perf_map.refresh()
    assert perf_map.lookup(0x2000) is None and perf_map.lookup(0x3000) is not None


def test_symlinks_fifos_foreign_and_stale_files_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.map"
    real.write_text("1000 10 f\n")
    link = tmp_path / "link.map"
    link.symlink_to(real)
    perf_map = PerfMap(os.getpid(), path=str(link), uid=os.geteuid())
    assert not perf_map.refresh() and perf_map.lookup(0x1000) is None
    assert perf_map.refused is not None and "symbolic link" in perf_map.refused
    fifo = tmp_path / "fifo.map"
    os.mkfifo(fifo)
    perf_map = PerfMap(os.getpid(), path=str(fifo), uid=os.geteuid())
    assert not perf_map.refresh()  # and it did not block
    assert perf_map.refused is not None and "regular" in perf_map.refused
    perf_map = PerfMap(os.getpid(), path=str(real), uid=os.geteuid() + 4242)
    assert not perf_map.refresh() and perf_map.lookup(0x1000) is None
    assert perf_map.refused is not None and "owned by" in perf_map.refused
    missing = PerfMap(os.getpid(), path=str(tmp_path / "none.map"), uid=os.geteuid())
    assert not missing.refresh() and missing.refused is None
    # Left in /tmp by an earlier process with the same pid: older than this one.
    import time

    stale = PerfMap(os.getpid(), path=str(real), uid=os.geteuid(), started=time.time() + 60)
    assert not stale.refresh() and stale.lookup(0x1000) is None
    assert stale.refused is not None and "older" in stale.refused
    fresh = PerfMap(os.getpid(), path=str(real), uid=os.geteuid(), started=time.time() - 60)
    assert fresh.refresh() and fresh.lookup(0x1000) is not None


def _remove_perf_map(profile: Path) -> None:
    """The runtime leaves /tmp/perf-PID.map behind; a test's should not pile up."""
    import sqlite3

    db = sqlite3.connect(f"file:{profile}?mode=ro", uri=True)
    try:
        pid = db.execute("SELECT value FROM meta WHERE key = 'pid'").fetchone()[0]
    finally:
        db.close()
    Path(f"/tmp/perf-{pid}.map").unlink(missing_ok=True)


def _functions(profile: Path, kind: str, *extra: str) -> dict[str, dict[str, Any]]:
    return {str(row["function"]): row for row in top_json(profile, kind, *extra)}


@pytest.mark.skipif(not os.access(NODE, os.X_OK), reason="node is not installed")
def test_node_perf_basic_prof_names_js_functions_in_cpu_and_heap(tmp_path: Path) -> None:
    """Without the perf map the same samples are `anon+0x...`, one row per address.
    `--interpreted-frames-native-stack` gives interpreted functions (leakyJsAlloc, called
    too rarely to be compiled) a code copy of their own in the map, as node's docs advise."""
    out = tmp_path / "node.db"
    result = run_rsprof("run", "-q", "--cpu-freq", "499", "-o", str(out), "--",
                        NODE, "--perf-basic-prof", "--interpreted-frames-native-stack",
                        str(TARGETS / "jit_hot.js"), "2",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    _remove_perf_map(out)
    cpu = _functions(out, "cpu")
    assert "hotLoopFn" in cpu, sorted(cpu)[:30]
    row = cpu["hotLoopFn"]
    # The JS loop is nearly all the CPU the program spends (the rest: node's start-up).
    assert row["self_pct"] > 50, row
    assert row["file"].endswith("jit_hot.js") and row["line"] == 4, row
    assert not [name for name in cpu if name.startswith(("anon+0x", "0x"))
                and cpu[name]["self_pct"] > 5], sorted(cpu)[:30]
    # A JIT frame is a frame: stacks go on through it to node's C++ (not `[truncated]`).
    traces = run_rsprof("traces", str(out), "--focus", "hotLoopFn", "-n", "1")
    assert "node::Start" in traces.stdout, traces.stdout
    # Heap stacks through JIT code: the Buffer allocations are charged under leakyJsAlloc.
    heap = run_rsprof("traces", "--kind", "heap", "--sample-index", "alloc_space", "--focus",
                      "leakyJsAlloc", "-n", "1", str(out))
    assert heap.returncode == 0, heap.stderr
    assert "leakyJsAlloc" in heap.stdout and "AllocateUninitialized" in heap.stdout, heap.stdout


def _has_cfi_unwinding() -> bool:
    help_text = run_rsprof("run", "--help").stdout
    return "--stack-bytes" in help_text


@pytest.mark.parametrize("python", PERF_PYTHONS, ids=lambda path: path.name)
def test_python_perf_trampolines_name_python_functions(tmp_path: Path, python: Path) -> None:
    """CPython 3.12+'s `-X perf` runs each Python function through a trampoline of its own
    named `py::qualname:file` in the perf map. The trampoline keeps no frame pointer and
    libpython is built without them, so only a CFI unwinder reaches it."""
    if not python.exists():
        pytest.skip(f"{python} is not installed")
    if not _has_cfi_unwinding():
        pytest.skip("needs CFI unwinding (frame pointers never reach the trampolines)")
    out = tmp_path / "py.db"
    # --python=off: the perf map's names alone (Python frames read from outside would
    # bring rows of the same names, tests/system/test_pysplice.py)
    result = run_rsprof("run", "-q", "--no-heap", "--python=off", "--cpu-freq", "499",
                        "-o", str(out), "--", str(python), "-X", "perf",
                        str(TARGETS / "jit_hot.py"), "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    _remove_perf_map(out)
    cpu = _functions(out, "cpu")
    assert "hot_py_fn" in cpu, sorted(cpu)[:30]
    row = cpu["hot_py_fn"]
    assert row["file"].endswith("jit_hot.py"), row
    assert row["total_pct"] > 50, row  # the loop is nearly all the program does


@pytest.mark.skipif(not os.access(NODE, os.X_OK), reason="node is not installed")
def test_jit_code_without_a_perf_map_is_an_address_frame_not_a_truncation(
        tmp_path: Path) -> None:
    """No perf map: JIT code has no name, but it is in an executable mapping, so it is a
    frame (its address) and the frame-pointer walk goes on through it to node's C++."""
    out = tmp_path / "nomap.db"
    result = run_rsprof("run", "-q", "--no-heap", "--cpu-freq", "499", "-o", str(out), "--",
                        NODE, str(TARGETS / "jit_hot.js"), "1.5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = top_json(out, "cpu")
    jit = [row for row in rows if row["module"] == "//anon"]
    assert jit and all(row["function"].startswith("0x") for row in jit), rows[:5]
    assert sum(row["self_pct"] for row in jit) > 50, rows[:5]
    hottest = max(jit, key=lambda row: row["self"])
    traces = run_rsprof("traces", str(out), "--focus", hottest["function"], "-n", "1")
    assert "node::Start" in traces.stdout and "[truncated]" not in traces.stdout, traces.stdout


def _model_lookup(model: dict[int, tuple[int, str]], address: int,
                  starts: list[int] | None = None) -> str | None:
    """The reading rules on a plain dict: the entries starting at or below the address,
    newest start first, at most LOOK_BACK of them; the first that holds it. `starts`:
    sorted(model), when the caller looks up many addresses in one model."""
    starts = sorted(model) if starts is None else starts
    index = bisect.bisect_right(starts, address) - 1
    for position in range(index, max(-1, index - LOOK_BACK), -1):
        size, name = model[starts[position]]
        if address < starts[position] + size:
            return name
    return None


@pytest.mark.slow
def test_compact_index_agrees_with_a_plain_model(tmp_path: Path) -> None:
    """Batches of every size (one line, thousands), in no address order, with repeated
    starts (the later line wins) and garbage lines, read as the file grows: every lookup
    agrees with a dict of the same lines."""
    rng = random.Random(7)
    path, perf_map = _map(tmp_path, b"")
    model: dict[int, tuple[int, str]] = {}
    for batch in range(40):
        text = []
        for index in range(rng.choice([1, 3, 40, 3000])):
            start = rng.randrange(0x1000, 0x41000, 0x10)
            size = rng.randrange(1, 0x400)
            name = f"f{batch}_{index}"
            text.append(f"{start:x} {size:x} {name}\n")
            model[start] = (size, name)
            if rng.random() < 0.01:
                text.append("not a line\n")
        with path.open("ab") as out:
            out.write("".join(text).encode())
        perf_map.refresh()
        assert len(perf_map) == len(model)
        starts = sorted(model)  # once per batch: sorting 30,000 starts per lookup took 14 s
        for _ in range(300):
            address = rng.randrange(0x1000, 0x41400)
            found = perf_map.lookup(address)
            expected = _model_lookup(model, address, starts)
            assert (found.function if found else None) == expected, (batch, hex(address))


def test_entries_and_bytes_are_bounded_with_a_warning(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perfmap, "MAX_ENTRIES", 100)
    path, perf_map = _map(tmp_path, "".join(f"{0x1000 + i * 0x10:x} 10 f{i}\n"
                                            for i in range(150)))
    perf_map.refresh()
    assert len(perf_map) == 100
    assert perf_map.truncated is not None and "first 100 entries" in perf_map.truncated
    assert perf_map.lookup(0x1000 + 99 * 0x10).function == "f99"  # type: ignore[union-attr]
    assert perf_map.lookup(0x1000 + 100 * 0x10) is None
    with path.open("ab") as out:
        out.write(b"9000 10 late\n")
    perf_map.refresh()
    assert len(perf_map) == 100 and perf_map.lookup(0x9000) is None
    monkeypatch.setattr(perfmap, "MAX_ENTRIES", 2_000_000)
    monkeypatch.setattr(perfmap, "MAX_BYTES", 1000)
    _, perf_map = _map(tmp_path, "".join(f"{0x1000 + i * 0x10:x} 10 f{i}\n" for i in range(150)))
    perf_map.refresh()
    assert 0 < len(perf_map) < 150
    assert perf_map.truncated is not None and "first 1000 of" in perf_map.truncated


def test_entries_take_a_few_bytes_each(tmp_path: Path) -> None:
    """Three 8-byte integers per entry, names read back from the file when looked up
    (before: one Python object per entry, ~400 bytes; a 2 M-entry map took 1 GiB)."""
    count = 200_000
    _, perf_map = _map(tmp_path, "".join(
        f"{0x100000 + i * 0x40:x} 40 JS:*someFunction{i} /srv/app/lib/file{i % 50}.js:{i}:7\n"
        for i in range(count)))
    tracemalloc.start()
    try:
        perf_map.refresh()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(perf_map) == count
    assert held < count * 40, held  # 24 bytes an entry, and the arrays' slack
    assert peak < count * 40 + (16 << 20), peak  # plus one chunk's lines at a time
    found = perf_map.lookup(0x100000 + 1234 * 0x40 + 5)
    assert found is not None and (found.function, found.file, found.line) == (
        "someFunction1234", "/srv/app/lib/file34.js", 1234)


def test_two_million_entries_bounded_memory_named(tmp_path: Path) -> None:
    """A real recording of JIT code whose perf map has 2 M entries and then some (184 MB):
    rsprof's peak RSS stays low (was 1034 MiB here), the code is named, and the cut is
    said. The map is written for the process this test started and removed after.
    CPU samples only (`--no-off-cpu`): the bound is the perf map's; off-CPU recording adds
    its own (kernel symbols, 2.4 MiB kept; off-CPU stacks with their kernel frames, more of
    them the more the target is preempted): a quiet run peaks at 242.9 MiB without and
    243.6 MiB with it, but CI runs at load ~20 went over 250 with it."""
    binary = build_target("jit_anon.c")
    target = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, text=True)
    assert target.stdout is not None
    _, pid, page = target.stdout.readline().split()
    perf_map = Path(f"/tmp/perf-{pid}.map")
    try:
        with open(perf_map, "w") as out:
            out.write(f"{int(page, 16):x} 6 jit_spin\n")
            address = 0x7E0000000000
            for i in range(perfmap.MAX_ENTRIES + 10):
                out.write(f"{address:x} 40 JS:*someFunctionName{i}"
                          f" /srv/app/node_modules/pkg/lib/file{i % 500}.js:{i % 9000}:7\n")
                address += 0x40
        out_db = tmp_path / "jit.db"
        timing = tmp_path / "time.txt"
        result = subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", str(timing), sys.executable, "-P", "-m",
             "rsprof", "-p", pid, "-q", "-d", "3s", "--no-off-cpu", "-o", str(out_db)],
            capture_output=True, text=True, env=rsprof_env(), timeout=300)
    finally:
        perf_map.unlink(missing_ok=True)
        target.kill()
        target.wait()
    assert result.returncode == 0, result.stderr
    assert "perf map cut" in result.stderr and "first 2000000 entries" in result.stderr
    peak_mib = int(timing.read_text().split()[-1]) / 1024
    assert peak_mib < 250, peak_mib
    rows = top_json(out_db, "cpu")
    assert rows and rows[0]["function"] == "jit_spin", rows[:3]


# ------------------------------------------------------------- where the map is (issue 20)


def test_the_map_is_looked_up_in_the_targets_root_under_its_own_pid(tmp_path: Path) -> None:
    assert perfmap.namespace_pid(b"Name:\tnode\nNSpid:\t4242\t17\t7\n") == 7
    assert perfmap.namespace_pid(b"NSpid:\t4242\n") == 4242
    assert perfmap.namespace_pid(b"Name:\tnode\n") is None
    pid = os.getpid()
    # Always through /proc/PID/root, even when that root is ours (PrivateTmp: same root,
    # another /tmp).
    assert perfmap.perf_map_location(pid) == (f"/proc/{pid}/root", f"perf-{pid}.map")
    assert PerfMap(pid).path == f"/proc/{pid}/root/tmp/perf-{pid}.map"


def test_no_symbolic_link_is_followed_out_of_the_targets_root(tmp_path: Path) -> None:
    """A root whose /tmp, or whose map, is a link: refused (an absolute link there would be
    resolved from rsprof's root, letting the target point root at any file)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "perf-1.map").write_text("1000 10 foreign\n")
    honest = tmp_path / "honest"
    (honest / "tmp").mkdir(parents=True)
    (honest / "tmp" / "perf-1.map").write_text("1000 10 mine\n")
    linked_tmp = tmp_path / "linked_tmp"
    linked_tmp.mkdir()
    (linked_tmp / "tmp").symlink_to(elsewhere)
    linked_map = tmp_path / "linked_map"
    (linked_map / "tmp").mkdir(parents=True)
    (linked_map / "tmp" / "perf-1.map").symlink_to(elsewhere / "perf-1.map")
    me = os.getpid()
    perf_map = PerfMap(me, uid=os.geteuid(), root=str(honest), name="perf-1.map")
    assert perf_map.refresh() and perf_map.lookup(0x1000).function == "mine"  # type: ignore[union-attr]
    for root in (linked_tmp, linked_map):
        perf_map = PerfMap(me, uid=os.geteuid(), root=str(root), name="perf-1.map")
        assert not perf_map.refresh() and perf_map.lookup(0x1000) is None
        assert perf_map.refused is not None and "symbolic link" in perf_map.refused


def _namespaced_target(binary: Path, *unshare: str) -> tuple[subprocess.Popen[str], int]:
    """The JIT target in new namespaces with a private tmpfs on /tmp (gone with them),
    writing its map there under its own pid; returns it and its pid as we see it. The
    binary is opened before the mount hides /tmp and executed through its descriptor."""
    script = f"exec 3<{binary} && mount -t tmpfs tmpfs /tmp && exec /proc/self/fd/3 --map"
    kill_child = ("--kill-child",) if "--fork" in unshare else ()  # it dies with unshare
    proc = subprocess.Popen(["unshare", *unshare, *kill_child, "sh", "-c", script],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        proc.wait()
        pytest.skip(f"namespaces unavailable here: {proc.stderr.read() if proc.stderr else ''}")
    pid = proc.pid
    if "--fork" in unshare:
        pid = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
    return proc, pid


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare")
@pytest.mark.parametrize("unshare", [("--mount",), ("--mount", "--pid", "--fork")],
                         ids=["private-tmp", "pid-namespace"])
def test_map_in_the_targets_own_tmp(tmp_path: Path, unshare: tuple[str, ...]) -> None:
    """systemd's PrivateTmp (a mount namespace, the same root) and a container's pid
    namespace: the map is the target's own, read through /proc/PID/root (before, with
    PrivateTmp, the host's /tmp was searched and the code stayed unnamed)."""
    binary = build_target("jit_anon.c")
    proc, pid = _namespaced_target(binary, *unshare)
    try:
        assert not Path(f"/tmp/perf-{pid}.map").exists()  # not in our /tmp
        out = tmp_path / "ns.db"
        result = run_rsprof("-p", str(pid), "-q", "-d", "1500ms", "--cpu-freq", "499",
                            "-o", str(out))
    finally:
        # The target itself first: with --fork it is the init of its pid namespace, which
        # survived unshare's SIGKILL and spun on a core (PPID 1) for the rest of the suite.
        if pid != proc.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
    assert result.returncode == 0, result.stderr
    rows = top_json(out, "cpu")
    assert rows and rows[0]["function"] == "jit_spin", rows[:3]
