"""rsprof.storage.live.follow: following a profile file while the writer adds to it (meta,
checkpoints, threads read once, then only what is new) and its time rules (ranges, windows,
buckets, trends)."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest
from rsprof.storage.live.follow import BULK_THRESHOLD, FollowedFile, trends
from rsprof.storage.samples import TimeRange

from unit.synthetic import PID, START_MS, Synth


def test_follows_a_file_being_written(tmp_path: Path) -> None:
    synth = Synth(tmp_path / "p.db")
    stack = synth.stack("work", "main")
    followed = FollowedFile(synth.path)
    assert not followed.read_meta()  # nothing committed yet: the writer commits per checkpoint
    assert followed.info.pid is None
    assert followed.read_checkpoints() == 0 and followed.last_id == 0
    summary = followed.summary()
    assert summary.count == 0 and summary.first_timestamp_ms is None

    synth.checkpoint({(stack, 11): 3, (stack, 12): 1})
    assert followed.read_meta()
    assert not followed.read_meta()
    assert followed.info.pid == PID and followed.info.state == "recording"
    synth.checkpoint({(stack, 11): 2})
    assert followed.read_checkpoints() == 2
    followed.read_threads()
    synth.checkpoint({(stack, 12): 5}, threads={12: "renamed"})
    assert followed.read_checkpoints() == 1
    followed.read_threads()
    summary = followed.summary()
    assert (summary.count, summary.last_id, summary.samples, summary.last_samples) == (3, 3, 11, 5)
    assert summary.first_timestamp_ms == START_MS + 1000
    assert summary.last_timestamp_ms == START_MS + 3000
    assert [(t.tid, t.name, t.samples, t.pid) for t in followed.threads()] == [
        (11, "t11", 5, PID), (12, "renamed", 6, PID)]

    synth.finish()
    assert followed.read_meta() and followed.info.state == "finished"
    assert followed.read_checkpoints() == 0


def test_meta_values(tmp_path: Path) -> None:
    synth = Synth(tmp_path / "p.db", meta={"interval_ms": "junk", "kernel_sampled": "0",
                                           "python_runtimes": "3.12", "target_launched": "1",
                                           "target_exit_code": "3", "pid": "x"})
    followed = FollowedFile(synth.finish())
    followed.read_meta()
    info = followed.info
    assert (info.pid, info.interval_ms, info.kernel_sampled, info.python, info.launched,
            info.target_exit_code) == (None, 1000, False, True, True, 3)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FollowedFile(tmp_path / "none.db")


@pytest.fixture
def ten(tmp_path: Path) -> FollowedFile:
    """Checkpoints 1..10 at 1 s intervals from the recording's start."""
    synth = Synth(tmp_path / "p.db")
    stack = synth.stack("work")
    for _ in range(10):
        synth.checkpoint({(stack, 1): 1})
    followed = FollowedFile(synth.finish())
    followed.read_meta()
    followed.read_checkpoints()
    return followed


@pytest.mark.parametrize(("since", "until", "indexes"), [
    (None, None, (0, 10)),
    (0.0, None, (0, 10)),
    (2.0, 4.0, (2, 4)),  # checkpoints 3 and 4: the middles of their intervals, 2.5 and 3.5 s
    (2.4, 4.6, (2, 5)),
    (2.6, 3.4, (0, 0)),  # no middle inside
    (2.6, 3.6, (3, 4)),
    (9.5, None, (9, 10)),
    (20.0, None, (0, 0)),
    (None, 0.5, (0, 0)),
])
def test_range_indexes(ten: FollowedFile, since: float | None, until: float | None,
                       indexes: tuple[int, int]) -> None:
    assert ten.range_indexes(TimeRange(since, until)) == indexes


@pytest.mark.parametrize(("start", "end", "indexes"), [
    (START_MS, START_MS + 10_000, (0, 10)),
    (START_MS + 1000, START_MS + 3000, (1, 3)),  # (start, end]
    (START_MS + 1001, START_MS + 2999, (1, 2)),
    (START_MS + 20_000, START_MS + 30_000, (10, 10)),
])
def test_window_indexes(ten: FollowedFile, start: int, end: int,
                        indexes: tuple[int, int]) -> None:
    assert ten.window_indexes(start, end) == indexes


@pytest.mark.parametrize(("since", "last", "keep", "split"), [
    (0, 10, 3, (0, list(range(1, 11)))),  # few: all one by one
    (4, 10, 3, (4, list(range(5, 11)))),
    (0, 5, 3, (0, [1, 2, 3, 4, 5])),
    (10, 10, 3, (10, [])),
])
def test_split_unread_few(ten: FollowedFile, since: int, last: int, keep: int,
                          split: tuple[int, list[int]]) -> None:
    assert ten.split_unread(since, last, keep) == split


def test_split_unread_many(tmp_path: Path) -> None:
    synth = Synth(tmp_path / "p.db")
    stack = synth.stack("work")
    count = BULK_THRESHOLD + 6
    for _ in range(count):
        synth.checkpoint({(stack, 1): 1})
    followed = FollowedFile(synth.finish())
    followed.read_checkpoints()
    assert followed.split_unread(0, count, 4) == (count - 4, list(range(count - 3, count + 1)))


def test_bucketize_keeps_each_buckets_last_value(ten: FollowedFile) -> None:
    values = [(START_MS + 1000 * i, float(i)) for i in range(1, 11)]
    assert ten.bucketize(START_MS, 3000, values) == ((3.0, 3.0), (6.0, 6.0), (9.0, 9.0),
                                                     (12.0, 10.0))


@pytest.mark.parametrize(("ring", "length", "carry", "expected"), [
    pytest.param([], 3, None, {}, id="empty"),
    pytest.param([{1: 5}, {1: 6, 2: 1}], 4, None, {1: [0, 0, 5, 6], 2: [0, 0, 0, 1]},
                 id="padded-oldest-first"),
    pytest.param([{1: 5}, {}, {1: 7}], 3, {}, {1: [5, 5, 7]}, id="running-values-repeat"),
    pytest.param([{}, {2: 4}], 3, {2: 9}, {2: [0, 9, 4]}, id="carried-from-before"),
])
def test_trends(ring: list[dict[int, int]], length: int, carry: dict[int, int] | None,
                expected: dict[int, list[int]]) -> None:
    assert trends(deque(ring), length, carry) == expected
