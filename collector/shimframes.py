"""rsprof's own heap shim out of the program's stacks (issue 20).

Under `rsprof run` every allocator call and every thread start goes through the LD_PRELOAD
shim (native/shim/heapshim.c, installed as `rsprof/lib/librsprof_heap.so`), so its
functions sit in the program's stacks: its pthread_create wrapper (`thread_trampoline`)
under every thread's start routine, its recording path (`record_alloc`, `capture`,
`shimcfi_walk`, `reserve`, ...) on top of every allocation. Stacks are rewritten once,
where they are resolved (before storage), so every report and export agrees:

- a shim frame that called out of the shim directly is dropped: the real allocator (libc's
  `malloc` called by the wrapper) or the thread's start routine (called by
  `thread_trampoline`) then stands where it would without the shim;
- a sample inside the shim's own work (its code, or libc and the kernel called from it) is
  charged to one frame, `[rsprof heap tracking]`, directly under the allocator function
  the program called, by its public name (`malloc`, `free`, `operator new(unsigned long)`),
  so the program's functions keep their inclusive time and the cost has its own name.

Both new frames belong to no module (like `[kernel]`): no frame of the shim's module is
left in a stored stack.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import cast

from rsprof.collector.symbols import demangle
from rsprof.collector.symbols.elf import ElfError, ElfFile
from rsprof.storage.intern import LocationKey

HEAP_TRACKING_FUNCTION = "[rsprof heap tracking]"
# Pseudo-addresses that are never code: the first page is never mapped ([truncated] is 0,
# [kernel] 1), and entry frames take a prefix of their own (Python frames have 0xFFFE).
HEAP_TRACKING_ADDRESS = 2
ENTRY_ADDRESS_BASE = 0xFFFD << 48

# The shim as built by setup.py (librsprof_heap.so); a renamed copy keeps the prefix.
_SHIM_MODULE = re.compile(r"^librsprof_heap[\w.-]*\.so(\.[\d.]+)?$")

STB_GLOBAL, STB_WEAK = 1, 2
STT_FUNC, STT_GNU_IFUNC = 2, 10


def is_shim_module(path: str) -> bool:
    return bool(_SHIM_MODULE.match(os.path.basename(path)))


@functools.lru_cache(maxsize=16)
def shim_exports(path: str) -> frozenset[str]:
    """The functions the shim exports (demangled), which are the names the program called:
    the shim is built with -fvisibility=hidden, so everything else is internal. Empty when
    the file cannot be read (then no entry gets a name, only `[rsprof heap tracking]`)."""
    try:
        symbols = ElfFile(path).symbols()
    except (OSError, ValueError, ElfError):
        return frozenset()
    return frozenset(
        demangle(symbol.name) for symbol in symbols
        if symbol.bind in (STB_GLOBAL, STB_WEAK) and symbol.type in (STT_FUNC, STT_GNU_IFUNC)
        and symbol.shndx != 0
    )


@dataclass(frozen=True, slots=True)
class ShimFrame:
    """What the rule needs of a frame of the shim: the public name of its outermost
    function (None: an internal function, e.g. thread_trampoline or a truncated walk's)."""

    public: str | None


# One item of a plan, root... leaf order is the caller's: ("keep", index of the frame),
# ("entry", public name) or ("tracking", "").
PlanItem = tuple[str, int | str]


def shim_plan(frames: Sequence[ShimFrame | None]) -> list[PlanItem] | None:
    """The rewritten stack of `frames` (leaf first; None: not a shim frame) as a plan, leaf
    first; None when no frame is the shim's (the stack stays as it is).

    Walked from the root: the first shim frame met is an entry (the program, or libc's
    thread start, called it). If it called out of the shim directly (the frame towards the
    leaf is not the shim's), it is dropped and the walk goes on: that callee is what runs
    without the shim. Otherwise the sample is in the shim's own work: the entry's public
    name and `[rsprof heap tracking]` end the stack, whatever the shim called from there."""
    if not any(frame is not None for frame in frames):
        return None
    plan: list[PlanItem] = []
    index = len(frames) - 1
    while index >= 0:
        frame = frames[index]
        if frame is None:
            plan.append(("keep", index))
        elif index > 0 and frames[index - 1] is None:
            pass  # a wrapper's call of the real function, or the thread's start routine
        else:
            if frame.public is not None:
                plan.append(("entry", frame.public))
            plan.append(("tracking", ""))
            break
        index -= 1
    plan.reverse()
    return plan


def entry_address(name: str) -> int:
    digest = hashlib.blake2b(name.encode(errors="replace"), digest_size=6).digest()
    return ENTRY_ADDRESS_BASE | int.from_bytes(digest, "little")


# A frame not in ShimFrames' memo yet (its entries may be None).
_UNSEEN = object()


class ShimFrames:
    """Applies shim_plan to stored stacks (frame ids) for a FrameResolver.

    `frame_info` is the resolver's frame id -> (module path, inline chain innermost first);
    `named_frame(address, name)` stores a frame of no module; `host_path` turns the target's
    path into one this process can open. Classifications are memoized per frame id (ids are
    global), so the usual stack with no shim frame costs one dict lookup per frame."""

    def __init__(self, frame_info: dict[int, tuple[str, tuple[LocationKey, ...]]],
                 named_frame: Callable[[int, str], int],
                 host_path: Callable[[str], str]) -> None:
        self.frame_info = frame_info
        self.named_frame = named_frame
        self.host_path = host_path
        self._memo: dict[int, ShimFrame | None] = {}
        self._pseudo: dict[str, int] = {}
        self.tracking_frame: int | None = None

    def classify(self, frame_id: int) -> ShimFrame | None:
        if frame_id in self._memo:
            return self._memo[frame_id]
        path, chain = self.frame_info.get(frame_id, ("", ()))
        found: ShimFrame | None = None
        if path and is_shim_module(path):
            outer = chain[-1].function if chain else ""
            found = ShimFrame(outer if outer in shim_exports(self.host_path(path)) else None)
        self._memo[frame_id] = found
        return found

    def rewrite(self, frames: tuple[int, ...]) -> tuple[int, ...]:
        memo = self._memo
        # Memo lookups through map (in C); a frame not classified yet is _UNSEEN.
        classes = cast("list[ShimFrame | None]", list(map(memo.get, frames, repeat(_UNSEEN))))
        if _UNSEEN in classes:
            classes = [memo[frame] if frame in memo else self.classify(frame)
                       for frame in frames]
        if classes.count(None) == len(classes):
            return frames  # the usual stack: no shim frame (shim_plan would say None)
        plan = shim_plan(classes)
        if plan is None:
            return frames
        out = []
        for kind, value in plan:
            if kind == "keep":
                assert isinstance(value, int)
                out.append(frames[value])
            elif kind == "entry":
                assert isinstance(value, str)
                out.append(self._pseudo_frame(entry_address(value), value))
            else:
                self.tracking_frame = self._pseudo_frame(HEAP_TRACKING_ADDRESS,
                                                         HEAP_TRACKING_FUNCTION)
                out.append(self.tracking_frame)
        return tuple(out)

    def _pseudo_frame(self, address: int, name: str) -> int:
        found = self._pseudo.get(name)
        if found is None:
            found = self._pseudo[name] = self.named_frame(address, name)
        return found
