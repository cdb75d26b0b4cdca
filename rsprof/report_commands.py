"""Commands that read a finished (or growing) profile: top, traces, peek, diff, export.

They share pprof's options (rsprof.options) and ask storage for every number.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from rsprof import render, report_render
from rsprof.export import FORMATS, export
from rsprof.options import (
    CONTEXT,
    build_query,
    check_kind,
    granularity_option,
    profile_file,
    sample_options,
    value_index,
)
from rsprof.storage import analysis
from rsprof.storage.callgraph import peek as peek_entries
from rsprof.storage.callgraph import traces as distinct_traces
from rsprof.storage.diff import cpu_diff, heap_diff
from rsprof.storage.reader import Profile
from rsprof.storage.selection import SampleQuery, Selection, empty_reason, select

NO_HEAP_HINT = (
    "this profile has no heap data; start the program with `rsprof run -- CMD`, attach with"
    " `rsprof -p PID` without --no-heap (meta heap_off_reason says why it was off), or start"
    " it with `LD_PRELOAD=$(rsprof preload) CMD`"
)
KIND_OPTION = click.option("--kind", type=click.Choice(["cpu", "heap", "offcpu", "wall"]),
                           default="cpu", show_default=True,
                           help="CPU samples, heap allocations, off-CPU time (where threads"
                                " waited) or wall-clock time (on-CPU + off-CPU).")
SAMPLE_INDEX_OPTION = click.option(
    "--sample-index", metavar="NAME",
    help="Value to weigh by: samples, cpu (CPU); inuse_space (default), inuse_objects,"
         " alloc_space, alloc_objects (heap); offcpu (default), switches (offcpu);"
         " wall (default), cpu, offcpu (wall).")


def _completing(words: tuple[str, ...]) -> Any:
    """Shell completion of a free-form parameter that takes one of `words` (click completes
    Choice parameters only; `top`'s KIND and `--format` check their values themselves, to
    say what is wrong in their own words)."""
    def complete(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
        return [word for word in words if word.startswith(incomplete)]
    return complete


FILE_ARGUMENT = click.argument("file", type=click.Path(path_type=Path), required=False)


def _say_if_empty(profile: Profile, selection: Selection, query: SampleQuery) -> None:
    """An empty selection is not an error (exit 0), but it is said, on stderr: an empty table
    alone reads as "nothing happened" when the range or thread asked for missed the data."""
    reason = empty_reason(selection, query, profile.summary().duration_ms)
    if reason:
        click.echo(f"rsprof: {reason}", err=True)


def _filter_note(query: SampleQuery, selection: Selection, index: int) -> str:
    if not query.filters.active:
        return ""
    kept = selection.samples.total(index)
    share = selection.percent(kept, index)
    return f"filters kept {kept} ({share:.1f}%): {query.filters.describe()}"


@click.command(context_settings=CONTEXT)
@click.argument("kind", metavar="cpu|heap|offcpu|wall",
                shell_complete=_completing(("cpu", "heap", "offcpu", "wall")))
@FILE_ARGUMENT
@click.option("-n", "--limit", type=click.IntRange(0), default=20, show_default=True,
              help="Rows to show (0 = all).")
@click.option("-t", "--threshold", type=float, default=0.0, help="Hide rows under this percent.")
@click.option("--cum", is_flag=True, help="cpu: sort by total (cumulative) instead of self.")
@click.option("--by", "sort", type=click.Choice(["live", "alloc_bytes", "allocs"]),
              default="live", show_default=True, help="heap: sort column.")
@granularity_option("functions")
@sample_options
@click.option("--json", "as_json", is_flag=True, help="JSON array of objects.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header line.")
def top(kind: str, file: Path | None, limit: int, threshold: float, cum: bool, sort: str,
        granularity: str, as_json: bool, as_csv: bool, **options: Any) -> None:
    """Top functions by CPU samples, off-CPU time (offcpu: where threads waited) or
    wall-clock time (wall: on-CPU + off-CPU), or call sites by heap bytes.

    --focus/--ignore/--show/--hide take regexes with pprof's meanings; percentages stay
    relative to every sample in the time range and thread, as in pprof. FILE: the newest
    profile in this folder by default.
    """
    check_kind(kind)
    if as_json and as_csv:
        raise click.UsageError("give --json or --csv, not both")
    fmt = "json" if as_json else "csv" if as_csv else "table"
    narrowed = any(value not in (None, False) for value in options.values())
    query = build_query(kind, options)
    with Profile(profile_file(file)) as profile:
        if kind != "heap":
            selection = select(profile, query)
            _say_if_empty(profile, selection, query)
            rows = analysis.rank_cpu(selection, granularity=granularity, sort_by_total=cum,
                                     threshold_pct=threshold, limit=limit)
            note = _filter_note(query, selection, 0) if fmt == "table" else ""
            render.cpu_rows(rows, selection.unfiltered_total[0], fmt, note,
                            unit=selection.samples.sample_types[0][1])
            return
        if analysis.heap_mode(profile) == "none":
            click.echo(f"rsprof: {NO_HEAP_HINT}", err=True)
            render.heap_rows([], fmt)
            return
        rows_heap = analysis.top_heap(profile, limit=limit, sort=sort,
                                      query=query if narrowed else None,
                                      granularity=granularity)
        if not rows_heap:
            _say_if_empty(profile, select(profile, query), query)
        render.heap_rows(rows_heap, fmt)


@click.command(context_settings=CONTEXT)
@FILE_ARGUMENT
@KIND_OPTION
@SAMPLE_INDEX_OPTION
@granularity_option("functions")
@click.option("--no-threads", is_flag=True, help="Merge the same stack across threads.")
@click.option("-n", "--limit", type=click.IntRange(0), default=0, help="Stacks to show (0 = all).")
@sample_options
@click.option("--json", "as_json", is_flag=True, help="JSON array of objects.")
def traces(file: Path | None, kind: str, sample_index: str | None, granularity: str,
           no_threads: bool, limit: int, as_json: bool, **options: Any) -> None:
    """Each distinct stack with its weight, heaviest first (as pprof -traces). FILE: the
    newest profile in this folder by default."""
    query = build_query(kind, options)
    with Profile(profile_file(file)) as profile:
        selection = select(profile, query)
        _say_if_empty(profile, selection, query)
    index = value_index(selection, sample_index)
    found = distinct_traces(selection, value_index=index, granularity=granularity,
                            per_thread=not no_threads and kind != "heap")
    unit = selection.samples.sample_types[index][1]
    report_render.traces(found[: limit or None], unit, selection.samples.total(index),
                         len(found), as_json=as_json)


@click.command(context_settings=CONTEXT)
@click.argument("file_or_regex", metavar="[FILE]")
@click.argument("regex", metavar="REGEX", required=False)
@KIND_OPTION
@SAMPLE_INDEX_OPTION
@granularity_option("functions")
@sample_options
@click.option("--json", "as_json", is_flag=True, help="JSON array of objects.")
def peek(file_or_regex: str, regex: str | None, kind: str, sample_index: str | None,
         granularity: str, as_json: bool, **options: Any) -> None:
    """Callers and callees of every function matching REGEX, with weights (as pprof -peek).
    FILE: the newest profile in this folder by default."""
    file = Path(file_or_regex) if regex is not None else None
    if regex is None:
        regex = file_or_regex
    try:
        pattern = re.compile(regex)
    except re.error as error:
        raise click.BadParameter(f"{regex!r} is not a valid regex: {error}",
                                 param_hint="REGEX") from None
    query = build_query(kind, options)
    with Profile(profile_file(file)) as profile:
        selection = select(profile, query)
        reason = empty_reason(selection, query, profile.summary().duration_ms)
    index = value_index(selection, sample_index)
    found = peek_entries(selection, pattern, value_index=index, granularity=granularity)
    if reason:
        click.echo(f"rsprof: {reason}", err=True)
    elif not found and not as_json:
        click.echo(f"rsprof: no function matches {regex!r}", err=True)
    report_render.peek(found, selection.samples.sample_types[index][1], as_json=as_json)


@click.command(context_settings=CONTEXT)
@click.argument("old", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--kind", type=click.Choice(["cpu", "heap", "both", "offcpu", "wall"]),
              default="both", show_default=True,
              help="Compare CPU shares, heap bytes, or both; or off-CPU / wall-clock shares.")
@click.option("-n", "--limit", type=click.IntRange(0), default=20, show_default=True,
              help="Rows per table (0 = all).")
@sample_options
@click.option("--json", "as_json", is_flag=True,
              help='JSON object {"cpu": [...], "heap": [...]}.')
def diff(old: Path, new: Path, kind: str, limit: int, as_json: bool, **options: Any) -> None:
    """Per-function changes from OLD to NEW, biggest first; "new" and "gone" marked.

    CPU is compared in percent of each profile's samples, heap in bytes.
    """
    query = build_query(kind if kind in ("heap", "offcpu", "wall") else "cpu", options)
    result: dict[str, list[dict[str, object]]] = {}
    with Profile(old) as before, Profile(new) as after:
        if kind in ("cpu", "both", "offcpu", "wall"):
            cpu = cpu_diff(before, after, query)[: limit or None]
            if as_json:
                result[query.kind] = [d.as_dict() for d in cpu]
            else:
                report_render.cpu_diff(cpu)
        both_heap = all(analysis.heap_mode(p) != "none" for p in (before, after))
        if kind == "heap" and not both_heap:
            raise click.ClickException("both profiles need heap data for --kind heap")
        if kind in ("heap", "both") and both_heap:
            heap = heap_diff(before, after, query)[: limit or None]
            if as_json:
                result["heap"] = [d.as_dict() for d in heap]
            else:
                report_render.heap_diff(heap)
    if as_json:
        render.write_json(result)  # one object, as --help says


@click.command("export", context_settings=CONTEXT)
@FILE_ARGUMENT
@click.option("-f", "--format", "fmt", default="pprof", show_default=True,
              metavar="|".join(FORMATS), help="Output format.",
              shell_complete=_completing(tuple(FORMATS)))
@KIND_OPTION
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Output file ('-' for stdout); default FILE's name with .KIND.pb.gz etc.")
@click.option("--diff-base", type=click.Path(path_type=Path),
              help="pprof: add OLD's samples negated and labelled pprof::base, as pprof does.")
@SAMPLE_INDEX_OPTION
@click.option("--per-thread", is_flag=True,
              help="folded, html: one root frame per thread (firefox: always per thread).")
@granularity_option("functions")
@sample_options
def export_command(file: Path | None, fmt: str, kind: str, output: Path | None,
                   diff_base: Path | None, sample_index: str | None, per_thread: bool,
                   granularity: str, **options: Any) -> None:
    """Write a profile as pprof (gzipped profile.proto), folded stacks, speedscope JSON, an
    interactive HTML flame graph (one file, no network: search, zoom, tooltips), the Firefox
    Profiler's format (threads on a timeline at checkpoint resolution; gzipped if -o ends
    .gz), or the top table as JSON / CSV. FILE: the newest profile in this folder by default.

    \b
    rsprof export app.db -o cpu.pb.gz && go tool pprof -top cpu.pb.gz
    rsprof export app.db --kind heap -o heap.pb.gz   (pprof -sample_index=inuse_space)
    rsprof export app.db -f folded -o - | flamegraph.pl > cpu.svg
    rsprof export app.db -f html -o cpu.html         (open in any browser)
    rsprof export app.db -f firefox -o app.json.gz   (load at profiler.firefox.com)
    """
    query = build_query(kind, options)
    target, selection = export(profile_file(file), fmt=fmt, query=query, output=output,
                               base_path=diff_base, sample_index=sample_index,
                               per_thread=per_thread, granularity=granularity)
    if target != "-":
        # Distinct stacks (per thread for CPU): the firefox format loads them per checkpoint.
        kept = len({(sample.frames, sample.tid) for sample in selection.samples.samples})
        click.echo(f"rsprof: wrote {target} ({fmt}, {kind}, {kept} stacks)", err=True)


COMMANDS = (top, traces, peek, diff, export_command)
