"""rsprof.storage.schema: the heap is one delta table (heap_deltas, by stack, process and
allocating thread) and one call site per stack (heap_call_sites); the per-stack, process,
thread and site tables of schema 1 are views over them with the same columns, so users'
SQL, the README's leak query and files of schema 1 all read the same numbers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from rsprof.storage.analysis import growing_sites, top_heap
from rsprof.storage.errors import ProfileError
from rsprof.storage.reader import Profile
from rsprof.storage.samples import load_samples
from rsprof.storage.schema import READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION
from rsprof.storage.writer import ProfileWriter
from tui_fixture import HEAP_THREADS, PID, build_profile, heap_pattern

from unit.synthetic import Synth, schema_1_copy, small_profile


@pytest.fixture(scope="module")
def fixture_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_profile(tmp_path_factory.mktemp("schema") / "p.db", 70)


def test_site_view_has_each_checkpoints_absolute_live_bytes(fixture_profile: Path) -> None:
    """heap_site_samples.live_bytes is the site's running total at the end of each
    checkpoint (a window over the deltas), as schema 1 stored it."""
    conn = sqlite3.connect(fixture_profile)
    got = {(c, loc): (ab, ac, fb, fc, live) for c, loc, ab, ac, fb, fc, live in conn.execute(
        "SELECT checkpoint_id, location_id, alloc_bytes, alloc_count, free_bytes, free_count,"
        " live_bytes FROM heap_site_samples")}
    want = {(i, loc): tuple(values) for i in range(1, 71) for loc, *values in heap_pattern(i)}
    assert got == want


def test_stack_process_and_thread_views_split_the_same_deltas(fixture_profile: Path) -> None:
    conn = sqlite3.connect(fixture_profile)
    per_stack = dict(conn.execute(
        "SELECT stack_id, SUM(alloc_bytes) FROM heap_stack_samples GROUP BY stack_id"))
    per_process = dict(conn.execute(
        "SELECT stack_id, SUM(alloc_bytes) FROM heap_process_samples WHERE pid = ?"
        " GROUP BY stack_id", (PID,)))
    per_thread = dict(conn.execute(
        "SELECT stack_id, SUM(alloc_bytes) FROM heap_thread_samples GROUP BY stack_id"))
    assert per_stack == per_process == per_thread
    assert per_stack[10] == 8192 * 70
    threads = {(stack, tid) for stack, tid in conn.execute(
        "SELECT DISTINCT stack_id, tid FROM heap_thread_samples")}
    assert threads == {(stack, tid) for stack, shares in HEAP_THREADS.items()
                       for tid, _ in shares}
    # the README's leak query, verbatim columns
    leaked = conn.execute(
        "SELECT function, total_alloc_bytes - total_free_bytes FROM heap_samples"
        " WHERE total_allocs > total_frees ORDER BY 2 DESC").fetchall()
    assert leaked == [("leaky_cache_insert", 8192 * 70), ("load_config", 1 << 19),
                      ("make_buffer", 16384)]


def test_call_site_is_stored_once_per_stack(tmp_path: Path) -> None:
    synth = Synth(tmp_path / "p.db")
    malloc = ("malloc", "", 0, "/usr/lib/x86_64-linux-gnu/libc.so.6")
    leak = synth.stack(malloc, ("leak", "leak.c", 5), "main")
    for _ in range(3):
        synth.checkpoint(heap={leak: (64, 1, 0, 0)})
    path = synth.finish()
    writer = ProfileWriter(path, append=True)  # appending knows what is stored
    assert writer._heap_stacks == {leak}
    writer.finish("test")
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT stack_id, position, inline_depth FROM heap_call_sites"
                        ).fetchall() == [(leak, 1, 0)]
    assert conn.execute("SELECT COUNT(*) FROM heap_deltas").fetchone() == (3,)


def test_schema_1_files_read_the_same(tmp_path: Path) -> None:
    new = small_profile(tmp_path / "new.db")
    old = schema_1_copy(new, tmp_path / "old.db")
    oldest = schema_1_copy(new, tmp_path / "oldest.db", by_thread=False)
    assert SCHEMA_VERSION == 2 and "1" in READABLE_SCHEMA_VERSIONS
    reports = []
    for path in (new, old, oldest):
        with Profile(path) as profile:
            sites = [(r.function, r.live_bytes, r.alloc_count) for r in top_heap(profile)]
            stacks = sorted((tuple(f.lines[0].function for f in s.frames), tuple(s.values))
                            for s in load_samples(profile, "heap").samples)
            reports.append((sites, stacks))
    assert reports[0] == reports[1] == reports[2]
    assert reports[0][0][0] == ("leak", 10_000, 10)
    for path in (new, old):
        with Profile(path) as profile:
            mine = load_samples(profile, "heap", tid=2).samples
            assert [s.frames[0].lines[0].function for s in mine] == ["churn"]
    with Profile(oldest) as profile, pytest.raises(ProfileError, match="per thread"):
        load_samples(profile, "heap", tid=2)


def test_appending_to_a_schema_1_file_is_refused(tmp_path: Path) -> None:
    old = schema_1_copy(small_profile(tmp_path / "new.db"), tmp_path / "old.db")
    with pytest.raises(ProfileError, match="older rsprof"):
        ProfileWriter(old, append=True)


def test_growing_sites_and_top_heap_read_both_schemas(fixture_profile: Path,
                                                      tmp_path: Path) -> None:
    """`top heap`'s site table and its Growing mark read the deltas (schema 2) or the
    per-site table (schema 1) and agree; the leak that grows every checkpoint is the one
    growing site."""
    old = schema_1_copy(fixture_profile, tmp_path / "old.db")
    answers = []
    for path in (fixture_profile, old):
        with Profile(path) as profile:
            answers.append((growing_sites(profile),
                            [(r.function, r.live_bytes, r.growing) for r in top_heap(profile)]))
    assert answers[0] == answers[1]
    assert answers[0][0] == {10}  # leaky_cache_insert
    assert answers[0][1][0] == ("leaky_cache_insert", 8192 * 70, True)
