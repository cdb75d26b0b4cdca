"""Heap numbers of the followed file: per allocating stack, the bytes and blocks allocated
and freed so far, the last checkpoints' live bytes (Trend) and the whole heap's live bytes
after each checkpoint (the timeline).

Stacks are the reports' `Frame`s cut at the call site the recorder stored (`FrameTable.stacks`),
a call site is keyed as `storage.granularity` keys "lines" (what `rsprof top heap` lists),
and the filters are `storage.filters.FrameFilter`: a row counts exactly what `rsprof export
--kind heap` writes for it. With a thread picked, the numbers are that thread's
allocations (`heap_deltas` by tid: a block freed by another thread still counts for the
thread that allocated it)."""

from __future__ import annotations

from array import array
from collections import deque
from typing import NamedTuple

from rsprof.storage.callgraph import call_tree
from rsprof.storage.filters import FrameFilter
from rsprof.storage.granularity import Entry, entry
from rsprof.storage.live.follow import FollowedFile, trends
from rsprof.storage.live.functions import NO_FILTER, CallPath, FilteredStacks, FunctionLabels
from rsprof.storage.live.rows import CallNode, HeapRow, HeapTimeline, Series, location_text
from rsprof.storage.samples import Frame, heap_deltas_source

_CHUNK = 500  # stack ids per statement


class HeapStack(NamedTuple):
    site: int  # the call site's key (its "lines" entry); -1 for an empty stack
    path: CallPath  # from the call site outwards, in function keys


_EMPTY = HeapStack(-1, CallPath((), (), None))


class HeapModel:
    def __init__(self, file: FollowedFile, labels: FunctionLabels, trend_len: int) -> None:
        self.file = file
        self.labels = labels
        self.trend_len = trend_len
        self.site_entries: list[Entry] = []
        self._site_numbers: dict[Entry, int] = {}
        self._frames: dict[int, tuple[Frame, ...]] = {}  # stack id -> from the call site
        self._stacks: dict[int, HeapStack] = {}
        self._filtered: FilteredStacks[HeapStack] = FilteredStacks()
        self._has_data = False
        self.reset(None)

    def reset(self, thread: int | None) -> None:
        """Forgets the numbers; `thread` (None: all) is whose allocations to count."""
        self.thread = thread
        self.last_id = 0
        # stack id -> [alloc_bytes, alloc_count, free_bytes, free_count] so far
        self._sums: dict[int, list[int]] = {}
        # live bytes per stack after each of the last checkpoints, only where they changed;
        # _before: each stack's live bytes before the first of them
        self._ring: deque[dict[int, int]] = deque(maxlen=self.trend_len)
        self._before: dict[int, int] = {}
        self._timeline = array("q")  # whole-heap live bytes after each checkpoint
        self._timeline_total = 0

    @property
    def by_thread(self) -> bool:
        """The file keeps heap data per allocating thread (all but early schema-1 files)."""
        return self.file.has_table("heap_deltas") or self.file.has_table("heap_thread_samples")

    @property
    def has_data(self) -> bool:
        """The file has heap data of any thread (a thread that allocated nothing shows an
        empty table, not the "how to get heap data" text)."""
        if not self._has_data and self.file.has_table("heap_stack_samples"):
            table, _, _ = self._source()
            self._has_data = bool(self.file.rows(f"SELECT 1 FROM {table} LIMIT 1"))
        return self._has_data

    # -- reading ------------------------------------------------------------------------------

    def _source(self) -> tuple[str, str, tuple[int, ...]]:
        thread = self.thread if self.by_thread else None
        return heap_deltas_source(self.file.has_table, tid=thread)

    def _load(self, stack_ids: set[int]) -> None:
        missing = sorted(stack_ids - self._stacks.keys())
        for start in range(0, len(missing), _CHUNK):
            chunk = missing[start:start + _CHUNK]
            loaded = self.file.frames.stacks(chunk, trim_to_call_site=True)
            for stack_id in chunk:
                frames = loaded.get(stack_id, ())
                self._frames[stack_id] = frames
                self._stacks[stack_id] = self._heap_stack(frames)

    def _heap_stack(self, frames: tuple[Frame, ...]) -> HeapStack:
        if not frames:
            return _EMPTY
        site = entry(frames[0], frames[0].lines[0], "lines")
        number = self._site_numbers.get(site)
        if number is None:
            number = self._site_numbers[site] = len(self.site_entries)
            self.site_entries.append(site)
        return HeapStack(number, self.labels.path(frames))

    def _add(self, stack_id: int, alloc_bytes: int, alloc_count: int, free_bytes: int,
             free_count: int) -> int:
        sums = self._sums.get(stack_id)
        if sums is None:
            sums = self._sums[stack_id] = [0, 0, 0, 0]
        sums[0] += alloc_bytes
        sums[1] += alloc_count
        sums[2] += free_bytes
        sums[3] += free_count
        return max(0, sums[0] - sums[2])

    def read(self, last: int) -> None:
        """Adds the checkpoints up to id `last`."""
        if not self.file.has_table("heap_stack_samples"):
            return
        table, where, params = self._source()
        sums = "SUM(alloc_bytes), SUM(alloc_count), SUM(free_bytes), SUM(free_count)"
        bulk_to, ids = self.file.split_unread(self.last_id, last, self.trend_len)
        if bulk_to > self.last_id:
            for slot in self._ring:
                self._before.update(slot)
            self._ring.clear()
            rows = self.file.rows(
                f"SELECT stack_id, {sums} FROM {table}"
                f" WHERE checkpoint_id > ? AND checkpoint_id <= ?{where} GROUP BY stack_id",
                (self.last_id, bulk_to, *params))
            self._load({row[0] for row in rows})
            for stack_id, *values in rows:
                self._before[stack_id] = self._add(stack_id, *values)
        if ids:
            rows = self.file.rows(
                f"SELECT checkpoint_id, stack_id, {sums} FROM {table}"
                f" WHERE checkpoint_id > ? AND checkpoint_id <= ?{where} GROUP BY 1, 2",
                (bulk_to, last, *params))
            self._load({row[1] for row in rows})
            per_checkpoint: dict[int, dict[int, int]] = {cid: {} for cid in ids}
            for cid, stack_id, *values in rows:
                per_checkpoint[cid][stack_id] = self._add(stack_id, *values)
            for cid in ids:
                if len(self._ring) == self._ring.maxlen:
                    self._before.update(self._ring[0])
                self._ring.append(per_checkpoint[cid])
        self._read_timeline(last, table, where, params)
        self.last_id = last

    def _read_timeline(self, last: int, table: str, where: str,
                       params: tuple[int, ...]) -> None:
        changes = dict(self.file.rows(
            f"SELECT checkpoint_id, SUM(alloc_bytes) - SUM(free_bytes) FROM {table}"
            f" WHERE checkpoint_id > ? AND checkpoint_id <= ?{where} GROUP BY checkpoint_id",
            (self.last_id, last, *params)))
        ids = self.file.checkpoint_ids
        lo = len(self._timeline)
        hi = len(ids)
        for i in range(lo, hi):
            if ids[i] > last:
                break
            self._timeline_total += changes.get(ids[i], 0)
            self._timeline.append(self._timeline_total)

    # -- the filters --------------------------------------------------------------------------

    def heap_stack(self, stack_id: int, filters: FrameFilter) -> HeapStack | None:
        """The stack's call site and path after the filters; None when they drop it."""
        if not filters.active:
            return self._stacks[stack_id]
        return self._filtered.get(stack_id, self._frames[stack_id], filters, self._heap_stack)

    # -- results ------------------------------------------------------------------------------

    def rows(self, filters: FrameFilter = NO_FILTER) -> list[HeapRow]:
        """Every call site with allocations (unsorted), in key order; trends are of live
        bytes."""
        n = self.trend_len
        by_stack = trends(self._ring, n, self._before)
        pad = n - len(self._ring)
        sites: dict[int, list[int]] = {}
        site_trends: dict[int, list[int]] = {}
        for stack_id, (alloc_bytes, alloc_count, free_bytes, free_count) in self._sums.items():
            stack = self.heap_stack(stack_id, filters)
            if stack is None or stack.site < 0:
                continue
            if not (alloc_bytes or alloc_count or free_bytes or free_count):
                continue
            live = max(0, alloc_bytes - free_bytes)
            acc = sites.get(stack.site)
            if acc is None:
                acc = sites[stack.site] = [0, 0, 0, 0, 0]
                site_trends[stack.site] = [0] * n
            acc[0] += live
            acc[1] += alloc_bytes
            acc[2] += alloc_count
            acc[3] += free_bytes
            acc[4] += free_count
            trend = by_stack.get(stack_id)
            if trend is None:  # unchanged over the last checkpoints
                flat = self._before.get(stack_id, live)
                trend = [0] * pad + [flat] * (n - pad)
            total = site_trends[stack.site]
            for i, value in enumerate(trend):
                total[i] += value
        rows = []
        for site in sorted(sites):
            live, alloc_bytes, alloc_count, free_bytes, free_count = sites[site]
            e = self.site_entries[site]
            rows.append(HeapRow(site, e.function, location_text(e.file, e.line), live,
                                alloc_bytes, alloc_count, free_bytes, free_count,
                                tuple(site_trends[site])))
        return rows

    def tree(self, filters: FrameFilter = NO_FILTER, allocated: bool = False) -> CallNode:
        """The top-down tree of allocating stacks (from the call site) by live bytes (or
        bytes allocated): a node's total is the bytes allocated under it, its self the bytes
        allocated right there (a call site)."""
        weighted = []
        base = 0  # every byte before the filters: what percentages are of, as pprof's
        for stack_id, (alloc_bytes, _count, free_bytes, _frees) in self._sums.items():
            value = alloc_bytes if allocated else max(0, alloc_bytes - free_bytes)
            base += value
            stack = self.heap_stack(stack_id, filters)
            if stack is not None:
                weighted.append((stack.path.path, value))
        return self.labels.tree(call_tree(weighted), "all live bytes", base)

    def timeline(self, points: int = 120) -> HeapTimeline:
        """Whole-heap live bytes over the recording, in exactly `points` buckets: a short
        recording's checkpoints repeat (wide bars), a long one's merge (each bucket keeps
        its highest value)."""
        values, stamps = self._timeline, self.file.timestamps
        n = len(values)
        if not n:
            return HeapTimeline((), 0, None, 0)
        t0 = self.file.chart_origin_ms
        peak = max(range(n), key=values.__getitem__)
        points = max(1, points)
        out = []
        for i in range(points):
            lo = i * n // points
            hi = max(lo + 1, (i + 1) * n // points)
            out.append((float(stamps[hi - 1] - t0), max(values[lo:hi])))
        return HeapTimeline(tuple(out), values[peak], stamps[peak] - t0, values[-1])

    def series(self, key: int, start_ms: int, end_ms: int, bucket_ms: int,
               filters: FrameFilter = NO_FILTER) -> Series:
        """Live bytes of call site `key` at the end of each bucket in (start_ms, end_ms]."""
        bucket_ms = max(1, bucket_ms)
        lo, hi = self.file.window_indexes(start_ms, end_ms)
        if lo >= hi:
            return Series(start_ms, end_ms, bucket_ms, ())
        wanted = []
        for stack_id in self._sums:
            stack = self.heap_stack(stack_id, filters)
            if stack is not None and stack.site == key:
                wanted.append(stack_id)
        table, where, params = self._source()
        ids, stamps = self.file.checkpoint_ids, self.file.timestamps
        delta: dict[int, int] = {}
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start:start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            for cid, change in self.file.rows(
                    f"SELECT checkpoint_id, SUM(alloc_bytes) - SUM(free_bytes) FROM {table}"
                    f" WHERE checkpoint_id <= ? AND stack_id IN ({marks}){where}"
                    " GROUP BY checkpoint_id", (ids[hi - 1], *chunk, *params)):
                delta[cid] = delta.get(cid, 0) + change
        first = ids[lo]
        live = sum(change for cid, change in delta.items() if cid < first)
        values = []
        for i in range(lo, hi):
            live += delta.get(ids[i], 0)
            values.append((stamps[i], float(live)))
        return Series(start_ms, end_ms, bucket_ms, self.file.bucketize(start_ms, bucket_ms, values))
