"""rsprof.storage.filters: pprof's --focus/--ignore/--show/--hide (and --hide-runtime) on
synthetic stacks, as one table: what each stack becomes, or that its sample is dropped."""

from __future__ import annotations

import pytest
from rsprof.storage.filters import FrameFilter
from rsprof.storage.samples import Frame, Sample

from unit.synthetic import LIBC, frame, line

MAIN = frame(line("main", "main.c", 5), address=0x1000, id=1)
PARSE = frame(line("parse", "src/parser.c", 40), address=0x1010, id=2)
MEMCPY = frame(line("memcpy", ""), module=LIBC, address=0x7F00, id=3)
HASH = frame(line("hash_round", "hash.h", 3), line("compute_hash", "hash.c", 9), address=0x1020,
             id=4)
SPIN = frame(line("spin", "worker.c", 1), address=0x1030, id=5)
WORKER = frame(line("worker", "worker.c", 9), address=0x1040, id=6)
START = frame(line("start_thread", ""), module=LIBC, address=0x7F10, id=7)

STACKS = {
    "parse": (PARSE, MAIN),
    "memcpy": (MEMCPY, PARSE, MAIN),
    "hash": (HASH, MAIN),
    "spin": (SPIN, WORKER, START),
}


def shown(frames: tuple[Frame, ...] | None) -> str | None:
    """A stack as 'leaf;caller', inline levels joined by '+' (innermost first)."""
    if frames is None:
        return None
    return ";".join("+".join(x.function for x in f.lines) for f in frames)


WHOLE = {name: shown(stack) for name, stack in STACKS.items()}


@pytest.mark.parametrize(("options", "expected"), [
    pytest.param({}, WHOLE, id="none"),
    pytest.param({"focus": "parse"}, {"parse": WHOLE["parse"], "memcpy": WHOLE["memcpy"]},
                 id="focus-function"),
    pytest.param({"focus": "ars"}, {"parse": WHOLE["parse"], "memcpy": WHOLE["memcpy"]},
                 id="focus-searches-anywhere"),
    pytest.param({"focus": "^arse"}, {}, id="focus-anchored"),
    pytest.param({"focus": r"parser\.c"}, {"parse": WHOLE["parse"], "memcpy": WHOLE["memcpy"]},
                 id="focus-source-file"),
    pytest.param({"focus": "libc"}, {"memcpy": WHOLE["memcpy"], "spin": WHOLE["spin"]},
                 id="focus-module"),
    pytest.param({"focus": "hash_round"}, {"hash": WHOLE["hash"]}, id="focus-inlined"),
    pytest.param({"focus": "^$"}, {}, id="empty-file-never-matches"),
    pytest.param({"ignore": "memcpy"}, {k: v for k, v in WHOLE.items() if k != "memcpy"},
                 id="ignore"),
    pytest.param({"focus": "main", "ignore": "memcpy"},
                 {"parse": WHOLE["parse"], "hash": WHOLE["hash"]}, id="ignore-wins-over-focus"),
    pytest.param({"focus": "parse", "ignore": "parse"}, {}, id="same-focus-and-ignore"),
    pytest.param({"hide": "memcpy"}, WHOLE | {"memcpy": "parse;main"}, id="hide-function"),
    pytest.param({"hide": "libc"}, WHOLE | {"memcpy": "parse;main", "spin": "spin;worker"},
                 id="hide-module"),
    pytest.param({"hide": "hash_round"}, WHOLE | {"hash": "compute_hash;main"},
                 id="hide-inlined-level"),
    pytest.param({"hide": "."}, {}, id="hide-everything-drops-samples"),
    pytest.param({"show": "main|parse"},
                 {"parse": "parse;main", "memcpy": "parse;main", "hash": "main"},
                 id="show"),
    pytest.param({"show": "libc"}, {"memcpy": "memcpy", "spin": "start_thread"},
                 id="show-module-keeps-whole-frames"),
    pytest.param({"show": "compute"}, {"hash": "compute_hash"}, id="show-inlined-level"),
    pytest.param({"show": ".", "hide": "main"},
                 {"parse": "parse", "memcpy": "memcpy;parse", "hash": "hash_round+compute_hash",
                  "spin": WHOLE["spin"]}, id="show-and-hide"),
    pytest.param({"focus": "memcpy", "hide": "memcpy"}, {"memcpy": "parse;main"},
                 id="focus-before-hide"),
    pytest.param({"hide_runtime": True}, WHOLE | {"spin": "spin;worker"},
                 id="hide-runtime-folds-start-up"),
    pytest.param({"show": "start_thread", "hide_runtime": True}, {"spin": "start_thread"},
                 id="hide-runtime-keeps-a-lone-leaf"),
])
def test_filters(options: dict[str, str | bool], expected: dict[str, str]) -> None:
    filters = FrameFilter.compile(**options)  # type: ignore[arg-type]
    got = {name: shown(filters.stack(stack)) for name, stack in STACKS.items()}
    assert {name: s for name, s in got.items() if s is not None} == expected
    # apply() keeps the same samples, in order, with their values and threads
    samples = [Sample(stack, [i, 10 * i], tid=i) for i, stack in enumerate(STACKS.values())]
    kept = filters.apply(samples)
    assert [shown(s.frames) for s in kept] == [v for v in got.values() if v is not None]
    assert all(s.values == [s.tid, 10 * (s.tid or 0)] for s in kept)


def test_unchanged_stacks_and_samples_are_the_same_objects() -> None:
    stack = STACKS["parse"]
    sample = Sample(stack, [1])
    for filters in (FrameFilter(), FrameFilter.compile(focus="parse"),
                    FrameFilter.compile(hide="nothing-matches")):
        assert filters.stack(stack) is stack
        assert filters.apply([sample])[0] is sample


def test_caches_are_per_frame_and_agree_with_fresh_ones() -> None:
    filters = FrameFilter.compile(focus="main", hide="parse")
    verdicts: dict[int, bool | None] = {}
    rewritten: dict[int, Frame | None] = {}
    for _ in range(2):
        for stack in STACKS.values():
            assert filters.stack(stack, verdicts, rewritten) == filters.stack(stack)
    assert set(verdicts) <= {id(f) for s in STACKS.values() for f in s}


@pytest.mark.parametrize(("option", "regex"), [
    ("focus", "("), ("ignore", "[a-"), ("show", "*x"), ("hide", "a{2,1}"),
])
def test_a_bad_regex_names_its_option(option: str, regex: str) -> None:
    with pytest.raises(ValueError, match=f"--{option} '.*' is not a valid regex"):
        FrameFilter.compile(**{option: regex})  # type: ignore[arg-type]


@pytest.mark.parametrize(("options", "active", "described"), [
    ({}, False, ""),
    ({"focus": ""}, False, ""),  # an empty option is no filter
    ({"focus": "a"}, True, "focus=a"),
    ({"hide": "b", "focus": "a"}, True, "focus=a; hide=b"),
    ({"ignore": "i", "show": "s"}, True, "ignore=i; show=s"),
    ({"hide_runtime": True}, True, "hide-runtime"),
    ({"show": "x|y", "hide_runtime": True}, True, "show=x|y; hide-runtime"),
])
def test_active_and_describe(options: dict[str, str | bool], active: bool,
                             described: str) -> None:
    filters = FrameFilter.compile(**options)  # type: ignore[arg-type]
    assert filters.active is active
    assert filters.describe() == described
    assert filters == FrameFilter.compile(**options)  # type: ignore[arg-type]
