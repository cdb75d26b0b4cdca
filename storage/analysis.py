"""Aggregations behind `rsprof top` and `rsprof list`."""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from rsprof.storage.errors import ProfileError
from rsprof.storage.granularity import Entry, EntryTable, entry
from rsprof.storage.reader import Profile, ProfileSummary
from rsprof.storage.samples import heap_deltas_source, heap_site_rows
from rsprof.storage.selection import WHOLE_CPU_PROFILE, SampleQuery, Selection, select


@dataclass(slots=True)
class FunctionRow:
    """One entry of `top cpu` (a function by default; a file, line or address with
    `--granularity`): self = samples where it is the leaf; total = samples where it is
    anywhere on the stack, counted once per sample even under recursion. Percentages are of
    every sample in the selected time range and thread, before focus/ignore/show/hide."""

    function: str
    file: str
    line: int
    module: str
    self: int
    self_pct: float
    total: int
    total_pct: float
    address: str = ""  # 0x... with --granularity addresses

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def top_cpu(
    profile: Profile,
    *,
    limit: int | None = 20,
    threshold_pct: float = 0.0,
    sort_by_total: bool = False,
    query: SampleQuery = WHOLE_CPU_PROFILE,
    granularity: str = "functions",
) -> tuple[list[FunctionRow], int]:
    """Entries by self (or total) samples, and the number of samples percentages are of."""
    selection = select(profile, query)
    rows = rank_cpu(selection, granularity=granularity, sort_by_total=sort_by_total,
                    threshold_pct=threshold_pct, limit=limit)
    return rows, selection.unfiltered_total[0]


def rank_cpu(
    selection: Selection,
    *,
    granularity: str = "functions",
    sort_by_total: bool = False,
    threshold_pct: float = 0.0,
    limit: int | None = None,
) -> list[FunctionRow]:
    """`top cpu`'s rows of a selection: sorted by self (or total), cut at the threshold and
    the limit (None or 0: every row)."""
    rows = cpu_rows(selection, granularity)
    if sort_by_total:
        rows.sort(key=lambda r: (-r.total, -r.self, r.function, r.file, r.line))
    else:
        rows.sort(key=lambda r: (-r.self, -r.total, r.function, r.file, r.line))
    measured = "total_pct" if sort_by_total else "self_pct"
    rows = [r for r in rows if getattr(r, measured) >= threshold_pct]
    return rows[:limit] if limit else rows


def cpu_rows(selection: Selection, granularity: str = "functions") -> list[FunctionRow]:
    """Every entry's self and total sample counts, unsorted."""
    table = EntryTable(granularity)
    self_counts: dict[int, int] = {}
    total_counts: dict[int, int] = {}
    # The line shown for a function: where its self samples fall most, else where it appears.
    line_votes: dict[int, dict[tuple[str, int], int]] = {}
    for sample in selection.samples.samples:
        count = sample.values[0]
        seen: set[int] = set()
        first = True
        for frame in sample.frames:
            for number, source in table.frame_entries(frame):
                if first:
                    self_counts[number] = self_counts.get(number, 0) + count
                votes = line_votes.setdefault(number, {})
                place = (source.file, source.line)
                votes[place] = votes.get(place, 0) + count * (1000 if first else 1)
                first = False
                if number not in seen:
                    seen.add(number)
                    total_counts[number] = total_counts.get(number, 0) + count
    rows = []
    for number, total in total_counts.items():
        e = table.entries[number]
        self_n = self_counts.get(number, 0)
        file, line = (e.file, e.line)
        if granularity == "functions":
            file, line = max(line_votes[number].items(), key=lambda item: item[1])[0]
        rows.append(
            FunctionRow(
                function=e.function,
                file=file,
                line=line,
                module=e.module,
                self=self_n,
                self_pct=selection.percent(self_n, 0),
                total=total,
                total_pct=selection.percent(total, 0),
                address=f"0x{e.address:x}" if e.address else "",
            )
        )
    return rows


def list_profiles(directory: str | os.PathLike[str]) -> list[ProfileSummary]:
    """Every readable profile in a folder, newest first; other files are skipped."""
    folder = Path(directory)
    try:
        st = folder.stat()
    except OSError as error:
        reason = "no such directory" if isinstance(error, FileNotFoundError) else error.strerror
        raise ProfileError(f"{folder}: {reason}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ProfileError(f"{folder}: not a directory")
    found: list[ProfileSummary] = []
    for file in folder.iterdir():
        if file.suffix != ".db" or not file.is_file():
            continue
        try:
            with Profile(file) as profile:
                found.append(profile.summary())
        except ProfileError:
            continue
    found.sort(key=lambda s: (s.start_time_ms or 0, s.path.name), reverse=True)
    return found


HEAP_SORT_KEYS = {"live": "live_bytes", "alloc_bytes": "total_alloc_bytes", "allocs": "alloc_count"}
GROWTH_WINDOW = 5  # checkpoints a site's live bytes must have kept rising over


@dataclass(slots=True)
class HeapSiteRow:
    function: str
    file: str
    line: int
    module: str
    live_bytes: int
    total_alloc_bytes: int
    total_free_bytes: int
    alloc_count: int
    free_count: int
    growing: bool

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def heap_mode(profile: Profile) -> str:
    """'none' when the target ran without the shim (and no heap rows exist)."""
    mode = profile.meta().get("heap_mode", "none")
    if mode == "none":
        table, _, _ = heap_deltas_source(profile.has)
        rows = profile.rows(f"SELECT 1 FROM {table} LIMIT 1")
        return "full" if rows else "none"
    return mode


def top_heap(
    profile: Profile,
    *,
    limit: int | None = 20,
    sort: str = "live",
    query: SampleQuery | None = None,
    granularity: str = "functions",
) -> list[HeapSiteRow]:
    """Call sites by live bytes (or allocated bytes, or allocation count). With a query
    (time range, filters) or another granularity, rows come from the allocating stacks."""
    column = HEAP_SORT_KEYS[sort]
    if query is not None or _site_granularity(granularity) != "lines":
        return rank_heap(select(profile, query or SampleQuery("heap")), growing_sites(profile),
                         granularity=granularity, sort=sort, limit=limit)
    totals = profile.rows(
        "SELECT h.location_id, l.function, l.file, l.line, COALESCE(m.path, ''),"
        " SUM(h.alloc_bytes) - SUM(h.free_bytes), SUM(h.alloc_bytes), SUM(h.free_bytes),"
        " SUM(h.alloc_count), SUM(h.free_count)"
        f" FROM {heap_site_rows(profile.has)} h JOIN locations l ON l.id = h.location_id"
        " LEFT JOIN modules m ON m.id = l.module_id GROUP BY h.location_id"
    )
    growing = growing_sites(profile)
    rows = [
        HeapSiteRow(*row[1:], growing=row[0] in growing)  # type: ignore[misc]
        for row in totals
    ]
    rows.sort(key=lambda r: (-getattr(r, column), r.function))
    if limit is not None and limit > 0:
        rows = rows[:limit]
    return rows


def _site_granularity(granularity: str) -> str:
    # A call site is a source line: the heap's "functions" (every command's default) is the
    # exact site table, as `top heap` always showed.
    return "lines" if granularity == "functions" else granularity


def rank_heap(
    selection: Selection,
    growing: set[int],
    *,
    granularity: str = "functions",
    sort: str = "live",
    limit: int | None = None,
) -> list[HeapSiteRow]:
    """`top heap`'s rows of a selection, sorted by `sort` (a HEAP_SORT_KEYS key)."""
    column = HEAP_SORT_KEYS[sort]
    rows = heap_rows(selection, _site_granularity(granularity), growing)
    rows.sort(key=lambda r: (-getattr(r, column), r.function, r.file, r.line))
    return rows[:limit] if limit else rows


def heap_rows(selection: Selection, granularity: str, growing: set[int]) -> list[HeapSiteRow]:
    """Per entry at the stack's leaf (the call site): in use at the end of the range, and
    allocated and freed within it."""
    rows: dict[Entry, HeapSiteRow] = {}
    for sample in selection.samples.samples:
        frame = sample.frames[0]
        site = frame.lines[0]
        e = entry(frame, site, granularity)
        row = rows.get(e)
        if row is None:
            row = rows[e] = HeapSiteRow(e.function, e.file, e.line, e.module, 0, 0, 0, 0, 0,
                                        False)
        alloc_objects, alloc_space, _inuse_objects, inuse_space = sample.values
        row.live_bytes += inuse_space
        row.total_alloc_bytes += alloc_space
        row.alloc_count += alloc_objects
        row.free_count += sample.freed[0]
        row.total_free_bytes += sample.freed[1]
        row.growing = row.growing or site.location_id in growing
    return list(rows.values())


def growing_sites(profile: Profile) -> set[int]:
    """Sites whose live bytes never fell and rose overall across the last checkpoints."""
    last = profile.rows("SELECT MAX(id) FROM checkpoints")[0][0]
    if last is None:
        return set()
    first = last - GROWTH_WINDOW + 1
    # A site's live bytes after each checkpoint that changed them, from the one before the
    # window on: each step is that checkpoint's net delta, so the deltas of the window's
    # checkpoints answer (the first point's live value does not matter: only its rises do).
    steps: dict[int, list[int]] = {}
    for location_id, _checkpoint_id, delta in profile.rows(
        "SELECT location_id, checkpoint_id, SUM(alloc_bytes) - SUM(free_bytes)"
        f" FROM {heap_site_rows(profile.has)} WHERE checkpoint_id >= ?"
        " GROUP BY location_id, checkpoint_id ORDER BY location_id, checkpoint_id",
        (first - 1,),
    ):
        steps.setdefault(location_id, []).append(delta)
    growing = set()
    for location_id, deltas in steps.items():
        rises = deltas[1:]  # from the first point on
        if (all(step >= 0 for step in rises) and sum(1 for step in rises if step > 0)
                >= GROWTH_WINDOW // 2 and sum(rises) > 0):
            growing.add(location_id)
    return growing
