"""`x` / `X`: the samples the view shows (`Snapshot.selection`: thread, time window, filter)
written to pprof or speedscope beside the profile, by `rsprof export` itself."""

from __future__ import annotations

import os
from pathlib import Path

from click import ClickException
from rsprof.storage.errors import ProfileError
from rsprof.storage.selection import EmptySelection, SampleQuery

from rsprof.export import export

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


def export_view(db_path: str | os.PathLike[str], *, fmt: str, selection: SampleQuery
                ) -> tuple[Path, int]:
    """Writes the export as `rsprof export -f FMT` with the same selection; returns its
    path and how many samples went in (CPU samples, or allocations for the heap). Raises
    ProfileError (EmptySelection) with a one-line reason when there is nothing to write,
    ExportError (a ClickException) when the file cannot be written."""
    path = Path(db_path)
    target = export_path(path, selection.kind, fmt)
    _written, selected = export(path, fmt=fmt, query=selection, output=target)
    return target, selected.samples.total(0)


ExportFailed = (ProfileError, OSError, ValueError, ClickException)
"""What `export_view` raises for an export that did not happen, each with a readable message."""

__all__ = ["EmptySelection", "ExportFailed", "ProfileError", "export_path", "export_view"]
