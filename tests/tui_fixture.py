"""A deterministic profile file for the TUI tests, written with plain SQL after create_schema.

Three threads of a process `demo` (PID 4242), nine functions, 120 one-second checkpoints
with a known pattern, and three heap call sites, one of them growing without bound:

- thread 4242 `demo`: parse_input 15 when i % 20 < 5 else 1; idle_wait 2; main 1.
- thread 4243 `worker-1`: compute_hash 20 + i % 10 (hash.c:42) and 5 (hash.c:57);
  hash_round 8 + i % 3 (inlined into compute_hash); __memmove_avx_unaligned_erms 3.
- thread 4244 `worker-2`, exits after checkpoint 90: matrix_multiply 10 + i // 4;
  compress_block 12 on even i, 6 on odd i; a long C++ name 4.

Off-CPU time (`offcpu=True` only; the other tests' file has none): thread 4242 sleeps in
idle_wait 600 ms per checkpoint (3 switch-outs, state S), worker-1 is preempted in
compute_hash 5 ms (state R).

Heap: leaky_cache_insert allocates 8 KiB per checkpoint and never frees; make_buffer churns
64 KiB per checkpoint and keeps 16 KiB; load_config allocates 1 MiB at checkpoint 1 and
frees half of it at checkpoint 60. By allocating thread (heap_deltas' tid): 4243 does
leaky_cache_insert, 4242 load_config, and make_buffer is split evenly between 4242 and 4244.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rsprof.storage.schema import create_schema

if TYPE_CHECKING:
    from rsprof.tui.app import RsprofApp
    from rsprof.tui.main_screen import MainScreen
    from rsprof.tui.widgets.chart import ProfileChart
    from rsprof.tui.widgets.table import ProfileTable
    from textual.pilot import Pilot

START_MS = 1_700_000_000_000
PID = 4242
LONG_NAME = (
    "std::vector<std::pair<std::string, unsigned long>, std::allocator<std::pair<std::string,"
    " unsigned long>>>::_M_realloc_insert<std::pair<std::string, unsigned long>>"
)

# id, function, file, line, module
LOCATIONS = [
    (1, "main", "src/main.c", 31, 1),
    (2, "compute_hash", "src/hash.c", 42, 1),
    (3, "compute_hash", "src/hash.c", 57, 1),
    (4, "parse_input", "src/parser.c", 88, 1),
    (5, "matrix_multiply", "src/matrix.c", 120, 1),
    (6, "compress_block", "src/compress/deflate_fast_path_with_a_long_name.c", 310, 1),
    (7, LONG_NAME, "/usr/include/c++/12/bits/vector.tcc", 439, 1),
    (8, "idle_wait", "src/main.c", 77, 1),
    (9, "__memmove_avx_unaligned_erms", "", 0, 2),
    (10, "leaky_cache_insert", "src/cache.c", 55, 1),
    (11, "make_buffer", "src/buffer.c", 12, 1),
    (12, "load_config", "src/config.c", 9, 1),
    (13, "hash_round", "src/hash.h", 14, 1),
]
# frame id -> locations by inline depth (frame 13: hash_round inlined into compute_hash)
FRAMES = {i: [i] for i in range(1, 13)} | {13: [13, 2]}
# stack id = leaf frame id; every stack is [leaf, main]
THREADS = [(4242, "demo"), (4243, "worker-1"), (4244, "worker-2")]
WORKER2_EXIT = 90
# heap site (= its stack id) -> (allocating tid, 1 / its share)
HEAP_THREADS = {10: [(4243, 1)], 11: [(4242, 2), (4244, 2)], 12: [(4242, 1)]}


def cpu_pattern(i: int) -> list[tuple[int, int, int]]:
    """(tid, leaf frame, count) for checkpoint i."""
    rows = [
        (4242, 4, 15 if i % 20 < 5 else 1),
        (4242, 8, 2),
        (4242, 1, 1),
        (4243, 2, 20 + i % 10),
        (4243, 3, 5),
        (4243, 13, 8 + i % 3),
        (4243, 9, 3),
    ]
    if i <= WORKER2_EXIT:
        rows += [(4244, 5, 10 + i // 4), (4244, 6, 12 if i % 2 == 0 else 6), (4244, 7, 4)]
    return rows


def offcpu_pattern(i: int) -> list[tuple[int, int, str, int, int]]:
    """(tid, stack, state, switches, ns) for checkpoint i of a file with off-CPU time."""
    return [(4242, 8, "S", 3, 600_000_000), (4243, 2, "R", 2, 5_000_000)]


def heap_pattern(i: int) -> list[tuple[int, int, int, int, int, int]]:
    """(location, alloc_bytes, alloc_count, free_bytes, free_count, live_bytes) for i."""
    rows = [(10, 8192, 2, 0, 0, 8192 * i)]
    if i == 1:
        rows.append((11, 81920, 20, 65536, 16, 16384))
        rows.append((12, 1 << 20, 3, 0, 0, 1 << 20))
    else:
        rows.append((11, 65536, 16, 65536, 16, 16384))
    if i == 60:
        rows.append((12, 0, 0, 1 << 19, 1, 1 << 19))
    return rows


def _write_static(conn: sqlite3.Connection, heap_mode: str) -> None:
    meta = {
        "version": "0.1.0",
        "pid": str(PID),
        "process_name": "demo",
        "exe_path": "/usr/bin/demo",
        "cmdline": "/usr/bin/demo --threads 2",
        "start_time": "2023-11-14T22:13:20Z",
        "start_time_ms": str(START_MS),
        "cpu_freq_hz": "99",
        "cpu_event": "cpu-clock",
        "interval_ms": "1000",
        "heap_mode": heap_mode,
        "state": "recording",
    }
    conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta.items())
    conn.execute("INSERT INTO modules VALUES (1, '/usr/bin/demo', 'abcdef')")
    conn.execute("INSERT INTO modules VALUES (2, '/usr/lib/x86_64-linux-gnu/libc.so.6', NULL)")
    conn.executemany(
        "INSERT INTO locations (id, function, file, line, module_id) VALUES (?, ?, ?, ?, ?)",
        LOCATIONS,
    )
    for fid, locs in FRAMES.items():
        module = 2 if fid == 9 else 1
        conn.execute(
            "INSERT INTO frames VALUES (?, ?, ?, ?)", (fid, 0x400000 + fid * 16, module, fid * 16)
        )
        conn.executemany(
            "INSERT INTO frame_locations VALUES (?, ?, ?)",
            [(fid, depth, loc) for depth, loc in enumerate(locs)],
        )
        conn.execute("INSERT INTO stacks VALUES (?, 2)", (fid,))
        conn.executemany("INSERT INTO stack_frames VALUES (?, ?, ?)", [(fid, 0, fid), (fid, 1, 1)])
    conn.executemany(
        "INSERT INTO threads (tid, name, first_checkpoint_id) VALUES (?, ?, 1)", THREADS
    )
    # a heap stack's call site is its leaf (the stack is [site, main])
    conn.executemany("INSERT INTO heap_call_sites VALUES (?, 0, 0, ?)",
                     [(loc, loc) for loc in HEAP_THREADS])


def _write_checkpoint(conn: sqlite3.Connection, i: int, with_heap: bool,
                      offcpu: bool = False) -> None:
    cpu = cpu_pattern(i)
    samples = sum(c for _t, _f, c in cpu)
    heap = heap_pattern(i) if with_heap else []
    conn.execute(
        "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            i,
            START_MS + i * 1000,
            samples,
            2 if i % 30 == 0 else 0,
            sum(h[2] + h[4] for h in heap),
            0,
            round(samples * 100 / 99, 1),
            50_000_000 + 8192 * i,
        ),
    )
    conn.executemany(
        "INSERT INTO cpu_stack_samples VALUES (?, ?, ?, ?)",
        [(i, frame, tid, count) for tid, frame, count in cpu],
    )
    if offcpu:
        conn.executemany(
            "INSERT INTO offcpu_stack_samples VALUES (?, ?, ?, ?, ?, ?)",
            [(i, stack, tid, state, switches, ns)
             for tid, stack, state, switches, ns in offcpu_pattern(i)],
        )
    conn.execute(
        "INSERT INTO cpu_samples SELECT s.checkpoint_id, fl.location_id, SUM(s.count)"
        " FROM cpu_stack_samples s"
        " JOIN stack_frames sf ON sf.stack_id = s.stack_id AND sf.position = 0"
        " JOIN frame_locations fl ON fl.frame_id = sf.frame_id AND fl.inline_depth = 0"
        " WHERE s.checkpoint_id = ? GROUP BY fl.location_id",
        (i,),
    )
    for loc, ab, ac, fb, fc, _live in heap:
        for tid, share in HEAP_THREADS[loc]:
            conn.execute(
                "INSERT INTO heap_deltas VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (i, loc, PID, tid, ab // share, ac // share, fb // share, fc // share),
            )
    conn.execute(
        "UPDATE threads SET last_checkpoint_id = ? WHERE tid != 4244 OR ? <= ?",
        (i, i, WORKER2_EXIT),
    )
    if i == WORKER2_EXIT + 1:
        conn.execute("UPDATE threads SET exited = 1 WHERE tid = 4244")


def build_profile(
    path: str | Path,
    checkpoints: int = 120,
    *,
    heap_mode: str = "full",
    state: str = "finished",
    stop_reason: str = "duration",
    offcpu: bool = False,
) -> Path:
    """Writes the fixture profile with checkpoints 1..`checkpoints` and returns its path;
    with `offcpu`, off-CPU time too (`offcpu_pattern`, meta offcpu_event)."""
    path = Path(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    create_schema(conn)
    _write_static(conn, heap_mode)
    if offcpu:
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('offcpu_event', 'sched:sched_switch')")
    conn.commit()
    conn.close()
    append_checkpoints(path, checkpoints)
    if state == "finished":
        finish(path, stop_reason)
    return path


def append_checkpoints(path: str | Path, upto: int) -> None:
    """Adds the next checkpoints up to id `upto`, one commit each, like the recorder."""
    conn = sqlite3.connect(path)
    with_heap = conn.execute("SELECT value FROM meta WHERE key = 'heap_mode'").fetchone()[0]
    offcpu = bool(conn.execute("SELECT 1 FROM meta WHERE key = 'offcpu_event'").fetchone())
    last = conn.execute("SELECT COALESCE(MAX(id), 0) FROM checkpoints").fetchone()[0]
    for i in range(last + 1, upto + 1):
        _write_checkpoint(conn, i, with_heap != "none", offcpu)
        conn.commit()
    conn.close()


def finish(path: str | Path, stop_reason: str = "duration") -> None:
    """Marks the recording finished, as the recorder does when it stops."""
    conn = sqlite3.connect(path)
    last = conn.execute("SELECT COALESCE(MAX(timestamp_ms), 0) FROM checkpoints").fetchone()[0]
    conn.executemany(
        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
        [("state", "finished"), ("stop_reason", stop_reason), ("end_time_ms", str(last))],
    )
    conn.commit()
    conn.close()


# -- app helpers for the TUI tests --------------------------------------------------------

FAKE_NOW = START_MS / 1000 + 125.5  # the fake clock: 2 min 5 s after the recording began


def make_app(path: str | Path, *, live: bool = False, **kwargs: Any) -> RsprofApp:
    """The app over `path` with a fixed clock, so the header's elapsed time is stable."""
    from rsprof.storage.live import LiveProfile
    from rsprof.tui.app import RsprofApp

    kwargs.setdefault("clock", lambda: FAKE_NOW)
    return RsprofApp(LiveProfile(path), live=live, **kwargs)


async def settle(pilot: Pilot[Any]) -> None:
    """Waits until the snapshot worker is idle and the screen is drawn."""
    app = pilot.app
    for _ in range(500):
        await pilot.pause()
        main = next((s for s in app.screen_stack if type(s).__name__ == "MainScreen"), None)
        if main is not None and not getattr(main, "busy", True):
            break
        await pilot.pause(0.01)
    await app.workers.wait_for_complete()
    await pilot.pause()


# A pilot scenario: what a test does with the running app.
Scenario = Callable[["Pilot[Any]", "RsprofApp"], Awaitable[None]]


def drive(app: RsprofApp, scenario: Scenario, size: tuple[int, int] = (80, 24)) -> None:
    """Runs `scenario` on `app` headless at `size`, once the first screen has settled."""
    import asyncio

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            await scenario(pilot, app)

    asyncio.run(main())


async def press(pilot: Pilot[Any], *keys: str) -> None:
    """Presses `keys` one by one, each settled before the next."""
    for key in keys:
        await pilot.press(key)
        await settle(pilot)


def parts(app: RsprofApp) -> tuple[MainScreen, ProfileTable, ProfileChart, str]:
    """The main screen, its table and chart, and the header's text."""
    from rsprof.tui.widgets.chart import ProfileChart
    from rsprof.tui.widgets.header import ProfileHeader
    from rsprof.tui.widgets.table import ProfileTable

    main = app.main
    header = main.query_one(ProfileHeader).plain
    return main, main.query_one(ProfileTable), main.query_one(ProfileChart), header
