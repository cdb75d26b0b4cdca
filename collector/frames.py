"""Turns raw instruction addresses into stored frames, locations and stacks.

New stacks arrive in batches from the C readers (CPU and heap); every address not seen
before is located in the target's address space, symbolized in one batch per module and
written through the ProfileWriter, which hands back row ids.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from itertools import islice, repeat, takewhile
from pathlib import Path
from typing import cast

from rsprof.collector.kallsyms import KernelFunction, KernelSymbols
from rsprof.collector.maps import AddressSpace, Mapping, read_executable_maps
from rsprof.collector.perfmap import JitSymbol, PerfMap, is_anonymous, process_start_time
from rsprof.collector.pyframes import decode_python, splice_apply, splice_shape, split_words
from rsprof.collector.shimframes import ShimFrames
from rsprof.collector.symbols import Module, SourceFrame, Symbolizer
from rsprof.storage.callsite import PYTHON_ADDRESS_BASE
from rsprof.storage.intern import LocationKey
from rsprof.storage.writer import ProfileWriter

from rsprof._native import (
    KERNEL_ADDRESS,
    PY_FRAME_ENTRY_BIT,
    PY_MARK_SAMPLED,
    TRUNCATED_ADDRESS,
    PyFrameReader,
)

# The root frame of a stack whose walk stopped at an address outside every mapping
# (TRUNCATED_ADDRESS, 0: never a caller, so it cannot collide with a real frame) and the
# leaf of a sample taken in kernel mode (KERNEL_ADDRESS, 1: the time the program spent in
# system calls and faults, on top of the user stack that entered them). Both addresses are
# native/stackwords.h's, exported by rsprof._native.
TRUNCATED_FUNCTION = "[truncated]"
KERNEL_FUNCTION = "[kernel]"
# The instructions that enter the kernel from user code (syscall, int 0x80, sysenter): the
# user address of a kernel sample that follows one is a return address, any other is the
# interrupted instruction itself (an interrupt, a page fault).
SYSCALL_INSTRUCTIONS = (b"\x0f\x05", b"\xcd\x80", b"\x0f\x34")
# The CPython evaluator: each of its native frames ran a group of Python frames, which take
# its place in a stack (collector.pyframes.splice_plan, splice_shape).
EVAL_FUNCTIONS = frozenset({"_PyEval_EvalFrameDefault"})
# The interpreter's start-up (it imports encodings, io and site through importlib's Python
# code before the program's first line runs).
STARTUP_FUNCTIONS = frozenset({"Py_InitializeFromConfig", "Py_InitializeEx", "Py_Initialize",
                               "_Py_InitializeMain", "pymain_init"})
# An off-CPU stack's kernel call chain: its leading addresses in the upper half.
_KERNEL_HALF = 1 << 63
# Leaves that are no code (never looked for in a mapping: no missed mapping either).
_PSEUDO_LEAVES = (KERNEL_ADDRESS, TRUNCATED_ADDRESS)
# Kernel call chains whose waited-in function is remembered (FrameResolver._kernel_waits).
KERNEL_WAITS_MEMO = 1 << 16
# Python frames are stored as frames of their source file (its `modules` row) at a
# pseudo-address: PYTHON_ADDRESS_BASE (storage.callsite, which picks heap call sites by
# it) and 48 bits of a hash of the function and line, so the same Python line is one frame
# in every process and recording.
# A Python frame of a heap stack whose code object was freed (or replaced) before the
# profiler could read it (native/heapreader.c: function id 0).
PYTHON_FREED_ID = 0
PYTHON_FREED_FUNCTION = "[python code freed]"


def python_address(qualname: str, first_line: int, line: int) -> int:
    digest = hashlib.blake2b(f"{qualname}\0{first_line}\0{line}".encode(errors="replace"),
                             digest_size=6).digest()
    return PYTHON_ADDRESS_BASE | int.from_bytes(digest, "little")


def _display_name(path: str) -> str:
    return os.path.basename(path) or path


class FrameResolver:
    def __init__(self, pid: int, writer: ProfileWriter, symbolizer: Symbolizer) -> None:
        self.pid = pid
        self.writer = writer
        self.ids = writer.ids  # frames and stacks are interned there, stored at checkpoints
        self.symbolizer = symbolizer
        self.space = AddressSpace()
        # Addresses found mapped in `space` (cleared when a mapping is added: it may replace
        # one): a new stack's callers are mostly known ones, checked in one pass in C.
        self._mapped: set[int] = set()
        self._modules: dict[str, Module | None] = {}
        self._module_ids: dict[str, int] = {}
        # (address, is_caller) -> frame id; callers are looked up at address - 1 (the call).
        self._frame_ids: dict[tuple[int, bool], int] = {}
        # frame id -> (module path, inline chain innermost first), for call-site rules.
        self.frame_info: dict[int, tuple[str, tuple[LocationKey, ...]]] = {}
        # JIT code's names (/tmp/perf-PID.map), opened when an anonymous mapping is met;
        # a forked child without a map of its own falls back to its parent's.
        self._perfmap: PerfMap | None = None
        self._parent_perfmap: PerfMap | None = None
        self._perfmap_fresh = False  # refreshed during this resolve_stacks call
        # Taken now, while the process surely exists (stacks may be resolved after it exits).
        self._started = process_start_time(pid) if pid > 0 else None
        self.on_warning: Callable[[str], None] | None = None
        # The image's CPython frame reader (set by the recorder), its functions by id, and
        # the stored frame of each (function id, line).
        self.python: PyFrameReader | None = None
        self._py_functions: dict[int, tuple[str, str, int]] = {}
        self._py_frames: dict[tuple[int, int], int] = {}
        # a Python frame's stack word -> its stored frame (the word is its function id,
        # line and entry flag): one lookup per frame of a new stack instead of a decode
        # and a call
        self._py_word_frames: dict[int, int] = {}
        self._py_frame_ids: set[int] = set()
        self._eval_frames: dict[int, bool] = {}
        self._after_syscall: dict[int, bool] = {}
        self._startup_frames: dict[int, bool] = {}
        # Stacks whose Python frames could not be paired with the evaluator frames (a cut
        # native stack, or a read across a call): kept native only, counted.
        self.python_unpaired = 0
        self.python_spliced = 0
        # of those, stacks whose innermost evaluator was between frames at the sampled
        # instant (kept native there: collector.pyframes.splice_plan's at_sample)
        self.python_between = 0
        # rsprof's heap shim taken out of the stacks (collector/shimframes.py), and the
        # stored stacks whose leaf is its `[rsprof heap tracking]` frame.
        self.shim = ShimFrames(self.frame_info, self._named_frame, self._host_path)
        self.heap_tracking_stacks: set[int] = set()
        # /proc/kallsyms, read at the first off-CPU stack with kernel frames (one list for
        # the recording: every image's resolver shares it)
        self.kernel: list[KernelSymbols] = []
        self._kernel_frames: dict[tuple[int, str], int] = {}
        # kernel call chain (leaf first) -> the frame of the function it waits in (None: not
        # named). A preempted thread's switch-outs share a few chains; looked up each time
        # they were 18 µs per off-CPU stack (bisects over 64 k kernel symbols per frame).
        self._kernel_waits_memo: dict[tuple[int, ...], int | None] = {}

    def for_new_image(self, pid: int, *, forked: bool) -> FrameResolver:
        """The resolver of another process image: a forked child (`forked`) starts with its
        parent's mappings, and so its frames; an exec starts from nothing. Module files and
        what is known of stored frames and stacks are shared (their ids are global)."""
        other = FrameResolver(pid, self.writer, self.symbolizer)
        other._modules = self._modules
        other._module_ids = self._module_ids
        other.frame_info = self.frame_info
        other._py_frame_ids = self._py_frame_ids  # frame ids are global
        other.shim = self.shim
        other.heap_tracking_stacks = self.heap_tracking_stacks
        other.on_warning = self.on_warning
        other.kernel = self.kernel
        other._kernel_frames = self._kernel_frames
        other._kernel_waits_memo = self._kernel_waits_memo
        if forked:
            other._parent_perfmap = self._perfmap
            other.space = self.space.copy()
            other._frame_ids = dict(self._frame_ids)
        return other

    # -- mappings ------------------------------------------------------------------------

    def add_mapping(self, mapping: Mapping) -> None:
        if mapping.path == "[vdso]":
            self._save_vdso(mapping)
        self.space.add(mapping)
        self._mapped.clear()
        module_id = self._module_id(mapping.path, mapping.build_id)
        self.ids.add_mapping(module_id, mapping.start, mapping.end, mapping.file_offset)

    def _add_missed_mappings(self) -> None:
        """Adds the anonymous executable mappings (JIT code) /proc/PID/maps has and the
        address space lacks. The heap ring and the perf ring are drained apart, so a heap
        stack can reach us before the MMAP2 record of the JIT code it runs through (seen:
        node's allocations from freshly compiled code, all `[truncated]` under load: a
        stack is resolved once, so one early miss was every allocation's). Only anonymous
        ones: a file mapping found now may belong to a later exec of the same pid, while
        JIT code has no other source. A process that is gone adds nothing."""
        try:
            current = read_executable_maps(self.pid)
        except OSError:
            return
        for mapping in current:
            if not is_anonymous(mapping.path):
                continue
            if self.space.find(mapping.start) is None and self.space.find(mapping.end - 1) is None:
                self.add_mapping(mapping)

    def _save_vdso(self, mapping: Mapping) -> None:
        """The vDSO exists only in memory: copy its ELF image out of the target so
        clock_gettime and friends get names instead of `[vdso]+0x...`."""
        if "[vdso]" in self._modules:
            return
        folder = Path(self.symbolizer.cache_dir or tempfile.gettempdir()) / "vdso"
        try:
            with open(f"/proc/{self.pid}/mem", "rb") as mem:
                mem.seek(mapping.start)
                image = mem.read(mapping.end - mapping.start)
            folder.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256(image).hexdigest()[:24]
            copy = folder / f"vdso-{digest}.so"
            if not copy.exists():
                partial = copy.with_suffix(f".{os.getpid()}.tmp")
                partial.write_bytes(image)
                partial.replace(copy)
            self._modules["[vdso]"] = self.symbolizer.module(str(copy))
        except (OSError, ValueError, OverflowError):
            self._modules["[vdso]"] = None

    def _open_module(self, path: str) -> Module | None:
        if path not in self._modules:
            module = None
            if path.startswith("/"):
                module = self.symbolizer.module(self._host_path(path))
            self._modules[path] = module
        return self._modules[path]

    def _host_path(self, path: str) -> str:
        """The target's file as this process can open it. Inside another mount namespace
        (a container) that is /proc/PID/root/...; otherwise the plain path, which keeps
        working after the target exits."""
        in_target = f"/proc/{self.pid}/root{path}"
        try:
            theirs = os.stat(in_target)
        except OSError:
            return path
        try:
            ours = os.stat(path)
        except OSError:
            return in_target
        same = (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)
        return path if same else in_target

    def _module_id(self, path: str, build_id: str | None = None) -> int:
        found = self._module_ids.get(path)
        if found is None:
            module = self._open_module(path)
            if module is not None and module.build_id:
                build_id = module.build_id
            found = self._module_ids[path] = self.ids.module_id(path, build_id)
        return found

    # -- stacks --------------------------------------------------------------------------

    def resolve_stacks(self, stacks: Sequence[tuple[int, Sequence[int]]],
                       python_read_late: bool = True,
                       leaf_is_return: bool = False) -> dict[int, int]:
        """Maps native stack ids (from a C reader) to stored stack ids. python_read_late:
        the stacks' Python frames were read after the native ones were taken (CPU samples,
        read at drain time), not with them (the heap shim's own reads). leaf_is_return:
        the first address is a return address too (a heap stack starts at the shim's return
        into malloc's caller), not an interrupted instruction (a CPU sample's leaf), so it
        is looked up at the call, as every caller is.

        A caller address outside every executable mapping is no function: a frame-pointer
        walk through code built without frame pointers read garbage there (seen: bytes of
        the file being compressed). The stack ends at the last justified frame and gets a
        `[truncated]` root, so shares stay honest and no junk name is ever reported."""
        self._perfmap_fresh = False
        stacks_in = stacks
        split = [(native_id, *split_words(ips)) for native_id, ips in stacks]
        waits = self._kernel_waits(split)
        # Each distinct address looked up once (a shell script's stacks are 40 frames deep
        # and share most of them: 1.66 M lookups for 43 k stacks were 2.3 s of 9 s), and
        # only as far as the stack goes: it ends at its first unmapped caller.
        mapped: dict[int, bool] = {}
        stacks = [(native_id, self._justified(ips, mapped)) for native_id, ips, _ in split]
        if any(not found for address, found in mapped.items()
               if address not in (KERNEL_ADDRESS, TRUNCATED_ADDRESS)):
            self._add_missed_mappings()
            mapped = {address: found for address, found in mapped.items() if found}
            stacks = [(native_id, self._justified(ips, mapped)) for native_id, ips, _ in split]
        python = {native_id: frames for native_id, _, frames in split if frames}
        sampled = {native_id for native_id, ips in stacks_in if PY_MARK_SAMPLED in ips}
        # A leaf is looked up at its address, a caller at its return address - 1 (the
        # call): one address can be both, with different lines, so both are keys.
        keys = [(native_id, self._lookup_keys(ips, leaf_is_return)) for native_id, ips in stacks]
        needed: set[tuple[int, bool]] = set()
        for _, stack in keys:
            needed.update(stack)
        self._resolve_frames(needed - self._frame_ids.keys())
        resolved = {}
        frame_of = self._frame_ids.__getitem__
        for native_id, stack in keys:
            frames = tuple(map(frame_of, stack))
            if native_id in python:
                frames = self._splice(frames, python[native_id],
                                      python_read_late and native_id not in sampled,
                                      native_id in sampled)
            wait = waits.get(native_id)
            if wait is not None and frames:
                frames = (frames[0], wait, *frames[1:])
            frames = self.shim.rewrite(frames)
            stack_id = resolved[native_id] = self.ids.stack_id(frames)
            if frames and frames[0] == self.shim.tracking_frame:
                self.heap_tracking_stacks.add(stack_id)
        return resolved

    def _kernel_waits(self, split: list[tuple[int, Sequence[int], Sequence[int]]]
                      ) -> dict[int, int]:
        """Off-CPU stacks arrive with their kernel call chain in place of the [kernel] leaf
        (upper-half addresses, leaf first). Rewrites each in `split` to the [kernel] leaf over
        its user frames and returns, by native id, the frame of the kernel function it waits
        in, placed under that leaf (docs/schema.md, `offcpu_stack_samples`)."""
        waits = {}
        for i, (native_id, ips, python) in enumerate(split):
            if not ips or ips[0] >> 63 == 0:
                continue
            chain = tuple(takewhile(_KERNEL_HALF.__le__, ips))
            n = len(chain)
            memo = self._kernel_waits_memo
            if chain in memo:
                wait = memo[chain]
            else:
                if not self.kernel:
                    self.kernel.append(KernelSymbols.load(cache_dir=self.symbolizer.cache_dir))
                    if self.kernel[0].hidden and self.on_warning is not None:
                        self.on_warning("the kernel functions threads wait in are not named:"
                                        " /proc/kallsyms lists no addresses"
                                        " (kernel.kptr_restrict)")
                if not self.kernel[0].covers(chain):
                    # a frame outside the code the cached table is right for (a BPF program
                    # or trampoline loaded since): the file as it is now
                    self.kernel[0] = KernelSymbols.load()
                function = self.kernel[0].waiting_function(chain)
                wait = None if function is None else self._kernel_frame(function)
                if len(memo) >= KERNEL_WAITS_MEMO:
                    memo.clear()  # bounded: a recording meets few distinct chains
                memo[chain] = wait
            split[i] = (native_id, [KERNEL_ADDRESS, *ips[n:]], python)
            if wait is not None:
                waits[native_id] = wait
        return waits

    def _kernel_frame(self, function: KernelFunction) -> int:
        key = (function.start, function.module)
        found = self._kernel_frames.get(key)
        if found is None:
            module_id = self.ids.module_id(function.module, None)
            location = LocationKey(function.name, "", 0, module_id)
            found = self._kernel_frames[key] = self.ids.frame_id(
                function.start, module_id, None, [location])
            self.frame_info[found] = (function.module, (location,))
        return found

    def _lookup_keys(self, ips: Sequence[int], leaf_is_return: bool) -> list[tuple[int, bool]]:
        """(address, whether it is a return address, looked up at the call, - 1, rather than
        an interrupted instruction, looked up as is) per frame: the leaf as leaf_is_return
        says, the user frame under a [kernel] leaf as _follows_syscall says, every other a
        return address. Built without a call per frame (a 40-frame stack's 40 calls were 8 %
        of the recorder's main thread)."""
        if not ips:
            return []
        keys = [(ips[0], leaf_is_return)]
        rest = 1
        if len(ips) > 1 and ips[0] == KERNEL_ADDRESS:
            keys.append((ips[1], self._follows_syscall(ips[1])))
            rest = 2
        keys.extend(zip(ips[rest:], repeat(True)))
        return keys

    def _follows_syscall(self, address: int) -> bool:
        """The user address under a kernel sample is where the thread entered the kernel:
        after its syscall instruction (a return address: the call is at - 1), or, for an
        interrupt or a fault, the interrupted instruction itself, which - 1 could put in the
        function before (seen: the first byte of a function named as the padding before it).
        Code not readable from a file (JIT) keeps the return-address rule."""
        found = self._after_syscall.get(address)
        if found is None:
            found = True
            mapping = self.space.find(address)
            module = self._open_module(mapping.path) if mapping is not None else None
            if mapping is not None and module is not None:
                offset = address - mapping.start + mapping.file_offset
                found = module.bytes_before(offset, 2) in SYSCALL_INSTRUCTIONS
            self._after_syscall[address] = found
        return found

    # -- Python frames ---------------------------------------------------------------------

    def _splice(self, native: tuple[int, ...], words: Sequence[int],
                read_late: bool, at_sample: bool = False) -> tuple[int, ...]:
        """The native stack with each evaluator frame replaced by the Python frames it ran
        (`words`: their stack words, innermost first); the native stack itself when they do
        not pair up (never a guess).

        A CPU sample taken while the interpreter starts keeps its native frames: its Python
        frames were read at drain time, and start-up's imports hand over to the program's
        own within milliseconds, in importlib frames of the same shape, so a late read can
        pair up and be wrong (seen once under load: encodings' import at start-up charged
        to the script's `<module>` at its own import line)."""
        # Per-frame memo lookups through map (in C); a frame met for the first time takes
        # the comprehension that fills the memo.
        memo = self._eval_frames
        is_eval = cast("list[bool]", list(map(memo.get, native)))
        if None in is_eval:
            is_eval = [memo[frame] if frame in memo else self._is_eval(frame)
                       for frame in native]
        shape = splice_shape(is_eval, [word >> PY_FRAME_ENTRY_BIT & 1 for word in words],
                             at_sample)
        if read_late and shape is not None:
            startup = self._startup_frames
            in_startup = list(map(startup.get, native))
            if None in in_startup:
                in_startup = [startup[frame] if frame in startup else self._in_startup(frame)
                              for frame in native]
            if any(in_startup):
                shape = None
        if shape is None or self.python is None:
            self.python_unpaired += 1
            return native
        self.python_spliced += 1
        if shape[2]:
            self.python_between += 1
        # Stored only now, for a stack that pairs (as before: a frame is stored for a
        # stack that uses it), innermost first.
        known = self._py_word_frames
        python = cast("list[int]", list(map(known.get, words)))
        if None in python:
            python = [known[word] if word in known else self._python_word_frame(word)
                      for word in words]
        return splice_apply(native, python, shape)

    def _python_word_frame(self, word: int) -> int:
        found = self._py_word_frames[word] = self._python_frame(*decode_python(word))
        return found

    def is_python_frame(self, frame_id: int) -> bool:
        """A frame of Python code (spliced in from a frame reader's walk)."""
        return frame_id in self._py_frame_ids

    def _is_eval(self, frame_id: int) -> bool:
        return self._runs_one_of(frame_id, EVAL_FUNCTIONS, self._eval_frames)

    def _in_startup(self, frame_id: int) -> bool:
        return self._runs_one_of(frame_id, STARTUP_FUNCTIONS, self._startup_frames)

    def _runs_one_of(self, frame_id: int, functions: frozenset[str],
                     memo: dict[int, bool]) -> bool:
        """Whether the frame (or a function inlined in it) is one of `functions`; memoized
        per frame."""
        found = memo.get(frame_id)
        if found is None:
            _, chain = self.frame_info.get(frame_id, ("", ()))
            found = memo[frame_id] = any(location.function in functions for location in chain)
        return found

    def _python_frame(self, function: int, line: int) -> int:
        key = (function, line)
        found = self._py_frames.get(key)
        if found is not None:
            return found
        if function not in self._py_functions and self.python is not None:
            start = max(self._py_functions, default=0) + 1
            for fid, qualname, file, first_line in self.python.functions(start):
                self._py_functions[fid] = (qualname, file, first_line)
        if function == PYTHON_FREED_ID:
            found = self._named_frame(python_address(PYTHON_FREED_FUNCTION, 0, 0),
                                      PYTHON_FREED_FUNCTION)
            self._py_frames[key] = found
            self._py_frame_ids.add(found)
            return found
        qualname, file, first_line = self._py_functions.get(function, (f"[python {function}]",
                                                                        "", 0))
        module_id = self.ids.module_id(file, None)
        location = LocationKey(qualname, file, line, module_id)
        found = self.ids.frame_id(python_address(qualname, first_line, line), module_id,
                                     line, [location])
        self._py_frames[key] = found
        self._py_frame_ids.add(found)
        self.frame_info[found] = (file, (location,))
        return found

    def _resolve_frames(self, needed: Iterable[tuple[int, bool]]) -> None:
        by_mapping: dict[Mapping | None, list[tuple[int, bool]]] = {}
        for key in needed:
            by_mapping.setdefault(self.space.find(key[0]), []).append(key)
        for mapping, keys in by_mapping.items():
            if mapping is None:
                for address, is_caller in keys:
                    if address == TRUNCATED_ADDRESS and is_caller:
                        self._frame_ids[(address, is_caller)] = self._truncated_frame()
                        continue
                    if address == KERNEL_ADDRESS and not is_caller:
                        self._frame_ids[(address, is_caller)] = self._named_frame(
                            KERNEL_ADDRESS, KERNEL_FUNCTION)
                        continue
                    name = f"0x{address:x}"
                    location = LocationKey(name, "", 0, None)
                    frame_id = self.ids.frame_id(address, None, None, [location])
                    self._frame_ids[(address, is_caller)] = frame_id
                    self.frame_info[frame_id] = ("", (location,))
                continue
            self._resolve_in_mapping(mapping, keys)

    def _justified(self, ips: Sequence[int], mapped: dict[int, bool]) -> Sequence[int]:
        """The stack up to its first unmapped caller, then `[truncated]`. Looks its
        addresses up (memoized in `mapped`) only that far: 8 Ki random 64-deep stacks (a
        flood, tests/targets/ring_abuse.c) were 512 Ki lookups for stacks that end at their
        second frame, 220-280 ms; 6-7 ms looked up this way (load 9, 2 cores).

        A stack whose addresses are all known mapped (`_mapped`; a pseudo-address leaf is
        no mapping and no miss) is whole: checked without a step per frame."""
        known = self._mapped
        if ips and (ips[0] in known or ips[0] in _PSEUDO_LEAVES) and all(
                map(known.__contains__, islice(ips, 1, None))):
            return ips
        for position, address in enumerate(ips):
            found = mapped.get(address)
            if found is None:
                found = mapped[address] = self.space.find(address) is not None
                if found:
                    known.add(address)
            if not found and position:
                return (*ips[:position], TRUNCATED_ADDRESS)
        return ips

    def _truncated_frame(self) -> int:
        return self._named_frame(TRUNCATED_ADDRESS, TRUNCATED_FUNCTION)

    def _named_frame(self, address: int, name: str) -> int:
        """A pseudo-frame ([truncated], [kernel], [rsprof heap tracking]) at an address that
        is never code."""
        location = LocationKey(name, "", 0, None)
        frame_id = self.ids.frame_id(address, None, None, [location])
        self.frame_info[frame_id] = ("", (location,))
        return frame_id

    def _resolve_in_mapping(self, mapping: Mapping, keys: list[tuple[int, bool]]) -> None:
        module_id = self._module_id(mapping.path, mapping.build_id)
        module = self._open_module(mapping.path)
        if module is None and is_anonymous(mapping.path):
            self._resolve_jit(mapping, module_id, keys)
            return
        offsets = [address - mapping.start + mapping.file_offset for address, _ in keys]
        if module is not None:
            vaddrs = [module.file_offset_to_vaddr(offset) for offset in offsets]
            lookups = [v - 1 if is_caller else v for v, (_, is_caller) in zip(vaddrs, keys)]
            chains: list[tuple[SourceFrame, ...]] = module.symbolize(lookups)
        else:
            vaddrs = offsets
            name = _display_name(mapping.path)
            chains = [(SourceFrame(f"{name}+0x{offset:x}", "", 0, None),) for offset in offsets]
        for (address, is_caller), vaddr, chain in zip(keys, vaddrs, chains):
            locations = [
                LocationKey(frame.function, frame.file, frame.line, module_id, frame.system_name)
                for frame in chain
            ]
            frame_id = self.ids.frame_id(address, module_id, vaddr, locations)
            self._frame_ids[(address, is_caller)] = frame_id
            self.frame_info[frame_id] = (mapping.path, tuple(locations))

    # -- JIT code ------------------------------------------------------------------------

    def _jit_symbol(self, address: int) -> JitSymbol | None:
        """The perf map entry holding `address`. A miss re-reads the map once per batch
        (it grows as code is compiled); a forked child that has no map of its own (or none
        holding the address) is looked up in its parent's."""
        if self._perfmap is None:
            self._perfmap = PerfMap(self.pid, started=self._started)
        found = self._perfmap.lookup(address)
        if found is None and not self._perfmap_fresh:
            self._perfmap_fresh = True
            self._perfmap.refresh()
            if self._perfmap.refused is not None and self.on_warning is not None:
                self.on_warning(f"perf map ignored: {self._perfmap.refused}")
            if self._perfmap.truncated is not None and self.on_warning is not None:
                self.on_warning(f"perf map cut: {self._perfmap.truncated}")
            found = self._perfmap.lookup(address)
        if found is None and self._parent_perfmap is not None:
            found = self._parent_perfmap.lookup(address)
        return found

    def _resolve_jit(self, mapping: Mapping, module_id: int, keys: list[tuple[int, bool]]) -> None:
        """Code in an anonymous executable mapping: named by the perf map when it has an
        entry (callers at address - 1, the call), else its bare address."""
        for address, is_caller in keys:
            symbol = self._jit_symbol(address - 1 if is_caller else address)
            if symbol is None:
                location = LocationKey(f"0x{address:x}", "", 0, module_id)
            else:
                system = symbol.raw if symbol.raw != symbol.function else None
                location = LocationKey(symbol.function, symbol.file, symbol.line, module_id,
                                       system)
            frame_id = self.ids.frame_id(address, module_id, None, [location])
            self._frame_ids[(address, is_caller)] = frame_id
            self.frame_info[frame_id] = (mapping.path, (location,))
