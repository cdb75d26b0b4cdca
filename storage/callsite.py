"""Which frame of an allocating stack is the call site: the first user frame.

Allocator, shim, C/C++ runtime and Rust `alloc::` frames are skipped by *module* and by
*exact symbol rules*, never by substring (rsprof's substring `free` also skipped a user's
`free_list`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Protocol

from rsprof.storage.intern import LocationKey

# Shared objects whose frames are never the user's call site.
_RUNTIME_MODULE = re.compile(
    r"^(librsprof_heap|libc|libc\.musl-.*|libstdc\+\+|libgcc_s|libm|ld-linux.*|ld-musl.*"
    r"|libjemalloc|libtcmalloc.*|libmimalloc|libpthread|libdl)(-[\d.]+)?\.so(\.[\d.]+)?$"
)

# Allocation entry points that may be linked statically into the target.
_ALLOCATOR_FUNCTIONS = frozenset(
    {
        "malloc", "calloc", "realloc", "reallocarray", "free", "posix_memalign",
        "aligned_alloc", "memalign", "valloc", "pvalloc", "strdup", "strndup",
        "__libc_malloc", "__libc_calloc", "__libc_realloc", "__libc_memalign",
        "operator new(unsigned long)", "operator new[](unsigned long)",
        "operator new(unsigned long, std::nothrow_t const&)",
        "operator new[](unsigned long, std::nothrow_t const&)",
        "operator new(unsigned long, std::align_val_t)",
        "operator new[](unsigned long, std::align_val_t)",
        "__rust_alloc", "__rust_alloc_zeroed", "__rust_realloc", "__rust_dealloc",
        "__rdl_alloc", "__rdl_alloc_zeroed", "__rdl_realloc",
        "__rg_alloc", "__rg_alloc_zeroed", "__rg_realloc",
    }
)

# Rust and C++ library paths, matched as whole leading path segments.
_LIBRARY_PATHS = ("alloc::", "<alloc::", "std::alloc::", "<std::alloc::", "core::alloc::",
                  "__gnu_cxx::new_allocator<", "std::allocator<", "std::__new_allocator<",
                  "std::allocator_traits<")


def is_runtime_module(path: str) -> bool:
    return bool(_RUNTIME_MODULE.match(os.path.basename(path)))


def is_allocator_symbol(function: str) -> bool:
    return function in _ALLOCATOR_FUNCTIONS or function.startswith(_LIBRARY_PATHS)


# Standard-library code inlined into the user's functions: `std::string s(...)` inside
# churn_strings() allocates through basic_string's inlined constructor, and the site is
# churn_strings. Matched by the function's leading namespace or the source being one of
# the compiler's C++ headers (GCC: .../include/c++/12/bits/basic_string.h; Clang's libc++:
# .../include/c++/v1/...), or Rust's own library sources.
_STD_NAMESPACES = ("std::", "__gnu_cxx::", "__cxxabiv1::", "alloc::", "core::", "<std::",
                   "<alloc::", "<core::", "<__gnu_cxx::")
_STD_SOURCES = re.compile(r"/include/c\+\+/|/rustc/[0-9a-f]+/library/|/lib/rustlib/src/")


def is_library_location(location: _Named) -> bool:
    """An allocator entry point, or standard-library code (often inlined) around it."""
    if is_allocator_symbol(location.function) or location.function.startswith(_STD_NAMESPACES):
        return True
    return bool(_STD_SOURCES.search(getattr(location, "file", "") or ""))


class _Named(Protocol):
    @property
    def function(self) -> str: ...


# A Python frame spliced into a stack has a pseudo-address with this prefix (no user
# address has it) and 48 bits of a hash of its function and line (collector/frames.py).
PYTHON_ADDRESS_BASE = 0xFFFE << 48


def is_python_address(address: int) -> bool:
    return address >> 48 == PYTHON_ADDRESS_BASE >> 48


# CPython's own module: the executable (python3, python3.12) or libpython3.X.so
INTERPRETER_MODULE = re.compile(r"^(lib)?python3(\.\d+)?[dmu]*(\.so(\.[\d.]+)?)?$")


def is_interpreter_module(path: str) -> bool:
    return bool(INTERPRETER_MODULE.match(os.path.basename(path)))


def call_site_position(
    frames: Sequence[tuple[str, Sequence[_Named]]], addresses: Sequence[int] = ()
) -> tuple[int, int] | None:
    """(frame index, inline index) of the first user location of a stack given leaf first as
    (module path, inline chain innermost first); the outermost runtime location if all are.
    With the frames' `addresses`, an allocation made by Python code is charged to the
    innermost Python frame (as memray does), whatever interpreter or extension C code lies
    between it and malloc: the recorder's per-site rows use the same rule."""
    python = next((i for i, address in enumerate(addresses) if is_python_address(address)),
                  None)
    if python is not None:
        return (python, 0)
    last: tuple[int, int] | None = None
    for frame_index, (module_path, chain) in enumerate(frames):
        if module_path and is_runtime_module(module_path):
            continue
        for inline_index, location in enumerate(chain):
            last = (frame_index, inline_index)
            if not is_library_location(location):
                return last
    return last


def call_site(frames: Sequence[tuple[str, Sequence[LocationKey]]]) -> LocationKey | None:
    """The first user location of a stack given leaf first as (module path, inline chain)."""
    position = call_site_position(frames)
    if position is None:
        return None
    return frames[position[0]][1][position[1]]
