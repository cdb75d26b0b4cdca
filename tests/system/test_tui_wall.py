"""The TUI's Wall view (issue 23) on a real recording: a thread computes 5 ms then sleeps
15 ms in a loop; the view (the TUI's model: `tui.model.build_snapshot`, as the worker thread
builds it) gives the sleeping function about 75 % of that thread's wall time, the share the
program measures itself, and `[sleeping]` under it. `rsprof top wall` on the same file is
tests/system/test_offcpu.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rsprof.storage.live import CpuRow, LiveProfile
from rsprof.tui.model import Query, View, build_snapshot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import run_rsprof

DUTY = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + t.tv_nsec * 1e-9; }
/* Each round is 20 ms from its start by the clock: compute until 5 ms into it, sleep until
   its end. On a loaded machine a preemption in compute() would stretch it (by other tasks'
   time slices: the program's own clock then measures 30-50 % asleep, and so does rsprof);
   SCHED_FIFO keeps the CPU hogs from preempting it, so the split is 5:15 there too. */
__attribute__((noinline)) void compute(double until) {
    volatile unsigned long x = 0; while (now() < until) x++; }
__attribute__((noinline)) void sleepy(double until) {
    struct timespec t = {(time_t)until, (long)((until - (time_t)until) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL)) {} }
static int rounds, realtime; static double sleep_pct;
static void *duty(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "duty");
    struct sched_param fifo = {.sched_priority = 1};
    realtime = pthread_setschedparam(pthread_self(), SCHED_FIFO, &fifo) == 0;
    double in_sleep = 0, start = now();
    for (int i = 0; i < rounds; i++) {
        double round = now();
        compute(round + 0.005); double b = now(); sleepy(round + 0.020); in_sleep += now() - b;
    }
    sleep_pct = 100 * in_sleep / (now() - start);
    return NULL;
}
int main(int argc, char **argv) {
    rounds = atoi(argv[1]);
    pthread_t t; pthread_create(&t, NULL, duty, NULL); pthread_join(t, NULL);
    FILE *f = fopen(argv[2], "w"); fprintf(f, "%f %d\n", sleep_pct, realtime); fclose(f);
    return 0;
}
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="sched:sched_switch needs root")
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_wall_view_gives_the_sleeping_function_its_share(tmp_path: Path) -> None:
    (tmp_path / "duty.c").write_text(DUTY)
    subprocess.run(["gcc", "-O1", "-g", "-pthread", "-o", str(tmp_path / "duty"),
                    str(tmp_path / "duty.c")], check=True)
    done = run_rsprof("run", "-q", "-F", "999", "-o", "d.db", "--", "./duty", "150",
                      "truth.txt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    measured, realtime = (tmp_path / "truth.txt").read_text().split()
    truth = float(measured)
    assert realtime == "1", "the duty thread could not take SCHED_FIFO"
    source = LiveProfile(tmp_path / "d.db")
    source.refresh()
    assert source.has_offcpu_data, source.no_offcpu_reason()
    # the main thread's name is the program's, "duty" too
    (tid,) = [t.tid for t in source.threads() if t.name == "duty" and t.tid != source.info.pid]
    # The thread picker's choice: the Wall view of the duty thread
    source.set_thread(tid)
    snapshot = build_snapshot(source, Query(view=View.WALL, thread=tid))
    assert snapshot.wall_available and snapshot.selection is not None
    rows = {r.function: r for r in snapshot.rows if isinstance(r, CpuRow)}
    sleepy = rows["sleepy"].total_pct
    # compute() runs 5 ms of each 20 ms round by the clock (preempted time included), so
    # the shares hold beside CPU hogs; the program's own clock is the truth.
    assert abs(sleepy - 75) <= 5, (sleepy, truth)
    assert abs(sleepy - truth) <= 3, (sleepy, truth)
    assert abs(rows["compute"].total_pct - (100 - truth)) <= 3, (rows["compute"], truth)
    assert rows["[sleeping]"].self_pct > 0.8 * sleepy
    # Whole process: the main thread waited in pthread_join all along, the same wall time
    source.set_thread(None)
    whole = build_snapshot(source, Query(view=View.WALL))
    rows = {r.function: r for r in whole.rows if isinstance(r, CpuRow)}
    assert abs(rows["sleepy"].total_pct - sleepy / 2) <= 5, rows["sleepy"]
    source.close()
