"""Incremental, read-only reader of a profile file: every query the TUI makes.

`LiveProfile` opens the file read-only (`file:...?mode=ro`), so it can follow a file that a
recorder is still writing (WAL mode, one commit per checkpoint). Each `refresh()` reads only
the checkpoints newer than the last one it saw and keeps, per function (CPU) and per call
site (heap), running totals, the last interval's value and a bounded ring of recent
per-checkpoint values for sparklines. Older history is never kept in memory: charts query
the file for the window they show (`cpu_series`, `heap_series`).

All public methods take one lock, so a LiveProfile may be used from any thread (one at a
time); its connection is opened with `check_same_thread=False` for that reason.
"""

from __future__ import annotations

import sqlite3
import threading
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from rsprof.storage.callgraph import TreeNode, call_tree, count_neighbours
from rsprof.storage.callsite import call_site_position
from rsprof.storage.schema import u64_from_sql

TREND_LEN = 12
"""Checkpoints kept per function for the Trend sparkline."""

_BULK_THRESHOLD = 2 * TREND_LEN
"""Above this many unread checkpoints, older ones are aggregated in SQL, not row by row."""


@dataclass(frozen=True, slots=True)
class ProfileInfo:
    """What `meta` says about the recording."""

    pid: int | None = None
    process_name: str = ""
    cmdline: str = ""
    start_time_ms: int | None = None
    end_time_ms: int | None = None
    state: str = ""
    stop_reason: str | None = None
    heap_mode: str = "none"
    interval_ms: int = 1000
    target_exit_code: int | None = None
    kernel_sampled: bool = True  # False: time in the kernel was not allowed to be sampled


@dataclass(frozen=True, slots=True)
class CheckpointSummary:
    """Totals over every checkpoint read so far."""

    count: int = 0
    last_id: int = 0
    first_timestamp_ms: int | None = None
    last_timestamp_ms: int | None = None
    samples: int = 0
    lost_samples: int = 0
    last_samples: int = 0
    target_cpu_pct: float | None = None
    target_rss_bytes: int | None = None


class CpuRow(NamedTuple):
    """One function (a name in a module, as `rsprof top cpu` counts them).

    self: samples whose innermost frame is in the function; total: samples with the
    function anywhere on the stack, once per sample even under recursion (`top`'s Self and
    Total). live: total samples in the last checkpoint interval; trend: total samples in
    each of the last checkpoints. Percentages are of every sample of the thread shown.

    (A NamedTuple: the table may hold 10 000 of them, rebuilt at every refresh.)"""

    key: int
    function: str
    location: str
    self_samples: int
    total_samples: int
    live_samples: int
    self_pct: float
    total_pct: float
    live_pct: float
    trend: tuple[int, ...]


class HeapRow(NamedTuple):
    """One allocation call site."""

    key: int
    function: str
    location: str
    live_bytes: int
    alloc_bytes: int
    alloc_count: int
    free_bytes: int
    free_count: int
    trend: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    tid: int
    name: str
    samples: int
    exited: bool
    pid: int | None = None  # its process (a recording that followed children has several)
    process: str = ""  # that process's command, its latest program


@dataclass(frozen=True, slots=True)
class Neighbour:
    """A caller or callee of a peeked function: samples with that call edge on the stack."""

    key: int
    function: str
    location: str
    samples: int
    pct: float  # of the peeked function's total samples


@dataclass(frozen=True, slots=True)
class PeekInfo:
    """pprof's peek for one function: its self and total samples, who calls it, whom it calls."""

    key: int
    function: str
    location: str
    self_samples: int
    total_samples: int
    all_samples: int  # every sample of the range and thread (the percentages' base)
    callers: tuple[Neighbour, ...]
    callees: tuple[Neighbour, ...]


@dataclass(frozen=True, slots=True)
class CallNode:
    """A node of the top-down call tree: `path` is the function keys from the root."""

    path: tuple[int, ...]
    key: int
    function: str
    location: str
    total_samples: int
    self_samples: int
    children: tuple[CallNode, ...]
    base_samples: int = 0  # the root: every sample before a focus (what percentages are of)


@dataclass(frozen=True, slots=True)
class HeapTimeline:
    """Live bytes of the whole heap over time: (ms since start, bytes) at bucket ends,
    each bucket its highest value, so a short peak is never averaged away. Live bytes are
    what the allocator shim saw allocated and not yet freed (not the process's RSS)."""

    points: tuple[tuple[float, int], ...]
    peak_bytes: int
    peak_offset_ms: int | None  # when the peak was first reached, since the start
    current_bytes: int


@dataclass(frozen=True, slots=True)
class Series:
    """A chart's data: `points` are (seconds since recording start, value), one per bucket."""

    start_ms: int
    end_ms: int
    bucket_ms: int
    points: tuple[tuple[float, float], ...]


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _location_text(file: str, line: int) -> str:
    if not file:
        return "?"
    return f"{file}:{line}" if line else file


class _Named(NamedTuple):
    """A location as storage.callsite's rules read it (function name, source file)."""

    function: str
    file: str


class _Stack(NamedTuple):
    """A stored stack in function keys: leaf first, inline levels each their own entry."""

    leaf: int  # function key of the innermost frame
    leaf_location: int  # its location id
    path: tuple[int, ...]
    distinct: tuple[int, ...]  # each function once (inclusive counts)


class LiveProfile:
    """Follows one profile file; see the module docstring."""

    def __init__(self, path: str | Path, *, trend_len: int = TREND_LEN) -> None:
        self.path = str(path)
        self.trend_len = trend_len
        self._lock = threading.RLock()
        self._conn = self._connect()
        self.info = ProfileInfo()
        self.thread: int | None = None
        self._loc: dict[int, tuple[str, str, int]] = {}
        self._loc_text: dict[int, str] = {}
        self._max_loc_id = 0
        # checkpoints
        self._cp_ids = array("q")
        self._cp_ts = array("q")
        self._cp_samples = array("q")
        self._lost = 0
        self._samples = 0
        self._cpu_pct: float | None = None
        self._rss: int | None = None
        self._thread_samples: dict[int, int] = {}
        self._threads_last_id = 0
        self._threads: list[ThreadInfo] = []
        # functions (CPU rows): id = index into these lists. A function is a name in a
        # module, as `rsprof top cpu` (storage.granularity, "functions") counts it.
        self._fn_index: dict[tuple[str, int | None], int] = {}
        self._fn_name: list[str] = []
        self._fn_locs: list[list[int]] = []
        self._fn_best_loc: list[int] = []
        self._loc_fid: dict[int, int] = {}
        self._loc_module: dict[int, int | None] = {}
        self._stacks: dict[int, _Stack] = {}
        # heap: allocating stacks cut at the call site (storage.callsite), as function keys,
        # and per stack [live bytes, allocated bytes] over the whole recording
        self._heap_paths: dict[int, tuple[int, ...]] = {}
        self._heap_site_of: dict[int, int] = {}  # stack id -> call-site location id
        self._has_heap_threads: bool | None = None  # heap_thread_samples exists
        self._reset_cpu()
        self._reset_heap()

    # -- connection -----------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if not Path(self.path).exists():
            raise FileNotFoundError(self.path)
        uri = f"file:{Path(self.path).resolve()}?mode=ro"
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

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- state ----------------------------------------------------------------------------

    def _reset_cpu(self) -> None:
        """Forgets CPU numbers; function ids (row keys) stay stable for the file's lifetime."""
        self._cpu_last_id = 0
        self._fn_self = [0] * len(self._fn_name)
        self._fn_total = [0] * len(self._fn_name)
        self._loc_total: dict[int, int] = {}
        self._stack_counts: dict[int, int] = {}
        self._cpu_sum = 0
        self._cpu_last: dict[int, int] = {}
        self._cpu_last_sum = 0
        self._cpu_ring: deque[dict[int, int]] = deque(maxlen=self.trend_len)

    def _reset_heap(self) -> None:
        """Forgets heap numbers (all of them follow the thread shown)."""
        self._heap_stack_bytes: dict[int, list[int]] = {}
        self._heap_stack_last_id = 0
        # whole-heap live bytes after each checkpoint (aligned with _cp_ids)
        self._heap_tl = array("q")
        self._tl_site: dict[int, int] = {}
        self._tl_total = 0
        self._tl_last_id = 0
        # one thread's live bytes per site, summed here (heap_site_samples has all threads)
        self._th_site_live: dict[int, int] = {}
        self._tl_thread_live: dict[int, int] = {}
        self._heap_last_id = 0
        # location id -> [alloc_bytes, alloc_count, free_bytes, free_count, live_bytes]
        self._heap: dict[int, list[int]] = {}
        self._heap_ring: deque[dict[int, int]] = deque(maxlen=self.trend_len)
        self._heap_base: dict[int, int] = {}

    def set_thread(self, tid: int | None) -> None:
        """Restricts CPU and heap numbers to one thread (None: all threads); the heap by
        the thread that allocated, when the file keeps it (`heap_by_thread`).

        The next `refresh()` re-reads the file for that thread.
        """
        with self._lock:
            if tid != self.thread:
                self.thread = tid
                self._reset_cpu()
                self._reset_heap()

    @property
    def heap_by_thread(self) -> bool:
        """The file keeps heap data per allocating thread (heap_thread_samples)."""
        with self._lock:
            if self._has_heap_threads is None:
                self._has_heap_threads = bool(self._conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE name = 'heap_thread_samples'"
                ).fetchall())
            return self._has_heap_threads

    def _heap_thread(self) -> int | None:
        """The thread the heap numbers are restricted to, if any."""
        return self.thread if self.thread is not None and self.heap_by_thread else None

    def _thread_site_rows(
        self, since: int, last: int, running: dict[int, int]
    ) -> list[tuple[int, int, int, int, int, int, int]]:
        """Rows shaped like heap_site_samples' (checkpoint_id, location_id, alloc_bytes,
        alloc_count, free_bytes, free_count, live_bytes) in (since, last], of the thread
        shown: its stacks' rows grouped by call site, live bytes summed here in `running`
        (site -> live bytes so far; the table and the timeline each keep their own)."""
        rows = self._conn.execute(
            "SELECT checkpoint_id, stack_id, SUM(alloc_bytes), SUM(alloc_count),"
            " SUM(free_bytes), SUM(free_count) FROM heap_thread_samples"
            " WHERE tid = ? AND checkpoint_id > ? AND checkpoint_id <= ?"
            " GROUP BY 1, 2 ORDER BY 1",
            (self.thread, since, last),
        ).fetchall()
        self._ensure_heap_paths(r[1] for r in rows)
        per: dict[tuple[int, int], list[int]] = {}
        for cid, sid, ab, ac, fb, fc in rows:
            acc = per.setdefault((cid, self._heap_site_of[sid]), [0, 0, 0, 0])
            acc[0] += ab
            acc[1] += ac
            acc[2] += fb
            acc[3] += fc
        out = []
        for (cid, lid), (ab, ac, fb, fc) in per.items():  # in checkpoint order
            live = running[lid] = running.get(lid, 0) + ab - fb
            out.append((cid, lid, ab, ac, fb, fc, live))
        return out

    # -- refresh --------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Reads what was committed since the last call. Returns True if anything was new."""
        with self._lock:
            try:
                self._conn.execute("BEGIN")
            except sqlite3.OperationalError:
                return False
            try:
                return self._refresh_locked()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # the recorder has not created the schema yet
                    return False
                raise
            finally:
                self._conn.execute("COMMIT")

    def _refresh_locked(self) -> bool:
        old_info = self.info
        self.info = self._read_meta()
        new_cps = self._read_checkpoints()
        last = self._cp_ids[-1] if self._cp_ids else 0
        changed = new_cps or self.info != old_info
        if self._cpu_last_id < last:
            self._read_cpu(last)
            changed = True
        if self._heap_last_id < last:
            self._read_heap(last)
        if self._tl_last_id < last:
            self._read_heap_timeline(last)
        if self._heap_stack_last_id < last:
            self._read_heap_stacks(last)
        if new_cps:
            self._read_threads(last)
        return bool(changed)

    def _read_meta(self) -> ProfileInfo:
        meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        return ProfileInfo(
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
        )

    def _read_checkpoints(self) -> int:
        last = self._cp_ids[-1] if self._cp_ids else 0
        rows = self._conn.execute(
            "SELECT id, timestamp_ms, samples, lost_samples, target_cpu_pct, target_rss_bytes"
            " FROM checkpoints WHERE id > ? ORDER BY id",
            (last,),
        ).fetchall()
        for cid, ts, samples, lost, cpu_pct, rss in rows:
            self._cp_ids.append(cid)
            self._cp_ts.append(ts)
            self._cp_samples.append(samples)
            self._lost += lost
            self._samples += samples
            if cpu_pct is not None:
                self._cpu_pct = cpu_pct
            if rss is not None:
                self._rss = rss
        return len(rows)

    def _read_threads(self, last: int) -> None:
        for tid, count in self._conn.execute(
            "SELECT tid, SUM(count) FROM cpu_stack_samples"
            " WHERE checkpoint_id > ? AND checkpoint_id <= ? GROUP BY tid",
            (self._threads_last_id, last),
        ):
            self._thread_samples[tid] = self._thread_samples.get(tid, 0) + count
        self._threads_last_id = last
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(threads)")}
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
            for tid, name, exited, pid, command in self._conn.execute(sql)
        ]

    def _ensure_locations(self, ids: Iterable[int]) -> None:
        missing = [i for i in ids if i not in self._loc]
        if not missing:
            return
        for lid, fn, file, line, module in self._conn.execute(
            "SELECT id, function, file, line, module_id FROM locations WHERE id > ?",
            (self._max_loc_id,),
        ):
            self._loc[lid] = (fn, file or "", line or 0)
            self._loc_module[lid] = module
            self._max_loc_id = max(self._max_loc_id, lid)
        for lid in missing:
            if lid not in self._loc:
                row = self._conn.execute(
                    "SELECT function, file, line, module_id FROM locations WHERE id = ?", (lid,)
                ).fetchone()
                self._loc[lid] = (row[0], row[1] or "", row[2] or 0) if row else (f"#{lid}", "", 0)
                self._loc_module[lid] = row[3] if row else None

    def _location_text(self, lid: int) -> str:
        text = self._loc_text.get(lid)
        if text is None:
            _fn, file, line = self._loc[lid]
            text = self._loc_text[lid] = _location_text(file, line)
        return text

    def _fid(self, lid: int) -> int:
        fid = self._loc_fid.get(lid)
        if fid is not None:
            return fid
        fn = self._loc[lid][0]
        ident = (fn, self._loc_module.get(lid))
        fid = self._fn_index.get(ident)
        if fid is None:
            fid = len(self._fn_name)
            self._fn_index[ident] = fid
            self._fn_name.append(fn)
            self._fn_locs.append([])
            self._fn_self.append(0)
            self._fn_total.append(0)
            self._fn_best_loc.append(lid)
        self._fn_locs[fid].append(lid)
        self._loc_fid[lid] = fid
        return fid

    def _ensure_stacks(self, ids: Iterable[int]) -> None:
        """Loads the stacks not known yet, as function keys (stacks never change)."""
        missing = sorted({i for i in ids if i not in self._stacks})
        for chunk_start in range(0, len(missing), 500):
            chunk = missing[chunk_start : chunk_start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._conn.execute(
                "SELECT sf.stack_id, fl.location_id FROM stack_frames sf"
                " JOIN frame_locations fl ON fl.frame_id = sf.frame_id"
                f" WHERE sf.stack_id IN ({marks})"
                " ORDER BY sf.stack_id, sf.position, fl.inline_depth",
                chunk,
            ).fetchall()
            self._ensure_locations(lid for _sid, lid in rows)
            paths: dict[int, list[int]] = {}
            for sid, lid in rows:
                paths.setdefault(sid, []).append(lid)
            for sid in chunk:
                lids = paths.get(sid)
                if not lids:  # an empty stack: nothing to attribute
                    self._stacks[sid] = _Stack(-1, 0, (), ())
                    continue
                path = tuple(self._fid(lid) for lid in lids)
                self._stacks[sid] = _Stack(path[0], lids[0], path, tuple(dict.fromkeys(path)))

    def _add_stack(self, sid: int, count: int) -> _Stack:
        stack = self._stacks[sid]
        self._cpu_sum += count
        self._stack_counts[sid] = self._stack_counts.get(sid, 0) + count
        if stack.leaf < 0:
            return stack
        leaf, lid = stack.leaf, stack.leaf_location
        self._fn_self[leaf] += count
        for fid in stack.distinct:
            self._fn_total[fid] += count
        total = self._loc_total.get(lid, 0) + count
        self._loc_total[lid] = total
        best = self._fn_best_loc[leaf]
        if best != lid and total > self._loc_total.get(best, 0):
            self._fn_best_loc[leaf] = lid
        return stack

    def _split(self, since: int, last: int) -> tuple[int, list[int]]:
        """Checkpoint ids in (since, last]: the id up to which to aggregate, then the rest."""
        lo = bisect_right(self._cp_ids, since)
        hi = bisect_right(self._cp_ids, last)
        ids = self._cp_ids[lo:hi].tolist()
        if len(ids) > _BULK_THRESHOLD:
            return ids[-self.trend_len - 1], ids[-self.trend_len :]
        return since, ids

    def _stack_rows(self, since: int, upto: int, grouped: bool) -> list[tuple[int, ...]]:
        """(stack_id, count) (grouped) or (checkpoint_id, stack_id, count) in (since, upto]."""
        where = "checkpoint_id > ? AND checkpoint_id <= ?"
        params: tuple[int, ...] = (since, upto)
        if self.thread is not None:
            where += " AND tid = ?"
            params += (self.thread,)
        if grouped:
            sql = f"SELECT stack_id, SUM(count) FROM cpu_stack_samples WHERE {where} GROUP BY 1"
        else:
            sql = (
                "SELECT checkpoint_id, stack_id, SUM(count) FROM cpu_stack_samples"
                f" WHERE {where} GROUP BY 1, 2"
            )
        return self._conn.execute(sql, params).fetchall()

    def _read_cpu(self, last: int) -> None:
        bulk_to, ids = self._split(self._cpu_last_id, last)
        if bulk_to > self._cpu_last_id:
            rows = self._stack_rows(self._cpu_last_id, bulk_to, grouped=True)
            self._ensure_stacks(r[0] for r in rows)
            for sid, count in rows:
                self._add_stack(sid, count)
        if ids:
            per_cp: dict[int, dict[int, int]] = {cid: {} for cid in ids}
            sums = dict.fromkeys(ids, 0)
            rows = self._stack_rows(bulk_to, last, grouped=False)
            self._ensure_stacks(r[1] for r in rows)
            for cid, sid, count in rows:
                stack = self._add_stack(sid, count)
                sums[cid] += count
                slot = per_cp[cid]
                for fid in stack.distinct:
                    slot[fid] = slot.get(fid, 0) + count
            for cid in ids:
                self._cpu_ring.append(per_cp[cid])
            self._cpu_last = per_cp[ids[-1]]
            self._cpu_last_sum = sums[ids[-1]]
        self._cpu_last_id = last

    def _ensure_heap_paths(self, ids: Iterable[int]) -> None:
        """Allocating stacks from their call site outwards: the shim's, allocator and
        runtime frames above the first user frame go (the rules of `rsprof top heap`)."""
        missing = sorted({i for i in ids if i not in self._heap_paths})
        for chunk_start in range(0, len(missing), 500):
            chunk = missing[chunk_start : chunk_start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._conn.execute(
                "SELECT sf.stack_id, sf.position, fl.location_id, COALESCE(m.path, ''),"
                " f.address"
                " FROM stack_frames sf JOIN frames f ON f.id = sf.frame_id"
                " LEFT JOIN modules m ON m.id = f.module_id"
                " JOIN frame_locations fl ON fl.frame_id = sf.frame_id"
                f" WHERE sf.stack_id IN ({marks})"
                " ORDER BY sf.stack_id, sf.position, fl.inline_depth",
                chunk,
            ).fetchall()
            self._ensure_locations(r[2] for r in rows)
            frames: dict[int, list[tuple[str, list[int]]]] = {}
            addresses: dict[int, list[int]] = {}
            previous: tuple[int, int] | None = None
            for sid, position, lid, module, address in rows:
                stack = frames.setdefault(sid, [])
                if previous != (sid, position):
                    stack.append((module, []))
                    addresses.setdefault(sid, []).append(u64_from_sql(address))
                    previous = (sid, position)
                stack[-1][1].append(lid)
            for sid in chunk:
                stack = frames.get(sid, [])
                named = [(module, [_Named(*self._loc[lid][:2]) for lid in lids])
                         for module, lids in stack]
                at = call_site_position(named, addresses.get(sid, ())) or (0, 0)
                lids = [lid for _m, chain in stack[at[0] :] for lid in chain][at[1] :]
                self._heap_paths[sid] = tuple(self._fid(lid) for lid in lids)
                # The call site, as the writer's heap_site_samples has it.
                flat = [lid for _m, chain in stack for lid in chain]
                self._heap_site_of[sid] = lids[0] if lids else (flat[0] if flat else -1)

    def _read_heap_stacks(self, last: int) -> None:
        tid = self._heap_thread()
        table, where = "heap_stack_samples", ""
        params: tuple[int, ...] = (self._heap_stack_last_id, last)
        if tid is not None:
            table, where, params = "heap_thread_samples", " AND tid = ?", (*params, tid)
        rows = self._conn.execute(
            "SELECT stack_id, SUM(alloc_bytes) - SUM(free_bytes), SUM(alloc_bytes)"
            f" FROM {table} WHERE checkpoint_id > ? AND checkpoint_id <= ?{where}"
            " GROUP BY stack_id",
            params,
        ).fetchall()
        for sid, live, allocated in rows:
            acc = self._heap_stack_bytes.setdefault(sid, [0, 0])
            acc[0] += live
            acc[1] += allocated
        self._heap_stack_last_id = last

    def _read_heap_timeline(self, last: int) -> None:
        """Whole-heap live bytes after each new checkpoint: each site's row holds its live
        bytes when it changed, so the total moves by the difference to its previous row."""
        changes: dict[int, int] = {}
        site_rows: list[tuple[int, int, int]]
        if self._heap_thread() is not None:
            site_rows = [(r[0], r[1], r[6]) for r in self._thread_site_rows(
                self._tl_last_id, last, self._tl_thread_live)]
        else:
            site_rows = self._conn.execute(
                "SELECT checkpoint_id, location_id, live_bytes FROM heap_site_samples"
                " WHERE checkpoint_id > ? AND checkpoint_id <= ? ORDER BY checkpoint_id",
                (self._tl_last_id, last),
            ).fetchall()
        for cid, lid, live in site_rows:
            self._tl_total += live - self._tl_site.get(lid, 0)
            self._tl_site[lid] = live
            changes[cid] = self._tl_total
        lo = bisect_right(self._cp_ids, self._tl_last_id)
        hi = bisect_right(self._cp_ids, last)
        value = self._heap_tl[-1] if self._heap_tl else 0
        for i in range(lo, hi):
            value = changes.get(self._cp_ids[i], value)
            self._heap_tl.append(value)
        self._tl_last_id = last

    def _read_heap(self, last: int) -> None:
        if self._heap_thread() is not None:
            self._read_thread_heap(last)
            return
        bulk_to, ids = self._split(self._heap_last_id, last)
        if bulk_to > self._heap_last_id:
            for slot in self._heap_ring:
                self._heap_base.update(slot)
            self._heap_ring.clear()
            rows = self._conn.execute(
                "SELECT location_id, SUM(alloc_bytes), SUM(alloc_count), SUM(free_bytes),"
                " SUM(free_count), MAX(checkpoint_id), live_bytes FROM heap_site_samples"
                " WHERE checkpoint_id > ? AND checkpoint_id <= ? GROUP BY location_id",
                (self._heap_last_id, bulk_to),
            ).fetchall()
            self._ensure_locations(r[0] for r in rows)
            for lid, ab, ac, fb, fc, _cid, live in rows:
                self._add_heap(lid, ab, ac, fb, fc, live)
                self._heap_base[lid] = live
        if ids:
            per_cp: dict[int, dict[int, int]] = {cid: {} for cid in ids}
            rows = self._conn.execute(
                "SELECT checkpoint_id, location_id, alloc_bytes, alloc_count, free_bytes,"
                " free_count, live_bytes FROM heap_site_samples"
                " WHERE checkpoint_id > ? AND checkpoint_id <= ?",
                (bulk_to, last),
            ).fetchall()
            self._ensure_locations(r[1] for r in rows)
            for cid, lid, ab, ac, fb, fc, live in rows:
                self._add_heap(lid, ab, ac, fb, fc, live)
                per_cp[cid][lid] = live
            for cid in ids:
                if len(self._heap_ring) == self._heap_ring.maxlen:
                    self._heap_base.update(self._heap_ring[0])
                self._heap_ring.append(per_cp[cid])
        self._heap_last_id = last

    def _read_thread_heap(self, last: int) -> None:
        """_read_heap for one thread: the same sums from heap_thread_samples."""
        rows = self._thread_site_rows(self._heap_last_id, last, self._th_site_live)
        per_cp: dict[int, dict[int, int]] = {}
        for cid, lid, ab, ac, fb, fc, live in rows:
            self._add_heap(lid, ab, ac, fb, fc, live)
            per_cp.setdefault(cid, {})[lid] = live
        lo = bisect_right(self._cp_ids, self._heap_last_id)
        hi = bisect_right(self._cp_ids, last)
        split = max(lo, hi - self.trend_len)
        for cid in self._cp_ids[lo:split]:
            self._heap_base.update(per_cp.get(cid, {}))
        for cid in self._cp_ids[split:hi]:
            if len(self._heap_ring) == self._heap_ring.maxlen:
                self._heap_base.update(self._heap_ring[0])
            self._heap_ring.append(per_cp.get(cid, {}))
        self._heap_last_id = last

    def _add_heap(self, lid: int, ab: int, ac: int, fb: int, fc: int, live: int) -> None:
        site = self._heap.get(lid)
        if site is None:
            self._heap[lid] = [ab, ac, fb, fc, live]
        else:
            site[0] += ab
            site[1] += ac
            site[2] += fb
            site[3] += fc
            site[4] = live

    # -- results --------------------------------------------------------------------------

    def summary(self) -> CheckpointSummary:
        with self._lock:
            if not self._cp_ids:
                return CheckpointSummary(target_cpu_pct=self._cpu_pct, target_rss_bytes=self._rss)
            return CheckpointSummary(
                count=len(self._cp_ids),
                last_id=self._cp_ids[-1],
                first_timestamp_ms=self._cp_ts[0],
                last_timestamp_ms=self._cp_ts[-1],
                samples=self._samples,
                lost_samples=self._lost,
                last_samples=self._cp_samples[-1],
                target_cpu_pct=self._cpu_pct,
                target_rss_bytes=self._rss,
            )

    def threads(self) -> list[ThreadInfo]:
        with self._lock:
            return list(self._threads)

    @property
    def has_heap_data(self) -> bool:
        """The file has heap data (of any thread: a thread that allocated nothing shows
        an empty table, not the "how to get heap data" text)."""
        with self._lock:
            if self._heap:
                return True
            if self._heap_thread() is None:
                return False
            return bool(self._conn.execute("SELECT 1 FROM heap_site_samples LIMIT 1").fetchall())

    def _trends(
        self, ring: deque[dict[int, int]], carry: dict[int, int] | None
    ) -> dict[int, list[int]]:
        n = self.trend_len
        pad = n - len(ring)
        trends: dict[int, list[int]] = {}
        for i, slot in enumerate(ring, start=pad):
            for key, value in slot.items():
                arr = trends.get(key)
                if arr is None:
                    arr = trends[key] = [-1] * n if carry is not None else [0] * n
                arr[i] = value
        if carry is not None:
            for key, arr in trends.items():
                prev = carry.get(key, 0)
                for i in range(pad, n):
                    if arr[i] < 0:
                        arr[i] = prev
                    prev = arr[i]
                for i in range(pad):
                    arr[i] = 0
        return trends

    def cpu_rows(self) -> list[CpuRow]:
        """Every function with samples (unsorted), in key order. Trends have `trend_len`
        values, oldest first; the first ones are 0 while fewer checkpoints exist."""
        with self._lock:
            trends = self._trends(self._cpu_ring, None)
            zero = (0,) * self.trend_len
            total = self._cpu_sum or 1
            last_total = self._cpu_last_sum or 1
            last = self._cpu_last
            rows = []
            for fid, samples in enumerate(self._fn_total):
                if not samples:
                    continue
                own = self._fn_self[fid]
                live = last.get(fid, 0)
                trend = trends.get(fid)
                rows.append(
                    CpuRow(
                        fid,
                        self._fn_name[fid],
                        self._location_text(self._fn_best_loc[fid]),
                        own,
                        samples,
                        live,
                        100.0 * own / total,
                        100.0 * samples / total,
                        100.0 * live / last_total,
                        tuple(trend) if trend is not None else zero,
                    )
                )
            return rows

    # -- call graph -----------------------------------------------------------------------

    def _stack_weights(self, start_ms: int | None, end_ms: int | None) -> dict[int, int]:
        """Samples per stack id of the thread shown: the whole recording read so far, or
        the checkpoints with timestamps in (start_ms, end_ms]."""
        if start_ms is None or end_ms is None:
            return dict(self._stack_counts)
        lo, hi = self._window_ids(start_ms, end_ms)
        if lo >= hi:
            return {}
        rows = self._stack_rows(self._cp_ids[lo] - 1, self._cp_ids[hi - 1], grouped=True)
        self._ensure_stacks(r[0] for r in rows)
        return dict(rows)  # type: ignore[arg-type]

    def function_label(self, key: int) -> tuple[str, str]:
        """(name, location) of function `key`."""
        with self._lock:
            if not 0 <= key < len(self._fn_name):
                return "?", "?"
            return self._fn_name[key], self._location_text(self._fn_best_loc[key])

    def call_tree(
        self, start_ms: int | None = None, end_ms: int | None = None, focus: str = ""
    ) -> CallNode:
        """The top-down call tree of the thread shown (whole recording, or a time window):
        the root holds every sample; children are heaviest first. `focus`: only the samples
        with a function whose name contains it (case-insensitive) on the stack, as
        `--filter` (pprof's -focus) keeps them."""
        with self._lock:
            weights = self._stack_weights(start_ms, end_ms)
            base = sum(weights.values())
            if focus:
                needle = focus.lower()
                hits = {f for f, name in enumerate(self._fn_name) if needle in name.lower()}
                weights = {sid: n for sid, n in weights.items()
                           if not hits.isdisjoint(self._stacks[sid].distinct)}
            root = call_tree((self._stacks[sid].path, n) for sid, n in weights.items())
            return replace(self._convert_tree(root, "all samples"), base_samples=base)

    def _convert_tree(self, root: TreeNode, root_name: str) -> CallNode:
        def convert(node: TreeNode, path: tuple[int, ...]) -> CallNode:
            name, where = (root_name, "") if node.key < 0 else (
                self._fn_name[node.key], self._location_text(self._fn_best_loc[node.key]))
            return CallNode(
                path, node.key, name, where, node.total, node.self,
                tuple(convert(c, (*path, c.key)) for c in node.sorted_children()),
            )

        return convert(root, ())

    def peek(self, key: int, start_ms: int | None = None, end_ms: int | None = None) -> PeekInfo:
        """Callers and callees of function `key` (pprof's -peek): each edge counted once
        per sample, with its share of the function's total samples."""
        with self._lock:
            weights = self._stack_weights(start_ms, end_ms)
            flat: dict[int, int] = {}
            total: dict[int, int] = {}
            callers: dict[int, dict[int, int]] = {}
            callees: dict[int, dict[int, int]] = {}
            wanted = key.__eq__
            for sid, n in weights.items():
                stack = self._stacks[sid]
                if key in stack.distinct:
                    count_neighbours(stack.path, n, wanted, flat, total, callers, callees)
            whole = total.get(key, 0)

            def edges(found: dict[int, int]) -> tuple[Neighbour, ...]:
                # ties by name, as `rsprof peek` orders them
                items = sorted(found.items(), key=lambda kv: (-kv[1], self._fn_name[kv[0]]))
                return tuple(
                    Neighbour(k, self._fn_name[k], self._location_text(self._fn_best_loc[k]),
                              n, 100.0 * n / whole if whole else 0.0)
                    for k, n in items
                )

            name, where = ("?", "?") if not 0 <= key < len(self._fn_name) else (
                self._fn_name[key], self._location_text(self._fn_best_loc[key]))
            return PeekInfo(
                key, name, where, flat.get(key, 0), whole, sum(weights.values()),
                edges(callers.get(key, {})), edges(callees.get(key, {})),
            )

    # -- heap -----------------------------------------------------------------------------

    def heap_tree(self, allocated: bool = False) -> CallNode:
        """The top-down tree of allocating stacks (cut at the call site) by live bytes (or
        bytes allocated): a node's total is the bytes allocated under it, its self the bytes
        allocated right there (a call site). Whole recording, of the thread shown (by the
        thread that allocated)."""
        with self._lock:
            self._ensure_heap_paths(self._heap_stack_bytes)
            index = 1 if allocated else 0
            root = call_tree(
                (self._heap_paths[sid], max(0, b[index]))
                for sid, b in self._heap_stack_bytes.items()
            )
            return self._convert_tree(root, "all live bytes")

    def heap_timeline(self, points: int = 120) -> HeapTimeline:
        """Whole-heap live bytes over the recording, in at most `points` buckets."""
        with self._lock:
            n = len(self._heap_tl)
            if not n:
                return HeapTimeline((), 0, None, 0)
            t0 = self.info.start_time_ms
            if t0 is None:
                t0 = self._cp_ts[0] - self.info.interval_ms
            peak_i = max(range(n), key=self._heap_tl.__getitem__)
            # Exactly `points` buckets: a short recording's checkpoints are repeated (wide
            # bars), a long one's are merged (each bucket keeps its highest value).
            points = max(1, points)
            out = []
            for i in range(points):
                lo = i * n // points
                hi = max(lo + 1, (i + 1) * n // points)
                out.append((float(self._cp_ts[hi - 1] - t0), max(self._heap_tl[lo:hi])))
            return HeapTimeline(
                tuple(out), self._heap_tl[peak_i], self._cp_ts[peak_i] - t0, self._heap_tl[-1]
            )

    def heap_rows(self) -> list[HeapRow]:
        """Every allocation call site seen (unsorted); trends are of live bytes."""
        with self._lock:
            trends = self._trends(self._heap_ring, self._heap_base)
            pad = self.trend_len - len(self._heap_ring)
            rows = []
            for lid, (ab, ac, fb, fc, live) in self._heap.items():
                fn = self._loc[lid][0]
                trend = trends.get(lid)
                if trend is None:
                    base = self._heap_base.get(lid, live)
                    trend = [0] * pad + [base] * (self.trend_len - pad)
                rows.append(
                    HeapRow(lid, fn, self._location_text(lid), live, ab, ac, fb, fc, tuple(trend))
                )
            return rows

    # -- charts ---------------------------------------------------------------------------

    def _window_ids(self, start_ms: int, end_ms: int) -> tuple[int, int]:
        lo = bisect_right(self._cp_ts, start_ms)
        hi = bisect_right(self._cp_ts, end_ms)
        return lo, hi

    def _bucketize(
        self, start_ms: int, end_ms: int, bucket_ms: int, values: Iterable[tuple[int, float]]
    ) -> tuple[tuple[float, float], ...]:
        t0 = self.info.start_time_ms
        if t0 is None:
            t0 = self._cp_ts[0] - self.info.interval_ms if self._cp_ts else 0
        points: dict[int, float] = {}
        for ts, value in values:
            points[(ts - start_ms - 1) // bucket_ms] = value
        return tuple(
            ((start_ms + (b + 1) * bucket_ms - t0) / 1000.0, v) for b, v in sorted(points.items())
        )

    def cpu_series(self, key: int, start_ms: int, end_ms: int, bucket_ms: int) -> Series:
        """CPU % (total samples of function `key`, i.e. with it anywhere on the stack, / all
        samples, of the selected thread) per bucket of `bucket_ms` for checkpoints with
        timestamp in (start_ms, end_ms]."""
        bucket_ms = max(1, bucket_ms)
        with self._lock:
            lo, hi = self._window_ids(start_ms, end_ms)
            if lo >= hi or key >= len(self._fn_locs):
                return Series(start_ms, end_ms, bucket_ms, ())
            first, last = self._cp_ids[lo], self._cp_ids[hi - 1]
            where = "checkpoint_id BETWEEN ? AND ?"
            params: tuple[int, ...] = (first, last)
            if self.thread is not None:
                where += " AND tid = ?"
                params += (self.thread,)
            # Every stack of the thread shown up to the last refresh is loaded already.
            stacks = [sid for sid, st in self._stacks.items() if key in st.distinct]
            num: dict[int, int] = {}
            if len(stacks) <= 2000:
                marks = ",".join("?" * len(stacks))
                num = dict(self._conn.execute(
                    f"SELECT checkpoint_id, SUM(count) FROM cpu_stack_samples WHERE {where}"
                    f" AND stack_id IN ({marks}) GROUP BY checkpoint_id",
                    (*params, *stacks),
                ).fetchall())
            else:  # too many for one statement's parameters: filter here
                wanted = set(stacks)
                for cid, sid, n in self._conn.execute(
                    f"SELECT checkpoint_id, stack_id, SUM(count) FROM cpu_stack_samples"
                    f" WHERE {where} GROUP BY 1, 2", params,
                ):
                    if sid in wanted:
                        num[cid] = num.get(cid, 0) + n
            if self.thread is None:
                den = {self._cp_ids[i]: self._cp_samples[i] for i in range(lo, hi)}
            else:
                den = dict(
                    self._conn.execute(
                        "SELECT checkpoint_id, SUM(count) FROM cpu_stack_samples"
                        " WHERE checkpoint_id BETWEEN ? AND ? AND tid = ? GROUP BY checkpoint_id",
                        (first, last, self.thread),
                    ).fetchall()
                )
            sums: dict[int, list[int]] = {}
            for i in range(lo, hi):
                cid = self._cp_ids[i]
                b = (self._cp_ts[i] - start_ms - 1) // bucket_ms
                acc = sums.setdefault(b, [0, 0, self._cp_ts[i]])
                acc[0] += num.get(cid, 0)
                acc[1] += den.get(cid, 0)
                acc[2] = self._cp_ts[i]
            values = [(ts, 100.0 * n / d if d else 0.0) for n, d, ts in sums.values()]
            return Series(
                start_ms, end_ms, bucket_ms, self._bucketize(start_ms, end_ms, bucket_ms, values)
            )

    def heap_series(self, key: int, start_ms: int, end_ms: int, bucket_ms: int) -> Series:
        """Live bytes of call site `key` at the end of each bucket in (start_ms, end_ms]."""
        bucket_ms = max(1, bucket_ms)
        with self._lock:
            lo, hi = self._window_ids(start_ms, end_ms)
            if lo >= hi:
                return Series(start_ms, end_ms, bucket_ms, ())
            if self._heap_thread() is not None:
                return self._thread_heap_series(key, start_ms, end_ms, bucket_ms, lo, hi)
            first, last = self._cp_ids[lo], self._cp_ids[hi - 1]
            before = self._conn.execute(
                "SELECT live_bytes FROM heap_site_samples WHERE location_id = ?"
                " AND checkpoint_id < ? ORDER BY checkpoint_id DESC LIMIT 1",
                (key, first),
            ).fetchone()
            changes = dict(
                self._conn.execute(
                    "SELECT checkpoint_id, live_bytes FROM heap_site_samples"
                    " WHERE location_id = ? AND checkpoint_id BETWEEN ? AND ?",
                    (key, first, last),
                ).fetchall()
            )
            live = before[0] if before else 0
            values = []
            for i in range(lo, hi):
                live = changes.get(self._cp_ids[i], live)
                values.append((self._cp_ts[i], float(live)))
            return Series(
                start_ms, end_ms, bucket_ms, self._bucketize(start_ms, end_ms, bucket_ms, values)
            )

    def _thread_heap_series(
        self, key: int, start_ms: int, end_ms: int, bucket_ms: int, lo: int, hi: int
    ) -> Series:
        """heap_series for the thread shown: its live bytes at site `key` (running sums of
        its stacks with that call site)."""
        rows = self._conn.execute(
            "SELECT checkpoint_id, stack_id, SUM(alloc_bytes) - SUM(free_bytes)"
            " FROM heap_thread_samples WHERE tid = ? AND checkpoint_id <= ?"
            " GROUP BY 1, 2",
            (self.thread, self._cp_ids[hi - 1]),
        ).fetchall()
        self._ensure_heap_paths(r[1] for r in rows)
        delta: dict[int, int] = {}
        for cid, sid, d in rows:
            if self._heap_site_of.get(sid) == key:
                delta[cid] = delta.get(cid, 0) + d
        first = self._cp_ids[lo]
        live = sum(d for cid, d in delta.items() if cid < first)
        values = []
        for i in range(lo, hi):
            live += delta.get(self._cp_ids[i], 0)
            values.append((self._cp_ts[i], float(live)))
        return Series(
            start_ms, end_ms, bucket_ms, self._bucketize(start_ms, end_ms, bucket_ms, values)
        )

    def timestamp_range(self) -> tuple[int, int] | None:
        """(first, last) checkpoint timestamps read so far."""
        with self._lock:
            if not self._cp_ts:
                return None
            return self._cp_ts[0], self._cp_ts[-1]
