"""CPU numbers of the followed file: running self and total counts per function, samples
per stack (for the call tree and peek), the last checkpoints for Live % and the Trend.

Stacks are the reports' `Frame`s (`storage.samples.FrameTable`), functions are keyed as
`storage.granularity` keys "functions" (a name in a module), and the filters are
`storage.filters.FrameFilter`, applied stack by stack: so a row, a tree node or a chart
counts exactly the samples `rsprof top`, `peek` and `export` select."""

from __future__ import annotations

from collections import deque

from rsprof.storage.callgraph import call_tree, count_neighbours
from rsprof.storage.filters import FrameFilter
from rsprof.storage.live.follow import FollowedFile, trends
from rsprof.storage.live.functions import (
    NO_FILTER,
    WHOLE_RECORDING,
    CallPath,
    FilteredStacks,
    FunctionLabels,
)
from rsprof.storage.live.rows import CallNode, CpuRow, Neighbour, PeekInfo, Series
from rsprof.storage.samples import Frame, TimeRange

_CHUNK = 500  # stack ids per statement


class CpuModel:
    """The CPU samples of the followed file (`cpu_stack_samples`, one per sample). The
    wall-clock model (`storage.live.wall.WallModel`) is this model over another table of
    weighted stacks: subclasses override `source()` and `load_stacks()`."""

    ROOT_NAME = "all samples"  # the call tree's root

    def __init__(self, file: FollowedFile, labels: FunctionLabels, trend_len: int) -> None:
        self.file = file
        self.labels = labels
        self.trend_len = trend_len
        self.thread: int | None = None
        self._frames: dict[int, tuple[Frame, ...]] = {}  # stack id -> frames, leaf first
        self._paths: dict[int, CallPath] = {}
        self._filtered: FilteredStacks[CallPath] = FilteredStacks()
        self.reset(None)

    def reset(self, thread: int | None) -> None:
        """Forgets the counts (for another thread); function keys stay."""
        self.thread = thread
        self.last_id = 0
        self._self: list[int] = []
        self._total: list[int] = []
        self._stack_counts: dict[int, int] = {}
        self._sum = 0
        self.labels.forget_counts()
        # The last checkpoints, per function (the unfiltered table) and per stack (filtered)
        self._ring: deque[dict[int, int]] = deque(maxlen=self.trend_len)
        self._stack_ring: deque[dict[int, int]] = deque(maxlen=self.trend_len)

    # -- reading ------------------------------------------------------------------------------

    def source(self) -> str:
        """The FROM clause of the weighted stacks: columns checkpoint_id, stack_id, tid and
        count (the weight)."""
        return "cpu_stack_samples"

    def whole_from_checkpoints(self) -> bool:
        """Whether `checkpoints.samples` is the whole process's weight per checkpoint."""
        return True

    def load_stacks(self, stack_ids: list[int]) -> dict[int, tuple[Frame, ...]]:
        """Frames of the source's stack ids, leaf first."""
        return self.file.frames.stacks(stack_ids)

    def _load(self, stack_ids: set[int]) -> None:
        missing = sorted(stack_ids - self._paths.keys())
        for start in range(0, len(missing), _CHUNK):
            chunk = missing[start:start + _CHUNK]
            loaded = self.load_stacks(chunk)
            for stack_id in chunk:
                frames = loaded.get(stack_id, ())
                self._frames[stack_id] = frames
                self._paths[stack_id] = self.labels.path(frames)

    def _stack_rows(self, since: int, upto: int, grouped: bool) -> list[tuple[int, ...]]:
        """(stack_id, count) (grouped) or (checkpoint_id, stack_id, count) in (since, upto]."""
        where = "checkpoint_id > ? AND checkpoint_id <= ?"
        params: tuple[int, ...] = (since, upto)
        if self.thread is not None:
            where += " AND tid = ?"
            params += (self.thread,)
        columns = "stack_id" if grouped else "checkpoint_id, stack_id"
        rows = self.file.rows(
            f"SELECT {columns}, SUM(count) FROM {self.source()} WHERE {where}"
            f" GROUP BY {columns}", params)
        self._load({row[-2] for row in rows})
        return rows

    def _add(self, stack_id: int, count: int) -> CallPath:
        stack = self._paths[stack_id]
        self._sum += count
        self._stack_counts[stack_id] = self._stack_counts.get(stack_id, 0) + count
        if not stack.path:
            return stack
        grow = len(self.labels.entries.entries) - len(self._self)
        if grow > 0:
            self._self.extend([0] * grow)
            self._total.extend([0] * grow)
        leaf = stack.path[0]
        self._self[leaf] += count
        for key in stack.distinct:
            self._total[key] += count
        assert stack.leaf_line is not None
        self.labels.count_leaf(leaf, stack.leaf_line, count)
        return stack

    def read(self, last: int) -> None:
        """Adds the checkpoints up to id `last`."""
        bulk_to, ids = self.file.split_unread(self.last_id, last, self.trend_len)
        if bulk_to > self.last_id:
            for stack_id, count in self._stack_rows(self.last_id, bulk_to, grouped=True):
                self._add(stack_id, count)
        if ids:
            per_function: dict[int, dict[int, int]] = {cid: {} for cid in ids}
            per_stack: dict[int, dict[int, int]] = {cid: {} for cid in ids}
            for cid, stack_id, count in self._stack_rows(bulk_to, last, grouped=False):
                stack = self._add(stack_id, count)
                per_stack[cid][stack_id] = count
                slot = per_function[cid]
                for key in stack.distinct:
                    slot[key] = slot.get(key, 0) + count
            for cid in ids:
                self._ring.append(per_function[cid])
                self._stack_ring.append(per_stack[cid])
        self.last_id = last

    # -- the filters --------------------------------------------------------------------------

    def call_path(self, stack_id: int, filters: FrameFilter) -> CallPath | None:
        """The stack's call path after the filters; None when they drop its samples."""
        if not filters.active:
            return self._paths[stack_id]
        return self._filtered.get(stack_id, self._frames[stack_id], filters, self.labels.path)

    def stack_weights(self, time_range: TimeRange) -> dict[int, int]:
        """Samples per stack id of the thread shown in `time_range`."""
        if time_range == WHOLE_RECORDING:
            return dict(self._stack_counts)
        lo, hi = self.file.range_indexes(time_range)
        if lo >= hi:
            return {}
        ids = self.file.checkpoint_ids
        return dict(self._stack_rows(ids[lo] - 1, ids[hi - 1], grouped=True))  # type: ignore[arg-type]

    # -- results ------------------------------------------------------------------------------

    def rows(self, filters: FrameFilter = NO_FILTER,
             time_range: TimeRange = WHOLE_RECORDING) -> list[CpuRow]:
        """Every function with samples (unsorted), in key order. Trends have `trend_len`
        values, oldest first (0 while fewer checkpoints exist); Live % and Trend are the
        last checkpoints', whatever the range."""
        if filters.active or time_range != WHOLE_RECORDING:
            return self._selected_rows(filters, time_range)
        ring = trends(self._ring, self.trend_len, None)
        last = self._ring[-1] if self._ring else {}
        return self._make_rows(self._self, self._total, last, ring, self._sum)

    def _selected_rows(self, filters: FrameFilter, time_range: TimeRange) -> list[CpuRow]:
        weights = self.stack_weights(time_range)
        size = len(self.labels.entries.entries)
        own, total = [0] * size, [0] * size
        for stack_id, count in weights.items():
            stack = self.call_path(stack_id, filters)
            if stack is None or not stack.path:
                continue
            own[stack.path[0]] += count
            for key in stack.distinct:
                total[key] += count
        ring: deque[dict[int, int]] = deque()
        for slot in self._stack_ring:
            per_function: dict[int, int] = {}
            for stack_id, count in slot.items():
                stack = self.call_path(stack_id, filters)
                if stack is not None:
                    for key in stack.distinct:
                        per_function[key] = per_function.get(key, 0) + count
            ring.append(per_function)
        last = ring[-1] if ring else {}
        return self._make_rows(own, total, last, trends(ring, self.trend_len, None),
                               sum(weights.values()))

    def _make_rows(self, own: list[int], total: list[int], last: dict[int, int],
                   ring: dict[int, list[int]], base: int) -> list[CpuRow]:
        whole = base or 1
        last_whole = sum(self._stack_ring[-1].values()) if self._stack_ring else 0
        last_whole = last_whole or 1
        zero = (0,) * self.trend_len
        labels = self.labels
        rows = []
        for key, samples in enumerate(total):
            if not samples:
                continue
            mine = own[key]
            live = last.get(key, 0)
            trend = ring.get(key)
            rows.append(CpuRow(
                key, labels.name(key), labels.location(key), mine, samples, live,
                100.0 * mine / whole, 100.0 * samples / whole, 100.0 * live / last_whole,
                tuple(trend) if trend is not None else zero,
            ))
        return rows

    def call_tree(self, time_range: TimeRange, filters: FrameFilter) -> CallNode:
        """The top-down call tree of the thread shown: the root holds every selected sample,
        children heaviest first; `base_samples` is every sample before the filters."""
        weights = self.stack_weights(time_range)
        paths = ((self.call_path(stack_id, filters), count) for stack_id, count in weights.items())
        root = call_tree((stack.path, count) for stack, count in paths if stack is not None)
        return self.labels.tree(root, self.ROOT_NAME, sum(weights.values()))

    def peek(self, key: int, time_range: TimeRange, filters: FrameFilter) -> PeekInfo:
        """Callers and callees of function `key` (pprof's -peek): each edge counted once
        per sample, with its share of the function's total samples."""
        weights = self.stack_weights(time_range)
        flat: dict[int, int] = {}
        total: dict[int, int] = {}
        callers: dict[int, dict[int, int]] = {}
        callees: dict[int, dict[int, int]] = {}
        wanted = key.__eq__
        for stack_id, count in weights.items():
            stack = self.call_path(stack_id, filters)
            if stack is not None and key in stack.distinct:
                count_neighbours(stack.path, count, wanted, flat, total, callers, callees)
        whole = total.get(key, 0)
        labels = self.labels

        def edges(found: dict[int, int]) -> tuple[Neighbour, ...]:
            # ties by name, as `rsprof peek` orders them
            items = sorted(found.items(), key=lambda kv: (-kv[1], labels.name(kv[0])))
            return tuple(Neighbour(k, labels.name(k), labels.location(k), n,
                                   100.0 * n / whole if whole else 0.0) for k, n in items)

        return PeekInfo(key, labels.name(key), labels.location(key), flat.get(key, 0), whole,
                        sum(weights.values()), edges(callers.get(key, {})),
                        edges(callees.get(key, {})))

    def series(self, key: int, start_ms: int, end_ms: int, bucket_ms: int,
               filters: FrameFilter) -> Series:
        """Total % of function `key` (samples with it on the stack, after the filters, / all
        samples of the thread shown) per bucket, for checkpoints in (start_ms, end_ms]."""
        bucket_ms = max(1, bucket_ms)
        lo, hi = self.file.window_indexes(start_ms, end_ms)
        if lo >= hi:
            return Series(start_ms, end_ms, bucket_ms, ())
        ids, stamps = self.file.checkpoint_ids, self.file.timestamps
        where = "checkpoint_id BETWEEN ? AND ?"
        params: tuple[int, ...] = (ids[lo], ids[hi - 1])
        if self.thread is not None:
            where += " AND tid = ?"
            params += (self.thread,)
        # Every stack of the thread shown up to the last refresh is loaded already.
        wanted = set()
        for stack_id in self._paths:
            stack = self.call_path(stack_id, filters)
            if stack is not None and key in stack.distinct:
                wanted.add(stack_id)
        selected: dict[int, int] = {}
        if len(wanted) <= 2000:
            marks = ",".join("?" * len(wanted))
            selected = dict(self.file.rows(
                f"SELECT checkpoint_id, SUM(count) FROM {self.source()} WHERE {where}"
                f" AND stack_id IN ({marks}) GROUP BY checkpoint_id", (*params, *wanted)))
        else:  # too many for one statement's parameters: pick them here
            for cid, stack_id, count in self.file.rows(
                    f"SELECT checkpoint_id, stack_id, SUM(count) FROM {self.source()}"
                    f" WHERE {where} GROUP BY 1, 2", params):
                if stack_id in wanted:
                    selected[cid] = selected.get(cid, 0) + count
        if self.thread is None and self.whole_from_checkpoints():
            whole = {ids[i]: self.file.checkpoint_samples[i] for i in range(lo, hi)}
        else:
            whole = dict(self.file.rows(
                f"SELECT checkpoint_id, SUM(count) FROM {self.source()} WHERE {where}"
                " GROUP BY checkpoint_id", params))
        sums: dict[int, list[int]] = {}
        for i in range(lo, hi):
            cid = ids[i]
            acc = sums.setdefault((stamps[i] - start_ms - 1) // bucket_ms, [0, 0, 0])
            acc[0] += selected.get(cid, 0)
            acc[1] += whole.get(cid, 0)
            acc[2] = stamps[i]
        values = [(ts, 100.0 * n / d if d else 0.0) for n, d, ts in sums.values()]
        return Series(start_ms, end_ms, bucket_ms, self.file.bucketize(start_ms, bucket_ms, values))
