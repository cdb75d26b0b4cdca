"""Output of `traces`, `peek` and `diff`: text close to pprof's for people, JSON for programs."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable

from rich.table import Table

from rsprof.render import _console, human_bytes, write_json
from rsprof.storage.callgraph import Peek, Trace
from rsprof.storage.diff import CpuDelta, HeapDelta
from rsprof.storage.granularity import Entry
from rsprof.tui.format import short_functions

RULE = "-" * 11 + "+" + "-" * 60


def _value(value: int, unit: str) -> str:
    if unit == "bytes":
        return human_bytes(value)
    if unit == "nanoseconds":
        return f"{value / 1e9:.2f}s"
    return str(value)


def _labels(entries: Iterable[Entry]) -> dict[Entry, str]:
    """Each entry's label with its function shortened for display (short_functions: two
    different functions never look the same)."""
    entries = set(entries)
    shown = short_functions(e.function for e in entries)
    return {e: dataclasses.replace(e, function=shown[e.function]).label for e in entries}


def traces(found: list[Trace], unit: str, total: int, distinct: int, *, as_json: bool) -> None:
    if as_json:
        write_json([t.as_dict() for t in found])
        return
    out = sys.stdout
    shown = f", the heaviest {len(found)} shown" if len(found) < distinct else ""
    out.write(f"{distinct} distinct stacks{shown}, {_value(total, unit)} in all\n")
    labels = _labels(entry for trace in found for entry in trace.stack)
    for trace in found:
        out.write(RULE + "\n")
        if trace.tid is not None:
            out.write(f"{'thread:':>10} | {trace.thread_name} ({trace.tid})\n")
        weight = f"{_value(trace.value, unit)} {trace.percent:.1f}%"
        for position, entry in enumerate(trace.stack):
            left = weight if position == 0 else ""
            out.write(f"{left:>10} | {labels[entry]}\n")
    if found:
        out.write(RULE + "\n")


def peek(found: list[Peek], unit: str, *, as_json: bool) -> None:
    if as_json:
        write_json([p.as_dict() for p in found])
        return
    labels = _labels(entry for item in found
                     for entry in (item.entry, *(e.entry for e in item.callers),
                                   *(e.entry for e in item.callees)))
    for item in found:
        sys.stdout.write(f"{labels[item.entry]}: flat {_value(item.flat, unit)}"
                         f" ({item.flat_pct:.1f}%), total {_value(item.total, unit)}"
                         f" ({item.total_pct:.1f}%)\n")
        sys.stdout.flush()
        table = Table(box=None, header_style="bold")
        table.add_column("", no_wrap=True)
        table.add_column("Weight", justify="right")
        table.add_column("%", justify="right")
        table.add_column("Function", overflow="fold")
        for edge in item.callers:
            table.add_row("caller", _value(edge.value, unit), f"{edge.percent:.1f}%",
                          labels[edge.entry])
        table.add_row("▶", _value(item.total, unit), "100.0%", labels[item.entry],
                      style="bold")
        for edge in item.callees:
            table.add_row("callee", _value(edge.value, unit), f"{edge.percent:.1f}%",
                          labels[edge.entry])
        _console().print(table)
        _console().print()


def cpu_diff(deltas: list[CpuDelta]) -> None:
    table = Table(title="CPU share by function (NEW - OLD)", title_justify="left", box=None,
                  header_style="bold")
    for name in ("Δ Self", "Old self", "New self", "Δ Total", "Old total", "New total"):
        table.add_column(name, justify="right")
    table.add_column("Function", overflow="fold")
    table.add_column("")
    shown = short_functions(d.function for d in deltas)
    for d in deltas:
        table.add_row(_arrow(d.delta_self_pct, "%"), f"{d.old_self_pct:.1f}%",
                      f"{d.new_self_pct:.1f}%", _arrow(d.delta_total_pct, "%"),
                      f"{d.old_total_pct:.1f}%", f"{d.new_total_pct:.1f}%", shown[d.function],
                      d.status)
    _console().print(table)


def heap_diff(deltas: list[HeapDelta]) -> None:
    table = Table(title="Heap by call-site function (NEW - OLD)", title_justify="left",
                  box=None, header_style="bold")
    for name in ("Δ In use", "Old in use", "New in use", "Δ Allocated"):
        table.add_column(name, justify="right")
    table.add_column("Function", overflow="fold")
    table.add_column("")
    shown = short_functions(d.function for d in deltas)
    for d in deltas:
        table.add_row(_arrow_bytes(d.delta_inuse_bytes), human_bytes(d.old_inuse_bytes),
                      human_bytes(d.new_inuse_bytes), _arrow_bytes(d.delta_alloc_bytes),
                      shown[d.function], d.status)
    _console().print(table)


def _arrow(delta: float, suffix: str) -> str:
    if delta == 0:
        return f"0.0{suffix}"
    return f"{'▲' if delta > 0 else '▼'} {delta:+.1f}{suffix}"


def _arrow_bytes(delta: int) -> str:
    if delta == 0:
        return "0 B"
    sign = "+" if delta > 0 else "-"
    return f"{'▲' if delta > 0 else '▼'} {sign}{human_bytes(abs(delta))}"
