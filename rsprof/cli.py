"""The `rsprof` command. Commands stay thin: they parse, call collector or storage, render.

Exit codes (rsprof's): 0 ok, 1 error, 2 usage, 3 process not found, 4 permission,
5 heap refused (`-p PID --heap`), 6 database; `rsprof run` otherwise ends with its target's
status (_run_status). Every failure is one line on stderr, never a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rsprof import __version__, render, report_commands
from rsprof.collector.errors import (
    CollectorError,
    PermissionDenied,
    ProcessNotFound,
)
from rsprof.collector.offcpu import OFFCPU_KERNEL_MAX_RATE
from rsprof.durations import parse_duration
from rsprof.exit_codes import (
    EXIT_DATABASE,
    EXIT_ERROR,
    EXIT_HEAP_REFUSED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PERMISSION,
    EXIT_USAGE,
)
from rsprof.options import CONTEXT, DEFAULT_STACK_BYTES, profile_file
from rsprof.storage import analysis
from rsprof.storage.errors import ProfileError, ProfileExists
from rsprof.storage.reader import Profile
from rsprof.storage.selection import EmptySelection

if TYPE_CHECKING:  # recording modules load only for recording commands: reports start faster
    from rsprof import session
    from rsprof.collector.process import Target



class Failure(Exception):
    """An error with its exit code, shown as one line."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _duration(_ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as error:
        raise click.BadParameter(str(error), param=param) from None


def _stack_bytes(ctx: click.Context, param: click.Parameter, value: int) -> int:
    if value % 8:
        raise click.BadParameter("must be a multiple of 8", param=param)
    return value


def record_options(func: click.decorators.FC) -> click.decorators.FC:
    """Options shared by attaching (-p/-P), `run` and `demo`."""
    return _record_options(func, demo=False)


def demo_options(func: click.decorators.FC) -> click.decorators.FC:
    """`demo`'s: the same, those that make no sense for a 5 s demo of a native program
    hidden from its help (-a, --follow, --python, --stack-bytes; still accepted)."""
    return _record_options(func, demo=True)


def _record_options(func: click.decorators.FC, *, demo: bool) -> click.decorators.FC:
    decorators = [
        click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
                     help="Profile file (default rsprof.<process>.<yymmddHHMMSS>.db here)."),
        click.option("-i", "--interval", default="1s", show_default=True, callback=_duration,
                     help="Checkpoint interval."),
        click.option("-d", "--duration", callback=_duration,
                     help="Stop after this long (e.g. 10s, 5m, 1h); default: until Ctrl-C."),
        # -F is perf's name for it, --rate/-r py-spy's.
        click.option("--cpu-freq", "-F", "--rate", "-r", "cpu_freq",
                     type=click.IntRange(1, 100_000), default=99, show_default=True,
                     help="CPU samples per second per thread (-F as in perf, --rate/-r as"
                          " in py-spy)."),
        click.option("--stack-bytes", type=click.IntRange(0, 65448), default=DEFAULT_STACK_BYTES,
                     show_default=True, callback=_stack_bytes, hidden=demo,
                     help="User stack bytes copied per CPU sample and unwound by CFI (multiple"
                          " of 8); 0 walks frame pointers instead."),
        click.option("--python", "python", type=click.Choice(["on", "off", "drain"]),
                     default="on", show_default=True, hidden=demo,
                     help="Python frames of CPython 3.11-3.13 targets, spliced into the native"
                          " stacks in place of the interpreter's _PyEval_EvalFrameDefault:"
                          " read at sample time by a BPF program where it can be loaded, else"
                          " from outside when the sample is drained (drain: always so);"
                          " off: native frames only."),
        click.option("--off-cpu/--no-off-cpu", "offcpu", default=True, show_default=True,
                     help="Also record where threads wait: each switch-out's stack and the"
                          " time until the thread runs again (sched:sched_switch; needs root"
                          " or CAP_PERFMON, else one line says so and CPU recording goes on)."),
        click.option("--off-cpu-kernel/--no-off-cpu-kernel", "offcpu_kernel", default=True,
                     show_default=True,
                     help="Name the kernel function each wait is in (pipe_read, futex_wait):"
                          " the kernel call chain of every switch-out, when kernel stacks are"
                          " allowed (until --off-cpu-kernel-max-rate)."),
        click.option("--off-cpu-kernel-max-rate", "offcpu_kernel_max_rate",
                     type=click.IntRange(min=0), default=OFFCPU_KERNEL_MAX_RATE,
                     show_default=True, metavar="N",
                     help="Stop naming kernel functions, and reading a Python target's frames"
                          " at each switch-out, once the target switches out more than N"
                          " times a second (over 0.25 s): each switch-out's kernel unwind"
                          " costs it 1-2 us (a storm of 100 k/s runs 1.3-2x slower), a"
                          " 20-frame Python read ~4.5 us (docs/benchmarks.md); one line says"
                          " when. 0: never stop."),
        click.option("--gil", is_flag=True, hidden=demo,
                     help="As py-spy's --gil: keep the CPU samples of a CPython's threads only"
                          " when the thread holds the GIL (decided at sample time by the BPF"
                          " program; needs --python on). Off-CPU time is recorded as without."),
        click.option("-q", "--quiet", count=True,
                     help="Record headless (no TUI): one line saying what is recorded, then"
                          " progress on a terminal; -qq: only the summary at the end."),
        click.option("-a", "--append", is_flag=True, hidden=demo,
                     help="Append to an existing profile."),
        click.option("--follow/--no-follow", default=None, hidden=demo,
                     help="Also sample the processes the target starts, each as its own"
                          " process in the profile (default: on for `run`, off when attaching)."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


@click.group(context_settings=CONTEXT, invoke_without_command=True)
@click.option("-p", "--pid", type=int, help="Attach to this process.")
@click.option("-P", "--process", "process_name",
              help="Attach to the process whose name contains this.")
@click.option("--heap/--no-heap", "heap", default=None,
              help="Track the heap too (default: on where it can be): a process started"
                   " without the shim gets it loaded with ptrace, and its heap is recorded"
                   " since the attach. With --heap, a refusal ends rsprof with status 5.")
@record_options
@click.version_option(__version__, prog_name="rsprof")
@click.pass_context
def cli(ctx: click.Context, pid: int | None, process_name: str | None, **options: object) -> None:
    """Live CPU and heap profiler for Linux processes.

    Attach with `rsprof -p PID` (or `-P NAME`), or start a program under it with
    `rsprof run -- CMD`. Profiles are SQLite files: reopen them with `rsprof view`,
    summarize with `rsprof top`, query with `rsprof query`.
    """
    if ctx.invoked_subcommand is not None:
        return
    if pid is None and process_name is None:
        click.echo(ctx.get_help())
        return
    _attach(pid, process_name, options)


@cli.command("record", context_settings=CONTEXT)
@click.option("-p", "--pid", type=int, help="Attach to this process.")
@click.option("-P", "--process", "process_name",
              help="Attach to the process whose name contains this.")
@click.option("--heap/--no-heap", "heap", default=None,
              help="Track the heap too (default: on where it can be): a process started"
                   " without the shim gets it loaded with ptrace, and its heap is recorded"
                   " since the attach. With --heap, a refusal ends rsprof with status 5.")
@record_options
def record(pid: int | None, process_name: str | None, **options: object) -> None:
    """Attach to a running process: the same as `rsprof -p PID` (perf and py-spy users
    type `record`). To start a program under rsprof, use `rsprof run -- CMD`."""
    if pid is None and process_name is None:
        raise click.UsageError("give -p PID or -P NAME (or use `rsprof run -- CMD`)")
    _attach(pid, process_name, options)


def _attach(pid: int | None, process_name: str | None, options: dict[str, object]) -> None:
    if pid is not None and process_name is not None:
        raise click.UsageError("give -p PID or -P NAME, not both")
    _check_record_options(options["cpu_freq"], options["interval"],  # type: ignore[arg-type]
                          options.get("gil", False), options.get("python", "on"))  # type: ignore[arg-type]
    from rsprof.collector.process import target_from_name, target_from_pid

    target = target_from_pid(pid) if pid is not None else target_from_name(str(process_name))
    asked = options.pop("heap")
    outcome = _record(target, heap=asked is not False, **options)  # type: ignore[arg-type]
    if outcome.heap_off_reason is not None and asked is True:
        raise TargetStatus(EXIT_HEAP_REFUSED)  # said already, in one line


MIN_INTERVAL_S = 0.01
MAX_INTERVAL_S = 86400.0


def _check_record_options(cpu_freq: int, interval: float, gil: bool = False,
                          python: str = "on") -> None:
    """Bad options are refused before anything is attached or launched."""
    _check_frequency(cpu_freq)
    if gil and python != "on":
        # The GIL's holder is read at sample time, by the BPF program --python on loads.
        raise click.BadParameter(f"needs --python on (not {python})", param_hint="'--gil'")
    # Below 10 ms the recorder does nothing but write checkpoints (-i 0.0000001s wrote
    # 737 in a second and starved the sampler); above a day nobody waits for one.
    if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
        raise click.BadParameter("must be between 10ms and 1d", param_hint="'-i' / '--interval'")


def _headless(quiet: int) -> bool:
    """No TUI: asked for (-q), or no terminal to draw it on."""
    return quiet > 0 or not (sys.stdin.isatty() and sys.stdout.isatty())


def _record(
    target: Target,
    *,
    output: Path | None,
    interval: float,
    duration: float | None,
    cpu_freq: int,
    stack_bytes: int,
    python: str,
    quiet: int,
    offcpu: bool = True,
    offcpu_kernel: bool = True,
    offcpu_kernel_max_rate: int = OFFCPU_KERNEL_MAX_RATE,
    gil: bool = False,
    append: bool,
    follow: bool | None,
    child: session.Launched | None = None,
    heap: bool = True,
) -> session.SessionOutcome:
    from rsprof import session
    from rsprof.collector.recorder import RecordOptions

    path = output or session.default_output(target.name)
    headless = _headless(quiet)
    options = RecordOptions(
        freq_hz=cpu_freq, interval_s=interval, duration_s=duration, stack_bytes=stack_bytes,
        python=python != "off", python_bpf=python == "on", offcpu=offcpu,
        offcpu_kernel=offcpu_kernel, offcpu_kernel_max_rate=offcpu_kernel_max_rate, gil=gil,
        follow=(child is not None) if follow is None else follow,
        heap=heap,
    )
    # Attaching (no child): the heap shim is loaded into the process unless --no-heap.
    outcome = session.record(target, path, options, append=append, quiet=headless, child=child,
                             progress=quiet < 2, heap_attach=heap and child is None)
    click.echo(session.describe(outcome), err=True)
    return outcome


def _record_launched(
    command: Sequence[str], *, heap: bool, heap_sample_bytes: int, **options: Any
) -> session.SessionOutcome:
    """`run` and `demo`: start COMMAND held before exec, then record it."""
    from rsprof import session

    _check_record_options(options["cpu_freq"], options["interval"], options.get("gil", False),
                          options.get("python", "on"))
    child = session.launch(command, heap=heap, heap_sample_bytes=heap_sample_bytes,
                           python=options.get("python", "on") != "off",
                           capture_output=not _headless(options["quiet"]))
    child.print_all_output = bool(options.pop("all_output", False))
    try:
        target = session.target_for_child(child, command)
        return _record(target, child=child, **options)
    finally:
        # On every way out (an error, Ctrl-C while finalizing): the target never outlives
        # rsprof. Already stopped on the usual ways, this does nothing then.
        session.stop_child(child)


class TargetStatus(Exception):
    """`rsprof run` ends with this status (no message): see `_run_status`."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _run_status(outcome: session.SessionOutcome) -> int:
    """`rsprof run`'s exit status (README, Exit codes), so `rsprof run -- ./tests && deploy`
    deploys only after passing tests: the target's when it ended on its own (128 + N for
    signal N, as shells say); 128 + N when signal N stopped rsprof (130 for Ctrl-C), whatever
    the target did then; 1 when the TUI failed; 0 when rsprof stopped the target at the
    duration or when the TUI was quit."""
    from rsprof import session

    reason = outcome.result.stop_reason
    signum = session.stopping_signal(reason)
    if signum is not None:
        return 128 + signum
    if reason.startswith("error"):
        return EXIT_ERROR
    code = outcome.target_exit_code
    if code is not None and not outcome.target_stopped:
        return 128 - code if code < 0 else code
    return EXIT_OK


def _check_frequency(freq: int) -> None:
    try:
        limit = int(Path("/proc/sys/kernel/perf_event_max_sample_rate").read_text())
    except (OSError, ValueError):
        return
    if freq > limit:
        raise click.BadParameter(
            f"{freq} Hz is above the kernel's limit of {limit}"
            " (/proc/sys/kernel/perf_event_max_sample_rate)",
            param_hint="'--cpu-freq'",
        )


@cli.command(context_settings={**CONTEXT, "ignore_unknown_options": True})
@record_options
@click.option("--heap-sample", "heap_sample", type=click.IntRange(0), default=0,
              help="Sample allocations every BYTES on average (Poisson); 0 = every allocation.")
@click.option("--no-heap", is_flag=True, help="CPU only: do not preload the heap shim.")
@click.option("--all-output", is_flag=True,
              help="With the TUI: print all of COMMAND's output when it ends (default: its"
                   " last 20 lines; all of it is in the profile either way).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(command: tuple[str, ...], heap_sample: int, no_heap: bool, all_output: bool,
        **options: object) -> None:
    """Start COMMAND under rsprof: heap and CPU from its first instruction.

    rsprof run [OPTIONS] -- CMD [ARGS]...

    With the live TUI, COMMAND's stdout and stderr are kept (they would be drawn over it):
    saved in the profile, and their last lines printed when the TUI ends. Headless (-q),
    COMMAND writes to rsprof's own stdout and stderr.
    """
    outcome = _record_launched(command, heap=not no_heap, heap_sample_bytes=heap_sample,
                               all_output=all_output, **options)
    status = _run_status(outcome)
    if status:
        raise TargetStatus(status)


@cli.command(context_settings=CONTEXT)
@demo_options
def demo(**options: object) -> None:
    """Profile the bundled demo program (3 busy threads, a leaking heap site).

    Runs 5 s headless when there is no terminal (or with -q) and prints the top tables;
    otherwise opens the live TUI.
    """
    from rsprof import session

    if not session.DEMO_PATH.exists():
        raise Failure(f"the demo program is missing ({session.DEMO_PATH}); reinstall rsprof")
    interactive = not options["quiet"] and sys.stdin.isatty() and sys.stdout.isatty()
    if options["duration"] is None and not interactive:
        options["duration"] = 5.0
    outcome = _record_launched((str(session.DEMO_PATH),), heap=True, heap_sample_bytes=0,
                               **options)
    if not interactive:
        with Profile(outcome.path) as profile:
            # 20 rows: with true (CFI) stacks the threads' common callers (_start, main,
            # start_thread, clone3) rank by total above the demo's own functions.
            rows, total = analysis.top_cpu(profile, limit=20, sort_by_total=True)
            render.cpu_table(rows, total, title="CPU: where time went (self and total)")
            if analysis.heap_mode(profile) != "none":
                render.heap_table(
                    analysis.top_heap(profile, limit=10), title="Heap: live bytes by call site"
                )
        click.echo(f"Reopen it with: rsprof view {outcome.path}\n"
                   f"Export it for pprof: rsprof export {outcome.path} -o cpu.pb.gz", err=True)
    status = _run_status(outcome)
    if status:
        raise TargetStatus(status)


@cli.command(context_settings=CONTEXT)
@click.argument("pid", type=click.IntRange(1, 2**31 - 1))
@click.option("--python", "python", type=click.Choice(["on", "off"]), default="on",
              show_default=True, help="Python frames of CPython 3.11-3.13 in place of the"
                                      " interpreter's; off: native frames only.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (threads, frames).")
def dump(pid: int, python: str, as_json: bool) -> None:
    """Every thread's stack now, once (as py-spy dump): where each thread runs or waits.

    The threads are stopped for a moment with ptrace (no signal sent, none lost) while their
    stacks are copied; the summary line says for how long.
    """
    from rsprof.collector.dump import dump as take_dump

    render.process_dump(take_dump(pid, python=python == "on"), as_json=as_json)


@cli.command(context_settings=CONTEXT)
def preload() -> None:
    """Print the heap shim's path, for LD_PRELOAD=$(rsprof preload) CMD."""
    from rsprof import session

    if not session.SHIM_PATH.exists():
        raise Failure(f"the heap shim is missing ({session.SHIM_PATH}); reinstall rsprof")
    click.echo(str(session.SHIM_PATH))


@cli.command(context_settings=CONTEXT)
@click.argument("file", type=click.Path(path_type=Path))
@click.argument("sql")
@click.option("--json", "as_json", is_flag=True, help="JSON array of objects.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header line.")
def query(file: Path, sql: str, as_json: bool, as_csv: bool) -> None:
    """Run SQL on a profile, read-only (tab-separated with a header line).

    The SQL reads the profile and nothing else: no ATTACH, VACUUM, writes, pragma
    assignments or extensions. Rows are printed as they come; Ctrl-C stops the query
    (exit 130).
    """
    import signal

    from rsprof.storage.sql import Query, QueryInterrupted

    if as_json and as_csv:
        raise click.UsageError("give --json or --csv, not both")
    run = Query(file, sql)
    # The statement runs in SQLite with the GIL released: a KeyboardInterrupt would only
    # surface when it ends. The handler sets a flag SQLite's progress handler polls.
    previous = signal.signal(signal.SIGINT, lambda *_: run.interrupt())
    try:
        columns = run.execute()
        render.query_result(columns, run.rows(),
                            fmt="json" if as_json else "csv" if as_csv else "tsv")
    except QueryInterrupted:
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGINT, previous)
        run.close()


@cli.command("list", context_settings=CONTEXT)
@click.option("-d", "--dir", "directory", type=click.Path(path_type=Path), default=Path("."),
              show_default=True, help="Folder to look in.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON list of objects (file, pid, process, start_time_ms, duration_ms,"
                   " samples, lost_samples, state).")
def list_(directory: Path, as_json: bool) -> None:
    """Profiles in a folder, newest first."""
    render.profile_list(analysis.list_profiles(directory), as_json=as_json)


@cli.command(context_settings=CONTEXT)
@click.argument("file", type=click.Path(path_type=Path), required=False)
def view(file: Path | None) -> None:
    """Open a saved profile in the TUI (the newest in this folder by default)."""
    file = profile_file(file)
    Profile(file).close()  # one clear error for a missing or foreign file, before Textual
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise Failure(
            "view needs a terminal (stdin and stdout); in scripts use `rsprof top` or"
            " `rsprof query`",
            EXIT_USAGE,
        )
    from rsprof.tui import run_tui

    sys.exit(run_tui(str(file), live=False))


for _command in report_commands.COMMANDS:
    cli.add_command(_command)


def _collector_exit_code(error: CollectorError) -> int:
    if isinstance(error, ProcessNotFound):
        return EXIT_NOT_FOUND
    if isinstance(error, PermissionDenied):
        return EXIT_PERMISSION
    return EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the command and turns every failure into one line + exit code."""
    try:
        cli.main(args=argv, prog_name="rsprof", standalone_mode=False)
    except click.exceptions.Exit as done:
        return done.exit_code
    except TargetStatus as done:  # `run`: the target's status, said by `describe` already
        return done.status
    except click.UsageError as error:
        command = error.ctx.info_name if error.ctx and error.ctx.parent else ""
        hint = f"rsprof {command} --help" if command else "rsprof --help"
        click.echo(f"rsprof: error: {error.format_message()} (see {hint})", err=True)
        return EXIT_USAGE
    except click.ClickException as error:
        click.echo(f"rsprof: error: {error.format_message()}", err=True)
        return error.exit_code
    except click.Abort:
        click.echo("rsprof: interrupted", err=True)
        return EXIT_INTERRUPTED
    except CollectorError as error:
        click.echo(f"rsprof: error: {error}", err=True)
        return _collector_exit_code(error)
    except EmptySelection as error:
        click.echo(f"rsprof: error: {error}", err=True)
        return EXIT_ERROR
    except ProfileExists as error:
        click.echo(f"rsprof: error: {error} (use -a/--append to add to it)", err=True)
        return EXIT_DATABASE
    except ProfileError as error:
        click.echo(f"rsprof: error: {error}", err=True)
        return EXIT_DATABASE
    except Failure as error:
        click.echo(f"rsprof: error: {error}", err=True)
        return error.exit_code
    except BrokenPipeError:
        return 0
    except ProcessLookupError as error:  # the target left between two steps
        click.echo(f"rsprof: error: the process exited ({error.strerror or error})", err=True)
        return EXIT_NOT_FOUND
    except OSError as error:  # a path too long, a device error: one line, not a bug report
        where = f"{error.filename}: " if error.filename else ""
        click.echo(f"rsprof: error: {where}{error.strerror or error}", err=True)
        return EXIT_ERROR
    except KeyboardInterrupt:
        click.echo("rsprof: interrupted", err=True)
        return EXIT_INTERRUPTED
    except Exception as error:  # a bug: still one line, the traceback only on request
        if os.environ.get("RSPROF_DEBUG"):
            raise
        click.echo(
            f"rsprof: internal error: {type(error).__name__}: {error}"
            " (set RSPROF_DEBUG=1 for the traceback)",
            err=True,
        )
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
