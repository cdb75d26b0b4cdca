"""rsprof.collector.frames: how raw addresses become stored stacks, on a made-up address
space (FakeSymbolizer): which frames are justified (a caller outside every mapping is
truncation, not a function), where each address is looked up (a leaf at itself, a caller
at its call), and where Python frames are spliced in place of the evaluator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rsprof.collector.frames import (
    KERNEL_FUNCTION,
    PYTHON_FREED_FUNCTION,
    TRUNCATED_FUNCTION,
    FrameResolver,
    python_address,
)
from rsprof.collector.maps import Mapping
from rsprof.collector.pyframes import encode_python
from rsprof.storage.callsite import is_python_address
from rsprof.storage.writer import ProfileWriter

from rsprof._native import KERNEL_ADDRESS, PY_MARK, PY_MARK_SAMPLED, TRUNCATED_ADDRESS
from unit.synthetic import FakeModule, FakeSymbolizer

BASE = 0x400000  # /bin/app is mapped at [BASE, END) from file offset 0: vaddr = address - BASE
END = 0x410000
LIB = 0x7F0000000000  # /lib/libnone.so: mapped, but its file cannot be read
CODE = bytearray(0x10000)
CODE[0x1003:0x1005] = b"\x0f\x05"  # a syscall instruction ending at vaddr 0x1005
CODE[0x6003:0x6005] = b"\xcd\x80"  # int 0x80 ending at 0x6005

# vaddr ranges of /bin/app's functions (inline chains innermost first)
FUNCTIONS = [
    (0x1000, 0x1010, [("leaf", "app.c", 10)]),
    (0x1010, 0x1020, [("other_leaf", "app.c", 11)]),
    (0x2000, 0x2100, [("caller", "app.c", 20)]),
    (0x3000, 0x3100, [("main", "app.c", 30)]),
    (0x4000, 0x4100, [("_PyEval_EvalFrameDefault", "ceval.c", 1)]),
    (0x5000, 0x5100, [("pymain_init", "main.c", 1)]),
    (0x6000, 0x6100, [("inlined", "app.h", 3), ("outer", "app.c", 60)]),
]


class FakePython:
    """The part of a PyFrameReader the resolver uses: function ids to names."""

    def functions(self, start: int) -> list[tuple[int, str, str, int]]:
        table = [(1, "heavy", "/s.py", 3), (2, "main", "/s.py", 10), (3, "<module>", "/s.py", 1)]
        return [row for row in table if row[0] >= start]


@pytest.fixture
def resolver(tmp_path: Path) -> FrameResolver:
    module = FakeModule(FUNCTIONS, code=bytes(CODE))
    found = FrameResolver(0, ProfileWriter(tmp_path / "p.db"), FakeSymbolizer({"/bin/app": module}))  # type: ignore[arg-type]
    found.add_mapping(Mapping(BASE, END, 0, "/bin/app"))
    found.add_mapping(Mapping(LIB, LIB + 0x1000, 0x2000, "/lib/libnone.so"))
    return found


def names(resolver: FrameResolver, ips: list[int], **options: Any) -> list[str]:
    """The stored stack of `ips` as function names, leaf first, inline levels their own."""
    stored = resolver.resolve_stacks([(1, ips)], **options)[1]
    return [location.function for frame in resolver.ids.stack_frames[stored]
            for location in resolver.frame_info[frame][1]]


def lookups(resolver: FrameResolver) -> list[int]:
    module = resolver._modules["/bin/app"]
    assert isinstance(module, FakeModule)
    return module.lookups


@pytest.mark.parametrize(("ips", "expected"), [
    pytest.param([BASE + 0x1005, BASE + 0x2005, BASE + 0x3005], ["leaf", "caller", "main"],
                 id="all-mapped"),
    pytest.param([BASE + 0x1005, 0x9999, BASE + 0x2005, BASE + 0x3005],
                 ["leaf", TRUNCATED_FUNCTION], id="unmapped-caller-cuts-the-rest"),
    pytest.param([BASE + 0x1005, BASE + 0x2005, END], ["leaf", "caller", TRUNCATED_FUNCTION],
                 id="mapping-end-is-outside"),
    pytest.param([BASE + 0x1005, BASE + 0x2005, BASE - 1], ["leaf", "caller", TRUNCATED_FUNCTION],
                 id="below-the-mapping"),
    pytest.param([BASE + 0x1005, BASE + 0x2005, TRUNCATED_ADDRESS],
                 ["leaf", "caller", TRUNCATED_FUNCTION], id="walk-stopped-in-C"),
    pytest.param([0x9999, BASE + 0x2005], ["0x9999", "caller"], id="unmapped-leaf-is-kept"),
    pytest.param([KERNEL_ADDRESS, BASE + 0x1005, BASE + 0x2005],
                 [KERNEL_FUNCTION, "leaf", "caller"], id="kernel-leaf"),
    pytest.param([BASE + 0x1005, LIB + 0x10], ["leaf", "libnone.so+0x2010"],
                 id="unreadable-module-named-by-file-offset"),
    pytest.param([BASE + 0x6005, BASE + 0x3005], ["inlined", "outer", "main"],
                 id="inline-chain"),
    pytest.param([BASE + 0x1005, 1 << 63, BASE + 0x3005], ["leaf", TRUNCATED_FUNCTION],
                 id="kernel-half-caller"),
])
def test_a_stack_ends_at_its_first_unjustified_caller(resolver: FrameResolver, ips: list[int],
                                                       expected: list[str]) -> None:
    assert names(resolver, ips) == expected


def test_truncation_is_one_shared_root_frame(resolver: FrameResolver) -> None:
    one = resolver.resolve_stacks([(1, [BASE + 0x1005, 0x9999])])[1]
    two = resolver.resolve_stacks([(2, [BASE + 0x1015, 0xDEAD0000, BASE + 0x2005])])[2]
    assert resolver.ids.stack_frames[one][-1] == resolver.ids.stack_frames[two][-1]
    # no junk frame is ever made for the garbage addresses
    functions = {loc.function for _path, chain in resolver.frame_info.values() for loc in chain}
    assert not {"0x9999", "0xdead0000"} & functions


@pytest.mark.parametrize(("ips", "options", "looked_up"), [
    pytest.param([BASE + 0x1005, BASE + 0x2005], {}, [0x1005, 0x2004], id="leaf-at-itself"),
    pytest.param([BASE + 0x1005, BASE + 0x2005], {"leaf_is_return": True}, [0x1004, 0x2004],
                 id="heap-leaf-is-a-return-address"),
    pytest.param([KERNEL_ADDRESS, BASE + 0x1005], {}, [0x1004], id="after-syscall"),
    pytest.param([KERNEL_ADDRESS, BASE + 0x6005], {}, [0x6004], id="after-int-0x80"),
    pytest.param([KERNEL_ADDRESS, BASE + 0x2005], {}, [0x2005], id="fault-is-the-instruction"),
])
def test_where_each_address_is_looked_up(resolver: FrameResolver, ips: list[int],
                                         options: dict[str, bool], looked_up: list[int]) -> None:
    resolver.resolve_stacks([(1, ips)], **options)
    assert sorted(lookups(resolver)) == sorted(looked_up)


def test_one_address_as_leaf_and_caller_is_two_frames(resolver: FrameResolver) -> None:
    """0x1010 is other_leaf's first byte: as a leaf it is other_leaf, as a return address
    the call was at 0x100f, in leaf."""
    stored = resolver.resolve_stacks([(1, [BASE + 0x1010, BASE + 0x2005]),
                                      (2, [BASE + 0x1005, BASE + 0x1010])])
    as_leaf = resolver.ids.stack_frames[stored[1]][0]
    as_caller = resolver.ids.stack_frames[stored[2]][1]
    assert as_leaf != as_caller
    assert resolver.frame_info[as_leaf][1][0].function == "other_leaf"
    assert resolver.frame_info[as_caller][1][0].function == "leaf"


def test_each_distinct_address_is_symbolized_once(resolver: FrameResolver) -> None:
    stacks = [(i, [BASE + 0x1005, BASE + 0x2005, BASE + 0x3005]) for i in range(50)]
    stored = resolver.resolve_stacks(stacks)
    assert len(set(stored.values())) == 1
    assert len(lookups(resolver)) == 3
    resolver.resolve_stacks([(99, [BASE + 0x1005, BASE + 0x2005])])
    assert len(lookups(resolver)) == 3


EVAL, MAIN, STARTUP, LEAF = BASE + 0x4005, BASE + 0x3005, BASE + 0x5005, BASE + 0x1005
HEAVY, PYMAIN, MODULE = (1, 4, False), (2, 12, False), (3, 20, True)


@pytest.mark.parametrize(("ips", "options", "expected", "counter"), [
    pytest.param([LEAF, EVAL, MAIN, PY_MARK, *encode_python([HEAVY, PYMAIN, MODULE])], {},
                 ["leaf", "heavy", "main", "<module>", "main"], "python_spliced",
                 id="one-evaluator-three-python-frames"),
    pytest.param([LEAF, EVAL, MAIN, PY_MARK, *encode_python([HEAVY, (2, 12, False)])], {},
                 ["leaf", "_PyEval_EvalFrameDefault", "main"], "python_unpaired",
                 id="no-entry-frame-keeps-native"),
    pytest.param([LEAF, EVAL, EVAL, MAIN, PY_MARK, *encode_python([MODULE])], {},
                 ["leaf", "_PyEval_EvalFrameDefault", "_PyEval_EvalFrameDefault", "main"],
                 "python_unpaired", id="fewer-groups-read-late-keeps-native"),
    pytest.param([LEAF, EVAL, EVAL, MAIN, PY_MARK_SAMPLED, *encode_python([MODULE])], {},
                 ["leaf", "_PyEval_EvalFrameDefault", "<module>", "main"], "python_between",
                 id="at-sample-innermost-between-frames"),
    pytest.param([LEAF, EVAL, STARTUP, PY_MARK, *encode_python([MODULE])], {},
                 ["leaf", "_PyEval_EvalFrameDefault", "pymain_init"], "python_unpaired",
                 id="start-up-read-late-keeps-native"),
    pytest.param([LEAF, EVAL, STARTUP, PY_MARK_SAMPLED, *encode_python([MODULE])], {},
                 ["leaf", "<module>", "pymain_init"], "python_spliced",
                 id="start-up-read-at-sample-is-spliced"),
    pytest.param([LEAF, EVAL, STARTUP, PY_MARK, *encode_python([MODULE])],
                 {"python_read_late": False}, ["leaf", "<module>", "pymain_init"],
                 "python_spliced", id="start-up-heap-stack-is-spliced"),
    pytest.param([LEAF, EVAL, MAIN, PY_MARK, *encode_python([(0, 7, True)])], {},
                 ["leaf", PYTHON_FREED_FUNCTION, "main"], "python_spliced",
                 id="freed-code-object"),
    pytest.param([LEAF, EVAL, MAIN, PY_MARK, *encode_python([(42, 7, True)])], {},
                 ["leaf", "[python 42]", "main"], "python_spliced", id="unknown-function-id"),
])
def test_python_frames_replace_the_evaluator(resolver: FrameResolver, ips: list[int],
                                             options: dict[str, bool], expected: list[str],
                                             counter: str) -> None:
    resolver.python = FakePython()  # type: ignore[assignment]
    assert names(resolver, ips, **options) == expected
    assert getattr(resolver, counter) == 1


def test_without_a_frame_reader_stacks_stay_native(resolver: FrameResolver) -> None:
    ips = [LEAF, EVAL, MAIN, PY_MARK, *encode_python([MODULE])]
    assert names(resolver, ips) == ["leaf", "_PyEval_EvalFrameDefault", "main"]
    assert resolver.python_unpaired == 1


def test_python_frames_are_one_frame_per_line_at_a_python_address(
        resolver: FrameResolver) -> None:
    resolver.python = FakePython()  # type: ignore[assignment]
    stored = resolver.resolve_stacks([
        (1, [EVAL, PY_MARK, *encode_python([(1, 4, False), MODULE])]),
        (2, [LEAF, EVAL, PY_MARK, *encode_python([(1, 4, False), (3, 21, True)])]),
    ])
    first, second = (resolver.ids.stack_frames[stored[i]] for i in (1, 2))
    assert first[0] == second[1]  # heavy:4 is one frame wherever it is
    assert first[1] != second[2]  # <module>:20 and <module>:21 are two
    assert all(resolver.is_python_frame(f) for f in (*first, second[1], second[2]))
    assert not resolver.is_python_frame(second[0])
    path, (location,) = resolver.frame_info[first[0]]
    assert (path, location.function, location.file, location.line) == ("/s.py", "heavy",
                                                                      "/s.py", 4)


@pytest.mark.parametrize(("a", "b", "same"), [
    (("f", 1, 2), ("f", 1, 2), True),
    (("f", 1, 2), ("f", 1, 3), False),
    (("f", 1, 2), ("g", 1, 2), False),
    (("f", 1, 2), ("f", 9, 2), False),
])
def test_python_address(a: tuple[str, int, int], b: tuple[str, int, int], same: bool) -> None:
    assert is_python_address(python_address(*a))
    assert (python_address(*a) == python_address(*b)) is same


def test_a_forked_image_keeps_the_parents_mappings_an_exec_does_not(
        resolver: FrameResolver) -> None:
    child = resolver.for_new_image(0, forked=True)
    assert names(child, [LEAF, BASE + 0x2005]) == ["leaf", "caller"]
    execed = resolver.for_new_image(0, forked=False)
    assert names(execed, [LEAF, BASE + 0x2005]) == [f"0x{LEAF:x}", TRUNCATED_FUNCTION]
