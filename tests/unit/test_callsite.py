"""rsprof.storage.callsite: which frame of an allocating stack is the heap call site, as
tables. The first cases are at the end; the tables add the module rule's edges, the
Python rule (call_site_position with addresses) and the fallbacks."""

from __future__ import annotations

import pytest
from rsprof.storage.callsite import (
    PYTHON_ADDRESS_BASE,
    call_site,
    call_site_position,
    is_allocator_symbol,
    is_library_location,
    is_python_address,
    is_runtime_module,
)
from rsprof.storage.intern import LocationKey

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
SHIM = "/opt/rsprof/lib/librsprof_heap.so"
APP = "/usr/bin/app"


def loc(function: str, file: str = "app.c") -> LocationKey:
    return LocationKey(function, file, 1, 1)


@pytest.mark.parametrize(("path", "runtime"), [
    ("libc.so.6", True),
    ("/lib/x86_64-linux-gnu/libc-2.31.so", True),
    ("/lib/libc.musl-x86_64.so.1", True),
    ("/lib/ld-musl-x86_64.so.1", True),
    ("/usr/lib/libstdc++.so.6.0.30", True),
    ("/usr/lib/libgcc_s.so.1", True),
    ("/usr/lib/libm.so.6", True),
    ("/usr/lib/libjemalloc.so.2", True),
    ("/usr/lib/libtcmalloc_minimal.so.4", True),
    ("/usr/lib/libmimalloc.so.2", True),
    ("/usr/lib/libpthread.so.0", True),
    ("/usr/lib/libdl.so.2", True),
    ("/lib64/ld-linux-x86-64.so.2", True),
    (SHIM, True),
    ("/usr/lib/libcurl.so.4", False),
    ("/usr/lib/libmalloc_arena.so", False),
    ("/srv/libc_helpers.so", False),
    ("/srv/libcrypto.so.3", False),
    ("/srv/libc.so.6.bak", False),
    ("/srv/libc.so/app", False),  # a folder named like libc: the basename decides
    ("", False),
    ("[vdso]", False),
])
def test_runtime_modules(path: str, runtime: bool) -> None:
    assert is_runtime_module(path) is runtime


@pytest.mark.parametrize(("function", "allocator"), [
    ("calloc", True), ("realloc", True), ("reallocarray", True), ("posix_memalign", True),
    ("aligned_alloc", True), ("strdup", True), ("strndup", True), ("__libc_malloc", True),
    ("operator new[](unsigned long)", True),
    ("operator new(unsigned long, std::align_val_t)", True),
    ("__rust_alloc_zeroed", True), ("__rdl_alloc", True), ("__rg_realloc", True),
    ("std::__new_allocator<char>::allocate(unsigned long, void const*)", True),
    ("std::allocator_traits<std::allocator<int> >::allocate", True),
    ("core::alloc::layout::Layout::array", True),
    ("<std::alloc::System as core::alloc::global::GlobalAlloc>::alloc", True),
    ("mallocx", False),  # jemalloc's own API is the program's call, said in meta instead
    ("Malloc", False), ("my::alloc::thing", False), ("xmalloc", False), ("strdup_safe", False),
    ("operator new", False), ("", False),
])
def test_allocator_symbols_are_exact(function: str, allocator: bool) -> None:
    assert is_allocator_symbol(function) is allocator


@pytest.mark.parametrize(("location", "library"), [
    (loc("std::vector<int>::_M_realloc_insert"), True),
    (loc("__gnu_cxx::__verbose_terminate_handler"), True),
    (loc("<core::fmt::Arguments as core::fmt::Display>::fmt"), True),
    (loc("helper", "/usr/include/c++/12/bits/stl_vector.h"), True),
    (loc("helper", "/usr/lib/llvm-15/include/c++/v1/vector"), True),
    (loc("helper", "/rustc/90c541806f23a127002de5b4038be731ba1458ca/library/alloc/src/vec.rs"),
     True),
    (loc("helper", "/home/u/.rustup/toolchains/x/lib/rustlib/src/rust/library/core/x.rs"), True),
    (loc("helper", "/usr/include/stdio.h"), False),
    (loc("standard_deviation"), False),  # not std::
    (loc("stdx::make"), False),
    (loc("main"), False),
])
def test_library_locations(location: LocationKey, library: bool) -> None:
    assert is_library_location(location) is library


Stack = list[tuple[str, tuple[LocationKey, ...]]]
PY = PYTHON_ADDRESS_BASE | 0x1234


@pytest.mark.parametrize(("stack", "addresses", "position"), [
    pytest.param([(SHIM, (loc("malloc"),)), (APP, (loc("work"),))], [], (1, 0),
                 id="shim-skipped"),
    pytest.param([(LIBC, (loc("strdup"),)), (LIBC, (loc("helper_in_libc"),)),
                  (APP, (loc("work"),))], [], (2, 0),
                 id="runtime-module-skipped-whatever-the-name"),
    pytest.param([(APP, (loc("malloc"),)), (APP, (loc("work"),))], [], (1, 0),
                 id="static-malloc-skipped-by-name"),
    pytest.param([(APP, (loc("std::allocator<int>::allocate"), loc("work"))),
                  (APP, (loc("main"),))], [], (0, 1), id="inlined-library-skipped"),
    pytest.param([(APP, (loc("malloc"),)), (APP, (loc("std::make_unique"),))], [], (1, 0),
                 id="only-library-locations-the-outermost"),
    pytest.param([(LIBC, (loc("malloc"),))], [], None, id="only-runtime-frames"),
    pytest.param([], [], None, id="empty"),
    pytest.param([("", (loc("0x1234"),)), (APP, (loc("work"),))], [], (0, 0),
                 id="unmapped-frame-is-not-runtime"),
    pytest.param([(LIBC, (loc("malloc"),)), (APP, (loc("PyMem_Malloc"),)),
                  ("/s.py", (loc("leak", "/s.py"),)), ("/s.py", (loc("main", "/s.py"),))],
                 [0x7F00, 0x401000, PY, PY + 1], (2, 0), id="innermost-python-frame"),
    pytest.param([(APP, (loc("work"),)), ("/s.py", (loc("leak", "/s.py"),))],
                 [0x401000, PY], (1, 0), id="python-wins-over-native-user-code"),
    pytest.param([(LIBC, (loc("malloc"),)), (APP, (loc("work"),))], [0x7F00, 0x401000],
                 (1, 0), id="addresses-without-python"),
])
def test_call_site_position(stack: Stack, addresses: list[int],
                            position: tuple[int, int] | None) -> None:
    assert call_site_position(stack, addresses) == position
    if not addresses:
        site = call_site(stack)
        assert site == (None if position is None else stack[position[0]][1][position[1]])


@pytest.mark.parametrize(("address", "python"), [
    (PYTHON_ADDRESS_BASE, True), (PYTHON_ADDRESS_BASE | (1 << 48) - 1, True),
    (PYTHON_ADDRESS_BASE - 1, False), ((PYTHON_ADDRESS_BASE >> 48) + 1 << 48, False),
    (0x401000, False), (0, False), ((1 << 64) - 16, False),
])
def test_python_addresses(address: int, python: bool) -> None:
    assert is_python_address(address) is python



def test_user_functions_that_merely_contain_allocator_words_are_kept() -> None:
    for name in ("free_list", "malloc_stats_report", "my_realloc_buffer", "alloc_node",
                 "allocator::Pool::grow", "std_alloc_wrapper"):
        assert not is_allocator_symbol(name), name
    for name in ("malloc", "free", "operator new(unsigned long)", "__rust_alloc",
                 "alloc::raw_vec::RawVec<T,A>::grow_one", "<alloc::vec::Vec<T> as Clone>::clone",
                 "std::allocator<int>::allocate(unsigned long, void const*)"):
        assert is_allocator_symbol(name), name


def test_runtime_modules_by_basename() -> None:
    for path in ("/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/libstdc++.so.6.0.30",
                 "/opt/rsprof/lib/librsprof_heap.so", "/lib64/ld-linux-x86-64.so.2"):
        assert is_runtime_module(path), path
    for path in ("/usr/bin/app", "/usr/lib/libcurl.so.4", "/srv/libcache.so", "/app/libc_utils.so"):
        assert not is_runtime_module(path), path


def test_first_user_frame_wins_inline_chains_expanded() -> None:
    stack = [
        ("/opt/rsprof/lib/librsprof_heap.so", (loc("malloc"),)),
        ("/usr/lib/libstdc++.so.6", (loc("operator new(unsigned long)"),)),
        # user code with an inlined std::allocator frame innermost
        ("/usr/bin/app", (loc("std::allocator<int>::allocate(unsigned long, void const*)"),
                          loc("free_list"))),
        ("/usr/bin/app", (loc("main"),)),
    ]
    site = call_site(stack)
    assert site is not None and site.function == "free_list"


def test_stack_with_only_runtime_frames_falls_back() -> None:
    assert call_site([("/usr/lib/x86_64-linux-gnu/libc.so.6", (loc("malloc"),))]) is None


def test_inlined_standard_library_code_is_not_the_call_site() -> None:
    string_ctor = LocationKey(
        "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >"
        "::_M_construct(unsigned long, char)",
        "/usr/include/c++/12/bits/basic_string.tcc", 229, 1)
    in_header = LocationKey("_M_create", "/usr/include/c++/12/bits/basic_string.tcc", 150, 1)
    rust_vec = LocationKey("<alloc::vec::Vec<T,A>>::push",
                           "/rustc/abc123/library/alloc/src/vec/mod.rs",
                           1800, 1)
    user = LocationKey("keep_strings", "/src/heap_stl.cc", 13, 1)
    frames = [("/usr/bin/app", (in_header, string_ctor, user))]
    assert call_site(frames) == user
    assert call_site([("/usr/bin/app", (rust_vec,)), ("/usr/bin/app", (user,))]) == user


