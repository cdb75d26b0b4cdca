"""The Firefox Profiler's processed profile format (https://profiler.firefox.com), as samply
writes it with its crate fxprof-processed-profile: `preprocessedProfileVersion` 66, the
stack, frame, function, resource, native-symbol and source tables shared by every thread
(`shared`), strings in `shared.stringArray`, each thread with its own samples table.

CPU: one thread per sampled thread, with its name, tid, pid and process name. The recorder
counts samples per checkpoint, not their instants, so the samples of one checkpoint are
spread evenly over its interval (one entry per sample, weight 1), grouped by stack: time
resolution is the checkpoint interval (`-i`). Each sample's `threadCPUDelta` is the
sampling period, so the activity graph shows the share of a CPU each thread used.

Heap: one thread per process, `weightType` "bytes" (or "samples" for object counts), one
sample per call-site stack weighted by the chosen value, all at the end of the range:
in-use values are the state at that instant and allocation totals are over the range, so
there is no finer time to give them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, TextIO

from rsprof.storage.callsite import is_python_address
from rsprof.storage.samples import Frame, Sample, SampleSet, is_kernel_frame

# The format version fxprof-processed-profile 0.8 writes (the profiler upgrades older
# versions when it loads a file, never newer ones).
PREPROCESSED_PROFILE_VERSION = 66
GECKO_PROFILE_VERSION = 24  # meta.version: the profiler ignores it for processed profiles

# Category names and colours; the profiler needs one "grey" category, its default.
CATEGORIES = (("Other", "grey"), ("User", "yellow"), ("Kernel", "orange"),
              ("Python", "blue"))
OTHER, USER, KERNEL, PYTHON = range(len(CATEGORIES))
RESOURCE_TYPE_LIBRARY = 1


def frame_category(frame: Frame) -> int:
    """Kernel for the `[kernel]` frame, Python for a Python function, User for native code
    in a mapped module, Other for the rest (an address outside every mapping)."""
    if is_kernel_frame(frame):
        return KERNEL
    if is_python_address(frame.address):
        return PYTHON
    return USER if frame.module else OTHER


def breakpad_id(build_id: str) -> str:
    """The debug id the profiler (and Breakpad) derive from a GNU build id: its first 16
    bytes as a little-endian GUID, upper-case hex, then the age (0)."""
    raw = bytes.fromhex(build_id)[:16] if build_id else b""
    raw = raw.ljust(16, b"\0")
    guid = raw[3::-1] + raw[5:3:-1] + raw[7:5:-1] + raw[8:]
    return guid.hex().upper() + "0"


class _Tables:
    """The `shared` tables, each interned by its key."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self._string_index: dict[str, int] = {}
        self.libs: list[dict[str, Any]] = []
        self._lib_index: dict[str, int] = {}
        self.resources: dict[str, list[Any]] = {"lib": [], "name": []}
        self._resource_index: dict[str, int] = {}
        self.sources: list[int] = []  # filename string index per source
        self._source_index: dict[str, int] = {}
        self.funcs: dict[str, list[Any]] = {"name": [], "resource": [], "source": []}
        self._func_index: dict[tuple[str, int, int | None], int] = {}
        self.frames: dict[str, list[Any]] = {
            "func": [], "category": [], "line": [], "address": [], "inlineDepth": []}
        self._frame_index: dict[tuple[int, int, int, int, int], int] = {}
        self.stacks: dict[str, list[int]] = {"frame": [], "prefixOffset": []}
        self._stack_index: dict[tuple[int | None, int], int] = {}

    def string(self, text: str) -> int:
        index = self._string_index.get(text)
        if index is None:
            index = self._string_index[text] = len(self.strings)
            self.strings.append(text)
        return index

    def resource(self, frame: Frame) -> int:
        if not frame.module or is_python_address(frame.address):
            return -1  # a Python function's module is its source file, not a library
        index = self._resource_index.get(frame.module)
        if index is None:
            name = os.path.basename(frame.module)
            build_id = frame.mapping.build_id if frame.mapping else ""
            lib = len(self.libs)
            self.libs.append({
                "name": name, "path": frame.module, "debugName": name,
                "debugPath": frame.module, "breakpadId": breakpad_id(build_id),
                "codeId": build_id or None, "arch": None,
            })
            index = self._resource_index[frame.module] = len(self.resources["lib"])
            self.resources["lib"].append(lib)
            self.resources["name"].append(self.string(name))
        return index

    def source(self, file: str) -> int | None:
        if not file:
            return None
        index = self._source_index.get(file)
        if index is None:
            index = self._source_index[file] = len(self.sources)
            self.sources.append(self.string(file))
        return index

    def func(self, name: str, file: str, resource: int) -> int:
        key = (name, resource, self.source(file))
        index = self._func_index.get(key)
        if index is None:
            index = self._func_index[key] = len(self.funcs["name"])
            self.funcs["name"].append(self.string(name or "[unknown]"))
            self.funcs["resource"].append(resource)
            self.funcs["source"].append(key[2])
        return index

    def frame_indexes(self, frame: Frame) -> Iterator[int]:
        """One frame-table row per inline level, outermost (depth 0) first."""
        category = frame_category(frame)
        resource = self.resource(frame)
        python = is_python_address(frame.address)
        address = -1 if python or not frame.module else frame.module_offset
        for depth, line in enumerate(reversed(frame.lines)):
            func = self.func(line.function, line.file, resource)
            key = (func, category, line.line, address, depth)
            index = self._frame_index.get(key)
            if index is None:
                index = self._frame_index[key] = len(self.frames["func"])
                self.frames["func"].append(func)
                self.frames["category"].append(category)
                self.frames["line"].append(line.line if line.line > 0 else None)
                self.frames["address"].append(address)
                self.frames["inlineDepth"].append(depth)
            yield index

    def stack(self, sample: Sample) -> int | None:
        prefix: int | None = None
        for frame in reversed(sample.frames):  # root first
            for frame_index in self.frame_indexes(frame):
                key = (prefix, frame_index)
                index = self._stack_index.get(key)
                if index is None:
                    index = self._stack_index[key] = len(self.stacks["frame"])
                    self.stacks["frame"].append(frame_index)
                    self.stacks["prefixOffset"].append(0 if prefix is None else index - prefix)
                prefix = index
        return prefix

    def shared(self) -> dict[str, Any]:
        frames = len(self.frames["func"])
        funcs = len(self.funcs["name"])
        resources = len(self.resources["lib"])
        sources = len(self.sources)
        return {
            "stackTable": {"length": len(self.stacks["frame"]), **self.stacks},
            "frameTable": {
                "length": frames,
                **self.frames,
                "subcategory": [0] * frames,
                "column": [None] * frames,
                "nativeSymbol": [None] * frames,
                "innerWindowID": [0] * frames,
                "originalLocation": [None] * frames,
            },
            "funcTable": {
                "length": funcs,
                **self.funcs,
                "isJS": [False] * funcs,
                "relevantForJS": [False] * funcs,
                "lineNumber": [None] * funcs,
                "columnNumber": [None] * funcs,
                "originalLocation": [None] * funcs,
            },
            "nativeSymbols": {"length": 0, "address": [], "functionSize": [], "libIndex": [],
                              "name": []},
            "resourceTable": {"length": resources, **self.resources,
                              "host": [None] * resources,
                              "type": [RESOURCE_TYPE_LIBRARY] * resources},
            "sources": {"length": sources, "id": [None] * sources, "filename": self.sources,
                        "startLine": [1] * sources, "startColumn": [1] * sources,
                        "sourceMapURL": [None] * sources, "content": [None] * sources},
            "sourceLocationTable": {"length": 0, "source": [], "line": [], "column": []},
            "stringArray": self.strings,
        }


def write_firefox(samples: SampleSet, out: TextIO, *, value_index: int | None = None) -> None:
    """The processed profile of `samples` (CPU ones loaded per checkpoint carry their
    times; merged ones are spread over the whole range)."""
    index = samples.default_index if value_index is None else value_index
    if not 0 <= index < len(samples.sample_types):
        raise ValueError(f"sample index {index} out of range for a {samples.kind} profile")
    tables = _Tables()
    start_ms = int(samples.meta.get("start_time_ms") or samples.start_ms)
    main_pid = int(samples.meta["pid"]) if str(samples.meta.get("pid", "")).isdigit() else 0
    if samples.kind != "heap":
        threads = _cpu_threads(samples, tables, start_ms, main_pid)
    else:
        threads = [_heap_thread(samples, tables, start_ms, main_pid, index)]
    interval_ms = samples.period_ns / 1e6 if samples.kind == "cpu" and samples.period_ns else 1.0
    process = samples.meta.get("process_name", "") or "profile"
    document = {
        "meta": {
            "categories": [{"name": name, "color": color, "subcategories": ["Other"]}
                           for name, color in CATEGORIES],
            "debug": False,
            "extensions": {"length": 0, "baseURL": [], "id": [], "name": []},
            "interval": interval_ms,
            "preprocessedProfileVersion": PREPROCESSED_PROFILE_VERSION,
            "processType": 0,
            "product": process,
            "oscpu": "Linux",
            "sampleUnits": {"time": "ms", "eventDelay": "ms", "threadCPUDelta": "µs"},
            "startTime": start_ms,
            "symbolicated": True,
            "pausedRanges": [],
            "version": GECKO_PROFILE_VERSION,
            "usesOnlyOneStackType": True,
            "sourceCodeIsNotOnSearchfox": True,
            "markerSchema": [],
        },
        "libs": tables.libs,
        "shared": tables.shared(),
        "threads": threads,
        "pages": [],
        "profilerOverhead": [],
        "counters": [],
    }
    json.dump(document, out, separators=(",", ":"), ensure_ascii=False)
    out.write("\n")


def _thread(name: str, tid: int, pid: int, process_name: str, main: bool,
            samples_table: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "isMainThread": main,
        "pausedRanges": [],
        "pid": str(pid),
        "processName": process_name,
        "processShutdownTime": None,
        "processStartupTime": 0,
        "processType": "default",
        "registerTime": 0,
        "tid": str(tid),
        "unregisterTime": None,
        "showMarkersInTimeline": False,
        "samples": samples_table,
        "markers": {"length": 0, "category": [], "data": [], "endTime": [], "name": [],
                    "phase": [], "startTime": []},
    }


def _cpu_threads(samples: SampleSet, tables: _Tables, start_ms: int,
                 main_pid: int) -> list[dict[str, Any]]:
    by_thread: dict[int, list[Sample]] = {}
    for sample in samples.samples:
        if sample.frames and sample.values[0] > 0:
            by_thread.setdefault(sample.tid or 0, []).append(sample)
    cpu_delta_us = samples.period_ns // 1000

    def order(tid: int) -> tuple[int, bool, int]:
        pid = by_thread[tid][0].pid or main_pid
        return (pid != main_pid, tid != pid, tid)  # the target first, its main thread first

    threads = []
    for tid in sorted(by_thread, key=order):
        thread_samples = by_thread[tid]
        pid = thread_samples[0].pid or main_pid
        times: list[float] = []
        stacks: list[int | None] = []
        # Per checkpoint interval (the whole range for merged samples): its samples spread
        # evenly, grouped by stack in the order they were loaded.
        groups: dict[tuple[int, int], list[Sample]] = {}
        for sample in thread_samples:
            interval = sample.interval_ms or (samples.start_ms, samples.end_ms)
            groups.setdefault(interval, []).append(sample)
        for (begin, end), group in sorted(groups.items()):
            count = sum(sample.values[0] for sample in group)
            step = (end - begin) / count
            position = 0
            for sample in group:
                stack = tables.stack(sample)
                for _ in range(sample.values[0]):
                    times.append(begin - start_ms + (position + 0.5) * step)
                    stacks.append(stack)
                    position += 1
        table = {
            "length": len(times),
            "weightType": "samples",
            "stack": stacks,
            "timeDeltas": _deltas(times),
            "weight": [1] * len(times),
            "threadCPUDelta": [cpu_delta_us] * len(times),
        }
        name = thread_samples[0].thread_name or f"thread {tid}"
        process_name = samples.process_names.get(pid, "") or str(pid)
        threads.append(_thread(name, tid, pid, process_name, tid == pid, table))
    return threads


def _heap_thread(samples: SampleSet, tables: _Tables, start_ms: int, main_pid: int,
                 index: int) -> dict[str, Any]:
    sample_type, unit = samples.sample_types[index]
    stacks: list[int | None] = []
    weights: list[int] = []
    for sample in samples.samples:
        value = sample.values[index]
        if value > 0 and sample.frames:
            stacks.append(tables.stack(sample))
            weights.append(value)
    at = samples.end_ms - start_ms
    table = {
        "length": len(stacks),
        "weightType": "bytes" if unit == "bytes" else "samples",
        "stack": stacks,
        "timeDeltas": [at] + [0] * (len(stacks) - 1) if stacks else [],
        "weight": weights,
        "threadCPUDelta": [None] * len(stacks),
    }
    process_name = samples.process_names.get(main_pid, "") or "profile"
    return _thread(f"heap {sample_type}", main_pid, main_pid, process_name, True, table)


def _deltas(times: list[float]) -> list[float]:
    """Each time minus the one before (the first minus 0), rounded to the microsecond."""
    deltas = []
    previous = 0.0
    for time in times:
        deltas.append(round(time - previous, 3))
        previous = time
    return deltas
