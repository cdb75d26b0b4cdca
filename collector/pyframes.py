"""Python frames of a running CPython, read from outside (`rsprof._native.PyFrameReader`).

`open_reader(pid)` finds the interpreter in the target (the executable or a libpython it
maps), reads its version from the `Py_Version` constant in the file, locates `_PyRuntime`,
`PyCode_Type` and `PyUnicode_Type` from the ELF symbol tables and the load address, and
gives the C reader the structure offsets: 3.13's own `_Py_DebugOffsets`, else those of the
minor version in the table below (generated
by tests/targets/pyoffsets.c from each version's own headers; tests/system/test_pyframes.py checks
it against every installed Python). Nothing is written to or stops the target.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Protocol, TypeVar

from rsprof.collector.pythreads import ThreadNames
from rsprof.collector.symbols.elf import PT_LOAD, ElfError, ElfFile

from rsprof._native import (
    PY_FRAME_ENTRY_BIT,
    PY_FRAME_FUNCTION_BITS,
    PY_FRAME_FUNCTION_SHIFT,
    PY_FRAME_LINE_BITS,
    PY_MARK,
    PY_MARK_SAMPLED,
    PyFrameReader,
)

T = TypeVar("T")

# Offsets per (major, minor), x86-64 / arm64 (LP64). -1: the field does not exist there.
_COMMON = {
    "tstate_next": 8, "frame_instr": 56, "code_name": 120, "code_qualname": 128,
    "code_filename": 112, "code_linetable": 136, "unicode_length": 16, "unicode_state": 32,
    "bytes_size": 16, "bytes_data": 32, "interp_next": 0,
    # Python thread names (collector/pythreads.py): dicts, ints, types, modules.
    "long_size": 16, "long_digits": 24, "module_dict": 16, "dict_used": 16, "dict_version": 24,
    "dict_keys": 32, "dict_values": 40, "dictkeys_log2_size": 8, "dictkeys_log2_index_bytes": 9,
    "dictkeys_kind": 10, "dictkeys_nentries": 24, "dictkeys_indices": 32, "type_flags": 168,
    # --gil (native/bpf/pyperf.bpf.c): struct _gil_runtime_state's holder and lock
    "tstate_interp": 16, "gil_last_holder": 8, "gil_locked": 16,
}
LAYOUTS: dict[tuple[int, int], dict[str, int]] = {
    (3, 11): {
        **_COMMON, "runtime_interpreters_head": 40, "interp_threads_head": 16,
        "tstate_native_thread_id": 160, "tstate_cframe": 56, "cframe_current_frame": 8,
        "tstate_current_frame": -1, "frame_code": 32, "frame_previous": 48, "frame_owner": 69,
        "owner_cstack": -1, "frame_is_entry": 68, "code_firstlineno": 72, "code_adaptive": 184,
        "unicode_ascii_data": 48, "unicode_compact_data": 72, "tstate_thread_id": 152,
        "interp_modules": 888, "dictvalues_values": 0, "heaptype_cached_keys": 872,
        "runtime_gil": 360, "interp_gil": -1,
    },
    (3, 12): {
        **_COMMON, "runtime_interpreters_head": 40, "interp_threads_head": 72,
        "tstate_native_thread_id": 144, "tstate_cframe": 56, "cframe_current_frame": 0,
        "tstate_current_frame": -1, "frame_code": 0, "frame_previous": 8, "frame_owner": 70,
        "owner_cstack": 3, "frame_is_entry": -1, "code_firstlineno": 68, "code_adaptive": 192,
        "unicode_ascii_data": 40, "unicode_compact_data": 56, "tstate_thread_id": 136,
        "interp_modules": 944, "dictvalues_values": 0, "heaptype_cached_keys": 880,
        "runtime_gil": -1, "interp_gil": 384,
    },
    (3, 13): {
        **_COMMON, "runtime_interpreters_head": 632, "interp_next": 7264,
        "interp_threads_head": 7344, "tstate_native_thread_id": 160, "tstate_cframe": -1,
        "cframe_current_frame": -1, "tstate_current_frame": 72, "frame_code": 0,
        "frame_previous": 8, "frame_owner": 70, "owner_cstack": 3, "frame_is_entry": -1,
        "code_firstlineno": 68, "code_adaptive": 200, "unicode_ascii_data": 40,
        "unicode_compact_data": 56, "tstate_thread_id": 152, "interp_modules": 7656,
        "dictvalues_values": 8, "heaptype_cached_keys": 880,
        "runtime_gil": -1, "interp_gil": 16,
    },
}

# CPython 3.13's _Py_DebugOffsets, at the start of _PyRuntime (Include/internal/
# pycore_runtime.h): `xdebugpy`, version, free_threaded, then groups of uint64 offsets,
# each group starting with the structure's size. Field -> index of its uint64 (after the
# 8-byte cookie). Layouts of later versions differ (3.14 adds fields): 3.13 only.
_DEBUG_COOKIE = b"xdebugpy"
_DEBUG_FIELDS_313 = {
    "version": 0, "free_threaded": 1,
    "runtime_interpreters_head": 4,
    "interp_next": 7, "interp_threads_head": 8, "interp_modules": 10,
    "tstate_next": 20, "tstate_interp": 21, "tstate_current_frame": 22, "tstate_thread_id": 23,
    "tstate_native_thread_id": 24,
    "frame_previous": 28, "frame_code": 29, "frame_instr": 30, "frame_owner": 32,
    "code_filename": 34, "code_name": 35, "code_qualname": 36, "code_linetable": 37,
    "code_firstlineno": 38, "code_adaptive": 42, "type_flags": 48,
    "dict_keys": 56, "dict_values": 57, "long_size": 61, "long_digits": 62,
    "bytes_size": 64, "bytes_data": 65,
    "unicode_state": 67, "unicode_length": 68, "unicode_ascii_data": 69,
}
_LIBPYTHON = re.compile(r"/libpython3\.\d+[a-z]*\.so")
_SYMBOLS = ("_PyRuntime", "PyCode_Type", "PyUnicode_Type", "Py_Version", "PyDict_Type",
            "PyLong_Type")


@dataclass(frozen=True, slots=True)
class PythonRuntime:
    """Where one CPython lives in a process."""

    path: str  # the file holding _PyRuntime (as the target names it)
    version: tuple[int, int, int]
    runtime: int  # run-time addresses in the target
    code_type: int
    unicode_type: int
    layout: dict[str, int] | None  # offsets for PyFrameReader; None: unsupported
    dict_type: int = 0  # PyDict_Type and PyLong_Type (0: unknown), to check what
    long_type: int = 0  # collector/pythreads.py reads

    @property
    def supported(self) -> bool:
        return self.layout is not None


def debug_offsets_layout(data: bytes, version: tuple[int, int, int]) -> dict[str, int] | None:
    """The reader's offsets from a 3.13 `_Py_DebugOffsets` (the first bytes of _PyRuntime
    as initialized in the file); None if it is not one, or describes a free-threaded build
    (whose object header differs)."""
    if version[:2] != (3, 13) or len(data) < 8 + 8 * 72 or data[:8] != _DEBUG_COOKIE:
        return None
    words = struct.unpack_from("<72Q", data, 8)
    values = {name: words[index] for name, index in _DEBUG_FIELDS_313.items()}
    if values.pop("free_threaded") or values.pop("version") >> 16 != 0x030D:
        return None
    # What 3.13 does not publish (dict internals, the heap type's cached keys) is the table's.
    layout = {**LAYOUTS[(3, 13)], **values, "tstate_cframe": -1, "cframe_current_frame": -1,
              "owner_cstack": 3, "frame_is_entry": -1,  # FRAME_OWNED_BY_CSTACK in 3.13
              # PyCompactUnicodeObject: PyASCIIObject + utf8_length + utf8
              "unicode_compact_data": values["unicode_ascii_data"] + 16}
    if any(value > 1 << 20 for value in layout.values()):
        return None
    return layout


def _file_mappings(pid: int) -> dict[str, list[tuple[int, int]]]:
    """path -> [(start, file offset)] of the process's file mappings."""
    found: dict[str, list[tuple[int, int]]] = {}
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                start = int(parts[0].split("-")[0], 16)
                found.setdefault(parts[5].strip(), []).append((start, int(parts[2], 16)))
    return found


def _host_path(pid: int, path: str) -> str:
    """The file as we can open it: through /proc/PID/root when the target's is another."""
    in_target = f"/proc/{pid}/root{path}"
    return in_target if os.path.exists(in_target) else path


@dataclass(frozen=True, slots=True)
class _ElfPython:
    """What one file says about the CPython in it (link-time addresses)."""

    first_load: int  # vaddr of the PT_LOAD at file offset 0
    runtime: int
    code_type: int
    unicode_type: int
    version: tuple[int, int, int]
    layout: dict[str, int] | None
    dict_type: int  # link-time address, 0 when the file does not export it
    long_type: int


def _file_identity(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


_ELF_PYTHONS: dict[tuple[int, int, int, int], _ElfPython | None] = {}
_ELF_PYTHONS_MAX = 256


def _elf_python(path: str, identity: tuple[int, int, int, int]) -> _ElfPython | None:
    """The file's CPython, None if it holds none. Cached per file identity, whatever the
    path it was opened by: a recording that follows a shell starting a program ten times a
    second looks at the same two files over and over, and a launched target's interpreter,
    looked at before its start (`program_runs_python`) by its own path, is found in its
    first milliseconds through /proc/PID/root (4.6 ms of parsing saved then: samples taken
    before the interpreter is found get no Python frames)."""
    if identity in _ELF_PYTHONS:
        return _ELF_PYTHONS[identity]
    found = _read_elf_python(path)
    if len(_ELF_PYTHONS) >= _ELF_PYTHONS_MAX:
        _ELF_PYTHONS.clear()
    _ELF_PYTHONS[identity] = found
    return found


def _read_elf_python(path: str) -> _ElfPython | None:
    try:
        elf = ElfFile(path)
    except (OSError, ValueError, ElfError):
        return None
    # A quick no for every other program (a node binary's symbols take 0.4 s to list):
    # CPython exports all four names, so its .dynstr holds them.
    dynstr = bytes(elf.data_of(".dynstr") or b"")
    if any(b"\0" + name + b"\0" not in dynstr for name in (b"_PyRuntime", b"Py_Version")):
        return None
    # CPython exports them all (the .dynstr check above): .dynsym alone is enough, and
    # reading it instead of .symtab too took the first look at pyenv's libpython3.11 from
    # 57 ms to 8 ms: samples taken before the interpreter is found get no frames.
    symbols = {s.name: s.value for s in elf.symbols(dynamic_only=True)
               if s.name in _SYMBOLS and s.value}
    if not {"_PyRuntime", "PyCode_Type", "PyUnicode_Type", "Py_Version"} <= symbols.keys():
        return None
    first_load = min(
        (seg for seg in elf.segments if seg.type == PT_LOAD and seg.offset == 0),
        key=lambda seg: seg.vaddr, default=None,
    )
    if first_load is None:
        return None
    offset = elf.vaddr_to_file_offset(symbols["Py_Version"])
    (hexversion,) = struct.unpack_from("<I", elf.data, offset)
    version = (hexversion >> 24, (hexversion >> 16) & 0xFF, (hexversion >> 8) & 0xFF)
    # 3.13 says its own offsets; they win over the table (a point release may move
    # a field). Older versions: the table.
    start = elf.vaddr_to_file_offset(symbols["_PyRuntime"])
    layout = debug_offsets_layout(bytes(elf.data[start:start + 8 + 8 * 72]), version)
    if layout is None and version[:2] != (3, 13):
        layout = LAYOUTS.get(version[:2])
    return _ElfPython(first_load.vaddr, symbols["_PyRuntime"], symbols["PyCode_Type"],
                      symbols["PyUnicode_Type"], version, layout,
                      symbols.get("PyDict_Type", 0), symbols.get("PyLong_Type", 0))


def program_runs_python(path: str, _depth: int = 0) -> bool:
    """Whether starting `path` runs a CPython 3.11+: an interpreter (or a program linked
    with libpython), or a script whose #! line names one (`#!/usr/bin/env python3` too).
    Used before the program runs, to decide how promptly its samples are drained."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    if head.startswith(b"#!") and _depth < 2:
        words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
        if words and os.path.basename(words[0]) == "env":
            words = [w for w in words[1:] if not w.startswith("-")]
            words[:1] = [shutil.which(words[0]) or words[0]] if words else []
        return bool(words) and program_runs_python(words[0], _depth + 1)
    if not head.startswith(b"\x7fELF"):
        return False
    identity = _file_identity(path)
    if identity is None:
        return False
    if _elf_python(path, identity) is not None:
        return True
    try:
        dynstr = bytes(ElfFile(path).data_of(".dynstr") or b"")
    except (OSError, ValueError, ElfError):
        return False
    if b"libpython3" not in dynstr:
        return False
    _look_at_libpython(path, dynstr)
    return True


_LIBRARY_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/local/lib",
                 "/lib64", "/usr/lib64", "/lib", "/usr/lib")


def _look_at_libpython(program: str, dynstr: bytes) -> None:
    """Reads, before the program starts, the libpython it links (found as ld.so would,
    roughly: its RUNPATH/RPATH with $ORIGIN, LD_LIBRARY_PATH, the usual folders), so that
    finding the interpreter in the running process costs no parsing. A guess that misses
    costs nothing but this look: what is kept is keyed by the file's identity."""
    strings = [word.decode(errors="replace") for word in dynstr.split(b"\0") if word]
    library = next((w for w in strings if _LIBPYTHON.search("/" + w) and "/" not in w), None)
    if library is None:
        return
    origin = os.path.dirname(os.path.realpath(program))
    folders = [folder.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
               for w in strings if w.startswith(("/", "$ORIGIN", "${ORIGIN}"))
               for folder in w.split(":")]
    folders += os.environ.get("LD_LIBRARY_PATH", "").split(":") + list(_LIBRARY_DIRS)
    for folder in filter(None, folders):  # an empty LD_LIBRARY_PATH entry names nothing
        candidate = os.path.join(folder, library)
        identity = _file_identity(candidate)
        if identity is not None:
            _elf_python(candidate, identity)
            return


def find_runtime(pid: int) -> PythonRuntime | None:
    """The CPython in `pid`: a libpython it maps, else its executable. None if neither has
    `_PyRuntime` (not CPython, or older than 3.7) or `Py_Version` (older than 3.11)."""
    mappings = _file_mappings(pid)
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    candidates = [path for path in mappings if _LIBPYTHON.search(path)]
    if exe in mappings:
        candidates.append(exe)
    for path in candidates:
        host = _host_path(pid, path)
        identity = _file_identity(host)
        found = _elf_python(host, identity) if identity is not None else None
        base = next((start for start, offset in mappings[path] if offset == 0), None)
        if found is None or base is None:
            continue
        bias = base - found.first_load
        return PythonRuntime(path, found.version, found.runtime + bias, found.code_type + bias,
                             found.unicode_type + bias, found.layout,
                             found.dict_type and found.dict_type + bias,
                             found.long_type and found.long_type + bias)
    return None


def open_reader(pid: int) -> PyFrameReader | None:
    """A frame reader for `pid`, or None when it runs no supported CPython (3.11-3.13).
    OSError if /proc/PID/maps cannot be read (gone, or no permission)."""
    runtime = find_runtime(pid)
    if runtime is None or runtime.layout is None:
        return None
    return reader_for(pid, runtime)


def reader_for(pid: int, runtime: PythonRuntime) -> PyFrameReader:
    """The frame reader of a supported runtime (runtime.layout set) of `pid`."""
    assert runtime.layout is not None
    return PyFrameReader(pid, runtime.runtime, runtime.code_type, runtime.unicode_type,
                         runtime.layout)


def splice_plan(native_is_eval: Sequence[bool], python_entry: Sequence[bool],
                at_sample: bool = False) -> list[tuple[str, int]] | None:
    """Where a thread's Python frames go in its native stack (both innermost first).

    CPython 3.11+ runs Python-to-Python calls inside the caller's evaluator call, so each
    `_PyEval_EvalFrameDefault` native frame ran a group of Python frames: innermost first,
    up to and including the next `entry` frame (PyFrame.entry). The plan lists, in stack
    order, ("native", i) for native frames kept and ("python", j) for the Python frames
    that replace evaluator frame after evaluator frame. None when the two do not pair up
    (as many groups as evaluator frames, the last group ending at an entry frame): the
    native stack was cut, or the Python stack was read across a call or return; keep the
    native stack then, never a guess.

    at_sample: the Python frames were read at the sampled instant (the BPF sampler), so
    one group fewer than evaluator frames is no stale read but the innermost evaluator
    between frames: entering (its frame not linked yet) or leaving one (a generator that
    yielded to the C code that resumed it). Only the innermost can be: every outer one is
    inside a call, its frames linked. That frame then stays native, the others pair."""
    shape = splice_shape(native_is_eval, python_entry, at_sample)
    if shape is None:
        return None
    evals, ends, between = shape
    innermost_native = evals[0] if between else -1
    plan: list[tuple[str, int]] = []
    group = 0
    for index, is_eval in enumerate(native_is_eval):
        if is_eval and index != innermost_native:
            plan.extend(("python", j) for j in range(ends[group - 1] if group else 0,
                                                     ends[group]))
            group += 1
        else:
            plan.append(("native", index))
    return plan


def splice_shape(native_is_eval: Sequence[bool], python_entry: Sequence[int] | Sequence[bool],
                 at_sample: bool = False) -> tuple[list[int], list[int], bool] | None:
    """splice_plan's rule (its docstring says it; it lists frame by frame what this
    places), as slices for splice_apply: (the evaluator frames' indices, the end
    (exclusive) of each Python group, whether the innermost evaluator stays native); None
    when the two do not pair up. Its loops run in C but one per evaluator frame: the
    recorder splices every new stack, ~40 frames, and splice_plan's step and tuple per
    frame were a fifth of resolving an off-CPU stack."""
    evals = list(compress(range(len(native_is_eval)), native_is_eval))
    ends = [index + 1 for index in compress(range(len(python_entry)), python_entry)]
    if (ends[-1] if ends else 0) != len(python_entry):
        return None  # frames after the last entry frame
    between = at_sample and len(evals) > 0 and len(ends) == len(evals) - 1
    if len(ends) != len(evals) and not between:
        return None
    return evals, ends, between


def splice_apply(native: Sequence[T], python: Sequence[T],
                 shape: tuple[list[int], list[int], bool]) -> tuple[T, ...]:
    """The native stack with each evaluator frame replaced by its group of `python` (both
    innermost first), as splice_shape placed them (the plan splice_plan would give)."""
    evals, ends, between = shape
    out: list[T] = []
    native_from = python_from = 0
    for group, at in enumerate(evals[1:] if between else evals):
        out.extend(native[native_from:at])
        out.extend(python[python_from:ends[group]])
        native_from, python_from = at + 1, ends[group]
    out.extend(native[native_from:])
    return tuple(out)

# A process image that is not CPython yet may still become one: ld.so maps libpython after
# the exec that created the image. Looked at again at these ages (s), then given up on.
# Dense early on: the samples taken before the interpreter is found get no frames read at
# sample time (the BPF program reads a process once it is configured), and ld.so maps a
# shared libpython within milliseconds of the exec (rsprof run of pyenv's 3.11: 38 of
# 1068 fib samples had none with a first retry at 50 ms).
_DETECT_AGES = (0.0, 0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 0.15, 0.25, 0.35, 0.5, 0.7)


class PythonImages:
    """Finds, once per process image, whether it runs a supported CPython, and gives each
    one's reader to the sampler, which then reads the Python frames of its samples at drain
    time (`PerfSampler.set_python`). Called from the drain loop, so that a launched Python
    program gets its frames from its first milliseconds."""

    def __init__(self, sampler: PythonSampler,
                 on_warning: Callable[[str], None] | None = None) -> None:
        self.sampler = sampler
        self.on_warning = on_warning
        self.readers: dict[int, PyFrameReader] = {}  # image -> reader, kept after it exits
        self.runtimes: dict[int, PythonRuntime] = {}
        self._attached: set[int] = set()  # images the sampler reads now
        self._tries: dict[int, tuple[float, int]] = {}  # image -> (first seen, tries)
        self._done: set[int] = set()
        self._names: dict[int, ThreadNames] = {}  # image -> its threads' Python names

    def thread_names(self) -> dict[int, str]:
        """{tid: Python name} of the threads of every live image whose CPython is read
        (`threading.Thread` names: collector/pythreads.py). Called once per checkpoint by
        the recorder's main thread while the drain loop may attach images: it iterates a
        copy. A thread that threading does not know is left out (it keeps its `comm`)."""
        names: dict[int, str] = {}
        for image in list(self._attached):
            reader, runtime = self.readers.get(image), self.runtimes.get(image)
            if reader is None or runtime is None or runtime.layout is None:
                continue
            found = self._names.get(image)
            if found is None:
                found = self._names[image] = ThreadNames(
                    reader, runtime.version, runtime.layout, runtime.runtime,
                    runtime.dict_type, runtime.long_type)
            names.update(found.poll())
        return names

    def reader_for(self, pid: int, image: int) -> PyFrameReader | None:
        """The reader of `image` (pid's current image), detected now if the periodic
        look has not found it yet (the heap ring met an allocation with Python frames, so
        the interpreter is there). None when it runs no supported CPython."""
        if image not in self.readers and image not in self._done:
            self._tries[image] = (time.monotonic() - _DETECT_AGES[-1], len(_DETECT_AGES) - 1)
            self.poll(only=image)
        return self.readers.get(image)

    def poll(self, now: float | None = None, only: int | None = None) -> None:
        now = time.monotonic() if now is None else now
        live = self.sampler.images()
        for pid, image in live:
            if image in self._done or (only is not None and image != only):
                continue
            first, tries = self._tries.get(image, (now, 0))
            if tries < len(_DETECT_AGES) and now - first < _DETECT_AGES[tries]:
                continue
            self._tries[image] = (first, tries + 1)
            try:
                runtime = find_runtime(pid)
            except OSError:
                self._done.add(image)  # gone, or not ours to read
                continue
            if runtime is None:
                if tries + 1 >= len(_DETECT_AGES):
                    self._done.add(image)
                continue
            self._done.add(image)
            self.runtimes[image] = runtime
            if runtime.layout is None:
                if self.on_warning is not None:
                    version = ".".join(map(str, runtime.version))
                    self.on_warning(f"Python {version} (pid {pid}) is not supported (3.11-3.13):"
                                    " its samples show the interpreter's native frames")
                continue
            try:
                reader = PyFrameReader(pid, runtime.runtime, runtime.code_type,
                                       runtime.unicode_type, runtime.layout)
            except (ValueError, OSError):
                continue
            self.readers[image] = reader
            self.sampler.set_python(image, reader)
            self._attached.add(image)
        # A process that exited keeps its reader (its function names are still needed);
        # the sampler stops reading for it.
        gone = self._attached - {image for _, image in live}
        for image in gone:
            self.sampler.set_python(image, None)
            self._attached.discard(image)
            self._names.pop(image, None)


class PythonSampler(Protocol):
    def images(self) -> list[tuple[int, int]]: ...
    def set_python(self, image: int, reader: PyFrameReader | None, /) -> None: ...


# The words native/perf.c and native/heapreader.c append to a stack's native addresses:
# PY_MARK, then one word per Python frame, innermost first (native/stackwords.h).
_FUNCTION_MASK = (1 << PY_FRAME_FUNCTION_BITS) - 1
_LINE_MASK = (1 << PY_FRAME_LINE_BITS) - 1
_LINE_SIGN = 1 << (PY_FRAME_LINE_BITS - 1)


def encode_python(frames: Sequence[tuple[int, int, bool]]) -> list[int]:
    """(function id, line, entry) per frame as the words that follow PY_MARK (the inverse of
    split_python's decoding, for stacks made in Python: `rsprof dump`)."""
    return [1 << 63 | int(entry) << PY_FRAME_ENTRY_BIT
            | (function & _FUNCTION_MASK) << PY_FRAME_FUNCTION_SHIFT | (line & _LINE_MASK)
            for function, line, entry in frames]


def split_python(ips: Sequence[int]) -> tuple[Sequence[int], list[tuple[int, int, bool]]]:
    """A sampled chain as (native addresses, [(function id, line, entry)])."""
    native, words = split_words(ips)
    return native, [(*decode_python(word), bool(word >> PY_FRAME_ENTRY_BIT & 1))
                    for word in words]


def split_words(ips: Sequence[int]) -> tuple[Sequence[int], Sequence[int]]:
    """A sampled chain as (native addresses, the Python frames' words undecoded)."""
    if PY_MARK in ips:
        mark = ips.index(PY_MARK)
    elif PY_MARK_SAMPLED in ips:
        mark = ips.index(PY_MARK_SAMPLED)
    else:
        return ips, ()
    return ips[:mark], ips[mark + 1:]


def decode_python(word: int) -> tuple[int, int]:
    """A Python frame's word as (function id, line)."""
    line = word & _LINE_MASK
    return ((word >> PY_FRAME_FUNCTION_SHIFT) & _FUNCTION_MASK,
            line - (_LINE_MASK + 1) if line & _LINE_SIGN else line)
