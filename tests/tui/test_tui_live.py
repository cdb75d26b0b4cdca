"""storage.live.LiveProfile (incremental reads) and the TUI's pure helpers."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
from rsprof.storage.live import TREND_LEN, CpuRow, LiveProfile
from rsprof.tui.format import fit_start, fmt_bytes, fmt_elapsed, sparkline
from rsprof.tui.model import ChartRequest, Query, View, build_snapshot, next_sort

# tests/ is not a package: make its helpers importable under plain `pytest` too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_fixture import (
    LONG_NAME,
    START_MS,
    append_checkpoints,
    build_profile,
    cpu_pattern,
    finish,
)


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    return build_profile(tmp_path / "fixture.db")


def expected_samples(upto: int) -> int:
    return sum(c for i in range(1, upto + 1) for _t, _f, c in cpu_pattern(i))


def by_name(rows: list) -> dict:
    return {r.function: r for r in rows}


def test_totals_match_sql(profile: Path) -> None:
    lp = LiveProfile(profile)
    assert lp.refresh()
    s = lp.summary()
    assert (s.count, s.samples, s.lost_samples) == (120, expected_samples(120), 8)
    rows = by_name(lp.cpu_rows())
    conn = sqlite3.connect(profile)
    for fn, samples in conn.execute(
        "SELECT l.function, SUM(c.count) FROM cpu_samples c"
        " JOIN locations l ON l.id = c.location_id GROUP BY l.function"
    ):
        assert rows[fn].self_samples == samples
    # Total: the cpu_functions view (and `rsprof top cpu`) count the same, once per sample
    for fn, own, total in conn.execute("SELECT function, self, total FROM cpu_functions"):
        assert (rows[fn].self_samples, rows[fn].total_samples) == (own, total)
    assert rows["compute_hash"].location == "src/hash.c:42"  # the hottest of its two lines
    assert sum(r.self_pct for r in rows.values()) == pytest.approx(100)
    # main's stack is main -> main (recursion): still 100 %, never 200 %
    assert rows["main"].total_pct == pytest.approx(100)
    # hash_round is inlined into compute_hash: compute_hash's total includes it
    assert rows["compute_hash"].total_samples == (
        rows["compute_hash"].self_samples + rows["hash_round"].self_samples)
    # last interval: checkpoint 120 (worker-2 exited after 90); Live is total samples
    assert rows["compute_hash"].live_samples == 20 + 0 + 5 + 8 + 0
    assert rows["matrix_multiply"].live_samples == 0
    assert rows["parse_input"].trend == (1,) * 11 + (15,)
    assert rows["main"].trend == tuple(
        sum(c for _t, _f, c in cpu_pattern(i)) for i in range(109, 121))
    assert not lp.refresh()  # nothing new


def test_incremental_refresh_reads_only_new_checkpoints(tmp_path: Path) -> None:
    path = build_profile(tmp_path / "p.db", 30, state="recording")
    lp = LiveProfile(path)
    lp.refresh()
    assert lp.summary().samples == expected_samples(30)
    append_checkpoints(path, 31)
    assert lp.refresh()
    assert lp.summary().count == 31
    assert lp.summary().samples == expected_samples(31)
    rows = by_name(lp.cpu_rows())
    assert rows["compute_hash"].live_samples == 20 + 1 + 5 + 8 + 1
    assert len(rows["compute_hash"].trend) == TREND_LEN
    append_checkpoints(path, 120)  # a big jump: older part aggregated in SQL
    lp.refresh()
    fresh = LiveProfile(path)
    fresh.refresh()
    assert by_name(lp.cpu_rows()) == by_name(fresh.cpu_rows())
    assert by_name(lp.heap_rows()) == by_name(fresh.heap_rows())
    assert lp.info.state == "recording"
    finish(path, "target-exited")
    assert lp.refresh()
    assert (lp.info.state, lp.info.stop_reason) == ("finished", "target-exited")


def test_ring_is_bounded(profile: Path) -> None:
    lp = LiveProfile(profile)
    lp.refresh()
    assert len(lp.cpu._ring) == len(lp.cpu._stack_ring) == TREND_LEN
    assert len(lp.heap._ring) == TREND_LEN


def test_heap_rows_and_trend_carry_forward(profile: Path) -> None:
    lp = LiveProfile(profile)
    lp.refresh()
    rows = by_name(lp.heap_rows())
    leak = rows["leaky_cache_insert"]
    assert leak.live_bytes == 8192 * 120 and leak.alloc_count == 240
    assert leak.trend == tuple(8192 * i for i in range(109, 121))
    # load_config has no row after checkpoint 60: its live bytes carry forward
    assert rows["load_config"].trend == (1 << 19,) * TREND_LEN
    assert rows["make_buffer"].free_bytes == 65536 * 120


def test_thread_filter(profile: Path) -> None:
    lp = LiveProfile(profile)
    lp.refresh()
    key = by_name(lp.cpu_rows())["matrix_multiply"].key
    threads = {t.tid: t for t in lp.threads()}
    assert threads[4244].name == "worker-2" and threads[4244].exited
    lp.set_thread(4244)
    lp.refresh()
    rows = by_name(lp.cpu_rows())
    assert set(rows) == {"main", "matrix_multiply", "compress_block", LONG_NAME}
    assert "compute_hash" not in rows
    assert rows["matrix_multiply"].key == key  # keys are stable across thread changes
    assert sum(r.self_samples for r in rows.values()) == threads[4244].samples
    assert rows["main"].total_samples == threads[4244].samples
    lp.set_thread(4243)
    lp.refresh()
    rows = by_name(lp.cpu_rows())
    # hash_round is inlined into compute_hash: the leaf (inline depth 0) gets the sample
    assert set(rows) == {"main", "compute_hash", "hash_round", "__memmove_avx_unaligned_erms"}


def test_series(profile: Path) -> None:
    lp = LiveProfile(profile)
    lp.refresh()
    key = by_name(lp.cpu_rows())["parse_input"].key
    s = lp.cpu_series(key, START_MS + 100_000, START_MS + 120_000, 1000)
    assert len(s.points) == 20 and s.points[-1][0] == 120.0
    samples_101 = sum(c for _t, _f, c in cpu_pattern(101))
    assert s.points[0][1] == pytest.approx(100 * 15 / samples_101)
    coarse = lp.cpu_series(key, START_MS, START_MS + 120_000, 10_000)
    assert len(coarse.points) == 12
    heap_key = by_name(lp.heap_rows())["load_config"].key
    h = lp.heap_series(heap_key, START_MS + 50_000, START_MS + 70_000, 5000)
    assert [v for _t, v in h.points] == [1 << 20, 1 << 19, 1 << 19, 1 << 19]
    assert lp.cpu_series(key, START_MS + 200_000, START_MS + 260_000, 1000).points == ()


def test_read_only(profile: Path) -> None:
    lp = LiveProfile(profile)
    with pytest.raises(sqlite3.OperationalError):
        lp.file.conn.execute("DELETE FROM checkpoints")


def test_snapshot_filter_sort_chart(profile: Path) -> None:
    lp = LiveProfile(profile)
    # The filter box is `--focus`: the functions of the samples through a matching frame
    # (compute_hash's and hash_round's, and main, which calls them).
    snap = build_snapshot(lp, Query(filter="(?i)HASH"))
    assert [r.function for r in snap.rows] == ["compute_hash", "main", "hash_round"]
    assert snap.selection is not None and snap.selection.filters.describe() == "focus=(?i)HASH"
    assert snap.trend_top == max(max(r.trend) for r in snap.rows if isinstance(r, CpuRow))
    assert snap.heap_available
    snap = build_snapshot(lp, Query(filter="hash("), refresh=False)
    assert snap.rows == [] and snap.selection is None and "not a valid regex" in snap.filter_error
    snap = build_snapshot(lp, Query(sort="function", descending=False), refresh=False)
    names = [r.function for r in snap.rows]
    assert names == sorted(names, key=str.lower)
    key = snap.rows[0].key
    snap = build_snapshot(lp, Query(chart=ChartRequest(key, zoom=0)), refresh=False)
    assert snap.series is not None and len(snap.series.points) == 5
    snap = build_snapshot(lp, Query(View.MEMORY, sort="live_bytes"), refresh=False)
    assert snap.rows[0].function == "leaky_cache_insert"
    assert next_sort(View.CPU, "total") == "live"
    assert next_sort(View.CPU, "location") == "self"


def test_format_helpers() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([0] * 12) == "▁" * 12
    assert sparkline([10, 11, 12], from_zero=False) == "▁▅█"
    assert fmt_bytes(512) == "512 B" and fmt_bytes(1536) == "1.5 KiB"
    assert fmt_elapsed(3_723_000) == "01:02:03"
    assert fit_start("src/very/long/path.c:12", 10) == "…path.c:12"
