"""Wall-clock numbers of the followed file: the CPU model (`cpu.CpuModel`: running counts,
trends, tree, peek, charts) over on-CPU plus off-CPU time, in nanoseconds.

As `rsprof top wall` counts it (`storage.samples.load_samples(kind="wall")`): a CPU sample
weighs one period (1 / `cpu_freq_hz`), an `offcpu_stack_samples` row its `ns`, and an
off-CPU stack's `[kernel]` leaf becomes its state's frame (`[sleeping]`, ...,
`storage.samples.offcpu_stack`). An off-CPU stack is keyed by a negative id that keeps its
stack and state apart (the same stack sleeping and preempted are two stacks here), so CPU
stack ids and off-CPU keys share one id space and every query of the CPU model works on both.
"""

from __future__ import annotations

from rsprof.storage.live.cpu import CpuModel
from rsprof.storage.samples import Frame, offcpu_stack

# Off-CPU key: -(stack_id * _STATES + code point of the state); every code point is below it.
_STATES = 0x110000


def offcpu_key(stack_id: int, state: str) -> int:
    """The wall model's id of an off-CPU stack in a state (negative: CPU stack ids are not)."""
    return -(stack_id * _STATES + ord(state))


def split_offcpu_key(key: int) -> tuple[int, str]:
    stack_id, code = divmod(-key, _STATES)
    return stack_id, chr(code)


class WallModel(CpuModel):
    """On-CPU + off-CPU nanoseconds per stack; see the module docstring."""

    ROOT_NAME = "all wall time"

    def source(self) -> str:
        freq = self.file.info.cpu_freq_hz
        period_ns = 1_000_000_000 // max(1, freq)
        # SQLite pushes the outer WHERE (checkpoints, thread) into both arms of the union,
        # where each table's primary key serves it.
        return (
            f"(SELECT checkpoint_id, stack_id, tid, count * {period_ns} AS count"
            " FROM cpu_stack_samples UNION ALL"
            f" SELECT checkpoint_id, -(stack_id * {_STATES} + unicode(state)) AS stack_id,"
            " tid, ns AS count FROM offcpu_stack_samples)"
        )

    def whole_from_checkpoints(self) -> bool:
        return False  # checkpoints.samples counts CPU samples only

    def load_stacks(self, stack_ids: list[int]) -> dict[int, tuple[Frame, ...]]:
        wanted = {key: split_offcpu_key(key) if key < 0 else (key, "") for key in stack_ids}
        loaded = self.file.frames.stacks(sorted({stack_id for stack_id, _ in wanted.values()}))
        stacks: dict[int, tuple[Frame, ...]] = {}
        for key, (stack_id, state) in wanted.items():
            frames = loaded.get(stack_id, ())
            # a stack the file does not have is dropped as `top wall` drops it
            stacks[key] = offcpu_stack(frames, state) if state and frames else frames
        return stacks
