"""Flame-graph exports of a `SampleSet`: collapsed ("folded") stacks for flamegraph.pl and
inferno, and speedscope's JSON file format (https://www.speedscope.app/file-format-schema.json).

Both are function-granular, like `rsprof top`: a frame is a function name, one per inline
level, so samples at different lines of a function land in one flame-graph box.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TextIO

from rsprof.storage.samples import Line, Sample, SampleSet

from rsprof import __version__

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
# pprof's sample-type units mapped to speedscope's ValueUnit; anything else is a plain count.
_SPEEDSCOPE_UNITS = {"nanoseconds": "nanoseconds", "bytes": "bytes"}


def write_folded(
    samples: SampleSet, out: TextIO, *, value_index: int | None = None, per_thread: bool = False
) -> None:
    """Collapsed stacks, `root;...;leaf COUNT` per distinct stack, sorted by stack."""
    index = samples.default_index if value_index is None else value_index
    totals: dict[str, int] = {}
    for sample, value in _weighted(samples, index):
        names = [_folded_name(line.function) for line in _root_first_lines(sample)]
        if per_thread and sample.tid is not None:
            names.insert(0, _folded_name(thread_label(sample)))
        stack = ";".join(names)
        totals[stack] = totals.get(stack, 0) + value
    for stack in sorted(totals):
        out.write(f"{stack} {totals[stack]}\n")


def write_speedscope(
    samples: SampleSet, out: TextIO, *, value_index: int | None = None, name: str = ""
) -> None:
    """speedscope's format: one sampled profile per thread for CPU (busiest first), one for
    heap; stacks root first, one entry per distinct stack weighted by the chosen value."""
    index = samples.default_index if value_index is None else value_index
    sample_type, unit = samples.sample_types[index]
    frames: list[dict[str, object]] = []
    frame_index: dict[tuple[str, str], int] = {}
    # The line shown for a function: the one carrying most of its weight (a speedscope frame
    # has one line, our samples have one per address).
    line_weights: list[dict[int, int]] = []

    def intern(function: str, file: str, line: int, weight: int) -> int:
        key = (function, file)
        i = frame_index.get(key)
        if i is None:
            i = frame_index[key] = len(frames)
            frames.append({"name": function or "[unknown]", **({"file": file} if file else {})})
            line_weights.append({})
        if line > 0:
            line_weights[i][line] = line_weights[i].get(line, 0) + weight
        return i

    # Group by thread for CPU; heap samples carry no thread, so they form one group.
    groups: dict[int | None, dict[tuple[int, ...], int]] = {}
    labels: dict[int | None, str] = {}
    for sample, value in _weighted(samples, index):
        stack = tuple(intern(line.function, line.file, line.line, value)
                      for line in _root_first_lines(sample))
        key = sample.tid if samples.kind != "heap" else None
        stacks = groups.setdefault(key, {})
        stacks[stack] = stacks.get(stack, 0) + value
        labels.setdefault(key, thread_label(sample) if key is not None else "")
    for frame, weights in zip(frames, line_weights):
        if weights:
            frame["line"] = max(weights.items(), key=lambda item: (item[1], -item[0]))[0]

    process = samples.meta.get("process_name", "") or "profile"
    order = sorted(groups, key=lambda tid: (-sum(groups[tid].values()), tid or 0))
    profiles = []
    for key in order:
        stacks = groups[key]
        # Sorted by frame names, root first: speedscope's time-order view then reads like
        # the flame graph instead of in an arbitrary order (there are no timestamps).
        ordered = sorted(stacks, key=lambda s: [str(frames[i]["name"]) for i in s])
        total = sum(stacks.values())
        profiles.append({
            "type": "sampled",
            "name": labels[key] if key is not None else f"{process} {sample_type}",
            "unit": _SPEEDSCOPE_UNITS.get(unit, "none"),
            "startValue": 0,
            "endValue": total,
            "samples": [list(stack) for stack in ordered],
            "weights": [stacks[stack] for stack in ordered],
        })
    document = {
        "$schema": SPEEDSCOPE_SCHEMA,
        "shared": {"frames": frames},
        "profiles": profiles,
        "name": name or f"{process} {samples.kind} ({sample_type})",
        "activeProfileIndex": 0,
        # The spec recommends "name@version".
        "exporter": f"rsprof@{__version__}",
    }
    json.dump(document, out, separators=(",", ":"))
    out.write("\n")


def thread_label(sample: Sample) -> str:
    """`name (tid)` as py-spy and inferno label a thread's root frame."""
    return f"{sample.thread_name or 'thread'} ({sample.tid})"


def _weighted(samples: SampleSet, index: int) -> Iterator[tuple[Sample, int]]:
    """Samples with a positive value at `index`: flame graphs cannot draw the others."""
    if not 0 <= index < len(samples.sample_types):
        raise ValueError(f"sample index {index} out of range for a {samples.kind} profile")
    for sample in samples.samples:
        value = sample.values[index]
        if value > 0 and sample.frames:
            yield sample, value


def _root_first_lines(sample: Sample) -> Iterator[Line]:
    # Frames are leaf first and a frame's lines innermost first: reverse both.
    for frame in reversed(sample.frames):
        yield from reversed(frame.lines)


def _folded_name(name: str) -> str:
    """A frame name the folded format can carry: `;` separates frames and a newline ends the
    record, so both are replaced; spaces are fine (the count follows the last space)."""
    if not name:
        return "[unknown]"
    return name.replace(";", ":").replace("\r", " ").replace("\n", " ")
