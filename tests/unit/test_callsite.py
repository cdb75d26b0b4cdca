"""Call-site rules: runtime frames are skipped by module and exact symbol, never substring."""

from __future__ import annotations

from rsprof.storage.callsite import call_site, is_allocator_symbol, is_runtime_module
from rsprof.storage.writer import LocationKey


def _loc(function: str) -> LocationKey:
    return LocationKey(function, "x.c", 1, 1)


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
        ("/opt/rsprof/lib/librsprof_heap.so", (_loc("malloc"),)),
        ("/usr/lib/libstdc++.so.6", (_loc("operator new(unsigned long)"),)),
        # user code with an inlined std::allocator frame innermost
        ("/usr/bin/app", (_loc("std::allocator<int>::allocate(unsigned long, void const*)"),
                          _loc("free_list"))),
        ("/usr/bin/app", (_loc("main"),)),
    ]
    site = call_site(stack)
    assert site is not None and site.function == "free_list"


def test_stack_with_only_runtime_frames_falls_back() -> None:
    assert call_site([("/usr/lib/x86_64-linux-gnu/libc.so.6", (_loc("malloc"),))]) is None


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


