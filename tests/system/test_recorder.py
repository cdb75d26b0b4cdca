"""The recorder's own rules on a real process: the recording window (collector/recorder.py)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from conftest import build_target, profile_meta, start_target


def test_the_window_ends_at_the_duration_while_a_checkpoint_runs_long(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint that takes seconds (300 spinning threads beside the recorder made one take
    6 s in CI) no longer stretches `-d`: sampling stops at the duration, from the drain
    thread, and meta end_time_ms is that moment. In-process, to plant the slow checkpoint."""
    from rsprof.collector.recorder import Recorder

    from rsprof.cli import main

    checkpoint = Recorder._checkpoint
    slowed: list[float] = []

    def slow(self: Recorder, final: bool = False) -> bool:
        if not final and not slowed:
            slowed.append(time.monotonic())
            time.sleep(2.5)  # from 0.3 s in to 2.8 s: past the 1 s duration
        return checkpoint(self, final)

    monkeypatch.setattr(Recorder, "_checkpoint", slow)
    out = tmp_path / "window.db"
    # split.c: two threads spin (main and split-busy), the late one never starts
    target = start_target(build_target("split.c"), "60", "100000")
    try:
        code = main(["-p", str(target.pid), "-q", "--no-heap", "-d", "1s", "-i", "300ms",
                     "--cpu-freq", "999", "-o", str(out)])
    finally:
        target.kill()
        target.wait()
    assert code == 0
    assert slowed, "the planted checkpoint did not run"
    meta = profile_meta(out)
    assert meta["stop_reason"] == "duration"
    recorded_s = (int(meta["end_time_ms"]) - int(meta["start_time_ms"])) / 1000
    assert 1 <= recorded_s < 1.5, recorded_s  # 2.8 s and more before
    db = sqlite3.connect(out)
    samples = db.execute("SELECT SUM(count) FROM cpu_stack_samples").fetchone()[0]
    # two spinning threads at most: 2 x 999 a second of the window, not of the 2.8 s
    assert 0 < samples <= recorded_s * 2 * 999 * 1.15, (samples, recorded_s)
