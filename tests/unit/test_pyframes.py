"""rsprof.collector.pyframes' pure rules: where a thread's Python frames go in its native
stack (splice_plan) and the stack words that carry them (encode_python / split_python).
tests/test_pyframes.py has the first cases of splice_plan; these are the rest of the table."""

from __future__ import annotations

import itertools

import pytest
from rsprof.collector.pyframes import (
    encode_python,
    splice_apply,
    splice_plan,
    splice_shape,
    split_python,
    split_words,
)

from rsprof._native import PY_FRAME_FUNCTION_BITS, PY_MARK, PY_MARK_SAMPLED

E, N = True, False  # an evaluator frame / another native frame; an entry frame / not
Plan = list[tuple[str, int]] | None


@pytest.mark.parametrize(("native", "python", "at_sample", "plan"), [
    pytest.param([], [], False, [], id="nothing"),
    pytest.param([N, N], [], True, [("native", 0), ("native", 1)], id="no-python-at-sample"),
    pytest.param([N, N], [True], False, None, id="python-frames-but-no-evaluator"),
    pytest.param([N, N], [True], True, None, id="python-frames-but-no-evaluator-at-sample"),
    pytest.param([E], [True], False, [("python", 0)], id="one-for-one"),
    pytest.param([E], [True], True, [("python", 0)], id="at-sample-pairs-when-they-pair"),
    pytest.param([E, E, E], [N, True, True, N, N, True], False,
                 [("python", 0), ("python", 1), ("python", 2), ("python", 3), ("python", 4),
                  ("python", 5)], id="three-groups-in-order"),
    pytest.param([N, E, N, E, N, E, N], [True, True, True], False,
                 [("native", 0), ("python", 0), ("native", 2), ("python", 1), ("native", 4),
                  ("python", 2), ("native", 6)], id="c-callbacks-between-evaluators"),
    pytest.param([E, E], [True, N], False, None, id="trailing-frames-after-the-last-entry"),
    pytest.param([E, E], [True, N], True, None, id="trailing-frames-at-sample"),
    pytest.param([E], [], True, [("native", 0)], id="at-sample-only-evaluator-between"),
    pytest.param([E], [], False, None, id="late-read-with-no-frames"),
    pytest.param([N, E, E, E], [True, N, True], True,
                 [("native", 0), ("native", 1), ("python", 0), ("python", 1), ("python", 2)],
                 id="at-sample-only-the-innermost-stays-native"),
    pytest.param([E, E, E], [True], True, None, id="at-sample-two-groups-short"),
    pytest.param([E, E], [True, True, True], True, None, id="more-groups-than-evaluators"),
])
def test_splice_plan(native: list[bool], python: list[bool], at_sample: bool,
                     plan: Plan) -> None:
    assert splice_plan(native, python, at_sample) == plan


def test_a_plan_uses_every_python_frame_once_in_order() -> None:
    """Whatever the shape, a plan that pairs keeps every non-evaluator native frame and
    every Python frame, each once, both in stack order."""
    for native in ([E, N, E, N], [N, E, E], [E]):
        evals = sum(native)
        for group_size in (1, 2, 3):
            python = ([N] * (group_size - 1) + [True]) * evals
            plan = splice_plan(native, python)
            assert plan is not None
            assert [i for kind, i in plan if kind == "python"] == list(range(len(python)))
            assert [i for kind, i in plan if kind == "native"] == [
                i for i, is_eval in enumerate(native) if not is_eval]


def test_splice_shape_is_splice_plan() -> None:
    """The recorder splices with splice_shape/splice_apply (slices, for speed); on every
    shape up to 5 native and 5 Python frames, read late or at the sample, they give what
    splice_plan's plan gives: the same stack, the same refusals, the same evaluator left
    native."""
    shapes = 0
    for n_native, n_python in itertools.product(range(6), range(6)):
        for native in itertools.product((N, E), repeat=n_native):
            for python in itertools.product((N, True), repeat=n_python):
                for at_sample in (False, True):
                    plan = splice_plan(native, python, at_sample)
                    shape = splice_shape(native, [int(entry) for entry in python], at_sample)
                    assert (plan is None) == (shape is None), (native, python, at_sample)
                    if plan is None or shape is None:
                        continue
                    shapes += 1
                    names = [f"n{i}" for i in range(n_native)]
                    frames = [f"p{j}" for j in range(n_python)]
                    assert splice_apply(names, frames, shape) == tuple(
                        names[i] if kind == "native" else frames[i] for kind, i in plan)
                    assert shape[2] == any(kind == "native" and native[i] for kind, i in plan)
    assert shapes > 100


MAX_FUNCTION = (1 << PY_FRAME_FUNCTION_BITS) - 1


@pytest.mark.parametrize("frames", [
    [],
    [(1, 1, False)],
    [(7, 42, True), (MAX_FUNCTION, -1, False)],
    [(3, 0, True), (4, -(1 << 31), False), (5, (1 << 31) - 1, True)],
    [(0, 12, True)],  # function id 0: a code object freed before it was read
])
@pytest.mark.parametrize("mark", [PY_MARK, PY_MARK_SAMPLED])
def test_python_words_round_trip(frames: list[tuple[int, int, bool]], mark: int) -> None:
    native = [0x401000, 0x7F0000402000]
    assert split_python([*native, mark, *encode_python(frames)]) == (native, frames)


def test_words_after_the_first_mark_are_python_frames() -> None:
    """A Python frame whose word equals a mark is still a frame: only the first mark
    splits (native addresses never have the top bits set)."""
    frames = [(MAX_FUNCTION, -16, True), (1, 2, False)]
    words = encode_python(frames)
    assert words[0] == PY_MARK
    assert split_python([0x1000, PY_MARK, *words]) == ([0x1000], frames)
    assert split_words((0x1000, PY_MARK, *words)) == ((0x1000,), tuple(words))


def test_native_only_stacks_are_returned_as_they_are() -> None:
    native = (0x1000, 0x2000)
    assert split_python(native) == (native, [])
    assert split_python(()) == ((), [])
