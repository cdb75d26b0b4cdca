"""Output of the CLI commands: rich tables for people, JSON / CSV / TSV for programs."""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from rsprof.storage.analysis import FunctionRow, HeapSiteRow
from rsprof.storage.reader import ProfileSummary
from rsprof.tui.format import short_functions

if TYPE_CHECKING:  # the collector loads only for `dump`: reports start faster
    from rsprof.collector.dump import ProcessDump

# JSON and CSV keys are the row dataclasses' fields, in order (the documented contract).
CPU_KEYS = [f.name for f in fields(FunctionRow)]
HEAP_KEYS = [f.name for f in fields(HeapSiteRow)]


def _console() -> Console:
    # Piped output is read by programs and wide terminals alike: never wrap it at 80.
    width = None if sys.stdout.isatty() else 200
    # NO_COLOR (no-color.org): rich drops colours but keeps bold and dim; no colour system
    # at all writes no escape sequence.
    plain = bool(os.environ.get("NO_COLOR"))
    return Console(file=sys.stdout, highlight=False, soft_wrap=False, width=width,
                   markup=False, emoji=False, color_system=None if plain else "auto")


def _location(file: str, line: int) -> str:
    if not file:
        return ""
    return f"{file}:{line}" if line else file


def human_bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def write_json(objects: Sequence[object] | dict[str, Any], out: IO[str] | None = None) -> None:
    stream = out or sys.stdout
    json.dump(objects, stream, indent=2)
    stream.write("\n")


def _write_csv(keys: Sequence[str], objects: list[dict[str, object]],
               out: IO[str] | None = None) -> None:
    writer = csv.DictWriter(out or sys.stdout, fieldnames=list(keys), lineterminator="\n")
    writer.writeheader()
    writer.writerows(objects)


def emit_rows(keys: Sequence[str], rows: Sequence[FunctionRow | HeapSiteRow], fmt: str,
              out: IO[str] | None = None) -> None:
    """JSON (an array of objects) or CSV (a header line, then rows) of top-table rows."""
    objects = [row.as_dict() for row in rows]
    if fmt == "json":
        write_json(objects, out)
    else:
        _write_csv(keys, objects, out)


def cpu_rows(rows: list[FunctionRow], total_samples: int, fmt: str, note: str = "",
             unit: str = "count") -> None:
    if fmt == "table":
        cpu_table(rows, total_samples, note=note, unit=unit)
    else:
        emit_rows(CPU_KEYS, rows, fmt)


def cpu_table(rows: list[FunctionRow], total_samples: int, title: str | None = None,
              note: str = "", unit: str = "count") -> None:
    """`top cpu`'s table; with unit "nanoseconds" (offcpu, wall) Self and Total are times."""
    def value(n: int) -> str:
        return f"{n / 1e9:.3f}s" if unit == "nanoseconds" else str(n)

    whole = (f"{value(total_samples)} in all" if unit == "nanoseconds"
             else f"{total_samples} samples")
    caption = whole + (f"; {note}" if note else "")
    table = Table(title=title, title_justify="left", caption=caption,
                  caption_justify="left", box=None, header_style="bold")
    table.add_column("Self", justify="right")
    table.add_column("Self %", justify="right")
    table.add_column("Total", justify="right")
    table.add_column("Total %", justify="right")
    table.add_column("Function", overflow="fold")
    table.add_column("Location", overflow="fold")
    shown = short_functions(r.function for r in rows)
    for r in rows:
        table.add_row(value(r.self), f"{r.self_pct:.1f}%", value(r.total), f"{r.total_pct:.1f}%",
                      f"{r.address} {shown[r.function]}" if r.address else shown[r.function],
                      _location(r.file, r.line))
    _console().print(table)


def heap_rows(rows: list[HeapSiteRow], fmt: str) -> None:
    if fmt == "table":
        heap_table(rows)
    else:
        emit_rows(HEAP_KEYS, rows, fmt)


def heap_table(rows: list[HeapSiteRow], title: str | None = None) -> None:
    table = Table(title=title, title_justify="left", box=None, header_style="bold")
    table.add_column("Live", justify="right")
    table.add_column("Allocated", justify="right")
    table.add_column("Allocs", justify="right")
    table.add_column("Frees", justify="right")
    table.add_column("Growing")
    table.add_column("Function", overflow="fold")
    table.add_column("Location", overflow="fold")
    shown = short_functions(r.function for r in rows)
    for r in rows:
        table.add_row(human_bytes(r.live_bytes), human_bytes(r.total_alloc_bytes),
                      str(r.alloc_count), str(r.free_count), "▲ yes" if r.growing else "",
                      shown[r.function], _location(r.file, r.line))
    _console().print(table)


def _tsv_cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return value.hex()
    return str(value).replace("\t", " ").replace("\n", " ")


def query_result(columns: list[str], rows: Iterable[tuple[object, ...]], *,
                 fmt: str = "tsv", out: IO[str] | None = None) -> None:
    """Writes rows as they come (a query of 10^6 rows prints its first line at once):
    TSV with a header line, CSV with a header line, or JSON as one array of objects
    written object by object."""
    stream = out or sys.stdout
    if fmt == "json":
        stream.write("[")
        first = True
        for row in rows:
            obj = {c: (v.hex() if isinstance(v, bytes) else v) for c, v in zip(columns, row)}
            stream.write(("\n  " if first else ",\n  ") + json.dumps(obj))
            first = False
        stream.write("\n]\n" if not first else "]\n")
        return
    if fmt == "csv":
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if v is None else v.hex() if isinstance(v, bytes) else v
                             for v in row])
        return
    if columns:
        stream.write("\t".join(columns) + "\n")
    for row in rows:
        stream.write("\t".join(_tsv_cell(v) for v in row) + "\n")


def _duration(ms: int) -> str:
    seconds = ms // 1000
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def profile_list(profiles: list[ProfileSummary], as_json: bool = False) -> None:
    if as_json:  # every profile, [] for none: scripts need no stderr to tell
        write_json([
            {"file": str(p.path), "pid": p.pid, "process": p.process,
             "start_time_ms": p.start_time_ms, "duration_ms": p.duration_ms,
             "samples": p.samples, "lost_samples": p.lost_samples, "state": p.state}
            for p in profiles
        ])
        return
    if not profiles:
        print("no profiles found", file=sys.stderr)
        return
    table = Table(box=None, header_style="bold")
    for name in ("FILE", "PROCESS", "START", "DURATION", "SAMPLES"):
        table.add_column(name, justify="right" if name == "SAMPLES" else "left")
    for p in profiles:
        start = (
            datetime.fromtimestamp(p.start_time_ms / 1000).strftime("%Y-%m-%d %H:%M:%S")
            if p.start_time_ms else "?"
        )
        name = p.process if p.pid is None else f"{p.process} ({p.pid})"
        state = f" ({p.state})" if p.state in ("recording", "abandoned") else ""
        table.add_row(p.path.name, name, start, _duration(p.duration_ms) + state, str(p.samples))
    _console().print(table)


def process_dump(dump: ProcessDump, as_json: bool = False) -> None:
    """`rsprof dump`: each thread's stack, leaf first, as py-spy dump prints them."""
    if as_json:
        write_json({
            "pid": dump.pid, "process": dump.name, "cmdline": dump.cmdline,
            "python": dump.python, "stopped_ms": round(dump.stopped_ms, 1),
            "threads": [{"tid": t.tid, "name": t.name, "state": t.state, "syscall": t.syscall,
                         "truncated": t.truncated, "frames": [asdict(f) for f in t.frames]}
                        for t in dump.threads],
        })
        return
    out = sys.stdout
    out.write(f"Process {dump.pid}: {dump.cmdline or dump.name}\n")
    python = "; Python frames read while stopped" if dump.python else ""
    out.write(f"{len(dump.threads)} threads, stopped {dump.stopped_ms:.1f} ms{python}\n")
    for thread in dump.threads:
        out.write(f"\nThread {thread.tid} \"{thread.name}\" ({thread.state})\n")
        for frame in thread.frames:
            where = (f"{frame.file}:{frame.line}" if frame.file and frame.line
                     else frame.file or os.path.basename(frame.module))
            out.write(f"    {frame.function} ({where})\n" if where else
                      f"    {frame.function}\n")
        if thread.truncated:
            out.write("    [truncated]\n")
