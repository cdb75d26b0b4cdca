"""rsprof.storage.diff: per-function changes between two synthetic profiles: CPU in shares
(runs of different length compare), heap in bytes, matched by name, new/gone marked,
biggest change first."""

from __future__ import annotations

from pathlib import Path

import pytest
from rsprof.storage.diff import cpu_diff, heap_diff
from rsprof.storage.filters import FrameFilter
from rsprof.storage.reader import Profile
from rsprof.storage.selection import SampleQuery

from unit.synthetic import LIBC, Synth


def _profile(path: Path, cpu: dict[str, int], heap: dict[str, tuple[int, int, int, int]],
             checkpoints: int) -> Path:
    synth = Synth(path)
    stacks = {name: synth.stack(name, "main") for name in {*cpu, *heap}}
    stacks["copy"] = synth.stack(("copy", "", 0, LIBC), "main")
    for _ in range(checkpoints):  # the same shares whatever the length
        synth.checkpoint({(stacks[name], 1): count for name, count in cpu.items()},
                         {stacks[name]: values for name, values in heap.items()})
    return synth.finish()


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("diff")
    old = _profile(folder / "old.db", {"work": 30, "parse": 10, "gone_fn": 10},
                   {"leak": (1000, 10, 400, 4), "churn": (500, 5, 500, 5),
                    "gone_site": (64, 1, 0, 0)}, 1)
    new = _profile(folder / "new.db", {"work": 10, "parse": 30, "new_fn": 10},
                   {"leak": (1000, 10, 0, 0), "churn": (500, 5, 500, 5),
                    "new_site": (32, 1, 0, 0)}, 3)
    return old, new


def test_cpu_diff(profiles: tuple[Path, Path]) -> None:
    with Profile(profiles[0]) as old, Profile(profiles[1]) as new:
        deltas = cpu_diff(old, new)
    got = [(d.function, d.old_self_pct, d.new_self_pct, d.delta_self_pct, d.delta_total_pct,
            d.status) for d in deltas]
    assert got == [
        ("parse", 20.0, 60.0, 40.0, 40.0, ""),  # ties on size: by name
        ("work", 60.0, 20.0, -40.0, -40.0, ""),
        ("gone_fn", 20.0, 0.0, -20.0, -20.0, "gone"),
        ("new_fn", 0.0, 20.0, 20.0, 20.0, "new"),
        ("main", 0.0, 0.0, 0.0, 0.0, ""),
    ]
    assert deltas[-1].old_total_pct == deltas[-1].new_total_pct == 100.0
    assert set(deltas[0].as_dict()) == {"function", "old_self_pct", "new_self_pct",
                                        "delta_self_pct", "old_total_pct", "new_total_pct",
                                        "delta_total_pct", "status"}


def test_cpu_diff_with_filters(profiles: tuple[Path, Path]) -> None:
    query = SampleQuery(filters=FrameFilter.compile(focus="^work$"))
    with Profile(profiles[0]) as old, Profile(profiles[1]) as new:
        deltas = {d.function: d.delta_self_pct for d in cpu_diff(old, new, query)}
    assert deltas == {"work": -40.0, "main": 0.0}  # shares stay of every sample


def test_heap_diff(profiles: tuple[Path, Path]) -> None:
    with Profile(profiles[0]) as old, Profile(profiles[1]) as new:
        deltas = heap_diff(old, new)
    got = [(d.function, d.old_inuse_bytes, d.new_inuse_bytes, d.delta_inuse_bytes,
            d.old_alloc_bytes, d.new_alloc_bytes, d.status) for d in deltas]
    assert got == [
        ("leak", 600, 3000, 2400, 1000, 3000, ""),
        ("new_site", 0, 96, 96, 0, 96, "new"),
        ("gone_site", 64, 0, -64, 64, 0, "gone"),
        ("churn", 0, 0, 0, 500, 1500, ""),
    ]
