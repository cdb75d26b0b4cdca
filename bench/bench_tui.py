#!/usr/bin/env python3
"""TUI benchmark: table refresh time and UI memory after an hour of live updates.

A synthetic profile with 10 000 functions and one hour of 1 s checkpoints (about 300
active functions and 1 000 samples per checkpoint, 8 threads, 2 000 heap sites with 40
active per checkpoint) is written checkpoint by checkpoint by a writer subprocess, as a
recorder would, while the TUI follows it:

1. baseline: RSS of this process with the app idle on an empty profile;
2. live: the app (under `App.run_test`) follows the growing file, 10 checkpoints per
   update, for the whole hour; then RSS again;
3. one table refresh after an hour: a new checkpoint, `LiveProfile.refresh()` plus the
   sorted table rows (`build_snapshot`), median of 20; the same through the app (worker,
   widget update and redraw); and the chart query of a 1 h window.

Usage: python bench/bench_tui.py [--checkpoints N] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rsprof.storage.live import LiveProfile  # noqa: E402
from rsprof.storage.schema import create_schema  # noqa: E402

FUNCTIONS = 10_000
HOT = 50
ACTIVE = 300
THREADS = 8
SITES = 2_000
ACTIVE_SITES = 40
START_MS = 1_700_000_000_000


def create_static(path: Path, functions: int = FUNCTIONS) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    create_schema(conn)
    meta = {
        "pid": "999999",
        "process_name": "synthetic",
        "start_time_ms": str(START_MS),
        "interval_ms": "1000",
        "heap_mode": "full",
        "state": "recording",
    }
    conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta.items())
    conn.execute("INSERT INTO modules VALUES (1, '/usr/bin/synthetic', NULL)")
    rows = [
        (i, f"ns{i % 97}::module{i % 13}::function_{i}", f"src/dir{i % 31}/file{i % 400}.cc", i)
        for i in range(1, functions + SITES + 1)
    ]
    conn.executemany(
        "INSERT INTO locations (id, function, file, line, module_id) VALUES (?, ?, ?, ?, 1)", rows
    )
    conn.executemany(
        "INSERT INTO frames VALUES (?, ?, 1, ?)", [(i, 0x400000 + i * 8, i * 8) for i, *_ in rows]
    )
    conn.executemany("INSERT INTO frame_locations VALUES (?, 0, ?)", [(i, i) for i, *_ in rows])
    conn.executemany("INSERT INTO stacks VALUES (?, 1)", [(i,) for i, *_ in rows])
    conn.executemany("INSERT INTO stack_frames VALUES (?, 0, ?)", [(i, i) for i, *_ in rows])
    # one allocating stack per heap site (its stack id is its location id), its own site
    conn.executemany("INSERT INTO heap_call_sites VALUES (?, 0, 0, ?)",
                     [(i, i) for i in range(functions + 1, functions + SITES + 1)])
    conn.executemany(
        "INSERT INTO threads (tid, name) VALUES (?, ?)",
        [(1000 + t, f"worker-{t}") for t in range(THREADS)],
    )
    conn.commit()
    conn.close()


class Writer:
    """Writes checkpoints like the recorder: one transaction per checkpoint."""

    def __init__(self, path: Path, functions: int = FUNCTIONS) -> None:
        self.conn = sqlite3.connect(path)
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.rng = random.Random(42)
        self.functions = functions
        self.live = [0] * (SITES + 1)
        self.last = self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM checkpoints").fetchone()[0]

    def write_to(self, upto: int) -> None:
        while self.last < upto:
            self.last += 1
            self._write(self.last)
            self.conn.commit()

    def _write(self, i: int) -> None:
        rng = self.rng
        fns = set(range(1, HOT + 1)) | {rng.randint(1, self.functions) for _ in range(ACTIVE - HOT)}
        stack_rows = []
        per_loc: dict[int, int] = {}
        for f in fns:
            count = rng.randint(5, 40) if f <= HOT else rng.randint(1, 3)
            stack_rows.append((i, f, 1000 + f % THREADS, count))
            per_loc[f] = count
        samples = sum(per_loc.values())
        heap_rows = []
        for _ in range(ACTIVE_SITES):
            site = rng.randint(1, SITES)
            ab, ac = rng.randint(1, 64) * 1024, rng.randint(1, 16)
            fb = min(self.live[site] + ab, rng.randint(0, 64) * 1024)
            self.live[site] += ab - fb
            heap_rows.append((i, self.functions + site, ab, ac, fb, ac // 2, self.live[site]))
        heap_rows = list({r[1]: r for r in heap_rows}.values())
        c = self.conn
        c.execute(
            "INSERT INTO checkpoints VALUES (?, ?, ?, 0, ?, 0, ?, ?)",
            (i, START_MS + i * 1000, samples, len(heap_rows), 400.0, 200 << 20),
        )
        c.executemany("INSERT INTO cpu_stack_samples VALUES (?, ?, ?, ?)", stack_rows)
        c.executemany(
            "INSERT INTO cpu_samples VALUES (?, ?, ?)", [(i, f, n) for f, n in per_loc.items()]
        )
        c.executemany("INSERT INTO heap_deltas VALUES (?, ?, 1, 1000, ?, ?, ?, ?)",
                      [row[:6] for row in heap_rows])


def writer_main(path: str) -> None:
    """Subprocess mode: reads target checkpoint ids on stdin, answers when written."""
    writer = Writer(Path(path))
    for line in sys.stdin:
        writer.write_to(int(line))
        print("ok", flush=True)


class WriterProcess:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--writer", str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def write_to(self, upto: int) -> None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"{upto}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 1e6


async def settle(pilot) -> None:  # type: ignore[no-untyped-def]
    main = pilot.app.main
    while main.busy:
        await pilot.pause(0.005)
    await pilot.pause()


async def run_app(path: Path, checkpoints: int, writer: WriterProcess | None) -> dict[str, float]:
    from rsprof.tui.app import RsprofApp

    app = RsprofApp(LiveProfile(path), live=True, refresh_interval=3600)
    out: dict[str, float] = {}
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        if writer is None:
            await pilot.pause(0.5)
            out["rss_mb"] = rss_mb()
            return out
        t0 = time.perf_counter()
        for upto in range(10, checkpoints + 1, 10):
            writer.write_to(upto)
            app.main.request_update(refresh=True)
            await settle(pilot)
        out["follow_s"] = time.perf_counter() - t0
        assert app.main.snapshot and app.main.snapshot.summary.count == checkpoints
        times, drawn = [], []
        for n in range(1, 21):
            writer.write_to(checkpoints + n)
            t = time.perf_counter()
            app.main.request_update(refresh=True)
            await settle(pilot)
            times.append(time.perf_counter() - t)
            drawn.append(app.main.last_update_s)
        out["app_drawn_ms"] = statistics.median(drawn) * 1000
        out["app_update_ms"] = statistics.median(times) * 1000
        out["rss_mb"] = rss_mb()
    return out


def measure_reader(path: Path, writer: WriterProcess, start: int) -> dict[str, float]:
    from rsprof.tui.model import ChartRequest, Query, build_snapshot

    t = time.perf_counter()
    lp = LiveProfile(path)
    lp.refresh()
    out = {"initial_load_s": time.perf_counter() - t}
    refresh, rows = [], []
    for n in range(1, 21):
        writer.write_to(start + n)
        t0 = time.perf_counter()
        lp.refresh()
        t1 = time.perf_counter()
        snap = build_snapshot(lp, Query(), refresh=False)
        t2 = time.perf_counter()
        refresh.append(t1 - t0)
        rows.append(t2 - t0)
    out["refresh_ms"] = statistics.median(refresh) * 1000
    out["refresh_rows_ms"] = statistics.median(rows) * 1000
    out["rows"] = len(snap.rows)
    key = snap.rows[0].key
    t = time.perf_counter()
    build_snapshot(lp, Query(chart=ChartRequest(key, zoom=6)), refresh=False)
    out["chart_1h_ms"] = (time.perf_counter() - t) * 1000
    lp.close()
    return out


def write_docs(text: str) -> None:
    """Replaces (or appends) the `## TUI` section of docs/benchmarks.md; other sections stay."""
    doc = REPO / "docs" / "benchmarks.md"
    lines = doc.read_text().split("\n") if doc.exists() else ["# Benchmarks", ""]
    new = [*text.rstrip("\n").split("\n"), ""]
    if "## TUI" in lines:
        start = lines.index("## TUI")
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        lines[start:end] = new
    else:
        while lines and lines[-1] == "":
            lines.pop()
        lines += ["", *new]
    doc.write_text("\n".join(lines).rstrip("\n") + "\n")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--writer":
        writer_main(sys.argv[2])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoints", type=int, default=3600)
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    n = args.checkpoints
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.db"
        conn = sqlite3.connect(empty)
        create_schema(conn)
        conn.commit()
        conn.close()
        before = rss_mb()
        base = asyncio.run(run_app(empty, 0, None))
        big = Path(tmp) / "hour.db"
        create_static(big)
        writer = WriterProcess(big)
        try:
            live = asyncio.run(run_app(big, n, writer))
            reader = measure_reader(big, writer, n + 20)
        finally:
            writer.close()
        size_mb = big.stat().st_size / 1e6
    lines = [
        "## TUI",
        "",
        f"`python bench/bench_tui.py` on {os.cpu_count()} CPUs, Python {sys.version.split()[0]}: "
        f"a synthetic profile with {FUNCTIONS:,} functions and {n:,} checkpoints of 1 s "
        f"(~{ACTIVE} active functions per checkpoint, {SITES:,} heap sites; {size_mb:.0f} MB "
        "file), written checkpoint by checkpoint by a separate process while the TUI follows "
        "it (10 checkpoints per update).",
        "",
        "| measure | result | goal |",
        "| --- | --- | --- |",
        f"| one table refresh after {n // 60} min: `LiveProfile.refresh()` of a new checkpoint "
        f"| {reader['refresh_ms']:.1f} ms | |",
        f"| ... plus the sorted table rows (`build_snapshot`, {int(reader['rows']):,} rows) "
        f"| {reader['refresh_rows_ms']:.1f} ms | ≤ 50 ms |",
        f"| the same in the app: request → worker → widgets updated (`run_test`) "
        f"| {live['app_drawn_ms']:.1f} ms | ≤ 50 ms |",
        f"| ... until the test pilot finds the event loop idle (adds the pilot's own waits) "
        f"| {live['app_update_ms']:.1f} ms | |",
        f"| chart query, 1 h window | {reader['chart_1h_ms']:.1f} ms | |",
        f"| opening the finished hour (`LiveProfile` first refresh) "
        f"| {reader['initial_load_s']:.2f} s | |",
        f"| following the whole hour ({n // 10} updates) | {live['follow_s']:.1f} s | |",
        f"| RSS: Python + imports before any app | {before:.0f} MB | |",
        f"| RSS: idle app on an empty profile (baseline) | {base['rss_mb']:.0f} MB | |",
        f"| RSS: app after following the hour | {live['rss_mb']:.0f} MB "
        f"(+{live['rss_mb'] - base['rss_mb']:.0f} MB over baseline) | ≤ 150 MB |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write_docs:
        write_docs(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
