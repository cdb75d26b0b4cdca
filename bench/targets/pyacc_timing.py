"""Timing for bench/bench_pyaccuracy.py's targets: runs `work(rounds)` and writes, as JSON to
argv[2], the work's wall and CPU time, the whole process's CPU time and lifetime, and the
CPU the profiler that started this process (its parent: `rsprof run`, `py-spy record --`)
used while the work ran (summed over its threads' schedstat, in ns), so the profiler's cost
per sample is read over the steady state only, without its start-up and finalization; with
PYACC_PHASES=1 (the plain runs) also the CPU time of each function `work` calls, the truth
of their shares.

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
    phases = _time_phases(work) if os.environ.get("PYACC_PHASES") else {}
    parent0, cpu0, wall0 = _parent_cpu_ns(), time.process_time(), time.perf_counter()
    work(rounds)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    parent = _parent_cpu_ns() - parent0
    times = os.times()
    with open(out, "w") as f:
        json.dump({"wall": wall, "cpu": cpu, "tool_cpu_ns": parent,
                   "process_cpu": times.user + times.system, "lifetime": _lifetime_s(),
                   "phases_cpu_ns": phases}, f)


def _time_phases(work) -> dict:
    """The truth the profilers' shares are compared with (PYACC_PHASES=1, plain runs only):
    each function `work` calls by its module's global name is wrapped to add up its thread
    CPU time (time.thread_time_ns, a few calls per round: nothing to speak of)."""
    spent: dict = {}
    namespace = work.__globals__
    for name in work.__code__.co_names:
        function = namespace.get(name)
        if not callable(function) or getattr(function, "__module__", None) != work.__module__:
            continue

        def timed(*args, _function=function, _name=name, **kwargs):
            begin = time.thread_time_ns()
            try:
                return _function(*args, **kwargs)
            finally:
                spent[_name] = spent.get(_name, 0) + time.thread_time_ns() - begin
        namespace[name] = timed
    return spent
