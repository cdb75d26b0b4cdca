"""rsprof.collector.kallsyms and the resolver's use of it: an off-CPU stack's kernel call
chain becomes one frame, the function the thread waits in (the first below the scheduler's),
on a made-up /proc/kallsyms."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from rsprof.collector import kallsyms
from rsprof.collector.frames import KERNEL_FUNCTION, FrameResolver
from rsprof.collector.kallsyms import KERNEL_MODULE, KernelFunction, KernelSymbols
from rsprof.collector.maps import Mapping
from rsprof.storage.writer import ProfileWriter

from rsprof._native import KERNEL_ADDRESS
from unit.synthetic import FakeModule, FakeSymbolizer

K = 0xFFFFFFFF81000000
KALLSYMS = f"""\
{K + 0x0ff0:016x} t __pfx_anon_pipe_read
{K + 0x1000:016x} t anon_pipe_read
{K + 0x2000:016x} T vfs_read
{K + 0x3000:016x} T do_syscall_64
{K + 0x4000:016x} T futex_wait
{K + 0x5000:016x} T hrtimer_nanosleep
{K + 0x6000:016x} T schedule_timeout.constprop.0
{K + 0x7000:016x} D some_data
{K + 0x8000:016x} T __traceiter_sched_switch
{K + 0x10000:016x} T __sched_text_start
{K + 0x10000:016x} t __schedule
{K + 0x11000:016x} T schedule
{K + 0x12000:016x} t do_nanosleep
{K + 0x13000:016x} T __sched_text_end
{K + 0x20000:016x} t ext4_wait\t[ext4]
"""
SCHEDULE = K + 0x10100  # __schedule+0x100
CALLS_SCHEDULE = K + 0x11023  # schedule+0x23
PIPE = K + 0x1366
VFS = K + 0x2010
SYSCALL = K + 0x3071


def test_names_a_return_address_at_its_call() -> None:
    symbols = KernelSymbols.parse(KALLSYMS)
    assert not symbols.hidden and symbols.sched_text == (K + 0x10000, K + 0x13000)
    assert symbols.function(PIPE).name == "anon_pipe_read"  # type: ignore[union-attr]
    # a call ending a function returns to the next one's first byte: named at the call
    assert symbols.function(K + 0x2000).name == "anon_pipe_read"  # type: ignore[union-attr]
    # __pfx_ padding and data symbols are no functions
    assert symbols.function(K + 0x0ff8) is None
    assert symbols.function(K + 0x7010).name == "schedule_timeout.constprop.0"  # type: ignore[union-attr]
    assert symbols.function(K + 0x20010).module == "[ext4]"  # type: ignore[union-attr]
    assert symbols.function(PIPE).module == KERNEL_MODULE  # type: ignore[union-attr]


@pytest.mark.parametrize(("chain", "expected"), [
    pytest.param([SCHEDULE, CALLS_SCHEDULE, PIPE, VFS, SYSCALL], "anon_pipe_read", id="pipe"),
    # do_nanosleep is in .sched.text: the kernel (get_wchan) skips it too
    pytest.param([SCHEDULE, CALLS_SCHEDULE, K + 0x12050, K + 0x5070, SYSCALL],
                 "hrtimer_nanosleep", id="nanosleep"),
    # outside .sched.text, skipped by name (a kernel without the section's bounds listed)
    pytest.param([SCHEDULE, K + 0x6010, K + 0x4010, SYSCALL], "futex_wait", id="by-name"),
    # a second probe on sched_switch (a BPF program) puts the tracepoint's iterator first
    pytest.param([K + 0x8040, SCHEDULE, CALLS_SCHEDULE, PIPE, VFS], "anon_pipe_read",
                 id="traceiter"),
    pytest.param([SCHEDULE, CALLS_SCHEDULE], None, id="scheduler-only"),
    pytest.param([], None, id="empty"),
])
def test_the_waiting_function_is_the_first_below_the_scheduler(
        chain: list[int], expected: str | None) -> None:
    found = KernelSymbols.parse(KALLSYMS).waiting_function(chain)
    assert (found.name if found else None) == expected


def test_skips_the_scheduler_by_name_without_section_bounds() -> None:
    text = "\n".join(line for line in KALLSYMS.splitlines() if "__sched_text" not in line)
    symbols = KernelSymbols.parse(text)
    assert symbols.sched_text is None
    found = symbols.waiting_function([SCHEDULE, CALLS_SCHEDULE, PIPE])
    assert found is not None and found.name == "anon_pipe_read"


def test_hidden_addresses_name_nothing(tmp_path: Path) -> None:
    """kernel.kptr_restrict (or no CAP_SYSLOG): every address reads 0."""
    hidden = "\n".join(f"{0:016x} {line.split()[1]} {line.split()[2]}"
                       for line in KALLSYMS.splitlines())
    symbols = KernelSymbols.parse(hidden)
    assert symbols.hidden and symbols.waiting_function([SCHEDULE, PIPE]) is None
    assert KernelSymbols.load(str(tmp_path / "missing")).hidden


BASE = 0x400000


def _resolver(tmp_path: Path, kallsyms: str) -> tuple[FrameResolver, list[str]]:
    module = FakeModule([(0x1000, 0x1010, [("read_one", "app.c", 10)]),
                         (0x2000, 0x2100, [("main", "app.c", 20)])], code=bytes(0x3000))
    resolver = FrameResolver(0, ProfileWriter(tmp_path / "p.db"),
                             FakeSymbolizer({"/bin/app": module}))  # type: ignore[arg-type]
    resolver.add_mapping(Mapping(BASE, BASE + 0x3000, 0, "/bin/app"))
    resolver.kernel.append(KernelSymbols.parse(kallsyms))
    warnings: list[str] = []
    resolver.on_warning = warnings.append
    return resolver, warnings


def _names(resolver: FrameResolver, stored: int) -> list[tuple[str, str]]:
    return [(location.function, resolver.frame_info[frame][0])
            for frame in resolver.ids.stack_frames[stored]
            for location in resolver.frame_info[frame][1]]


def test_an_off_cpu_chain_becomes_the_kernel_leaf_over_the_waiting_function(
        tmp_path: Path) -> None:
    resolver, warnings = _resolver(tmp_path, KALLSYMS)
    user = [BASE + 0x1005, BASE + 0x2005]
    stacks = [(1, [SCHEDULE, CALLS_SCHEDULE, PIPE, VFS, SYSCALL, *user]),
              # another path to the same wait is the same stored stack
              (2, [SCHEDULE, CALLS_SCHEDULE, PIPE + 8, VFS, SYSCALL, *user]),
              # without kernel frames (kernel not allowed): the [kernel] leaf only
              (3, [KERNEL_ADDRESS, *user])]
    stored = resolver.resolve_stacks(stacks)
    assert _names(resolver, stored[1]) == [(KERNEL_FUNCTION, ""),
                                           ("anon_pipe_read", KERNEL_MODULE),
                                           ("read_one", "/bin/app"), ("main", "/bin/app")]
    assert stored[1] == stored[2]
    assert _names(resolver, stored[3]) == [(KERNEL_FUNCTION, ""), ("read_one", "/bin/app"),
                                           ("main", "/bin/app")]
    assert warnings == []


def test_hidden_kernel_addresses_keep_the_kernel_leaf_and_say_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resolver, warnings = _resolver(tmp_path, "")
    resolver.kernel.clear()  # read at the first kernel chain: this read finds 0 addresses
    monkeypatch.setattr(KernelSymbols, "load",
                        classmethod(lambda cls, path=None, cache_dir=None:
                                    KernelSymbols([], None, hidden=True)))
    stacks = [(1, [SCHEDULE, PIPE, BASE + 0x1005]), (2, [SCHEDULE, VFS, BASE + 0x1005])]
    stored = resolver.resolve_stacks(stacks)
    assert _names(resolver, stored[1]) == [(KERNEL_FUNCTION, ""), ("read_one", "/bin/app")]
    assert stored[1] == stored[2]
    assert len(warnings) == 1 and "kptr_restrict" in warnings[0]


@pytest.mark.parametrize("copies", [1, 3000], ids=["small", "over-512KiB"])
def test_any_order_and_any_file_size_name_the_same(tmp_path: Path, copies: int) -> None:
    """The file is read in 256 KiB pieces (native/kallsyms.c), lines cut between pieces
    joined again, the names packed into one string; a file not in address order is sorted
    once: every lookup is the same as on the whole sorted text."""
    lines = KALLSYMS.splitlines(keepends=True)
    # modules and the scheduler first (not in order), then filler functions far above,
    # enough of them to cross several pieces mid-line
    shuffled = lines[7:] + lines[:7] + [
        f"{K + 0x100000 + 0x40 * i:016x} t filler_function_{i}\t[filler]\n"
        for i in range(copies)]
    path = tmp_path / "kallsyms"
    path.write_text("".join(shuffled))
    whole, read = KernelSymbols.parse(KALLSYMS), KernelSymbols.load(str(path))
    assert len(read) == len(whole) + copies and read.sched_text == whole.sched_text
    for address in range(K, K + 0x21000, 0x80):
        assert read.function(address) == whole.function(address), hex(address)
    last = K + 0x100000 + 0x40 * (copies - 1)
    assert read.function(last + 0x11) == KernelFunction(last, f"filler_function_{copies - 1}",
                                                        "[filler]")
    assert KernelSymbols.parse("".join(shuffled)).function(last + 1) == read.function(last + 1)


def test_unreadable_file_is_hidden(tmp_path: Path) -> None:
    assert KernelSymbols.load(str(tmp_path / "missing")).hidden


def test_a_kernel_chain_met_again_is_named_once(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A preempted thread's switch-outs repeat a few kernel chains: each is named once per
    recording (every image's resolver shares the answer), with the same frame each time."""
    resolver, _ = _resolver(tmp_path, KALLSYMS)
    calls: list[tuple[int, ...]] = []
    original = KernelSymbols.waiting_function

    def counted(self: KernelSymbols, chain: Sequence[int]) -> KernelFunction | None:
        calls.append(tuple(chain))
        return original(self, chain)

    monkeypatch.setattr(KernelSymbols, "waiting_function", counted)
    chain = [SCHEDULE, CALLS_SCHEDULE, PIPE, VFS, SYSCALL]
    first = resolver.resolve_stacks([(1, [*chain, BASE + 0x1005, BASE + 0x2005])])
    again = resolver.resolve_stacks([(2, [*chain, BASE + 0x1007, BASE + 0x2005])])
    child = resolver.for_new_image(1, forked=True)
    other = child.resolve_stacks([(3, [*chain, BASE + 0x1005, BASE + 0x2005])])
    assert calls == [tuple(chain)]
    assert _names(resolver, first[1])[:2] == [(KERNEL_FUNCTION, ""),
                                              ("anon_pipe_read", KERNEL_MODULE)]
    wait = resolver.ids.stack_frames[first[1]][1]
    assert resolver.ids.stack_frames[again[2]][1] == wait
    assert other[3] == first[1]


# -- the cache of this boot's table -------------------------------------------------------

# The kernel image's code bounds and a BPF program above it (not in any module's range)
WITH_TEXT = (f"{K:016x} T _stext\n" + KALLSYMS + f"{K + 0x30000:016x} T _etext\n"
             f"{K + 0x40000000:016x} t bpf_prog_0123_rs_probe\t[bpf]\n")
BPF = K + 0x40000010


@pytest.fixture
def boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A made-up boot id and /proc/modules; returns the kallsyms file to read."""
    (tmp_path / "boot_id").write_text("0f4b6c1e-7d2a-4a51-9c3e-2b8d5f6a7c90\n")
    (tmp_path / "modules").write_text(
        f"ext4 1048576 1 - Live 0x{K + 0x20000:x}\nbroken line\n")
    monkeypatch.setattr(kallsyms, "BOOT_ID", str(tmp_path / "boot_id"))
    monkeypatch.setattr(kallsyms, "MODULES", str(tmp_path / "modules"))
    path = tmp_path / "kallsyms"
    path.write_text(WITH_TEXT)
    return path


def _cache_files(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "kallsyms").glob("*.bin"))


def test_the_boots_table_is_read_once_then_taken_from_the_cache(boot: Path,
                                                                tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = KernelSymbols.load(str(boot), cache_dir=cache)
    assert first.covered is None and len(_cache_files(cache)) == 1
    assert (cache / "kallsyms").stat().st_mode & 0o777 == 0o700
    boot.unlink()  # the second load does not read the file
    cached = KernelSymbols.load(str(boot), cache_dir=cache)
    assert cached.covered == ((K, K + 0x30000), (K + 0x20000, K + 0x20000 + 1048576))
    assert len(cached) == len(first) and cached.sched_text == first.sched_text
    assert not cached.hidden
    for address in range(K, K + 0x31000, 0x40):
        assert cached.function(address) == first.function(address), hex(address)
    assert cached.covers([SCHEDULE, PIPE, K + 0x20010]) and not cached.covers([SCHEDULE, BPF])
    assert first.covers([BPF])


def test_another_boot_or_other_modules_read_the_file_and_replace_the_table(
        boot: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    KernelSymbols.load(str(boot), cache_dir=cache)
    before = _cache_files(cache)
    (tmp_path / "modules").write_text(f"ext4 1048576 1 - Live 0x{K + 0x28000:x}\n")
    assert KernelSymbols.load(str(boot), cache_dir=cache).covered is None
    after_modules = _cache_files(cache)
    (tmp_path / "boot_id").write_text("5a1e9c3b-0000-4000-8000-000000000001\n")
    assert KernelSymbols.load(str(boot), cache_dir=cache).covered is None
    after_boot = _cache_files(cache)
    assert len({*before, *after_modules, *after_boot}) == 3
    assert len(after_boot) == 1  # the other boots' and module sets' tables are removed


def test_no_cache_without_a_boot_id_or_with_hidden_addresses(boot: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    cache = tmp_path / "cache"
    hidden = tmp_path / "hidden"
    hidden.write_text("\n".join(f"{0:016x} {line.split()[1]} {line.split()[2]}"
                                for line in WITH_TEXT.splitlines()))
    assert KernelSymbols.load(str(hidden), cache_dir=cache).hidden
    assert _cache_files(cache) == []
    monkeypatch.setattr(kallsyms, "BOOT_ID", str(tmp_path / "missing"))
    assert KernelSymbols.load(str(boot), cache_dir=cache).covered is None
    assert _cache_files(cache) == []


def _spoil(table: Path, how: str) -> None:
    data = table.read_bytes()
    if how == "symlink":
        real = table.with_name("real.data")
        table.rename(real)
        table.symlink_to(real)
    elif how == "group-writable":
        table.chmod(0o664)
    elif how == "other-owner":
        os.chown(table, 65534, 65534)
    elif how == "truncated":
        table.write_bytes(data[:-1])
    elif how == "bad-magic":
        table.write_bytes(b"x" + data[1:])
    elif how == "module-index":
        # the first symbol's module index (after the header and the starts) past the list
        header = kallsyms._CACHE_HEADER.size
        n = kallsyms._CACHE_HEADER.unpack_from(data)[1]
        at = header + 8 * n
        table.write_bytes(data[:at] + b"\xff\xff" + data[at + 2:])
    elif how == "fifo":
        table.unlink()
        os.mkfifo(table, 0o600)
    elif how == "directory":
        table.unlink()
        table.mkdir()


@pytest.mark.parametrize("how", ["symlink", "group-writable", "other-owner", "truncated",
                                 "bad-magic", "module-index", "fifo", "directory"])
def test_a_cached_table_not_to_trust_is_not_used(boot: Path, tmp_path: Path, how: str) -> None:
    """The cache is read as data: only a regular file of this user's that no one else may
    write, of the format and sizes written, whose module indexes hold; else the file is
    read as without a cache (a FIFO does not block the read)."""
    if how == "other-owner" and os.geteuid() != 0:
        pytest.skip("chown needs root")
    cache = tmp_path / "cache"
    KernelSymbols.load(str(boot), cache_dir=cache)
    (name,) = _cache_files(cache)
    _spoil(cache / "kallsyms" / name, how)
    again = KernelSymbols.load(str(boot), cache_dir=cache)
    assert again.covered is None  # read from the file
    assert again.function(PIPE).name == "anon_pipe_read"  # type: ignore[union-attr]


def test_a_chain_outside_the_cached_code_reads_the_file_again(boot: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """A BPF program loaded since the table was cached is not in it: a chain with a frame
    outside the kernel's and the modules' code reads /proc/kallsyms as it is now."""
    cache = tmp_path / "cache"
    KernelSymbols.load(str(boot), cache_dir=cache)
    cached = KernelSymbols.load(str(boot), cache_dir=cache)
    assert cached.covered is not None
    resolver, _ = _resolver(tmp_path, "")
    resolver.kernel[0] = cached
    monkeypatch.setattr(kallsyms, "KALLSYMS", str(boot))
    user = [BASE + 0x1005]
    stored = resolver.resolve_stacks([(1, [SCHEDULE, CALLS_SCHEDULE, PIPE, *user])])
    assert resolver.kernel[0] is cached  # inside the cached code: kept
    stored.update(resolver.resolve_stacks([(2, [SCHEDULE, BPF, PIPE, *user])]))
    assert resolver.kernel[0] is not cached and resolver.kernel[0].covered is None
    assert _names(resolver, stored[1])[1] == ("anon_pipe_read", KERNEL_MODULE)
    assert _names(resolver, stored[2])[1] == ("bpf_prog_0123_rs_probe", "[bpf]")
