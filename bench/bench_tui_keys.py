#!/usr/bin/env python3
"""Key latency of the live TUI while it records busy threads, in a real terminal (tmux).

`rsprof demo --cpu-freq 999` (three busy threads: hash, matrix, request parsing) runs in a
tmux pane; once its table shows, `j` and `k` are sent alternately with tmux send-keys and
the pane is polled (capture-pane -e) until the highlighted row moves. The time from
send-keys to the moved highlight is one key's latency (it includes ~2-4 ms of tmux
round trips). Presses are spaced 100-300 ms apart at random so they land at every phase
of the 0.5 s refresh and the 1 s checkpoint. Repeated with the chart open (`c`).

Latency depends on the machine's load (every process waits for a CPU); the CPU time the TUI
process's UI thread spends per key depends much less on it: read from
/proc/PID/task/PID/stat around the presses, minus what the same thread used per second
while idle just before (its refreshes), divided by the presses.

`--views` (issue 24 item 4) measures the keys that open and close views, at 120x40 by
default: f, F, e, c, m and Tab, each pressed to open and again to close (both count),
with the chart closed and open; the time from send-keys until the pane shows the new
state (f: the call tree's header, F: the flame's tab, e: the callers panel's header, c: the
chart's title, m: the other view's columns, Tab: the table's cursor losing or regaining
focus; with the chart closed, Tab goes to the callers panel, opened for it). "row": with
the chart open, `j`/`k` until the chart's title names the new row. "first screen": `rsprof
run -- rsprof-demo` started in a new tmux pane until the table shows a data row.

Usage: python bench/bench_tui_keys.py [--presses N] [--size 80x24] [--freq 999]
           [--baseline OTHER/bin/rsprof --rounds N] [--views] [--starts N]
Prints median / p90 / max per mode, in ms; with --baseline, runs of the two builds
alternate, so both see the same machine load.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CURSOR_BG = re.compile(r"\x1b\[(?:[0-9;]*;)?48;5;130m")  # the table cursor's background


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False).stdout


def cursor_line(session: str) -> int | None:
    lines = tmux("capture-pane", "-p", "-e", "-t", session).splitlines()
    for i, line in enumerate(lines):
        if CURSOR_BG.search(line[:40]):
            return i
    return None


def pane_text(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session)


def focused(session: str) -> bool:
    """The table has the focus: its cursor row has the focused highlight."""
    return cursor_line(session) is not None


# key -> (tmux key, the pane shows the opened state)
VIEW_KEYS: dict[str, tuple[str, Callable[[str], bool]]] = {
    "f": ("f", lambda s: "Function (call tree)" in pane_text(s)),
    "F": ("F", lambda s: "CPU flame" in pane_text(s)),
    "e": ("e", lambda s: "% of it" in pane_text(s)),
    "c": ("c", lambda s: "Total % of samples" in pane_text(s)),
    "m": ("m", lambda s: "Allocs" in pane_text(s)),
    "Tab": ("Tab", lambda s: not focused(s)),
}


def chart_title(session: str) -> str | None:
    """The function the chart's title names (None: no chart)."""
    for line in pane_text(session).splitlines():
        if "· Total % of samples ·" in line:
            return line.split("·")[0].strip()
    return None


def timed(session: str, key: str, done, timeout: float = 5) -> float:  # type: ignore[no-untyped-def]
    """ms from send-keys until done() (5000 when it never happens)."""
    start = time.perf_counter()
    tmux("send-keys", "-t", session, key)
    while True:
        if done():
            return (time.perf_counter() - start) * 1000
        if time.perf_counter() - start > timeout:
            return timeout * 1000
        time.sleep(0.001)


def measure_views(session: str, presses: int, rng: random.Random,
                  chart: bool) -> dict[str, list[float]]:
    """Each view key `presses` times (opening and closing alternately)."""
    out: dict[str, list[float]] = {}
    for name, (key, shown) in VIEW_KEYS.items():
        extra = "e" if name == "Tab" and not chart else ""  # Tab needs a second panel
        if extra:
            tmux("send-keys", "-t", session, extra)
            wait(lambda: "% of it" in pane_text(session), 10)
        times = out.setdefault(f"{name} chart {'open' if chart else 'closed'}", [])
        # What the first press does: `c` with the chart open closes it first. (Taking it as
        # an opening timed each press against the state it left: ~8 ms when the poll came
        # first, the 5 s timeout when the redraw did.)
        initially = shown(session)
        for i in range(presses):
            want = (i % 2 == 0) != initially  # toggle, then toggle back
            times.append(timed(session, key,
                               lambda f=shown, w=want: f(session) == w))  # type: ignore[misc]
            time.sleep(rng.uniform(0.1, 0.3))
        if presses % 2:  # left toggled: back as it was
            tmux("send-keys", "-t", session, key)
            wait(lambda f=shown, was=initially: f(session) == was, 10)  # type: ignore[misc]
        if extra:
            tmux("send-keys", "-t", session, extra)
            wait(lambda: "% of it" not in pane_text(session), 10)
        time.sleep(0.3)
    return out


def measure_rows(session: str, presses: int, rng: random.Random) -> list[float]:
    """With the chart open: j/k until the chart's title names the new row."""
    times = []
    for i in range(presses):
        before = chart_title(session)
        times.append(timed(session, "j" if i % 2 == 0 else "k",
                           lambda b=before: chart_title(session) not in (b, None)))
        time.sleep(rng.uniform(0.1, 0.3))
    return times


def measure_start(rsprof: str, size: str, freq: int) -> float | None:
    """ms from starting `rsprof run -- rsprof-demo` in a new pane to a data row on screen."""
    cols, rows = size.split("x")
    python = Path(rsprof).read_text().splitlines()[0].removeprefix("#!").strip()
    demo = subprocess.run([python, "-P", "-c", "from rsprof import session;"
                           " print(session.DEMO_PATH)"], capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        session = f"rsprof-start-{os.getpid()}"
        out = Path(tmp) / "run.db"
        command = (f"cd {shlex.quote(tmp)} && {shlex.quote(rsprof)} run --cpu-freq {freq}"
                   f" -o {shlex.quote(str(out))} -- {shlex.quote(demo)}; sleep 60")
        start = time.perf_counter()
        tmux("new-session", "-d", "-s", session, "-x", cols, "-y", rows, command)
        try:
            if not wait(lambda: cursor_line(session) is not None, 60, step=0.005):
                return None
            elapsed = (time.perf_counter() - start) * 1000
            tmux("send-keys", "-t", session, "q")
            wait(lambda: "y/n" in pane_text(session), 10)
            tmux("send-keys", "-t", session, "y")
            wait(lambda: "RECORDING" not in pane_text(session), 20)
        finally:
            tmux("kill-session", "-t", session)
    return elapsed


def wait(check, timeout: float, step: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step)
    return False


def measure(session: str, presses: int, rng: random.Random) -> list[float]:
    times = []
    for i in range(presses):
        before = cursor_line(session)
        key = "j" if i % 2 == 0 else "k"
        start = time.perf_counter()
        tmux("send-keys", "-t", session, key)
        while True:
            now = cursor_line(session)
            elapsed = time.perf_counter() - start
            if now is not None and now != before:
                times.append(elapsed * 1000)
                break
            if elapsed > 5:
                times.append(5000.0)
                break
            time.sleep(0.001)
        time.sleep(rng.uniform(0.1, 0.3))
    return times


def ui_ticks(pid: int) -> int:
    """utime + stime of the process's main (UI) thread, in clock ticks."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def tui_pid(db: Path) -> int | None:
    out = subprocess.run(["pgrep", "-f", f"rsprof.tui {db}"], capture_output=True,
                         text=True, check=False).stdout.split()
    return int(out[0]) if out else None


def measure_cpu(session: str, pid: int | None, presses: int,
                rng: random.Random) -> tuple[list[float], float]:
    """Latencies, and the UI thread's CPU ms per key (idle rate subtracted)."""
    if pid is None:
        return measure(session, presses, rng), float("nan")
    hz = os.sysconf("SC_CLK_TCK")
    t0, c0 = time.monotonic(), ui_ticks(pid)
    time.sleep(5)
    idle_rate = (ui_ticks(pid) - c0) / (time.monotonic() - t0)
    t1, c1 = time.monotonic(), ui_ticks(pid)
    times = measure(session, presses, rng)
    used = ui_ticks(pid) - c1 - idle_rate * (time.monotonic() - t1)
    return times, max(0.0, used) * 1000 / hz / presses


def summary(name: str, times: list[float]) -> str:
    times = sorted(times)
    p90 = times[int(0.9 * (len(times) - 1))]
    what = "runs" if name.endswith("after run") else "presses"
    return (f"{name}: median {statistics.median(times):.0f} ms, p90 {p90:.0f} ms,"
            f" max {max(times):.0f} ms ({len(times)} {what})")


def run_once(rsprof: str, size: str, freq: int, presses: int, rng: random.Random,
             cpu: dict[str, list[float]], views: bool = False) -> dict[str, list[float]] | None:
    cols, rows = size.split("x")
    with tempfile.TemporaryDirectory() as tmp:
        session = f"rsprof-keys-{os.getpid()}"
        out = Path(tmp) / "rsprof.rsprof-demo.bench.db"
        # No stderr redirect: Textual draws on stderr.
        command = (f"cd {shlex.quote(tmp)} && {shlex.quote(rsprof)} demo --cpu-freq"
                   f" {freq} -o {shlex.quote(str(out))}; sleep 60")
        tmux("new-session", "-d", "-s", session, "-x", cols, "-y", rows, command)
        try:
            if not wait(lambda: cursor_line(session) is not None, 90):
                screen = tmux("capture-pane", "-p", "-t", session)
                print(f"{rsprof}: the TUI did not show a table:\n{screen}",
                      file=sys.stderr)
                return None
            time.sleep(3)  # a few checkpoints in: the table has rows to move over
            if views:
                got = measure_views(session, presses, rng, chart=False)
                tmux("send-keys", "-t", session, "c")
                wait(lambda: chart_title(session) is not None, 10)
                time.sleep(1)
                got |= measure_views(session, presses, rng, chart=True)
                got["chart for a new row"] = measure_rows(session, presses, rng)
                tmux("send-keys", "-t", session, "q")
                wait(lambda: "y/n" in pane_text(session), 10)
                tmux("send-keys", "-t", session, "y")
                wait(lambda: "RECORDING" not in pane_text(session), 20)
                return got
            pid = tui_pid(out)
            closed, per_key = measure_cpu(session, pid, presses, rng)
            cpu.setdefault("chart closed", []).append(per_key)
            tmux("send-keys", "-t", session, "c")
            time.sleep(1.5)
            opened, per_key = measure_cpu(session, pid, presses, rng)
            cpu.setdefault("chart open", []).append(per_key)
            tmux("send-keys", "-t", session, "c")
            tmux("send-keys", "-t", session, "q")
            wait(lambda: "y/n" in pane_text(session), 10)  # a live recording asks first
            tmux("send-keys", "-t", session, "y")
            wait(lambda: "RECORDING" not in pane_text(session), 20)
        finally:
            tmux("kill-session", "-t", session)
    return {"chart closed": closed, "chart open": opened}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presses", type=int, default=40)
    parser.add_argument("--size", default=None, help="COLSxROWS (80x24; --views: 120x40)")
    parser.add_argument("--freq", type=int, default=999)
    # The rsprof of the Python running this script first: the first `rsprof` on PATH may be
    # another install (or someone's wrapper) and measure the wrong build.
    beside = Path(sys.executable).with_name("rsprof")
    parser.add_argument("--rsprof", default=str(beside) if beside.exists()
                        else shutil.which("rsprof") or "rsprof")
    parser.add_argument("--baseline", help="another rsprof to compare with: runs alternate "
                        "between the two (the machine's load changes over minutes)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--views", action="store_true",
                        help="f/F/e/c/m/Tab (chart closed and open) and the chart for a new "
                        "row, instead of j/k (default size 120x40)")
    parser.add_argument("--starts", type=int, default=0,
                        help="also time `rsprof run` to the first data row, N times per round")
    args = parser.parse_args()
    if args.size is None:
        args.size = "120x40" if args.views else "80x24"
    if shutil.which("tmux") is None:
        print("needs tmux", file=sys.stderr)
        return 2
    rng = random.Random(1)
    builds = {"this": args.rsprof}
    if args.baseline:
        builds = {"baseline": args.baseline, "this": args.rsprof}
    times: dict[str, dict[str, list[float]]] = {name: {} for name in builds}
    cpu: dict[str, dict[str, list[float]]] = {name: {} for name in builds}
    for _ in range(args.rounds):
        for name, rsprof in builds.items():
            got = run_once(rsprof, args.size, args.freq, args.presses, rng, cpu[name],
                           views=args.views)
            for _ in range(args.starts):
                first = measure_start(rsprof, args.size, args.freq)
                if first is not None:
                    times[name].setdefault("first screen after run", []).append(first)
            if got is None:  # a start-up slower than 90 s on a loaded machine: skip the run
                continue
            for mode, values in got.items():
                times[name].setdefault(mode, []).extend(values)
    print(f"rsprof demo --cpu-freq {args.freq}, {args.size}, {os.cpu_count()} CPUs,"
          f" load average {os.getloadavg()[0]:.0f} (1 min), {os.getloadavg()[2]:.0f} (15 min),"
          f" {time.strftime('%Y-%m-%d %H:%M %Z')}")
    for name, modes in times.items():
        for mode, values in modes.items():
            per_key = " ".join(f"{v:.1f}" for v in cpu[name].get(mode, []))
            cpu_text = f"; UI thread CPU {per_key} ms/key" if per_key else ""
            print(summary(f"{name} {mode}", values) + cpu_text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
