"""rsprof.collector.offcpu (the sched_switch tracepoint's layout) and the off-CPU read model
on synthetic profiles: the state leaf, wall = CPU + off-CPU, and files without the
offcpu_stack_samples table (schema 2 from before it, schema 1) reading as no off-CPU time."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from rsprof.collector.offcpu import parse_format
from rsprof.storage.reader import Profile
from rsprof.storage.samples import load_samples, offcpu_stack
from rsprof.storage.writer import Checkpoint

from unit.synthetic import PID, Synth, frame, schema_1_copy

# the kernel's sched_switch format (6.x), trimmed to the fields around prev_state
FORMAT = """name: sched_switch
ID: 316
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
"""


def test_parse_format_finds_prev_state() -> None:
    assert parse_format(FORMAT) == 32
    assert parse_format(FORMAT.replace("offset:32;", "offset:40;")) == 40


@pytest.mark.parametrize("text", ["", FORMAT.replace("size:8;\tsigned:1;\n\tfield:char next",
                                                     "size:4;\tsigned:1;\n\tfield:char next")])
def test_parse_format_refuses_a_format_without_an_8_byte_prev_state(text: str) -> None:
    with pytest.raises(ValueError):
        parse_format(text)


def test_offcpu_stack_replaces_the_kernel_leaf_by_the_state() -> None:
    kernel = frame("[kernel]", module="[kernel]")
    user = frame("read", module="/bin/x")
    stack = offcpu_stack((kernel, user), "S")
    assert [f.lines[0].function for f in stack] == ["[sleeping]", "read"]
    assert offcpu_stack((user,), "R")[0].lines[0].function == "[preempted]"
    assert offcpu_stack((kernel, user), "D")[0].lines[0].function == "[uninterruptible wait]"


def _duty_profile(path: Path) -> Path:
    """tid 1: compute 1 sample a checkpoint at 100 Hz (10 ms), 30 ms asleep in sleepy."""
    synth = Synth(path)
    compute = synth.stack("compute", "main")
    sleepy = synth.stack("[kernel]", "sleepy", "main")
    for _ in range(5):
        synth.time_ms += 1000
        synth.writer.write_checkpoint(Checkpoint(
            timestamp_ms=synth.time_ms, samples=1, cpu={(compute, 1): 1},
            offcpu={(sleepy, 1, "S"): (3, 30_000_000)}, threads={1: "main"},
            thread_pids={1: PID}))
    return synth.finish()


def _totals(path: Path, kind: str) -> dict[str, int]:
    """Nanoseconds (the kind's first value) per stack's outermost-but-main function."""
    totals: dict[str, int] = {}
    for sample in load_samples(Profile(path), kind).samples:
        names = [f.lines[0].function for f in sample.frames]
        key = "/".join(names[:-1])
        totals[key] = totals.get(key, 0) + sample.values[0]
    return totals


def test_wall_is_cpu_time_plus_offcpu_time(tmp_path: Path) -> None:
    path = _duty_profile(tmp_path / "d.db")
    assert _totals(path, "offcpu") == {"[sleeping]/sleepy": 150_000_000}
    assert _totals(path, "wall") == {"compute": 50_000_000, "[sleeping]/sleepy": 150_000_000}


def test_files_without_the_offcpu_table_read_as_no_offcpu_time(tmp_path: Path) -> None:
    path = _duty_profile(tmp_path / "d.db")
    conn = sqlite3.connect(path)  # schema 2 as written before off-CPU time was
    conn.execute("DROP TABLE offcpu_stack_samples")
    conn.commit()
    conn.close()
    old = schema_1_copy(path, tmp_path / "old.db")
    for file in (path, old):
        assert _totals(file, "offcpu") == {}
        assert _totals(file, "wall") == {"compute": 50_000_000}
