"""rsprof's heap shim is in no stored stack (collector/shimframes.py, issue 20): the rule on
synthetic stacks, then real programs under `rsprof run` against the same under `rsprof -p`."""

from __future__ import annotations

from rsprof.collector.recorder import RecordResult
from rsprof.collector.shimframes import (
    HEAP_TRACKING_ADDRESS,
    HEAP_TRACKING_FUNCTION,
    ShimFrame,
    ShimFrames,
    is_shim_module,
    shim_exports,
    shim_plan,
)
from rsprof.storage.intern import LocationKey

from rsprof.session import SHIM_PATH, heap_tracking_note

MALLOC = ShimFrame("malloc")
FREE = ShimFrame("free")
DLCLOSE = ShimFrame("dlclose")
INTERNAL = ShimFrame(None)  # record_alloc, capture, reserve, thread_trampoline, ...
USER = None  # a frame of any other module


def kept(plan: list[tuple[str, int | str]] | None) -> list[object]:
    assert plan is not None
    return [value if kind != "tracking" else HEAP_TRACKING_FUNCTION for kind, value in plan]


# -- the rule, on synthetic stacks (leaf first) ---------------------------------------------


def test_a_stack_without_shim_frames_is_left_alone() -> None:
    assert shim_plan([USER, USER, USER]) is None
    assert shim_plan([]) is None


def test_the_real_allocator_called_by_the_wrapper_keeps_its_time() -> None:
    # _int_malloc <- libc malloc <- shim malloc <- churn <- main: as without the shim
    assert kept(shim_plan([USER, USER, MALLOC, USER, USER])) == [0, 1, 3, 4]


def test_the_shims_own_work_is_one_frame_under_the_public_entry() -> None:
    # reserve <- record_alloc <- malloc (on_alloc inlined) <- churn <- worker
    plan = shim_plan([INTERNAL, INTERNAL, MALLOC, USER, USER])
    assert kept(plan) == [HEAP_TRACKING_FUNCTION, "malloc", 3, 4]


def test_a_sample_in_the_wrapper_itself_is_heap_tracking() -> None:
    assert kept(shim_plan([FREE, USER])) == [HEAP_TRACKING_FUNCTION, "free", 1]


def test_what_the_shims_internals_call_is_heap_tracking() -> None:
    # [kernel] <- fallocate (libc) <- ring_grow <- record_alloc <- malloc <- churn
    plan = shim_plan([USER, USER, INTERNAL, INTERNAL, MALLOC, USER])
    assert kept(plan) == [HEAP_TRACKING_FUNCTION, "malloc", 5]


def test_the_thread_trampoline_is_dropped() -> None:
    # churn <- worker <- thread_trampoline <- start_thread <- clone3
    assert kept(shim_plan([USER, USER, INTERNAL, USER, USER])) == [0, 1, 3, 4]
    # the heap stack of the same thread: worker <- thread_trampoline <- start_thread
    assert kept(shim_plan([USER, INTERNAL, USER])) == [0, 2]


def test_a_sample_in_the_trampolines_own_code_is_heap_tracking() -> None:
    assert kept(shim_plan([INTERNAL, USER, USER])) == [HEAP_TRACKING_FUNCTION, 1, 2]


def test_shim_calls_nested_under_a_real_call_are_each_rewritten() -> None:
    # record_alloc <- malloc <- destructor <- _dl_close <- libc dlclose <- shim dlclose <- main
    plan = shim_plan([INTERNAL, MALLOC, USER, USER, USER, DLCLOSE, USER])
    assert kept(plan) == [HEAP_TRACKING_FUNCTION, "malloc", 2, 3, 4, 6]
    # the thread trampoline under a thread's allocation: both rules at once
    plan = shim_plan([INTERNAL, MALLOC, USER, INTERNAL, USER])
    assert kept(plan) == [HEAP_TRACKING_FUNCTION, "malloc", 2, 4]


def test_a_walk_that_ends_inside_the_shim_names_no_internal_function() -> None:
    # reserve <- record_alloc <- [truncated]: no public entry is known
    assert kept(shim_plan([INTERNAL, INTERNAL, USER])) == [HEAP_TRACKING_FUNCTION, 2]
    assert kept(shim_plan([INTERNAL, INTERNAL])) == [HEAP_TRACKING_FUNCTION]


# -- the shim's module and its exports --------------------------------------------------------


def test_the_shim_module_is_recognised_by_name() -> None:
    assert is_shim_module(str(SHIM_PATH))
    assert is_shim_module("/x/rsprof/lib/librsprof_heap.so")
    assert not is_shim_module("/usr/lib/x86_64-linux-gnu/libc.so.6")
    assert not is_shim_module("/opt/librsprof_heapless/app")


def test_the_shims_exports_are_its_public_names() -> None:
    exports = shim_exports(str(SHIM_PATH))
    assert {"malloc", "free", "calloc", "realloc", "posix_memalign", "pthread_create"} <= exports
    assert not exports & {"thread_trampoline", "record_alloc", "capture", "reserve",
                          "on_alloc", "shimcfi_walk"}
    assert shim_exports("/nonexistent/librsprof_heap.so") == frozenset()


def test_resolved_frames_are_rewritten_to_stored_pseudo_frames() -> None:
    shim, libc, app = str(SHIM_PATH), "/usr/lib/x86_64-linux-gnu/libc.so.6", "/tmp/app"

    def loc(function: str) -> LocationKey:
        return LocationKey(function, "", 0, 1)

    frame_info = {
        10: (shim, (loc("reserve"), loc("record_alloc"))),   # inline chain, innermost first
        11: (shim, (loc("on_alloc"), loc("malloc"))),
        12: (app, (loc("churn"),)),
        13: (shim, (loc("thread_trampoline"),)),
        14: (libc, (loc("start_thread"),)),
        15: (libc, (loc("_int_malloc"),)),
    }
    named: list[tuple[int, str]] = []

    def named_frame(address: int, name: str) -> int:
        named.append((address, name))
        return 100 + len(named)

    frames = ShimFrames(frame_info, named_frame, lambda path: path)
    tracking = frames.rewrite((10, 11, 12, 13, 14))
    assert tracking[2:] == (12, 14)
    # [rsprof heap tracking] at its pseudo-address, then malloc at one of the entry prefix
    assert named[0] == (HEAP_TRACKING_ADDRESS, HEAP_TRACKING_FUNCTION)
    assert named[1][1] == "malloc" and named[1][0] >> 48 == 0xFFFD
    assert tracking[:2] == (101, 102)
    assert frames.tracking_frame == tracking[0]
    assert frames.rewrite((15, 11, 12, 13, 14)) == (15, 12, 14)
    assert frames.rewrite((12, 14)) == (12, 14)
    assert frames.rewrite((10, 11, 12)) == tracking[:3]  # pseudo-frames stored once
    assert len(named) == 2


def test_the_summary_says_the_share_and_how_to_lower_it() -> None:
    result = RecordResult("duration", 1, 1000, 0, 2, "full", heap_tracking_samples=50,
                          counted_samples=1000)
    assert "heap tracking took 5.0% of CPU samples" in heap_tracking_note(result)
    assert "--heap-sample" not in heap_tracking_note(result)
    result.heap_tracking_samples = 300
    note = heap_tracking_note(result)
    assert "heap tracking took 30.0% of CPU samples" in note
    assert "--heap-sample BYTES" in note and "--no-heap" in note


# -- real programs ------------------------------------------------------------------------------










