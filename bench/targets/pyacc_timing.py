"""Timing for bench/bench_pyaccuracy.py's targets: runs `work(rounds)` and writes, as JSON to
argv[2], the work's wall and CPU time, the whole process's CPU time and lifetime, and the
CPU the profiler that started this process (its parent: `rsprof run`, `py-spy record --`)
used while the work ran (summed over its threads' schedstat, in ns), so the profiler's cost
per sample is read over the steady state only, without its start-up and finalization.

`calibrate SECONDS` instead prints how many rounds take SECONDS of CPU time."""
import json
import os
import sys
import time


def _parent_cpu_ns() -> int:
    task = f"/proc/{os.getppid()}/task"
    total = 0
    for tid in os.listdir(task):
        try:
            with open(f"{task}/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):
            pass  # a thread that ended
    return total


def _lifetime_s() -> float:
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")


def main(work) -> None:
    if sys.argv[1] == "calibrate":
        budget, rounds, begin = float(sys.argv[2]), 0, time.process_time()
        while time.process_time() - begin < budget / 4:
            work(1)
            rounds += 1
        print(rounds * 4)
        return
    rounds, out = int(sys.argv[1]), sys.argv[2]
    parent0, cpu0, wall0 = _parent_cpu_ns(), time.process_time(), time.perf_counter()
    work(rounds)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    parent = _parent_cpu_ns() - parent0
    times = os.times()
    with open(out, "w") as f:
        json.dump({"wall": wall, "cpu": cpu, "tool_cpu_ns": parent,
                   "process_cpu": times.user + times.system, "lifetime": _lifetime_s()}, f)
