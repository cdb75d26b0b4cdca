"""Kernel function names for off-CPU stacks (docs/native.md, "Off-CPU time").

A switch-out's kernel call chain (leaf first) starts in the scheduler (__schedule, schedule,
schedule_timeout, ...) and goes on through the function the thread waits in (anon_pipe_read,
futex_wait, do_nanosleep) to the system call's entry. The scheduler's frames say nothing
about the wait: the stored stack keeps one kernel frame, the first below them, named from
/proc/kallsyms (read once per recording)."""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from rsprof._native import kallsyms_text

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
# __traceiter_sched_switch: with a second probe on sched_switch beside perf's (rsprof's own
# BPF program for Python frames, or another tool's), the tracepoint calls its probes through
# this iterator, which is then the chain's first frame, above __schedule
SCHEDULER_PREFIXES = ("schedule_timeout_", "wait_for_completion", "__wait_for_completion",
                      "__traceiter_")
# Which lines are text symbols is native/kallsyms.c's rule (the regular expression
# ^([0-9a-fA-F]+) [tTwW] (?!__pfx_)(\S+)(?:\t\[(\S+)\])? it replaced): type t, T, w or W;
# __pfx_ symbols are the padding before a function (CONFIG_FUNCTION_PADDING), no return
# address is ever in one.


@dataclass(frozen=True, slots=True)
class KernelFunction:
    start: int
    name: str
    module: str  # KERNEL_MODULE, or "[ext4]" for a loadable module's function


class KernelSymbols:
    """The kernel's text symbols by address. `hidden`: the file lists every address as 0
    (kernel.kptr_restrict, or a reader without CAP_SYSLOG): nothing can be named.

    Kept compact, in the recorder's process for the whole recording: the starts in one
    array, the names in one string, a module index per symbol (64 k text symbols on 6.18:
    2.3 MiB kept, against 12.7 MiB as one object per symbol, which pushed a recording's
    peak RSS past test_perfmap's bound). KernelFunction objects are made per lookup."""

    def __init__(self, symbols: Sequence[KernelFunction],
                 sched_text: tuple[int, int] | None, hidden: bool) -> None:
        ordered = sorted(symbols, key=lambda s: s.start)
        self._starts = array("Q", (s.start for s in ordered))
        self._pack_names([s.name for s in ordered])
        self._module_names: list[str] = []
        index: dict[str, int] = {}
        self._modules = array("H")
        for symbol in ordered:
            at = index.setdefault(symbol.module, len(index))
            if at == len(self._module_names):
                self._module_names.append(symbol.module)
            self._modules.append(at)
        self.sched_text = sched_text
        self.hidden = hidden

    @classmethod
    def parse(cls, text: str) -> KernelSymbols:
        """/proc/kallsyms' text: `ADDRESS TYPE NAME[\t[MODULE]]` per line."""
        return cls._from_native(kallsyms_text(text.encode()))

    @classmethod
    def _from_native(cls, parsed: tuple[bytes, bytes, bytes, str, list[str], int, int, bool,
                                        bool, bool]) -> KernelSymbols:
        """The text symbols as native/kallsyms.c reads them (the comment above says which;
        address 0 left out). In C: the regular expression over 6.18's 122 k lines was 127 ms
        of the recorder's main thread at each recording's first off-CPU stack (a 2 s
        recording at 499 Hz: 127 µs per sample), the C reader 3-5 ms besides the kernel's
        42-44 ms of writing the file. The file is read in 256 KiB pieces: only the kept
        symbols are held."""
        (starts_bytes, modules_bytes, ends_bytes, names, module_names, start, end_, listed,
         nonzero, ordered) = parsed
        symbols = KernelSymbols([], None, hidden=False)
        symbols._starts.frombytes(starts_bytes)
        symbols._modules.frombytes(modules_bytes)
        symbols._module_names = module_names
        if names.isascii():
            symbols._names = names
            symbols._name_ends.frombytes(ends_bytes)
        else:  # the ends count bytes; a str's offsets count characters
            symbols._pack_names(names.split("\n") if names else [])
        starts, modules = symbols._starts, symbols._modules
        if not ordered:
            # Not in address order (not seen on 6.18: one list, ascending): sorted once.
            order = sorted(range(len(starts)), key=starts.__getitem__)
            listed_names = names.split("\n")
            symbols._starts = array("Q", (starts[i] for i in order))
            symbols._modules = array("H", (modules[i] for i in order))
            symbols._pack_names([listed_names[i] for i in order])
        symbols.sched_text = (start, end_) if start and end_ and start < end_ else None
        symbols.hidden = listed and not nonzero
        return symbols

    @classmethod
    def load(cls, path: str = KALLSYMS) -> KernelSymbols:
        """Reads /proc/kallsyms; unreadable, it is as if every address were hidden."""
        try:
            return cls._from_native(kallsyms_text(path))
        except OSError:
            return cls([], None, hidden=True)

    def function(self, address: int) -> KernelFunction | None:
        """The function a return address is in (looked up at address - 1, the call)."""
        i = bisect.bisect_right(self._starts, address - 1) - 1
        if i < 0:
            return None
        name = self._names[self._name_ends[i - 1] + 1 if i else 0:self._name_ends[i]]
        return KernelFunction(self._starts[i], name, self._module_names[self._modules[i]])

    def __len__(self) -> int:
        return len(self._starts)

    def _pack_names(self, names: list[str]) -> None:
        """The names in one string, each ending where `_name_ends` says (a str per symbol
        costs ~70 bytes: 4.5 MiB for 64 k names, the blob 1.3 MiB)."""
        self._names = "\n".join(names)
        self._name_ends = array("I")
        end = -1
        for name in names:
            end += len(name) + 1
            self._name_ends.append(end)

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
