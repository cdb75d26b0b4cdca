"""The followed file: its read-only connection, and what every view reads from it (meta,
checkpoints, threads, frames), each read once and then only what is new."""

from __future__ import annotations

import sqlite3
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from rsprof.storage.live.rows import CheckpointSummary, ProfileInfo, ThreadInfo
from rsprof.storage.samples import FrameTable, TimeRange, checkpoints_in_range

BULK_THRESHOLD = 24
"""Above this many unread checkpoints, the older ones are summed in SQL, not row by row."""


def heap_since_attach(meta: dict[str, str]) -> str:
    """The local time (HH:MM:SS) `rsprof -p` loaded the heap shim into the running process,
    from meta heap_since and heap_attached_at (UTC, ISO 8601); "" when it did not."""
    if meta.get("heap_since") != "attach":
        return ""
    try:
        return datetime.fromisoformat(meta.get("heap_attached_at") or "").astimezone().strftime(
            "%H:%M:%S")
    except ValueError:
        return "?"


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _connect(path: str) -> sqlite3.Connection:
    if not Path(path).exists():
        raise FileNotFoundError(path)
    uri = f"file:{Path(path).resolve()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.OperationalError:
        # Read-only directory and no -shm file: only a finished file can be read, as is.
        conn.close()
        conn = sqlite3.connect(
            uri + "&immutable=1", uri=True, check_same_thread=False, isolation_level=None
        )
    return conn


class FollowedFile:
    """One profile file opened read-only (`file:...?mode=ro`), so a file a recorder is
    still writing (WAL mode, one commit per checkpoint) can be followed. Not locked: the
    owning `LiveProfile` serializes every call."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.conn = _connect(self.path)
        self.info = ProfileInfo()
        self.checkpoint_ids = array("q")
        self.timestamps = array("q")
        self.checkpoint_samples = array("q")
        self._lost = 0
        self._samples = 0
        self._cpu_pct: float | None = None
        self._rss: int | None = None
        self._thread_samples: dict[int, int] = {}
        self._threads_last_id = 0
        self._threads: list[ThreadInfo] = []
        self._tables: set[str] = set()
        self._frames: FrameTable | None = None

    def rows(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple]:  # type: ignore[type-arg]
        return self.conn.execute(sql, params).fetchall()

    @property
    def frames(self) -> FrameTable:
        """Frames as `storage.samples` reads them for the reports (created on first use: a
        file just created by the recorder has no schema yet)."""
        if self._frames is None:
            self._frames = FrameTable(self)
        return self._frames

    def has_table(self, name: str) -> bool:
        """Tables never go away, so a table once seen is not asked for again."""
        if name not in self._tables and self.rows(
                "SELECT 1 FROM sqlite_master WHERE name = ?", (name,)):
            self._tables.add(name)
        return name in self._tables

    def has(self, name: str) -> bool:
        """As `Profile.has` (storage.analysis reads through either)."""
        return self.has_table(name)

    @property
    def last_id(self) -> int:
        return self.checkpoint_ids[-1] if self.checkpoint_ids else 0

    # -- refresh ------------------------------------------------------------------------------

    def read_meta(self) -> bool:
        """Re-reads `meta`; True when it changed."""
        meta = dict(self.rows("SELECT key, value FROM meta"))
        info = ProfileInfo(
            pid=_int(meta.get("pid")),
            process_name=meta.get("process_name") or "",
            cmdline=meta.get("cmdline") or "",
            start_time_ms=_int(meta.get("start_time_ms")),
            end_time_ms=_int(meta.get("end_time_ms")),
            state=meta.get("state") or "",
            stop_reason=meta.get("stop_reason"),
            heap_mode=meta.get("heap_mode") or "none",
            interval_ms=_int(meta.get("interval_ms")) or 1000,
            target_exit_code=_int(meta.get("target_exit_code")),
            kernel_sampled=meta.get("kernel_sampled") != "0",
            python=bool(meta.get("python_runtimes")),
            launched=meta.get("target_launched") == "1",
            heap_since_attach=heap_since_attach(meta),
            heap_off_reason=meta.get("heap_off_reason") or "",
            cpu_freq_hz=_int(meta.get("cpu_freq_hz")) or 99,
            offcpu_event=meta.get("offcpu_event") or "",
            offcpu_error=meta.get("offcpu_error") or "",
        )
        changed, self.info = info != self.info, info
        return changed

    def read_checkpoints(self) -> int:
        """Appends the checkpoints committed since the last call; returns how many."""
        rows = self.rows(
            "SELECT id, timestamp_ms, samples, lost_samples, target_cpu_pct, target_rss_bytes"
            " FROM checkpoints WHERE id > ? ORDER BY id",
            (self.last_id,),
        )
        for cid, ts, samples, lost, cpu_pct, rss in rows:
            self.checkpoint_ids.append(cid)
            self.timestamps.append(ts)
            self.checkpoint_samples.append(samples)
            self._lost += lost
            self._samples += samples
            if cpu_pct is not None:
                self._cpu_pct = cpu_pct
            if rss is not None:
                self._rss = rss
        return len(rows)

    def read_threads(self) -> None:
        last = self.last_id
        for tid, count in self.rows(
            "SELECT tid, SUM(count) FROM cpu_stack_samples"
            " WHERE checkpoint_id > ? AND checkpoint_id <= ? GROUP BY tid",
            (self._threads_last_id, last),
        ):
            self._thread_samples[tid] = self._thread_samples.get(tid, 0) + count
        self._threads_last_id = last
        columns = {row[1] for row in self.rows("PRAGMA table_info(threads)")}
        if "pid" in columns:  # files written before processes were followed have no pid
            sql = (
                "SELECT t.tid, t.name, t.exited, t.pid, p.command FROM threads t"
                " LEFT JOIN processes p ON p.id ="
                " (SELECT MAX(id) FROM processes WHERE pid = t.pid) ORDER BY t.tid"
            )
        else:
            sql = "SELECT tid, name, exited, NULL, NULL FROM threads ORDER BY tid"
        self._threads = [
            ThreadInfo(tid, name or "", self._thread_samples.get(tid, 0), bool(exited), pid,
                       command or "")
            for tid, name, exited, pid, command in self.rows(sql)
        ]

    # -- results ------------------------------------------------------------------------------

    def summary(self) -> CheckpointSummary:
        if not self.checkpoint_ids:
            return CheckpointSummary(target_cpu_pct=self._cpu_pct, target_rss_bytes=self._rss)
        return CheckpointSummary(
            count=len(self.checkpoint_ids),
            last_id=self.checkpoint_ids[-1],
            first_timestamp_ms=self.timestamps[0],
            last_timestamp_ms=self.timestamps[-1],
            samples=self._samples,
            lost_samples=self._lost,
            last_samples=self.checkpoint_samples[-1],
            target_cpu_pct=self._cpu_pct,
            target_rss_bytes=self._rss,
        )

    def threads(self) -> list[ThreadInfo]:
        return list(self._threads)

    # -- time ---------------------------------------------------------------------------------

    @property
    def recording_start_ms(self) -> int:
        """Where `--since/--until` count from, as `storage.samples` takes it."""
        if self.info.start_time_ms is not None:
            return self.info.start_time_ms
        return self.timestamps[0] if self.timestamps else 0

    @property
    def chart_origin_ms(self) -> int:
        """Where chart axes start: the recording's start, or one interval before the first
        checkpoint of a file without it."""
        if self.info.start_time_ms is not None:
            return self.info.start_time_ms
        return self.timestamps[0] - self.info.interval_ms if self.timestamps else 0

    def range_indexes(self, time_range: TimeRange) -> tuple[int, int]:
        """[lo, hi) indexes of the checkpoints in `time_range`, by `--since/--until`'s rule
        (`storage.samples.checkpoints_in_range`)."""
        rows = zip(self.checkpoint_ids, self.timestamps, strict=True)
        chosen, _start, _end = checkpoints_in_range(list(rows), self.recording_start_ms,
                                                   time_range)
        inside = [i for i, (_cid, within) in enumerate(chosen) if within]
        return (inside[0], inside[-1] + 1) if inside else (0, 0)

    def window_indexes(self, start_ms: int, end_ms: int) -> tuple[int, int]:
        """[lo, hi) indexes of the checkpoints with timestamps in (start_ms, end_ms]."""
        return bisect_right(self.timestamps, start_ms), bisect_right(self.timestamps, end_ms)

    def split_unread(self, since: int, last: int, keep: int) -> tuple[int, list[int]]:
        """Checkpoint ids in (since, last]: the id up to which to sum in SQL, then the
        newest `keep` (or all, when few) to read one by one."""
        lo = bisect_right(self.checkpoint_ids, since)
        hi = bisect_right(self.checkpoint_ids, last)
        ids = self.checkpoint_ids[lo:hi].tolist()
        if len(ids) > max(BULK_THRESHOLD, 2 * keep):
            return ids[-keep - 1], ids[-keep:]
        return since, ids

    def bucketize(
        self, start_ms: int, bucket_ms: int, values: Iterable[tuple[int, float]]
    ) -> tuple[tuple[float, float], ...]:
        """(timestamp, value) pairs to (seconds since the chart origin, value) per bucket;
        a bucket keeps its last value."""
        t0 = self.chart_origin_ms
        points: dict[int, float] = {}
        for ts, value in values:
            points[(ts - start_ms - 1) // bucket_ms] = value
        return tuple(
            ((start_ms + (b + 1) * bucket_ms - t0) / 1000.0, v) for b, v in sorted(points.items())
        )


def trends(
    ring: deque[dict[int, int]], length: int, carry: dict[int, int] | None
) -> dict[int, list[int]]:
    """Per key, its values in the ring's checkpoints, oldest first, padded to `length` with
    zeros. With `carry`, a slot holds a key's value only when it changed (running values,
    like live bytes): the others repeat the previous one, starting from `carry`'s."""
    pad = length - len(ring)
    out: dict[int, list[int]] = {}
    for i, slot in enumerate(ring, start=pad):
        for key, value in slot.items():
            values = out.get(key)
            if values is None:
                values = out[key] = [-1] * length if carry is not None else [0] * length
            values[i] = value
    if carry is not None:
        for key, values in out.items():
            previous = carry.get(key, 0)
            for i in range(pad, length):
                if values[i] < 0:
                    values[i] = previous
                previous = values[i]
            for i in range(pad):
                values[i] = 0
    return out
