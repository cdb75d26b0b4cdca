"""Processes the target starts, exec, short-lived threads and many threads: what the
recorder follows, on real processes (issue: never break or misread the program)."""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_share, build_target, heap_rings, rsprof_env, run_rsprof, start_target

pytestmark = pytest.mark.slow  # hundreds of threads, forks and execs: minutes in all


def _top(profile: Path, *extra: str) -> dict[str, dict[str, Any]]:
    result = run_rsprof("top", "cpu", str(profile), "--json", "-n", "0", *extra)
    assert result.returncode == 0, result.stderr
    return {row["function"]: row for row in json.loads(result.stdout)}


def _processes(profile: Path) -> list[tuple[int, int | None, int | None, str, int]]:
    db = sqlite3.connect(profile)
    return db.execute("SELECT pid, ppid, parent_id, command, exited FROM processes").fetchall()


def test_run_follows_children_each_as_its_own_process(tmp_path: Path) -> None:
    alpha = build_target("phase.c", ("-DPHASE=alpha",))
    beta = build_target("phase.c", ("-DPHASE=beta",))
    out = tmp_path / "children.db"
    # A shell that starts two programs one after the other (fork + exec each time).
    script = f"{alpha} 600; {beta} 200"
    result = run_rsprof("run", "-q", "--no-heap", "--cpu-freq", "499", "-o", str(out),
                        "--", "sh", "-c", script)
    assert result.returncode == 0, result.stderr
    assert "target-exited" in result.stderr
    rows = _top(out)
    assert_share(rows["alpha_spin"]["self"], rows["beta_spin"]["self"], 0.75, floor=0.06)
    processes = _processes(out)
    commands = {command for _, _, _, command, _ in processes}
    # The command line, read as the exec is drained; on a machine so loaded that the
    # program is gone by then, the path of the program it ran.
    assert {f"{alpha} 600", str(alpha)} & commands, processes
    assert {f"{beta} 200", str(beta)} & commands, processes
    # Each child names the shell as its parent, and each program's samples are its own.
    shell_pid = next(pid for pid, _, parent, _, _ in processes if parent is None)
    alpha_pid = next(pid for pid, _, _, c, _ in processes if c.startswith(str(alpha)))
    assert any(pid == alpha_pid and ppid == shell_pid for pid, ppid, _, _, _ in processes)
    only_alpha = _top(out, "--pid", str(alpha_pid))
    assert "alpha_spin" in only_alpha and "beta_spin" not in only_alpha
    assert all(exited for pid, _, _, c, exited in processes if c.startswith(str(beta)))


def test_no_follow_records_the_target_only(tmp_path: Path) -> None:
    alpha = build_target("phase.c", ("-DPHASE=alpha",))
    out = tmp_path / "nofollow.db"
    result = run_rsprof("run", "-q", "--no-heap", "--no-follow", "-o", str(out),
                        "--", "sh", "-c", f"{alpha} 300; true")
    assert result.returncode == 0, result.stderr
    db = sqlite3.connect(out)
    assert "alpha_spin" not in {
        name for (name,) in db.execute("SELECT function FROM cpu_functions")}
    # The launcher's exec into `sh` is the same process: one pid, whatever its images.
    assert db.execute("SELECT COUNT(DISTINCT pid) FROM processes").fetchone()[0] == 1


def test_exec_into_a_program_with_the_same_layout(tmp_path: Path) -> None:
    # The old recorder cached frames by address alone: after the exec, beta's samples were
    # credited to alpha_spin (same addresses in both builds).
    alpha = build_target("phase.c", ("-DPHASE=alpha",))
    beta = build_target("phase.c", ("-DPHASE=beta",))
    out = tmp_path / "exec.db"
    result = run_rsprof("run", "-q", "--no-heap", "--cpu-freq", "499", "-o", str(out),
                        "--", str(alpha), "400", str(beta), "400")
    assert result.returncode == 0, result.stderr
    rows = _top(out)
    assert_share(rows["alpha_spin"]["self"], rows["beta_spin"]["self"], 0.5, floor=0.07)
    commands = [command for _, _, _, command, _ in _processes(out)]
    assert f"{alpha} 400 {beta} 400" in commands, commands
    assert {f"{beta} 400", str(beta)} & set(commands), commands


def test_heap_of_a_child_process(tmp_path: Path) -> None:
    leaky = build_target("leaky.c")
    out = tmp_path / "child-heap.db"
    result = run_rsprof("run", "-q", "-i", "200ms", "-o", str(out),
                        "--", "sh", "-c", f"{leaky} 20 10 0; true")
    assert result.returncode == 0, result.stderr
    heap = json.loads(run_rsprof("top", "heap", str(out), "--json", "-n", "0").stdout)
    leak = {row["function"]: row for row in heap}["leak_site"]
    assert (leak["live_bytes"], leak["alloc_count"]) == (20 * 4000, 20)


def test_short_lived_threads_get_their_samples(tmp_path: Path) -> None:
    # 100 threads of 20 ms CPU each (2 s) after 1 s on the main thread: threads 2/3 of the
    # time. The first recorder opened an event per thread by hand when it saw the thread
    # start, and missed most of each one's life (the main thread's share came out 3-5x).
    binary = build_target("short_threads.c")
    out = tmp_path / "short.db"
    result = run_rsprof("run", "-q", "--no-heap", "--cpu-freq", "999", "-o", str(out),
                        "--", str(binary), "100", "20", "1000")
    assert result.returncode == 0, result.stderr
    rows = _top(out)
    assert_share(rows["thread_spin"]["total"], rows["main_spin"]["total"], 2 / 3, floor=0.06)
    db = sqlite3.connect(out)
    threads = db.execute("SELECT COUNT(*) FROM threads").fetchone()[0]
    assert threads >= 90, threads


def test_duration_holds_with_300_spinning_threads(tmp_path: Path) -> None:
    """300 threads spin on 2 cores from the attach on: the recording still stops on time,
    every thread is sampled, and the heap is attached (its helper's pipe is above fd 1024,
    past select()'s reach: once a traceback and no heap)."""
    go = tmp_path / "go"
    target = start_target(build_target("many_threads.c"), "300", f"--go={go}")
    out = tmp_path / "many.db"
    # They spin once rsprof says it records: 300 spinners leave an interpreter starting up
    # ~1/150 of a core (20-30 s for rsprof's own start-up, not the recorder's to speed up).
    recorder = subprocess.Popen(
        [sys.executable, "-P", "-m", "rsprof", "-p", str(target.pid), "-d", "2s",
         "--cpu-freq", "999", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=rsprof_env())
    try:
        assert recorder.stderr is not None
        first = recorder.stderr.readline()
        go.touch()
        stderr = first + recorder.stderr.read()
        assert recorder.wait(timeout=240) == 0, stderr
    finally:
        recorder.kill()
        recorder.wait()
        target.kill()
        target.wait()
    assert first.startswith("rsprof: recording"), stderr
    assert "stopped: duration" in stderr and "Traceback" not in stderr, stderr
    # The window is the duration, although 300 threads compete with the recorder for 2 cores:
    # a checkpoint taking 30 ms of CPU then takes 0.3-6 s, and sampling went on meanwhile
    # (-d 2s recorded for 8.3 s in CI; -d 8s once for 15-30 s). The drain thread ends it.
    db = sqlite3.connect(out)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    recorded_s = (int(meta["end_time_ms"]) - int(meta["start_time_ms"])) / 1000
    assert 2 <= recorded_s < 2 + 1.5, recorded_s
    # ... and no sample was taken after it: at most every CPU's time in the window.
    samples = db.execute("SELECT SUM(count) FROM cpu_stack_samples").fetchone()[0]
    assert samples <= recorded_s * len(os.sched_getaffinity(0)) * 999 * 1.1, (samples, recorded_s)
    # Every thread is sampled: each gets a few ms of CPU in 2 s, a few periods at 999 Hz.
    sampled = db.execute("SELECT COUNT(DISTINCT tid) FROM cpu_stack_samples").fetchone()[0]
    assert sampled > 200, sampled
    assert meta.get("heap_since") == "attach", meta


def test_attach_to_more_threads_than_the_soft_fd_limit(tmp_path: Path) -> None:
    """1,500 threads (asleep) and the usual soft fd limit of 1,024: rsprof raises its own
    soft limit to the hard one, as perf record does (it stopped at "perf_event_open: Too
    many open files"), and every thread is in the profile."""
    target = start_target(build_target("many_threads.c"), "1500", f"--go={tmp_path / 'never'}")
    out = tmp_path / "many.db"

    def soft_1024() -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))

    try:
        result = subprocess.run(
            [sys.executable, "-P", "-m", "rsprof", "-p", str(target.pid), "-q", "-d", "1s",
             "-o", str(out)],
            capture_output=True, text=True, timeout=240, env=rsprof_env(),
            preexec_fn=soft_1024)
    finally:
        target.kill()
        target.wait()
    assert result.returncode == 0, result.stderr
    threads = sqlite3.connect(out).execute("SELECT COUNT(*) FROM threads").fetchone()[0]
    assert threads == 1501, threads


def test_attach_with_follow_sees_new_children(tmp_path: Path) -> None:
    alpha = build_target("phase.c", ("-DPHASE=alpha",))
    # A shell that keeps starting alpha: attached to with --follow, alpha's samples are in
    # the profile under alpha's own pid; without it, only the shell's.
    shell = subprocess.Popen(["sh", "-c", f"while :; do {alpha} 100; done"])
    try:
        followed, alone = tmp_path / "followed.db", tmp_path / "alone.db"
        result = run_rsprof("-p", str(shell.pid), "-q", "-d", "1500ms", "--follow",
                            "-o", str(followed))
        assert result.returncode == 0, result.stderr
        result = run_rsprof("-p", str(shell.pid), "-q", "-d", "1s", "-o", str(alone))
        assert result.returncode == 0, result.stderr
    finally:
        shell.kill()
        shell.wait()
    assert _top(followed)["alpha_spin"]["self"] > 0
    commands = [command for _, _, _, command, _ in _processes(followed)]
    # a child gone before its command line was read keeps a NULL command (docs/schema.md)
    assert any(c is not None and c.startswith(str(alpha)) for c in commands), commands
    db = sqlite3.connect(alone)
    assert "alpha_spin" not in {n for (n,) in db.execute("SELECT function FROM cpu_functions")}


def test_heap_of_children_gone_before_the_drain_saw_them(tmp_path: Path) -> None:
    # Eight children that each leak 3 x 4000 B and exit within a millisecond or two: most
    # are gone before the drain has seen them (before, their rings went with them, and
    # a shell script's `ls` showed no heap at all). Each leaves its unread ring for us.
    leaky = build_target("leaky.c")
    out = tmp_path / "short.db"
    script = "; ".join([f"{leaky} 3 0 0 > /dev/null"] * 8) + "; true"
    result = run_rsprof("run", "-q", "-o", str(out), "--", "sh", "-c", script)
    assert result.returncode == 0, result.stderr
    rows = json.loads(run_rsprof("top", "heap", str(out), "--json", "-n", "0").stdout)
    assert {r["function"]: r for r in rows}["leak_site"]["live_bytes"] == 8 * 3 * 4000
    pids = {pid for pid, _, _, command, _ in _processes(out) if command.startswith(str(leaky))}
    assert len(pids) == 8, _processes(out)
    for pid in pids:
        mine = json.loads(run_rsprof("top", "heap", str(out), "--json", "-n", "0",
                                     "--pid", str(pid)).stdout)
        assert {r["function"]: r for r in mine}["leak_site"]["live_bytes"] == 3 * 4000, pid
    # Read, then removed: nothing of this session is left in /dev/shm.
    assert not [ring for pid in pids for ring in heap_rings(pid)]


def test_heap_split_by_process(tmp_path: Path) -> None:
    # Two children leak 20 and 10 ticks of 4000 B at leak_site: together 30, each its own.
    leaky = build_target("leaky.c")
    out = tmp_path / "two-heaps.db"
    result = run_rsprof("run", "-q", "-i", "200ms", "-o", str(out),
                        "--", "sh", "-c", f"{leaky} 20 10 0; {leaky} 10 10 0")
    assert result.returncode == 0, result.stderr

    def leak(*extra: str) -> int:
        rows = json.loads(run_rsprof("top", "heap", str(out), "--json", "-n", "0", *extra).stdout)
        return int({r["function"]: r for r in rows}["leak_site"]["live_bytes"])

    assert leak() == 30 * 4000
    pids = [pid for pid, _, _, command, _ in _processes(out) if command.startswith(str(leaky))]
    assert len(pids) == 2, _processes(out)
    assert sorted(leak("--pid", str(pid)) for pid in pids) == [10 * 4000, 20 * 4000]
