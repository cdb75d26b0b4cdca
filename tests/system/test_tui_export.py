"""The TUI's `x` / `X` write exactly what the view shows: the same file as `rsprof export`
with the view's selection (thread, time window, the filter box as `--focus`), and the
functions in it are the table's rows with the table's numbers."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rsprof.storage.live import CpuRow
from rsprof.storage.pprof import profile_pb2
from rsprof.tui.app import RsprofApp
from rsprof.tui.export import export_view
from rsprof.tui.model import Snapshot
from rsprof.tui.widgets.table import ProfileTable

sys.path.insert(0, str(Path(__file__).parent.parent))
from conftest import run_rsprof
from tui_fixture import append_checkpoints, build_profile, make_app, settle

STEM = "rsprof.demo.231114221320"


class Shown:
    """What the view showed after the keys (the app's screens are gone once it stops)."""

    rows: list[Any]
    snapshot: Snapshot | None


def drive(app: RsprofApp, keys: list[str], before_keys: Callable[[], None] | None = None
          ) -> Shown:
    shown = Shown()

    async def main() -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            if before_keys is not None:
                before_keys()
            for key in keys:
                await pilot.press(key)
                await settle(pilot)
            await app.workers.wait_for_complete()
            shown.rows = list(app.main.query_one(ProfileTable).rows)
            shown.snapshot = app.main.snapshot

    asyncio.run(main())
    return shown


def typed(text: str) -> list[str]:
    """The keys that open the filter box, type `text` and keep it."""
    return ["slash", *text, "enter"]


def pprof(path: Path) -> profile_pb2.Profile:
    pb = profile_pb2.Profile()
    pb.ParseFromString(gzip.decompress(path.read_bytes()))
    return pb


def totals_by_function(pb: profile_pb2.Profile) -> Counter[str]:
    """Samples with the function anywhere on the stack, once per sample (Total)."""
    names = {f.id: pb.string_table[f.name] for f in pb.function}
    lines = {loc.id: [names[line.function_id] for line in loc.line] for loc in pb.location}
    totals: Counter[str] = Counter()
    for sample in pb.sample:
        for name in {n for loc in sample.location_id for n in lines[loc]}:
            totals[name] += sample.value[0]
    return totals


def cli_export(profile: Path, out: Path, *args: str) -> Path:
    done = run_rsprof("export", str(profile), "-o", str(out), *args)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.parametrize("keys, options", [
    # "libc" names no function: it matches libc's module path (issue 25: the table showed
    # nothing and the export wrote every sample)
    (typed("libc"), ["--focus", "libc"]),
    (typed("hash"), ["--focus", "hash"]),
    # one thread, the last minute (`w`), a filter: every part of the selection at once
    (["t", "j", "enter", "w", *typed("hash")],
     ["--tid", "4243", "--since", "60s", "--until", "120s", "--focus", "hash"]),
])
def test_tui_export_of_a_filtered_view_equals_rsprof_export(
        tmp_path: Path, keys: list[str], options: list[str]) -> None:
    path = build_profile(tmp_path / f"{STEM}.db")
    rows = drive(make_app(path), [*keys, "x"]).rows
    written = tmp_path / f"{STEM}.cpu.pb.gz"
    assert written.exists() and rows
    expected = cli_export(path, tmp_path / "cli.pb.gz", *options)
    assert pprof(written) == pprof(expected)
    # ...and the file holds what the table shows: its functions, with their Total
    shown = {r.function: r.total_samples for r in rows if isinstance(r, CpuRow)}
    assert dict(totals_by_function(pprof(written))) == shown


def test_tui_export_of_a_view_that_shows_nothing_writes_nothing(tmp_path: Path) -> None:
    path = build_profile(tmp_path / f"{STEM}.db")
    shown = drive(make_app(path), [*typed("xyz"), "x"])
    assert shown.rows == []
    assert not list(tmp_path.glob(f"{STEM}.cpu*"))
    snapshot = shown.snapshot
    assert snapshot is not None and snapshot.selection is not None
    with pytest.raises(Exception, match=r"the filters \(focus=xyz\) kept no samples") as error:
        export_view(path, fmt="pprof", selection=snapshot.selection)
    done = run_rsprof("export", str(path), "-o", str(tmp_path / "cli.pb.gz"), "--focus", "xyz")
    assert done.returncode == 1 and str(error.value) in done.stderr


def test_tui_heap_export_equals_rsprof_export(tmp_path: Path) -> None:
    path = build_profile(tmp_path / f"{STEM}.db")
    rows = drive(make_app(path), ["2", *typed("cache"), "X"]).rows
    assert [r.function for r in rows] == ["leaky_cache_insert"]
    written = tmp_path / f"{STEM}.heap.speedscope.json"
    expected = cli_export(path, tmp_path / "cli.speedscope.json", "--kind", "heap",
                          "-f", "speedscope", "--focus", "cache")
    assert json.loads(written.read_text()) == json.loads(expected.read_text())


def test_export_of_a_file_still_recorded_ends_where_the_view_does(tmp_path: Path) -> None:
    """Checkpoints committed after the view was drawn are not in its export (`--until`)."""
    path = build_profile(tmp_path / f"{STEM}.db", 60, state="recording")
    shown = drive(make_app(path, refresh_interval=3600), ["x"],
                  before_keys=lambda: append_checkpoints(path, 80))
    assert shown.snapshot is not None and shown.snapshot.summary.count == 60
    written = pprof(tmp_path / f"{STEM}.cpu.pb.gz")
    assert sum(s.value[0] for s in written.sample) == shown.snapshot.summary.samples
    expected = cli_export(path, tmp_path / "cli.pb.gz", "--until", "60s")
    assert written == pprof(expected)
