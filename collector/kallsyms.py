"""Kernel function names for off-CPU stacks (docs/native.md, "Off-CPU time").

A switch-out's kernel call chain (leaf first) starts in the scheduler (__schedule, schedule,
schedule_timeout, ...) and goes on through the function the thread waits in (anon_pipe_read,
futex_wait, do_nanosleep) to the system call's entry. The scheduler's frames say nothing
about the wait: the stored stack keeps one kernel frame, the first below them, named from
/proc/kallsyms (read once per recording)."""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

KALLSYMS = "/proc/kallsyms"
KERNEL_MODULE = "[kernel.kallsyms]"  # perf's name for the kernel image's frames

# The scheduler's functions, for a kernel whose .sched.text bounds are not listed: the
# kernel itself (get_wchan, in_sched_functions) skips every function of that section.
SCHEDULER_FUNCTIONS = frozenset({
    "__schedule", "schedule", "schedule_idle", "schedule_preempt_disabled", "__cond_resched",
    "preempt_schedule", "preempt_schedule_common", "preempt_schedule_irq",
    "preempt_schedule_notrace", "__wait_for_common", "wait_for_common",
    "do_wait_for_common", "io_schedule", "io_schedule_timeout", "schedule_timeout",
    "schedule_hrtimeout", "schedule_hrtimeout_range", "schedule_hrtimeout_range_clock",
    "bit_wait", "bit_wait_io",
})
SCHEDULER_PREFIXES = ("schedule_timeout_", "wait_for_completion", "__wait_for_completion")
# A text symbol's line; __pfx_ symbols are the padding before a function
# (CONFIG_FUNCTION_PADDING): no return address is ever in one
TEXT_SYMBOL = re.compile(r"^([0-9a-fA-F]+) [tTwW] (?!__pfx_)(\S+)(?:\t\[(\S+)\])?", re.M)
NONZERO_ADDRESS = re.compile(r"^0*[1-9a-fA-F]", re.M)


@dataclass(frozen=True, slots=True)
class KernelFunction:
    start: int
    name: str
    module: str  # KERNEL_MODULE, or "[ext4]" for a loadable module's function


class KernelSymbols:
    """The kernel's text symbols by address. `hidden`: the file lists every address as 0
    (kernel.kptr_restrict, or a reader without CAP_SYSLOG): nothing can be named."""

    def __init__(self, symbols: Sequence[KernelFunction],
                 sched_text: tuple[int, int] | None, hidden: bool) -> None:
        ordered = sorted(symbols, key=lambda s: s.start)
        self._starts = [s.start for s in ordered]
        self._symbols = ordered
        self.sched_text = sched_text
        self.hidden = hidden

    @classmethod
    def parse(cls, text: str) -> KernelSymbols:
        """/proc/kallsyms' text: `ADDRESS TYPE NAME[\t[MODULE]]` per line. One regular
        expression over the whole text, not a split per line (half the time): it runs once,
        in the recorder's thread (6.18's 122 k lines, 64 k text symbols: 0.3 s loaded, of
        which 0.1 s is the kernel writing the file)."""
        symbols = []
        bounds: dict[str, int] = {}
        for address_hex, name, module in TEXT_SYMBOL.findall(text):
            address = int(address_hex, 16)
            if name in ("__sched_text_start", "__sched_text_end"):
                bounds[name] = address
            if address:
                symbols.append(KernelFunction(address, name,
                                              f"[{module}]" if module else KERNEL_MODULE))
        start, end = bounds.get("__sched_text_start"), bounds.get("__sched_text_end")
        sched = (start, end) if start and end and start < end else None
        hidden = bool(text.strip()) and NONZERO_ADDRESS.search(text) is None
        return cls(symbols, sched, hidden=hidden)

    @classmethod
    def load(cls, path: str = KALLSYMS) -> KernelSymbols:
        """Reads /proc/kallsyms; unreadable, it is as if every address were hidden."""
        try:
            with open(path) as f:
                return cls.parse(f.read())
        except OSError:
            return cls([], None, hidden=True)

    def function(self, address: int) -> KernelFunction | None:
        """The function a return address is in (looked up at address - 1, the call)."""
        i = bisect.bisect_right(self._starts, address - 1) - 1
        return self._symbols[i] if i >= 0 else None

    def in_scheduler(self, address: int, function: KernelFunction | None) -> bool:
        if self.sched_text is not None and self.sched_text[0] <= address - 1 < self.sched_text[1]:
            return True
        if function is None:
            return False
        name = function.name.split(".", 1)[0]  # schedule_timeout.constprop.0
        return name in SCHEDULER_FUNCTIONS or name.startswith(SCHEDULER_PREFIXES)

    def waiting_function(self, chain: Sequence[int]) -> KernelFunction | None:
        """The function a switched-out thread waits in: the first frame of its kernel call
        chain (leaf first) below the scheduler's; None when hidden or not named."""
        if self.hidden:
            return None
        for address in chain:
            function = self.function(address)
            if not self.in_scheduler(address, function):
                return function
        return None
