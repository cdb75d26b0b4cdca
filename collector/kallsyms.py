"""Kernel function names for off-CPU stacks (docs/native.md, "Off-CPU time").

A switch-out's kernel call chain (leaf first) starts in the scheduler (__schedule, schedule,
schedule_timeout, ...) and goes on through the function the thread waits in (anon_pipe_read,
futex_wait, do_nanosleep) to the system call's entry. The scheduler's frames say nothing
about the wait: the stored stack keeps one kernel frame, the first below them, named from
/proc/kallsyms (read once per recording, or from the cache of this boot's, below)."""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import os
import stat
import struct
import tempfile
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rsprof._native import kallsyms_text

KALLSYMS = "/proc/kallsyms"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
MODULES = "/proc/modules"
# The cache of this boot's table (<cache dir>/kallsyms/<boot id>-<modules' hash>.bin): the
# kernel writes /proc/kallsyms in 42-60 ms of CPU at every read (122 k lines, each name
# expanded and formatted), at the first off-CPU stack of every recording: in a 2 s
# recording at 499 Hz, 40-60 µs of the recorder per sample. Its text symbols change within
# a boot only as modules load (keyed by /proc/modules) and as BPF programs and ftrace
# trampolines come and go (outside the kernel's and the modules' code: `covers`).
CACHE_MAGIC = b"rsprof-ksyms\x00v01"  # 16 bytes
_CACHE_HEADER = struct.Struct("<16s10Q")  # magic; counts and bounds (_write_cache)
_CACHE_MAX = 256 << 20
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
        # The code this table is known right for when it came from the cache (the kernel's
        # _stext.._etext, each module's range then): None, read now, it is right for all.
        self.covered: tuple[tuple[int, int], ...] | None = None

    @classmethod
    def parse(cls, text: str) -> KernelSymbols:
        """/proc/kallsyms' text: `ADDRESS TYPE NAME[\t[MODULE]]` per line."""
        return cls._from_native(kallsyms_text(text.encode()))

    @classmethod
    def _from_native(cls, parsed: tuple[bytes, bytes, bytes, str, list[str], int, int, int,
                                        int, bool, bool]) -> KernelSymbols:
        """The text symbols as native/kallsyms.c reads them (the comment above says which;
        address 0 left out), in address order. In C: the regular expression over 6.18's
        122 k lines was 127 ms of the recorder's main thread at each recording's first
        off-CPU stack (a 2 s recording at 499 Hz: 127 µs per sample), the C reader 3-5 ms
        besides the kernel's 42-60 ms of writing the file; and sorting here the few symbols
        listed out of order (BPF programs, ftrace trampolines) another 30-40 ms, now done
        there too. The file is read in 256 KiB pieces: only the kept symbols are held."""
        (starts_bytes, modules_bytes, ends_bytes, names, module_names, start, end_, _, _,
         listed, nonzero) = parsed
        symbols = KernelSymbols([], None, hidden=False)
        symbols._starts.frombytes(starts_bytes)
        symbols._modules.frombytes(modules_bytes)
        symbols._module_names = module_names
        if names.isascii():
            symbols._names = names
            symbols._name_ends.frombytes(ends_bytes)
        else:  # the ends count bytes; a str's offsets count characters
            symbols._pack_names(names.split("\n") if names else [])
        symbols.sched_text = (start, end_) if start and end_ and start < end_ else None
        symbols.hidden = listed and not nonzero
        return symbols

    @classmethod
    def load(cls, path: str | None = None, cache_dir: Path | None = None) -> KernelSymbols:
        """Reads /proc/kallsyms; unreadable, it is as if every address were hidden. With
        `cache_dir`, this boot's table is taken from there when it was written before
        (`covered` then says for which code it holds), and written there when read."""
        modules = _modules_text() if cache_dir is not None else None
        key = None if modules is None else _cache_key(modules)
        cache = None if key is None or cache_dir is None else cache_dir / "kallsyms" / key
        if cache is not None:
            cached = _read_cache(cache)
            if cached is not None:
                return cached
        try:
            parsed = kallsyms_text(KALLSYMS if path is None else path)
        except OSError:
            return cls([], None, hidden=True)
        symbols = cls._from_native(parsed)
        if cache is not None and modules is not None and not symbols.hidden and parsed[7] \
                and parsed[8]:
            _write_cache(cache, parsed, _module_ranges(modules))
        return symbols

    def covers(self, chain: Sequence[int]) -> bool:
        """Every return address of `chain` is in code this table names right."""
        if self.covered is None:
            return True
        return all(any(lo <= address - 1 < hi for lo, hi in self.covered) for address in chain)

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


def _modules_text() -> bytes | None:
    """/proc/modules (loaded modules and their addresses): empty on a kernel without
    loadable modules, None if it cannot be read. Read once per load: the cache's key and the
    modules' ranges it records come from the same text."""
    try:
        with open(MODULES, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""
    except OSError:
        return None


def _cache_key(modules: bytes) -> str | None:
    """This boot's id and what /proc/modules says, as a file name; None if the boot cannot
    be told."""
    try:
        with open(BOOT_ID, "rb") as f:
            boot = f.read(64).strip().decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    if not boot or not all(c in "0123456789abcdef-" for c in boot):
        return None
    return f"{boot}-{hashlib.sha256(modules).hexdigest()[:16]}.bin"


def _module_ranges(modules: bytes) -> list[tuple[int, int]]:
    """Each loaded module's code and data, [start, end), from /proc/modules' text (`name size
    refs deps state address`); none where addresses are hidden."""
    ranges = []
    for line in modules.decode(errors="replace").splitlines():
        fields = line.split()
        try:
            size, address = int(fields[1]), int(fields[5], 16)
        except (IndexError, ValueError):
            continue
        if address and size > 0:
            ranges.append((address, address + size))
    return ranges


def _write_cache(path: Path, parsed: tuple[bytes, bytes, bytes, str, list[str], int, int, int,
                                           int, bool, bool], modules: list[tuple[int, int]]
                 ) -> None:
    """Writes the table as read (and the modules' ranges) for the next recording of this boot:
    a new file renamed into place, in a folder only the user can enter; the files of other
    boots are removed. Nothing is written if the folder cannot be made."""
    (starts, module_ids, ends, names, module_names, sched_start, sched_end, text_start,
     text_end, listed, nonzero) = parsed
    name_bytes = names.encode()
    module_bytes = "\n".join(module_names).encode()
    ranges = array("Q", [bound for pair in [(text_start, text_end), *modules] for bound in pair])
    header = _CACHE_HEADER.pack(CACHE_MAGIC, len(starts) // 8, len(name_bytes), len(module_bytes),
                                len(ranges) // 2, sched_start, sched_end, int(listed),
                                int(nonzero), 0, 0)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".kallsyms-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            for part in (header, starts, module_ids, ends, name_bytes, module_bytes,
                         ranges.tobytes()):
                f.write(part)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return
    with contextlib.suppress(OSError):
        for other in path.parent.glob("*.bin"):
            if other.name != path.name:
                other.unlink()


def _read_cache(path: Path) -> KernelSymbols | None:
    """The table `_write_cache` wrote, or None: missing, not a regular file of this user's
    that no one else may write, or not of its format and sizes. Read as data only; a
    table that does not hold together is not used."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                or st.st_mode & 0o022 or not _CACHE_HEADER.size <= st.st_size <= _CACHE_MAX):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(_CACHE_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    (magic, n, names_len, modules_len, n_ranges, sched_start, sched_end, listed, nonzero, _,
     _) = _CACHE_HEADER.unpack_from(data)
    sizes = (8 * n, 2 * n, 4 * n, names_len, modules_len, 16 * n_ranges)
    if magic != CACHE_MAGIC or _CACHE_HEADER.size + sum(sizes) != len(data) or n_ranges < 1:
        return None
    parts, at = [], _CACHE_HEADER.size
    for size in sizes:
        parts.append(data[at:at + size])
        at += size
    try:
        names = parts[3].decode()
        module_names = parts[4].decode().split("\n") if modules_len else []
    except UnicodeDecodeError:
        return None
    symbols = KernelSymbols._from_native((parts[0], parts[1], parts[2], names, module_names,
                                          sched_start, sched_end, 0, 0, bool(listed),
                                          bool(nonzero)))
    if (symbols._modules and max(symbols._modules) >= len(module_names)) or (
            names.isascii() and symbols._name_ends and symbols._name_ends[-1] != len(names)):
        return None
    bounds = array("Q")
    bounds.frombytes(parts[5])
    symbols.covered = tuple((bounds[i], bounds[i + 1]) for i in range(0, len(bounds), 2))
    return symbols
