"""One recording session, as the CLI starts it: attach (or launch), record, finalize.

Whatever stops the recording (the duration, Ctrl-C, SIGTERM, the target exiting, the
TUI quitting, an error), the file is finalized and the reason is written to it and said.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from types import FrameType

from rsprof import INHERITED_FDS
from rsprof.collector.errors import CollectorError
from rsprof.collector.heap import HeapTracker
from rsprof.collector.heapattach import HeapAttach
from rsprof.collector.process import Target, target_from_pid
from rsprof.collector.recorder import Recorder, RecordOptions, RecordResult, heap_tracking_share
from rsprof.output import TAIL_LINES, OutputCapture
from rsprof.render import human_bytes
from rsprof.storage.errors import StorageFullError
from rsprof.storage.writer import ProfileWriter

SHIM_PATH = Path(__file__).parent / "lib" / "librsprof_heap.so"
DEMO_PATH = Path(__file__).parent / "bin" / "rsprof-demo"


def default_output(process_name: str) -> Path:
    stamp = datetime.now().strftime("%y%m%d%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in process_name) or "process"
    return Path.cwd() / f"rsprof.{safe}.{stamp}.db"


@dataclass(slots=True)
class SessionOutcome:
    path: Path
    result: RecordResult
    target_exit_code: int | None  # Popen's: negative for a signal
    target_stopped: bool = False  # rsprof ended the target (it had not exited on its own)
    # `rsprof -p`: the heap shim was loaded into the running process at this time.time()
    heap_attached_at: float | None = None
    heap_off_reason: str | None = None  # why heap tracking could not start in it


class Launched(subprocess.Popen[bytes]):
    """A target started by `launch`, held before its exec until `release`."""

    release_fd: int | None
    environment: list[bytes]  # the target's, entry by entry
    stopped_by_rsprof: bool  # ended by `stop_child`, not on its own
    output: OutputCapture | None  # its stdout and stderr, kept while the TUI is on
    print_all_output: bool  # after the TUI: all of it, not its last lines


LAUNCHER_PATH = Path(__file__).parent / "bin" / "rsprof-launch"
# How long a target has to exit after SIGTERM when rsprof stops it, before SIGKILL.
STOP_GRACE_S = 5.0


def launch(argv: Sequence[str], *, heap: bool, heap_sample_bytes: int,
           python: bool = True, capture_output: bool = False) -> Launched:
    """Starts CMD held just before its exec, so sampling covers its first instruction.

    rsprof-launch (native/launch/launch.c) waits on a pipe, then execs CMD in the same
    process (perf events follow a thread across exec) with the environment `release` sends:
    the user's, byte for byte, and LD_PRELOAD only for CMD, so the launcher never creates a
    heap ring of its own under CMD's PID. CMD gets the fds rsprof inherited and none of
    rsprof's own, and dies with rsprof (PR_SET_PDEATHSIG, set by the launcher): so this runs
    on the main thread, which lives as long as rsprof (the death signal follows the thread
    that forked).
    """
    if not argv:
        raise CollectorError("no command given after --")
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("launch() must run on the main thread (PR_SET_PDEATHSIG)")
    if not LAUNCHER_PATH.exists():
        raise CollectorError(f"the launcher is missing ({LAUNCHER_PATH}); reinstall rsprof")
    environment = _target_environment(heap=heap and SHIM_PATH.exists(),
                                      heap_sample_bytes=heap_sample_bytes, python=python)
    search = _value(environment, b"PATH")
    path = shutil.which(argv[0], path=os.defpath if search is None else os.fsdecode(search))
    if path is None:
        raise CollectorError(f"{argv[0]}: command not found")
    # With the TUI, CMD's output goes to ptys rsprof reads (rsprof/output.py), not over it.
    output = OutputCapture.open() if capture_output else None
    read_fd, write_fd = os.pipe()
    try:
        child = Launched(
            [str(LAUNCHER_PATH), str(read_fd), str(os.getpid()), path, *argv],
            env={},  # the launcher's own; CMD's comes through the pipe
            close_fds=True, pass_fds=(*_inherited_fds(), read_fd),
            stdout=output.slaves["stdout"] if output else None,
            stderr=output.slaves["stderr"] if output else None,
        )
    except BaseException:
        os.close(write_fd)
        if output is not None:
            output.start()
            output.finish(0)
        raise
    finally:
        os.close(read_fd)
    if output is not None:
        output.start()
    child.output = output
    child.print_all_output = False
    child.release_fd = write_fd
    child.environment = environment
    child.stopped_by_rsprof = False
    return child


def _inherited_fds() -> list[int]:
    """The fds rsprof inherited (rsprof.INHERITED_FDS) that are still open and still
    inheritable: still the user's, not a number rsprof closed and reused."""
    fds = []
    for fd in INHERITED_FDS:
        try:
            if os.get_inheritable(fd):
                fds.append(fd)
        except OSError:
            pass
    return fds


def _user_environment() -> list[bytes]:
    """The environment rsprof was started with, entry by entry and byte for byte: the
    kernel's copy, not os.environ, into which Python's locale coercion writes
    LC_CTYPE=C.UTF-8 under LANG=C (PEP 538), and which cannot hold an entry without "="."""
    try:
        with open("/proc/self/environ", "rb") as file:
            block = file.read()
    except OSError:
        return [name + b"=" + value for name, value in os.environb.items()]
    return block.split(b"\0")[:-1] if block else []


def _name(entry: bytes) -> bytes:
    return entry.split(b"=", 1)[0]


def _value(entries: list[bytes], name: bytes) -> bytes | None:
    """NAME's value as getenv(3) finds it: the first entry."""
    return next((e[len(name) + 1:] for e in entries if _name(e) == name), None)


def _target_environment(*, heap: bool, heap_sample_bytes: int, python: bool) -> list[bytes]:
    """The user's environment, plus with the heap shim LD_PRELOAD and its RSPROF_* settings."""
    entries = _user_environment()
    if not heap:
        return entries
    preload = _value(entries, b"LD_PRELOAD")
    shim = os.fsencode(SHIM_PATH)
    settings = {b"LD_PRELOAD": shim + b":" + preload if preload else shim,
                b"RSPROF_HEAP_WAIT_PPID": str(os.getpid()).encode()}
    if heap_sample_bytes:
        settings[b"RSPROF_HEAP_SAMPLE_BYTES"] = str(heap_sample_bytes).encode()
    if not python:  # --python=off: the shim need not read Python frames either
        settings[b"RSPROF_HEAP_PYTHON"] = b"0"
    # Unless the user set them:
    # A target that exits within milliseconds waits (briefly) for us to attach and drain
    # its ring; only CMD itself (its parent is us, RSPROF_HEAP_WAIT_PPID), not the programs
    # it starts.
    # 64 MiB holds ~40 ms of a 20 M pairs/s allocation storm: with the drain thread also
    # serving perf rings, the shim's 16 MiB default dropped ~2 % of such a storm.
    defaults = {b"RSPROF_HEAP_EXIT_WAIT_MS": b"2000", b"RSPROF_HEAP_RING_MB": b"64"}
    names = {_name(e) for e in entries}
    kept = [e for e in entries if _name(e) not in settings]
    added = {**{k: v for k, v in defaults.items() if k not in names}, **settings}
    return kept + [name + b"=" + value for name, value in added.items()]


def release(child: Launched) -> None:
    """Lets the held target exec, with its environment."""
    fd = child.release_fd
    if fd is None:
        return
    child.release_fd = None
    message = b"go\0" + b"".join(entry + b"\0" for entry in child.environment)
    try:
        view = memoryview(message)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass  # the launcher is gone (killed): the recorder sees the target exit
    finally:
        os.close(fd)


def stop_child(child: Launched, grace_s: float = STOP_GRACE_S) -> int:
    """Ends a launched target, if it still runs, and returns its exit status (Popen's:
    negative for a signal). SIGTERM, then SIGKILL after `grace_s`, said on stderr. Safe to
    call again: every way out of `rsprof run` calls it."""
    if child.release_fd is not None:  # never released: the launcher exits without exec
        os.close(child.release_fd)
        child.release_fd = None
    if child.poll() is None:
        child.stopped_by_rsprof = True
        child.terminate()
        try:
            child.wait(grace_s)
        except subprocess.TimeoutExpired:
            _print_warning(f"the target (PID {child.pid}) did not exit {grace_s:g} s after"
                           " SIGTERM: sent SIGKILL")
            child.kill()
            child.wait()
        # Ended by a signal, its shim had no chance to remove its heap ring (64 MiB in
        # /dev/shm): the recorder's own sweep ran while it was still alive.
        HeapTracker.sweep_stale()
    return child.returncode


def record(
    target: Target,
    output: Path,
    options: RecordOptions,
    *,
    append: bool = False,
    quiet: bool = True,
    child: Launched | None = None,
    progress: bool = False,
    heap_attach: bool = False,
) -> SessionOutcome:
    """Records `target` into `output`: with the TUI, or `quiet` (headless). `progress`
    (headless only): say at once what is recorded and how to stop it, then, on a terminal,
    a progress line rewritten at each checkpoint, as py-spy record does. `heap_attach`: load
    the heap shim into the running process once sampling has started (`rsprof -p`;
    collector/heapattach.py)."""
    writer = ProfileWriter(output, append=append)
    if not quiet and options.first_checkpoint_s is None:
        # The TUI's first screen: data a quarter second in, not after the first interval.
        options = replace(options, first_checkpoint_s=FIRST_CHECKPOINT_S)
    recorder = Recorder(target, writer, options, child=child)
    injection = HeapAttach(target.pid, recorder.warn) if heap_attach else None
    if injection is not None:
        recorder.extra_meta = injection.meta
    line = (ProgressLine(target, output, options, child, recorder, injection)
            if quiet and progress else None)
    if quiet:  # with the TUI on screen, warnings are said once it has closed
        recorder.on_warning = _print_warning if line is None else line.warning
    captured = child.output if child is not None else None

    def checkpoint_written(totals: RecordResult, elapsed_s: float) -> None:
        if line is not None:
            line.update(totals, elapsed_s)
        if captured is not None:  # the recording thread: the writer's
            captured.save(writer.add_output)

    recorder.on_checkpoint = checkpoint_written
    result: RecordResult | None = None
    exit_code: int | None = None
    tui = None if quiet else TuiProcess(output, recorder)
    try:
        try:
            result = _record(recorder, child, tui, line, injection)
        finally:
            # After the recorder's last read of the ring, whatever ended it.
            if injection is not None:
                injection.finish()
    except BaseException as error:
        if line is not None:
            line.clear()
        if child is not None:  # first: a launched target never outlives a failed recording
            stop_child(child)
        if isinstance(error, StorageFullError):
            _finish_quietly(writer, "error: disk full")
        elif recorder.checkpoints_written == 0 and writer.created:
            writer.abandon()  # failed before recording anything: leave no empty profile
        else:
            _finish_quietly(writer, f"error: {error}")
        if tui is not None:
            tui.close()
        raise
    if line is not None:
        line.clear()
    if not quiet:
        for message in recorder.warnings:
            _print_warning(message)
    if child is not None:
        exit_code = stop_child(child)
    if captured is not None:
        captured.finish()
        captured.save(writer.add_output)
    extra: dict[str, object] = {"heap_mode": result.heap_mode}
    if result.window_end_ms is not None:
        extra["end_time_ms"] = result.window_end_ms  # sampling stopped; writing took longer
    if injection is not None:
        extra.update(injection.meta())
    if exit_code is not None:
        extra["target_exit_code"] = exit_code
    writer.finish(result.stop_reason, extra)
    if tui is not None:
        # The finished file is on screen ("target exited (exit code N)"): the TUI stays
        # until the user quits, unless the terminal or a signal ended the session.
        tui.close(wait=result.stop_reason not in ("hangup", "terminated"))
    if captured is not None and result.stop_reason != "hangup":  # no terminal to print on
        captured.print_tail(None if child is not None and child.print_all_output
                            else TAIL_LINES)
    return SessionOutcome(output, result, exit_code,
                          child is not None and child.stopped_by_rsprof,
                          injection.injected.attached_at
                          if injection is not None and injection.injected is not None else None,
                          injection.refused if injection is not None else None)


def _print_warning(message: str) -> None:
    print(f"rsprof: warning: {message}", file=sys.stderr, flush=True)


class ProgressLine:
    """Headless recording's words on stderr: one line when sampling has begun (what, where
    to, how to stop), then on a terminal one progress line, rewritten in place at each
    checkpoint (elapsed, samples, live heap), cleared before the summary or a warning."""

    def __init__(self, target: Target, output: Path, options: RecordOptions,
                 child: Launched | None, recorder: Recorder,
                 injection: HeapAttach | None = None) -> None:
        self.target = target
        self.output = output
        self.options = options
        self.child = child
        self.recorder = recorder
        self.injection = injection  # `rsprof -p`: the shim being loaded into the process
        self.heap = False  # heap tracked: said at the start, shown in the progress line
        self.shown = False  # a progress line is on the terminal
        self.on_terminal = sys.stderr.isatty()

    def started(self) -> None:
        what = (f"running {self.target.cmdline or self.target.name} (pid {self.target.pid})"
                if self.child is not None else
                f"recording {self.target.name} (pid {self.target.pid})")
        if self.child is not None:  # its ring appears after exec: the shim is what tells
            preload = _value(self.child.environment, b"LD_PRELOAD") or b""
            heap = self.options.heap and os.fsencode(SHIM_PATH) in preload
        else:
            heap = self.options.heap and self.recorder.heap_rings > 0
        attaching = self.injection is not None and self.injection.state == "attaching"
        self.heap = heap or attaching
        kinds = "CPU and heap" if heap else "CPU, heap attaching," if attaching else "CPU"
        until = (f" for {_seconds(self.options.duration_s)}" if self.options.duration_s
                 else "")
        stop = "Ctrl-C to stop" if self.child is None else "Ctrl-C stops it and the program"
        print(f"rsprof: {what}: {kinds} at {self.options.freq_hz} Hz{until} into"
              f" {self.output}; {stop}", file=sys.stderr, flush=True)

    def update(self, totals: RecordResult, elapsed_s: float) -> None:
        if not self.on_terminal:
            return
        text = f"rsprof: {_seconds(elapsed_s)}, {totals.samples:,} samples"
        if totals.lost_samples:
            text += f" ({totals.lost_samples:,} lost)"
        state = self.injection.state if self.injection is not None else None
        if state == "attaching":
            text += ", attaching heap"
        elif state == "off":
            text += ", heap off"
        elif self.heap or self.recorder.heap_rings:
            text += f", heap live {human_bytes(totals.heap_live_bytes)}"
            if state == "attached" and self.injection is not None:
                text += f" since {self.injection.since()}"
        print(f"\r\x1b[K{text}", end="", file=sys.stderr, flush=True)
        self.shown = True

    def warning(self, message: str) -> None:
        self.clear()
        _print_warning(message)

    def clear(self) -> None:
        if self.shown:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)
            self.shown = False


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def _finish_quietly(writer: ProfileWriter, reason: str) -> None:
    try:
        writer.finish(reason)
    except Exception:  # the original error is what the user must see
        pass


class TuiProcess:
    """The live TUI in a process of its own (`python -m rsprof.tui FILE --live`) that
    follows the file the recorder writes: keys never wait for sampling, unwinding or
    symbolization, which hold the GIL in this process. When it exits, the recording stops
    (tui_exit_reason): status 0 (`q`, `Esc`) is "user-quit", 130 (Ctrl-C) is "interrupted"."""

    def __init__(self, output: Path, recorder: Recorder) -> None:
        self.output = output
        self.recorder = recorder
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # -P: the current folder must not shadow the installed package (`rsprof demo` run
        # from a checkout of rsprof would import its unbuilt rsprof/ folder).
        # On the terminal itself, whatever rsprof's stdout and stderr are (Textual draws on
        # stderr: `rsprof run -- prog 2>err.log` put the TUI into err.log).
        try:
            terminal: int | None = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            terminal = None
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", "rsprof.tui", str(self.output), "--live"],
                stdin=terminal, stdout=terminal, stderr=terminal,
            )
        finally:
            if terminal is not None:
                os.close(terminal)
        threading.Thread(target=self._watch, name="rsprof-tui-watch", daemon=True).start()

    def _watch(self) -> None:
        assert self.process is not None
        self.recorder.request_stop(tui_exit_reason(self.process.wait()))

    def close(self, *, wait: bool = False) -> None:
        """Waits for the user to quit (`wait`), or ends the TUI now."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        if not wait:
            process.terminate()
        try:
            process.wait(None if wait else 5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# Signals that end a recording the way Ctrl-C does: the file is finalized with the reason
# and a launched target is stopped, never orphaned. SIGHUP (the terminal closed, or
# `kill -HUP`) is treated like SIGTERM.
_SIGNAL_REASONS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated",
                   signal.SIGHUP: "hangup"}


def tui_exit_reason(status: int) -> str:
    """The stop reason of a recording whose live TUI ended with `status` (Popen's: -N for
    signal N). A TUI ended by one of the signals that stop a recording gets that signal's
    reason: closing the terminal sends SIGHUP to the TUI and the recorder alike, and the
    TUI may die of it before the recorder's handler runs (CI saw "error: the TUI exited
    with status -1" for a closed terminal)."""
    if status == 0:
        return "user-quit"
    if status == 130:
        return "interrupted"
    if status < 0 and -status in _SIGNAL_REASONS:
        return _SIGNAL_REASONS[signal.Signals(-status)]
    return f"error: the TUI exited with status {status}"


def stopping_signal(stop_reason: str) -> int | None:
    """The signal that stopped a recording with this reason, if one did."""
    return next((int(sig) for sig, reason in _SIGNAL_REASONS.items() if reason == stop_reason),
                None)


def _record(
    recorder: Recorder, child: Launched | None, tui: TuiProcess | None,
    line: ProgressLine | None,
    injection: HeapAttach | None = None,
) -> RecordResult:
    """Runs the recorder in this thread until something stops it. Ctrl-C, SIGTERM and
    SIGHUP (the terminal closed) stop it the same way, so the file is always finalized."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        recorder.request_stop(_SIGNAL_REASONS.get(signal.Signals(signum), "terminated"))

    previous = {sig: signal.signal(sig, on_signal) for sig in _SIGNAL_REASONS}

    def attached() -> None:
        # Release the child once sampling is enabled: the first checkpoint callback is
        # too late, so the recorder exposes an attach hook.
        if injection is not None:  # first: the start line says whether it is attaching
            injection.start()
        if line is not None:
            line.started()
        if child is not None:
            release(child)
        if tui is not None:
            tui.start()

    recorder.on_attached = attached
    try:
        return recorder.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def target_for_child(child: Launched, argv: Sequence[str]) -> Target:
    """The launched child as a Target (until released it is the waiting launcher)."""
    target_from_pid(child.pid)  # validates that it is still there
    exe = shutil.which(argv[0]) or argv[0]
    return Target(pid=child.pid, name=Path(argv[0]).name[:15], exe=exe, cmdline=" ".join(argv))


FIRST_CHECKPOINT_S = 0.25
"""With the TUI, the first checkpoint comes this soon (then one every interval)."""

# Above this share of CPU samples in the heap shim's own work, the summary says how to lower it.
HEAP_TRACKING_HINT_PCT = 10.0


def heap_tracking_note(r: RecordResult) -> str:
    """The summary's words on what heap tracking cost the target (collector/shimframes.py
    charges it to `[rsprof heap tracking]`)."""
    pct = 100 * heap_tracking_share(r)
    text = f"; heap tracking took {pct:.1f}% of CPU samples ([rsprof heap tracking])"
    if pct > HEAP_TRACKING_HINT_PCT:
        text += (": to lower it, sample allocations (--heap-sample BYTES, e.g. 65536)"
                 " or turn heap tracking off (--no-heap)")
    return text


def describe(outcome: SessionOutcome) -> str:
    r = outcome.result
    lost = f", {r.lost_samples} lost" if r.lost_samples else ""
    # stacks the CFI walk could not finish end in a [truncated] root: say how many
    truncated = f", {r.truncated_samples} with truncated stacks" if r.truncated_samples else ""
    if r.gil_dropped:  # --gil: read, then left out
        truncated += f", {r.gil_dropped} left out by --gil (GIL not held)"
    text = (
        f"rsprof: recorded {r.samples} samples{lost}{truncated} from {_count(r.threads, 'thread')}"
        f" in {_count(r.checkpoints, 'checkpoint')} to {outcome.path} (stopped: {r.stop_reason})"
    )
    code = outcome.target_exit_code
    if code is not None and outcome.target_stopped:
        text += f"; target stopped by rsprof ({_signal_name(-code)})" if code < 0 else (
            f"; target exited with code {code} when rsprof stopped it")
    elif code is not None:
        text += (f"; target killed by {_signal_name(-code)}" if code < 0
                 else f"; target exited with code {code}")
    if outcome.heap_attached_at is not None:
        # Blocks allocated before the shim came are unknown: leaks read "allocated since
        # attach and still live".
        since = datetime.fromtimestamp(outcome.heap_attached_at).strftime("%H:%M:%S")
        text += f"; heap since attach at {since} (blocks allocated before it are not known)"
    if outcome.heap_off_reason:
        text += f"; heap off: {outcome.heap_off_reason}"
    if r.heap_mode != "none" and r.counted_samples:
        text += heap_tracking_note(r)
    if not r.kernel_sampled:
        text += ("; kernel time not sampled (needs root, CAP_PERFMON or"
                 " kernel.perf_event_paranoid <= 1)")
    return text


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
