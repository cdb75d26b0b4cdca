"""Off-CPU time: where the kernel's `sched:sched_switch` tracepoint is, and what its raw
record holds (docs/native.md, "Off-CPU time").

The sampler opens the tracepoint on every thread of the target (it fires in the thread being
switched out, so the user registers and stack copied with it are the waiting thread's) and
reads `prev_state` from the raw record: why the thread left the CPU."""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass

TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
EVENT = "events/sched/sched_switch"

# Switch-outs per second (all the target's threads, over 0.25 s of record time) above which
# the kernel call chain of each switch-out is shed (`--off-cpu-kernel-max-rate`): its unwind
# costs the target 1-2 us a switch-out (docs/benchmarks.md, "Off-CPU: context-switch storm"),
# 2-4 % of a CPU at this rate, and a storm of 100-400 k/s ran 1.3-2.2x slower with it.
OFFCPU_KERNEL_MAX_RATE = 20_000

# prev_state's letter as stored in offcpu_stack_samples.state, and its meaning
STATES = {
    "S": "sleeping",
    "D": "uninterruptible",
    "R": "preempted",
    "I": "idle",
    "T": "stopped",
}


@dataclass(frozen=True, slots=True)
class Tracepoint:
    id: int
    state_offset: int  # offset of prev_state in the raw record


class OffCpuUnavailable(Exception):
    """Off-CPU time cannot be recorded here; the message says why, in one line."""


def _mount_tracefs() -> bool:
    """tracefs is not mounted: mount it where the kernel expects it, as perf does (root)."""
    if os.geteuid() != 0 or not os.path.isdir(TRACEFS[0]):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.mount(b"nodev", TRACEFS[0].encode(), b"tracefs", 0, None) == 0


def parse_format(text: str) -> int:
    """Offset of `prev_state` in a sched_switch `format` file (ValueError without it)."""
    match = re.search(r"field:[^;]*\bprev_state;\s*offset:(\d+);\s*size:(\d+);", text)
    if match is None or int(match.group(2)) != 8:
        raise ValueError("no 8-byte prev_state field in the sched_switch format")
    return int(match.group(1))


def find_tracepoint() -> Tracepoint:
    """The sched_switch tracepoint's id and layout; OffCpuUnavailable says why not."""
    for attempt in range(2):
        for root in TRACEFS:
            base = os.path.join(root, EVENT)
            try:
                with open(os.path.join(base, "id")) as f:
                    tp_id = int(f.read().strip())
                with open(os.path.join(base, "format")) as f:
                    offset = parse_format(f.read())
            except PermissionError:
                raise OffCpuUnavailable(
                    f"{base} is not readable (needs root or CAP_PERFMON with access to"
                    " tracefs)") from None
            except (OSError, ValueError):
                continue
            return Tracepoint(tp_id, offset)
        if attempt == 0 and not _mount_tracefs():
            break
    raise OffCpuUnavailable("the sched:sched_switch tracepoint was not found (tracefs not"
                            " mounted at /sys/kernel/tracing, or not readable: needs root)")
