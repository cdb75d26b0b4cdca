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
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType

from rsprof.collector.errors import CollectorError
from rsprof.collector.heap import HeapTracker
from rsprof.collector.process import Target, target_from_pid
from rsprof.collector.recorder import Recorder, RecordOptions, RecordResult, heap_tracking_share
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
    target_exit_code: int | None


def launch(argv: Sequence[str], *, heap: bool, heap_sample_bytes: int,
           python: bool = True) -> subprocess.Popen[bytes]:
    """Starts CMD held just before its exec, so sampling covers its first instruction.

    A small bash (dash cannot name file descriptors above 9) waits on a pipe, then execs
    CMD in the same process (perf events follow a thread across exec). LD_PRELOAD is
    exported only for CMD, so the shell never creates a heap ring of its own under CMD's PID.
    """
    if not argv:
        raise CollectorError("no command given after --")
    if shutil.which(argv[0]) is None:
        raise CollectorError(f"{argv[0]}: command not found")
    read_fd, write_fd = os.pipe()
    env = dict(os.environ)
    preload = env.get("LD_PRELOAD", "")
    if heap and SHIM_PATH.exists():
        preload = f"{SHIM_PATH}:{preload}" if preload else str(SHIM_PATH)
        if heap_sample_bytes:
            env["RSPROF_HEAP_SAMPLE_BYTES"] = str(heap_sample_bytes)
        # A target that exits within milliseconds waits (briefly) for us to attach and drain
        # its ring; only CMD itself (its parent is us), not the programs it starts.
        env.setdefault("RSPROF_HEAP_EXIT_WAIT_MS", "2000")
        env["RSPROF_HEAP_WAIT_PPID"] = str(os.getpid())
        if not python:  # --python=off: the shim need not read Python frames either
            env["RSPROF_HEAP_PYTHON"] = "0"
        # 64 MiB holds ~40 ms of a 20 M pairs/s allocation storm: with the drain thread also
        # serving perf rings, the shim's 16 MiB default dropped ~2 % of such a storm.
        env.setdefault("RSPROF_HEAP_RING_MB", "64")
    env.pop("LD_PRELOAD", None)
    env["RSPROF_LAUNCH_PRELOAD"] = preload
    script = (
        f"read -r _ <&{read_fd} || exit 127; exec {read_fd}<&-;"
        ' if [ -n "$RSPROF_LAUNCH_PRELOAD" ]; then export LD_PRELOAD="$RSPROF_LAUNCH_PRELOAD"; fi;'
        ' unset RSPROF_LAUNCH_PRELOAD; exec "$0" "$@"'
    )
    try:
        child = subprocess.Popen(["/bin/bash", "-c", script, *argv], env=env, pass_fds=(read_fd,))
    finally:
        os.close(read_fd)
    child.rsprof_release_fd = write_fd  # type: ignore[attr-defined]
    return child


def release(child: subprocess.Popen[bytes]) -> None:
    fd = getattr(child, "rsprof_release_fd", None)
    if fd is not None:
        os.write(fd, b"go\n")
        os.close(fd)
        child.rsprof_release_fd = None  # type: ignore[attr-defined]


def stop_child(child: subprocess.Popen[bytes], grace_s: float = 5.0) -> int | None:
    """Ends a launched target that outlived the recording; returns its exit status."""
    release(child)
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(grace_s)
        except subprocess.TimeoutExpired:
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
    child: subprocess.Popen[bytes] | None = None,
) -> SessionOutcome:
    writer = ProfileWriter(output, append=append)
    recorder = Recorder(target, writer, options, child=child)
    if quiet:  # with the TUI on screen, warnings are said once it has closed
        recorder.on_warning = _print_warning
    result: RecordResult | None = None
    exit_code: int | None = None
    tui = None if quiet else TuiProcess(output, recorder)
    try:
        result = _record(recorder, child, tui)
    except StorageFullError:
        _finish_quietly(writer, "error: disk full")
        if tui is not None:
            tui.close()
        raise
    except BaseException as error:
        if recorder.checkpoints_written == 0 and writer.created:
            writer.abandon()  # failed before recording anything: leave no empty profile
        else:
            _finish_quietly(writer, f"error: {error}")
        if child is not None:
            stop_child(child)
        if tui is not None:
            tui.close()
        raise
    if not quiet:
        for message in recorder.warnings:
            _print_warning(message)
    if child is not None:
        exit_code = stop_child(child)
    extra: dict[str, object] = {"heap_mode": result.heap_mode}
    if exit_code is not None:
        extra["target_exit_code"] = exit_code
    writer.finish(result.stop_reason, extra)
    if tui is not None:
        # The finished file is on screen ("target exited (exit code N)"): the TUI stays
        # until the user quits, unless the terminal or a signal ended the session.
        tui.close(wait=result.stop_reason not in ("hangup", "terminated"))
    return SessionOutcome(output, result, exit_code)


def _print_warning(message: str) -> None:
    print(f"rsprof: warning: {message}", file=sys.stderr, flush=True)


def _finish_quietly(writer: ProfileWriter, reason: str) -> None:
    try:
        writer.finish(reason)
    except Exception:  # the original error is what the user must see
        pass


class TuiProcess:
    """The live TUI in a process of its own (`python -m rsprof.tui FILE --live`) that
    follows the file the recorder writes: keys never wait for sampling, unwinding or
    symbolization, which hold the GIL in this process. When it exits, the recording stops:
    status 0 (`q`, `Esc`) is "user-quit", 130 (Ctrl-C) is "interrupted"."""

    def __init__(self, output: Path, recorder: Recorder) -> None:
        self.output = output
        self.recorder = recorder
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # -P: the current folder must not shadow the installed package (`rsprof demo` run
        # from a checkout of rsprof would import its unbuilt rsprof/ folder).
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-m", "rsprof.tui", str(self.output), "--live"]
        )
        threading.Thread(target=self._watch, name="rsprof-tui-watch", daemon=True).start()

    def _watch(self) -> None:
        assert self.process is not None
        status = self.process.wait()
        if status == 0:
            reason = "user-quit"
        elif status == 130:
            reason = "interrupted"
        else:
            reason = f"error: the TUI exited with status {status}"
        self.recorder.request_stop(reason)

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


def _record(
    recorder: Recorder, child: subprocess.Popen[bytes] | None, tui: TuiProcess | None
) -> RecordResult:
    """Runs the recorder in this thread until something stops it. Ctrl-C, SIGTERM and
    SIGHUP (the terminal closed) stop it the same way, so the file is always finalized."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        recorder.request_stop(_SIGNAL_REASONS.get(signal.Signals(signum), "terminated"))

    previous = {sig: signal.signal(sig, on_signal) for sig in _SIGNAL_REASONS}

    def attached() -> None:
        # Release the child once sampling is enabled: the first checkpoint callback is
        # too late, so the recorder exposes an attach hook.
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


def target_for_child(child: subprocess.Popen[bytes], argv: Sequence[str]) -> Target:
    """The launched child as a Target (until released it is the waiting shell)."""
    target_from_pid(child.pid)  # validates that it is still there
    exe = shutil.which(argv[0]) or argv[0]
    return Target(pid=child.pid, name=Path(argv[0]).name[:15], exe=exe, cmdline=" ".join(argv))


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
    text = (
        f"rsprof: recorded {r.samples} samples{lost}{truncated} from {r.threads} threads in"
        f" {r.checkpoints} checkpoints to {outcome.path} (stopped: {r.stop_reason})"
    )
    if outcome.target_exit_code is not None:
        text += f"; target exited with code {outcome.target_exit_code}"
    if r.heap_mode != "none" and r.counted_samples:
        text += heap_tracking_note(r)
    if not r.kernel_sampled:
        text += ("; kernel time not sampled (needs root, CAP_PERFMON or"
                 " kernel.perf_event_paranoid <= 1)")
    return text
