"""Aggregations behind `rsprof top` and `rsprof list`."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

from storage.errors import ProfileError
from storage.reader import Location, Profile, ProfileSummary


@dataclass(slots=True)
class FunctionRow:
    """One function of `top cpu`: self = samples where it is the leaf; total = samples where
    it is anywhere on the stack, counted once per sample even under recursion."""

    function: str
    file: str
    line: int
    module: str
    self: int
    self_pct: float
    total: int
    total_pct: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def top_cpu(
    profile: Profile,
    *,
    limit: int | None = 20,
    threshold_pct: float = 0.0,
    sort_by_total: bool = False,
    tid: int | None = None,
) -> tuple[list[FunctionRow], int]:
    """Functions by self (or total) samples, and the number of samples they share."""
    stack_counts = profile.cpu_stack_counts(tid)
    stacks = profile.stack_locations()
    locations = profile.locations()
    grand_total = sum(stack_counts.values())

    def key(location: Location) -> tuple[str, str]:
        return (location.function, location.module)

    self_counts: dict[tuple[str, str], int] = {}
    total_counts: dict[tuple[str, str], int] = {}
    # The line shown for a function: where its self samples fall most, else where it appears.
    line_votes: dict[tuple[str, str], dict[tuple[str, int], int]] = {}
    for stack_id, count in stack_counts.items():
        chain = stacks.get(stack_id, [])
        if not chain:
            continue
        leaf = locations[chain[0]]
        self_counts[key(leaf)] = self_counts.get(key(leaf), 0) + count
        seen: set[tuple[str, str]] = set()
        for position, location_id in enumerate(chain):
            location = locations[location_id]
            k = key(location)
            votes = line_votes.setdefault(k, {})
            weight = count * (1000 if position == 0 else 1)
            votes[(location.file, location.line)] = (
                votes.get((location.file, location.line), 0) + weight
            )
            if k not in seen:
                seen.add(k)
                total_counts[k] = total_counts.get(k, 0) + count

    rows = []
    for k, total in total_counts.items():
        self_n = self_counts.get(k, 0)
        file, line = max(line_votes[k].items(), key=lambda item: item[1])[0]
        rows.append(
            FunctionRow(
                function=k[0],
                file=file,
                line=line,
                module=k[1],
                self=self_n,
                self_pct=_pct(self_n, grand_total),
                total=total,
                total_pct=_pct(total, grand_total),
            )
        )
    if sort_by_total:
        rows.sort(key=lambda r: (-r.total, -r.self, r.function))
    else:
        rows.sort(key=lambda r: (-r.self, -r.total, r.function))
    measured = "total_pct" if sort_by_total else "self_pct"
    rows = [r for r in rows if getattr(r, measured) >= threshold_pct]
    if limit is not None and limit > 0:
        rows = rows[:limit]
    return rows, grand_total


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def list_profiles(directory: str | os.PathLike[str]) -> list[ProfileSummary]:
    """Every readable profile in a folder, newest first; other files are skipped."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ProfileError(f"{folder}: no such directory")
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
        rows = profile.rows("SELECT 1 FROM heap_site_samples LIMIT 1")
        return "full" if rows else "none"
    return mode


def top_heap(profile: Profile, *, limit: int | None = 20, sort: str = "live") -> list[HeapSiteRow]:
    """Call sites by live bytes (or allocated bytes, or allocation count)."""
    column = HEAP_SORT_KEYS[sort]
    totals = profile.rows(
        "SELECT h.location_id, l.function, l.file, l.line, COALESCE(m.path, ''),"
        " SUM(h.alloc_bytes) - SUM(h.free_bytes), SUM(h.alloc_bytes), SUM(h.free_bytes),"
        " SUM(h.alloc_count), SUM(h.free_count)"
        " FROM heap_site_samples h JOIN locations l ON l.id = h.location_id"
        " LEFT JOIN modules m ON m.id = l.module_id GROUP BY h.location_id"
    )
    growing = _growing_sites(profile)
    rows = [
        HeapSiteRow(*row[1:], growing=row[0] in growing)  # type: ignore[misc]
        for row in totals
    ]
    rows.sort(key=lambda r: (-getattr(r, column), r.function))
    if limit is not None and limit > 0:
        rows = rows[:limit]
    return rows


def _growing_sites(profile: Profile) -> set[int]:
    """Sites whose live bytes never fell and rose overall across the last checkpoints."""
    last = profile.rows("SELECT MAX(id) FROM checkpoints")[0][0]
    if last is None:
        return set()
    first = last - GROWTH_WINDOW + 1
    history: dict[int, list[tuple[int, int]]] = {}
    for location_id, checkpoint_id, live in profile.rows(
        "SELECT location_id, checkpoint_id, live_bytes FROM heap_site_samples"
        " WHERE checkpoint_id >= ? ORDER BY location_id, checkpoint_id",
        (first - 1,),
    ):
        history.setdefault(location_id, []).append((checkpoint_id, live))
    growing = set()
    for location_id, points in history.items():
        lives = [live for _, live in points]
        rises = sum(1 for a, b in pairwise(lives) if b > a)
        never_fell = all(b >= a for a, b in pairwise(lives))
        if never_fell and rises >= GROWTH_WINDOW // 2 and lives[-1] > lives[0]:
            growing.add(location_id)
    return growing
