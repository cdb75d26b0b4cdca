"""Options shared by the commands that read a profile's samples (top, traces, peek, diff,
export): pprof's filters, granularity, thread and time range."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rsprof.durations import parse_duration
from rsprof.storage.analysis import list_profiles
from rsprof.storage.errors import ProfileError
from rsprof.storage.filters import FrameFilter
from rsprof.storage.granularity import GRANULARITIES
from rsprof.storage.samples import KINDS, TimeRange
from rsprof.storage.selection import SampleQuery, Selection

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# User stack bytes copied per CPU sample for CFI unwinding (`--stack-bytes`); chosen by
# measurement, see docs/benchmarks.md ("CFI unwinding").
DEFAULT_STACK_BYTES = 16384


def profile_file(file: Path | None) -> Path:
    """FILE, or else the newest profile in the current folder (as `view` and `list` see
    them): `rsprof run -- app && rsprof top cpu` reads what was just recorded."""
    if file is not None:
        return file
    found = list_profiles(Path.cwd())
    if not found:
        raise ProfileError("no profile in this folder; give a FILE")
    return found[0].path


def _point(_ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value, allow_zero=True)
    except ValueError as error:
        raise click.BadParameter(str(error), param=param) from None


def sample_options(func: click.decorators.FC) -> click.decorators.FC:
    decorators = [
        click.option("--focus", "--filter", "focus", metavar="REGEX",
                     help="Only samples with a frame matching REGEX (function, file or module);"
                          " --filter: the same (the original rsprof's name)."),
        click.option("--ignore", metavar="REGEX", help="Drop samples with a frame matching REGEX."),
        click.option("--show", metavar="REGEX", help="Keep only frames matching REGEX."),
        click.option("--hide", metavar="REGEX", help="Remove frames matching REGEX."),
        click.option("--hide-runtime", is_flag=True,
                     help="Fold out process and thread start-up frames (_start, clone3, ...)"
                          " and, in Python stacks, the interpreter's own: your code first."),
        click.option("--tid", type=click.IntRange(1, 2**31 - 1),
                     help="Only this thread (CPU: the sampled thread; heap: the allocating"
                          " thread)."),
        click.option("--pid", "process_pid", type=click.IntRange(1, 2**31 - 1),
                     help="Only this process, of a recording that followed children."),
        click.option("--since", callback=_point, metavar="TIME",
                     help="Start of the time range, from the recording's start (e.g. 2s, 1m)."),
        click.option("--until", callback=_point, metavar="TIME",
                     help="End of the time range, from the recording's start."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def granularity_option(default: str) -> Any:
    return click.option("--granularity", "-g", type=click.Choice(GRANULARITIES),
                        default=default, show_default=True,
                        help="What one row is: a function, file, source line or address.")


def build_query(kind: str, options: dict[str, Any]) -> SampleQuery:
    """The query for `kind` from the options above (popped from `options`)."""
    since, until = options.pop("since"), options.pop("until")
    if since is not None and until is not None and since >= until:
        raise click.BadParameter("must be later than --since", param_hint="'--until'")
    try:
        filters = FrameFilter.compile(focus=options.pop("focus"), ignore=options.pop("ignore"),
                                      show=options.pop("show"), hide=options.pop("hide"),
                                      hide_runtime=options.pop("hide_runtime"))
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    tid = options.pop("tid")
    pid = options.pop("process_pid")
    return SampleQuery(kind, tid, TimeRange(since, until), filters, pid)


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise click.BadParameter(f"unknown kind {kind!r}: use {', '.join(KINDS)}",
                                 param_hint="KIND")
    return kind


def value_index(selection: Selection, name: str | None) -> int:
    """`--sample-index NAME` as an index into the selection's sample types (usage error)."""
    try:
        return selection.samples.value_index(name)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="'--sample-index'") from None
