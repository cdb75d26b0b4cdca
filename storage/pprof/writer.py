"""A SampleSet as a gzipped pprof Profile (profile.proto), for `go tool pprof` and every
other pprof reader. docs/exports.md describes the mapping from rsprof's schema."""

from __future__ import annotations

import gzip
import re
from typing import BinaryIO

from rsprof.storage.pprof import profile_pb2 as pb
from rsprof.storage.samples import Frame, Mapping, Sample, SampleSet

# rsprof's names for an address nothing resolved: `module+0xOFFSET`, or `0xADDRESS` for a
# frame without locations (see docs/schema.md, locations.function).
_UNRESOLVED = re.compile(r"(?:^0x|\+0x)[0-9a-f]+$")


def write_pprof(samples: SampleSet, out: BinaryIO, *, base: SampleSet | None = None) -> None:
    """Writes `samples` to `out` as a gzipped pprof profile. With `base`, the file is a diff
    as `go tool pprof -diff_base` builds one: base samples negated and labelled
    `pprof::base=true`, so pprof reports the change and takes percentages of the base."""
    if base is not None and base.kind != samples.kind:
        raise ValueError(f"cannot diff a {samples.kind} profile against a {base.kind} base")
    if base is not None and base.sample_types != samples.sample_types:
        raise ValueError("the base has other sample types than the profile")
    builder = _Builder()
    profile = builder.profile
    for type_name, unit in samples.sample_types:
        profile.sample_type.add(type=builder.string(type_name), unit=builder.string(unit))
    profile.default_sample_type = builder.string(samples.sample_types[samples.default_index][0])
    if samples.kind == "cpu":
        period_type, period = ("cpu", "nanoseconds"), samples.period_ns
    elif samples.kind in ("offcpu", "wall"):
        # values are nanoseconds already, one sample per (stack, thread, state)
        period_type, period = (samples.kind, "nanoseconds"), 1
    else:
        # Go's heap profiles: space/bytes, period = bytes between samples (MemProfileRate);
        # 1 when every allocation is traced, as rsprof's default heap mode does.
        period_type = ("space", "bytes")
        # By the sample size, not heap_mode: a sampled profile whose program had its own
        # malloc reads "partial" (docs/schema.md).
        period = int(samples.meta.get("heap_sample_bytes") or 0) or 1
    profile.period_type.type = builder.string(period_type[0])
    profile.period_type.unit = builder.string(period_type[1])
    profile.period = max(1, period)
    profile.time_nanos = samples.start_ms * 1_000_000
    profile.duration_nanos = samples.duration_ns
    for sample in samples.samples:
        builder.sample(sample, sign=1)
    for sample in base.samples if base is not None else ():
        builder.sample(sample, sign=-1)
    builder.add_mappings(samples.meta.get("exe_path", ""))
    # mtime=0: the same samples always give the same bytes.
    out.write(gzip.compress(profile.SerializeToString(), mtime=0))


class _Builder:
    """Interns strings, functions, locations and mappings into one Profile message."""

    def __init__(self) -> None:
        self.profile = pb.Profile()
        self.profile.string_table.append("")  # index 0 must be "" (profile.proto)
        self._strings: dict[str, int] = {"": 0}
        self._functions: dict[tuple[str, str, str], int] = {}
        # By the whole Frame: a heap stack trimmed inside an inline chain has a frame with
        # the same id but fewer lines, which must be its own Location.
        self._locations: dict[Frame, int] = {}
        # The same frame object recurs in many samples: look it up by identity first, since
        # hashing a frame's whole value per sample costs more than the rest of the writer.
        # (Samples keep their frames alive while the profile is written, so ids stay unique.)
        self._locations_by_id: dict[int, int] = {}
        self._mappings: dict[Mapping, int] = {}
        self._mapping_frames: dict[int, list[Frame]] = {}

    def string(self, text: str) -> int:
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self.profile.string_table)
            self.profile.string_table.append(text)
        return index

    def sample(self, sample: Sample, *, sign: int) -> None:
        if not any(sample.values):
            return
        message = self.profile.sample.add(
            location_id=[self._location(frame) for frame in sample.frames],
            value=[sign * value for value in sample.values],
        )
        # `thread` is a string label so `-tags` and `-tagfocus=thread=NAME` work by name;
        # tid is numeric, as perf_to_profile writes it (`-tagfocus=tid=1234` then works).
        if sample.thread_name:
            message.label.add(key=self.string("thread"), str=self.string(sample.thread_name))
        if sample.tid is not None:
            message.label.add(key=self.string("tid"), num=sample.tid)
        if sign < 0:
            message.label.add(key=self.string("pprof::base"), str=self.string("true"))

    def _location(self, frame: Frame) -> int:
        location_id = self._locations_by_id.get(id(frame))
        if location_id is None:
            location_id = self._locations_by_id[id(frame)] = self._new_location(frame)
        return location_id

    def _new_location(self, frame: Frame) -> int:
        location_id = self._locations.get(frame)
        if location_id is not None:
            return location_id
        location_id = self._locations[frame] = len(self._locations) + 1
        mapping_id = 0
        if frame.mapping is not None:
            mapping_id = self._mappings.setdefault(frame.mapping, len(self._mappings) + 1)
            self._mapping_frames.setdefault(mapping_id, []).append(frame)
        location = self.profile.location.add(id=location_id, mapping_id=mapping_id,
                                             address=frame.address)
        for line in frame.lines:  # innermost inlined function first, as pprof wants
            location.line.add(function_id=self._function(line.function, line.system_name,
                                                         line.file), line=line.line)
        return location_id

    def _function(self, name: str, system_name: str, file: str) -> int:
        key = (name, system_name, file)
        function_id = self._functions.get(key)
        if function_id is None:
            function_id = self._functions[key] = len(self._functions) + 1
            self.profile.function.add(id=function_id, name=self.string(name),
                                      system_name=self.string(system_name),
                                      filename=self.string(file))
        return function_id

    def add_mappings(self, exe_path: str) -> None:
        # pprof takes mapping[0] as the main binary (the `File:` of its reports).
        ordered = sorted(self._mappings.items(),
                         key=lambda item: (item[0].path != exe_path, item[0].start))
        for mapping, mapping_id in ordered:
            lines = [line for frame in self._mapping_frames[mapping_id] for line in frame.lines]
            # As pprof's own symbolizer sets them: the mapping is symbolized to that level
            # (pprof then never re-symbolizes it). rsprof expands inlined calls wherever it
            # has DWARF, which is also where line numbers come from.
            has_lines = any(line.line > 0 for line in lines)
            self.profile.mapping.add(
                id=mapping_id, memory_start=mapping.start, memory_limit=mapping.end,
                file_offset=mapping.file_offset, filename=self.string(mapping.path),
                build_id=self.string(mapping.build_id),
                has_functions=any(not _UNRESOLVED.search(line.function) for line in lines),
                has_filenames=any(line.file for line in lines),
                has_line_numbers=has_lines, has_inline_frames=has_lines,
            )
