"""`x` / `X`: the current view written to pprof or speedscope next to the profile, with
the TUI's thread, time window and name filter applied (as `rsprof export` would with
`--tid`, `--since/--until` and `--filter`)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from rsprof.storage.errors import ProfileError
from rsprof.storage.filters import FrameFilter
from rsprof.storage.reader import Profile
from rsprof.storage.samples import TimeRange
from rsprof.storage.selection import EmptySelection, SampleQuery, require_samples, select

SUFFIXES = {"pprof": ".pb.gz", "speedscope": ".speedscope.json"}


def export_path(db_path: Path, kind: str, fmt: str) -> Path:
    """`<profile stem>.<kind>[.N]<suffix>` beside the profile; never an existing file."""
    stem = db_path.name.removesuffix(".db")
    candidate = db_path.with_name(f"{stem}.{kind}{SUFFIXES[fmt]}")
    n = 1
    while candidate.exists():
        n += 1
        candidate = db_path.with_name(f"{stem}.{kind}.{n}{SUFFIXES[fmt]}")
    return candidate


def export_view(
    db_path: str | os.PathLike[str],
    *,
    fmt: str,
    kind: str,
    tid: int | None,
    since_s: float | None,
    until_s: float | None,
    name_filter: str,
) -> tuple[Path, int]:
    """Writes the export; returns its path and how many samples went in. Raises
    ProfileError (EmptySelection) with a one-line reason when there is nothing to write.
    The count is CPU samples, or allocations for the heap."""
    path = Path(db_path)
    focus = f"(?i){re.escape(name_filter)}" if name_filter else None
    with Profile(path) as profile:
        if kind == "heap" and not profile.rows(
            "SELECT 1 FROM sqlite_master WHERE name = 'heap_thread_samples'"
        ):
            tid = None  # a file from before the heap kept its thread: all of it, as shown
        query = SampleQuery(
            kind=kind,
            tid=tid,
            time_range=TimeRange(since_s, until_s),
            filters=FrameFilter.compile(focus=focus),
        )
        selection = select(profile, query)
    require_samples(selection, query, path)
    target = export_path(path, kind, fmt)
    # Written beside and renamed: a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".rsprof-export-")
    try:
        if fmt == "pprof":
            from rsprof.storage.pprof.writer import write_pprof

            with os.fdopen(fd, "wb") as out:
                write_pprof(selection.samples, out)
        else:
            from rsprof.storage.flame import write_speedscope

            with os.fdopen(fd, "w", encoding="utf-8") as text:
                write_speedscope(selection.samples, text, name=path.name)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target, selection.samples.total(0)


__all__ = ["EmptySelection", "ProfileError", "export_path", "export_view"]
