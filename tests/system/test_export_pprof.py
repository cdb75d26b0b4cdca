"""pprof export (storage/pprof): the file parses back with profile.proto's own bindings, and
`go tool pprof` reads it and reports the same numbers rsprof has (the SampleSet and
`rsprof top`), on real recorded profiles with a known CPU split and exact heap bytes."""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LEAKY_THREADS, LEAKY_TICKS, run_rsprof, top_json
from rsprof.storage.pprof import profile_pb2 as pb
from rsprof.storage.pprof.writer import write_pprof
from rsprof.storage.reader import Profile
from rsprof.storage.samples import (
    CPU_SAMPLE_TYPES,
    HEAP_SAMPLE_TYPES,
    Frame,
    Line,
    Mapping,
    Sample,
    SampleSet,
    load_samples,
)

GO = shutil.which("go")
needs_go = pytest.mark.skipif(
    GO is None, reason="`go tool pprof` needs Go (apt-get install golang-go); not installed"
)


def load(path: Path, kind: str) -> SampleSet:
    with Profile(path) as profile:
        return load_samples(profile, kind)


def export(samples: SampleSet, out: Path, base: SampleSet | None = None) -> Path:
    with out.open("wb") as file:
        write_pprof(samples, file, base=base)
    return out


def parse(path: Path) -> pb.Profile:
    return pb.Profile.FromString(gzip.decompress(path.read_bytes()))


@pytest.fixture(scope="module")
def cpu(split_cpu_profile: Path) -> SampleSet:
    return load(split_cpu_profile, "cpu")


@pytest.fixture(scope="module")
def heap(leaky_heap_profile: Path) -> SampleSet:
    return load(leaky_heap_profile, "heap")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, cpu: SampleSet, heap: SampleSet,
             split_cpu_profile_1to1: Path) -> dict[str, Path]:
    """Written once through Python: cpu, heap, the 1:1 base, and the cpu-vs-base diff."""
    folder = tmp_path_factory.mktemp("pprof")
    base = load(split_cpu_profile_1to1, "cpu")
    return {
        "cpu": export(cpu, folder / "cpu.pb.gz"),
        "heap": export(heap, folder / "heap.pb.gz"),
        "base": export(base, folder / "base.pb.gz"),
        "diff": export(cpu, folder / "diff.pb.gz", base=base),
    }


# --- the file itself, read back with profile_pb2 ------------------------------------------


def strings(profile: pb.Profile) -> list[str]:
    return list(profile.string_table)


def value_types(profile: pb.Profile) -> list[tuple[str, str]]:
    table = strings(profile)
    return [(table[t.type], table[t.unit]) for t in profile.sample_type]


LineTuple = tuple[str, str, str, int]  # (name, system_name, file, line)


def stacks(profile: pb.Profile) -> Iterator[tuple[pb.Sample, list[list[LineTuple]]]]:
    """Each sample with its stack: per location, its lines as (name, system_name, file, line)."""
    table = strings(profile)
    functions = {f.id: f for f in profile.function}
    locations = {loc.id: loc for loc in profile.location}
    for sample in profile.sample:
        stack = []
        for location_id in sample.location_id:
            lines = []
            for line in locations[location_id].line:
                f = functions[line.function_id]
                lines.append((table[f.name], table[f.system_name], table[f.filename], line.line))
            stack.append(lines)
        yield sample, stack


def labels(profile: pb.Profile, sample: pb.Sample) -> dict[str, str | int]:
    table = strings(profile)
    return {table[lab.key]: table[lab.str] if lab.str else lab.num for lab in sample.label}


def frame_lines(frame: Frame) -> list[LineTuple]:
    return [(ln.function, ln.system_name, ln.file, ln.line) for ln in frame.lines]


def build_id(path: str) -> str:
    notes = subprocess.run(["readelf", "-n", path], capture_output=True, text=True, check=True)
    found = re.search(r"Build ID: ([0-9a-f]+)", notes.stdout)
    assert found, f"readelf -n {path}: no build id"
    return found.group(1)


def test_cpu_file_structure(cpu: SampleSet, exported: dict[str, Path]) -> None:
    profile = parse(exported["cpu"])
    table = strings(profile)
    assert table[0] == ""
    assert value_types(profile) == [("samples", "count"), ("cpu", "nanoseconds")]
    assert table[profile.default_sample_type] == "samples"
    assert (table[profile.period_type.type], table[profile.period_type.unit]) == (
        "cpu", "nanoseconds")
    assert profile.period == cpu.period_ns == 1_000_000_000 // 999
    assert profile.time_nanos == int(cpu.meta["start_time_ms"]) * 1_000_000
    assert profile.duration_nanos == (cpu.end_ms - cpu.start_ms) * 1_000_000
    assert 2.5e9 < profile.duration_nanos < 6e9  # a 3 s recording

    # Every sample as rsprof has it: same stack (every inline level), values and thread.
    ours = [(s.values, s.tid, s.thread_name, [frame_lines(f) for f in s.frames])
            for s in cpu.samples]
    theirs = []
    for sample, stack in stacks(profile):
        tags = labels(profile, sample)
        assert set(tags) == {"thread", "tid"}
        theirs.append((list(sample.value), tags["tid"], tags["thread"], stack))
    assert theirs == ours
    threads = {(tags["thread"], tags["tid"]) for tags in
               (labels(profile, s) for s in profile.sample)}
    assert {name for name, _ in threads} == {"split-main", "split-busy", "split-late"}
    assert {tid for _, tid in threads} == {s.tid for s in cpu.samples}

    # Functions are unique per (name, system_name, file) and carry the source file.
    keys = [(f.name, f.system_name, f.filename) for f in profile.function]
    assert len(keys) == len(set(keys))
    named = {table[f.name]: table[f.filename] for f in profile.function}
    for function in ("heavy", "light", "work", "spin", "other_busy", "late_worker"):
        assert named[function].endswith("tests/targets/split.c"), function


def test_mappings_and_locations(cpu: SampleSet, exported: dict[str, Path]) -> None:
    profile = parse(exported["cpu"])
    table = strings(profile)
    mappings = {m.id: m for m in profile.mapping}
    exe = cpu.meta["exe_path"]
    # pprof takes mapping[0] as the main binary.
    assert table[profile.mapping[0].filename] == exe
    for mapping in profile.mapping:
        path = table[mapping.filename]
        assert mapping.memory_start < mapping.memory_limit
        if os.path.exists(path):
            assert table[mapping.build_id] == build_id(path), path
    main = profile.mapping[0]  # built with -g: symbols, files, lines and inline info
    assert main.has_functions and main.has_filenames and main.has_line_numbers
    assert main.has_inline_frames

    # One Location per distinct Frame (a return address and a sampled one may share an
    # address with different lines, so by value, not by address).
    frames = {f for s in cpu.samples for f in s.frames}
    assert len(profile.location) == len(frames)
    by_address = {f.address: f for f in frames}
    inline = 0
    for location in profile.location:
        assert location.id and location.line
        frame = by_address[location.address]
        inline += len(location.line) > 1
        if not location.mapping_id:
            assert frame.mapping is None
            continue
        mapping = mappings[location.mapping_id]
        assert mapping.memory_start <= location.address < mapping.memory_limit
        assert table[mapping.filename] == frame.module
        if frame.module == exe:
            # gcc's layout puts code at ELF address == file offset, so the mapping's
            # start/offset must turn the address into the module offset rsprof stored.
            assert location.address - mapping.memory_start + mapping.file_offset == \
                frame.module_offset
    # Inlined calls (if the target has any hot ones) keep pprof's innermost-first order;
    # test_inline_frames_and_interning checks that order on a hand-made stack.
    assert inline == sum(len(f.lines) > 1 for f in frames)


def test_heap_file_structure(heap: SampleSet, exported: dict[str, Path]) -> None:
    profile = parse(exported["heap"])
    table = strings(profile)
    assert value_types(profile) == list(HEAP_SAMPLE_TYPES)
    assert table[profile.default_sample_type] == "inuse_space"
    assert (table[profile.period_type.type], table[profile.period_type.unit]) == (
        "space", "bytes")
    assert profile.period == 1  # every allocation traced
    inuse: Counter[str] = Counter()
    alloc: Counter[str] = Counter()
    for sample, stack in stacks(profile):
        assert not sample.label  # the shim records no threads
        inuse[stack[0][0][0]] += sample.value[3]
        alloc[stack[0][0][0]] += sample.value[1]
    assert inuse["leak_site"] == LEAKY_TICKS * 4000
    assert inuse["keep_site"] == 123457
    assert inuse["thread_leak"] == LEAKY_TICKS * LEAKY_THREADS * 64
    assert inuse["churn_site"] == 0 and alloc["churn_site"] == LEAKY_TICKS * 777
    assert sum(s.value[3] for s in profile.sample) == heap.total(3)


def handmade() -> tuple[SampleSet, dict[str, Frame]]:
    """A hand-made profile with what the recorded targets may lack: inlined C++ code, an
    address nothing resolved, a heap-style trimmed frame, and a sample worth nothing."""
    exe = Mapping(7, 0x1000, 0x3000, 0x1000, "/bin/app", "abcd")
    lib = Mapping(9, 0x7000, 0x8000, 0, "/lib/libx.so", "")
    push = Line(1, "std::vector<int>::push_back(int const&)",
                "_ZNSt6vectorIiSaIiEE9push_backERKi", "/usr/include/c++/12/bits/stl_vector.h",
                1280)
    fill = Line(2, "fill(int)", "_Z4filli", "app.cc", 10)
    main = Line(3, "main", "main", "app.cc", 20)
    frames = {
        "inlined": Frame(1, 0x1100, "/bin/app", 0x100, exe, (push, fill)),
        "trimmed": Frame(1, 0x1100, "/bin/app", 0x100, exe, (fill,)),  # same id, fewer lines
        "caller": Frame(2, 0x1200, "/bin/app", 0x200, exe, (main,)),
        "unknown": Frame(3, 0x7010, "/lib/libx.so", 0x10, lib,
                         (Line(4, "libx.so+0x10", "libx.so+0x10", "", 0),)),
        "unmapped": Frame(4, 0x9999, "", 0, None, (Line(0, "0x9999", "0x9999", "", 0),)),
    }
    inlined, trimmed, caller, unknown, unmapped = frames.values()
    samples = SampleSet("cpu", CPU_SAMPLE_TYPES, 0, [
        Sample((inlined, caller), [3, 30], 5, "t1"),
        Sample((trimmed, caller, unknown, unmapped), [2, 20], 6, "t2"),
        Sample((caller,), [0, 0], 5, "t1"),
    ], 1000, 3000, period_ns=10, meta={"exe_path": "/bin/app"})
    return samples, frames


def test_inline_frames_and_interning() -> None:
    samples, frames = handmade()
    inlined, trimmed, caller, unknown, unmapped = frames.values()
    out = io.BytesIO()
    write_pprof(samples, out)
    profile = pb.Profile.FromString(gzip.decompress(out.getvalue()))
    table = strings(profile)

    assert len(profile.sample) == 2  # the all-zero sample is left out
    got = [stack for _, stack in stacks(profile)]
    assert got[0] == [frame_lines(inlined), frame_lines(caller)]
    assert got[0][0][0][0].startswith("std::vector")  # innermost inlined function first
    assert got[1] == [frame_lines(f) for f in (trimmed, caller, unknown, unmapped)]
    # Locations by whole frame value; functions once each; `fill` appears in two locations.
    assert len(profile.location) == 5
    assert len(profile.function) == 5
    push_fn = next(f for f in profile.function if table[f.name].startswith("std::vector"))
    assert table[push_fn.system_name] == "_ZNSt6vectorIiSaIiEE9push_backERKi"
    locations = {loc.address: loc for loc in profile.location if loc.address != 0x1100}
    assert locations[0x9999].mapping_id == 0
    flags = {table[m.filename]: (m.has_functions, m.has_filenames, m.has_line_numbers,
                                 m.has_inline_frames) for m in profile.mapping}
    assert flags == {"/bin/app": (True, True, True, True),
                     "/lib/libx.so": (False, False, False, False)}
    assert table[profile.mapping[0].filename] == "/bin/app"
    assert profile.time_nanos == 1000 * 1_000_000 and profile.duration_nanos == 2000 * 1_000_000


@needs_go
def test_pprof_reads_inline_frames(tmp_path: Path) -> None:
    samples, _ = handmade()
    blocks = trace_blocks(pprof("-traces", export(samples, tmp_path / "inline.pb.gz")))
    assert blocks == [
        ({"thread": "t1", "tid": "5"}, 3,
         ["std::vector<int>::push_back(int const&) (inline)", "fill(int)", "main"]),
        ({"thread": "t2", "tid": "6"}, 2, ["fill(int)", "main", "libx.so+0x10", "0x9999"]),
    ]
    raw = pprof("-raw", tmp_path / "inline.pb.gz")
    assert "(_ZNSt6vectorIiSaIiEE9push_backERKi)" in raw  # system_name = the mangled name
    assert re.search(r"/bin/app abcd \[FN\]\[FL\]\[LN\]\[IN\]$", raw, re.M)


def test_diff_base_file(cpu: SampleSet, exported: dict[str, Path]) -> None:
    profile = parse(exported["diff"])
    base = parse(exported["base"])
    ours = [s for s in profile.sample if "pprof::base" not in labels(profile, s)]
    theirs = [s for s in profile.sample if labels(profile, s).get("pprof::base") == "true"]
    assert len(ours) == len(cpu.samples)
    assert sum(s.value[0] for s in ours) == cpu.total(0)
    assert len(theirs) == len(base.sample)
    assert sum(s.value[0] for s in theirs) == -sum(s.value[0] for s in base.sample)
    assert all(v < 0 for s in theirs for v in s.value)


def test_base_of_another_kind_is_refused(cpu: SampleSet, heap: SampleSet) -> None:
    with pytest.raises(ValueError, match="cpu profile against a heap base"):
        write_pprof(cpu, io.BytesIO(), base=heap)


# --- go tool pprof reading our files -------------------------------------------------------


def pprof(*args: str | Path) -> str:
    """`go tool pprof -symbolize=none ARGS`: our files carry symbols, nothing to look up."""
    assert GO is not None
    home = Path(os.environ.get("RSPROF_TEST_BUILD", "/tmp/rsprof-test-targets")) / "go-home"
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    # pprof writes its state under $HOME and $PPROF_TMPDIR; go wants a cache dir.
    env = dict(os.environ, HOME=str(home), PPROF_TMPDIR=str(home / "tmp"),
               GOCACHE=str(home / "cache"), GOFLAGS="")
    result = subprocess.run([GO, "tool", "pprof", "-symbolize=none", *map(str, args)],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def top_rows(output: str) -> dict[str, tuple[int, int]]:
    """`-top` rows as function -> (flat, cum), with `-unit=B` bytes as plain numbers. The
    `(inline)` label is dropped: pprof derives it from edges it may trim (`-traces` has it
    exactly, see test_pprof_traces)."""
    rows: dict[str, tuple[int, int]] = {}
    lines = iter(output.splitlines())
    for line in lines:
        if line.split()[:2] == ["flat", "flat%"]:
            break
    for line in lines:
        flat, _, _, cum, _, name = line.split(maxsplit=5)
        name = re.sub(r" \((?:partial-)?inline\)$", "", name)
        assert name not in rows, f"two -top rows named {name}"
        rows[name] = (int(flat.removesuffix("B")), int(cum.removesuffix("B")))
    return rows


def expected_rows(samples: SampleSet, index: int) -> dict[str, tuple[int, int]]:
    """What `go tool pprof -top` must show: flat per leaf function (the innermost inlined
    one), cum once per sample per function; a function worth nothing (churn_site's in-use
    bytes) has no row."""
    flat: Counter[str] = Counter()
    cum: Counter[str] = Counter()
    for sample in samples.samples:
        names = [line.function for frame in sample.frames for line in frame.lines]
        flat[names[0]] += sample.values[index]
        for name in set(names):
            cum[name] += sample.values[index]
    return {name: (flat[name], cum[name]) for name in cum if cum[name]}


def heavy_share(rows: dict[str, tuple[int, int]]) -> float:
    heavy, light = rows["heavy"][1], rows["light"][1]
    return heavy / (heavy + light)


@needs_go
def test_pprof_top_cpu(cpu: SampleSet, exported: dict[str, Path]) -> None:
    output = pprof("-top", "-nodefraction=0", exported["cpu"])
    assert "Type: samples" in output
    assert "Build ID: " + build_id(cpu.meta["exe_path"]) in output
    rows = top_rows(output)
    assert rows == expected_rows(cpu, 0)
    share = heavy_share(rows)
    assert 0.68 <= share <= 0.82, f"heavy share {share:.2f} in pprof, expected 0.75 (3:1)"
    # The other sample type, in nanoseconds: samples times the period.
    output = pprof("-top", "-nodefraction=0", "-sample_index=cpu", "-unit=ns", exported["cpu"])
    assert "Type: cpu" in output
    heavy_ns = int(re.search(r"(\d+)ns\s+\S+\s+heavy$", output, re.M).group(1))  # type: ignore[union-attr]
    assert heavy_ns == rows["heavy"][1] * cpu.period_ns


@needs_go
def test_pprof_top_matches_rsprof_top(split_cpu_profile: Path, leaky_heap_profile: Path,
                                      exported: dict[str, Path]) -> None:
    cpu_rows = top_rows(pprof("-top", "-nodefraction=0", exported["cpu"]))
    ours = {row["function"]: row for row in top_json(split_cpu_profile, "cpu")}
    for function in ("heavy", "light", "work", "spin", "other_busy", "late_worker"):
        assert cpu_rows[function] == (ours[function]["self"], ours[function]["total"]), function
    heap_rows = top_rows(pprof("-top", "-nodefraction=0", "-sample_index=inuse_space",
                               "-unit=B", exported["heap"]))
    # rsprof's rows are call sites (function and line: main has two, its pthread_create's
    # thread blocks and its printf buffer), pprof's are functions: add ours up by name.
    live: dict[str, int] = {}
    for row in top_json(leaky_heap_profile, "heap"):
        live[str(row["function"])] = live.get(str(row["function"]), 0) + int(row["live_bytes"])
    for function, live_bytes in live.items():
        # A site with nothing live (churn_site) has no row in pprof's inuse_space report.
        assert heap_rows.get(function, (0, 0))[0] == live_bytes, function


@needs_go
def test_pprof_top_heap(heap: SampleSet, exported: dict[str, Path]) -> None:
    path = exported["heap"]
    default = pprof("-top", "-nodefraction=0", "-unit=B", path)
    assert "Type: inuse_space" in default  # default_sample_type
    inuse = pprof("-top", "-nodefraction=0", "-sample_index=inuse_space", "-unit=B", path)
    rows = top_rows(inuse)
    assert rows == top_rows(default) == expected_rows(heap, 3)
    assert rows["leak_site"] == (LEAKY_TICKS * 4000, LEAKY_TICKS * 4000)
    assert rows["keep_site"][0] == 123457
    assert rows["thread_leak"][0] == LEAKY_TICKS * LEAKY_THREADS * 64
    assert "churn_site" not in rows  # allocated and freed: nothing in use
    alloc = top_rows(pprof("-top", "-nodefraction=0", "-sample_index=alloc_space", "-unit=B",
                           path))
    assert alloc == expected_rows(heap, 1)
    assert alloc["churn_site"][0] == LEAKY_TICKS * 777
    objects = top_rows(pprof("-top", "-nodefraction=0", "-sample_index=alloc_objects", path))
    assert objects["leak_site"][0] == objects["churn_site"][0] == LEAKY_TICKS


def trace_blocks(output: str) -> list[tuple[dict[str, str], int, list[str]]]:
    """`-traces` output as (labels, value, stack functions leaf first) per sample."""
    blocks = []
    for block in output.split("-----------+")[1:]:
        tags: dict[str, str] = {}
        value, stack = 0, list[str]()
        for line in block.splitlines()[1:]:
            if ":  " in line and not stack and not value:
                key, _, text = line.strip().partition(":  ")
                tags[key] = text.strip()
            elif line.strip():
                first, *rest = line.split(maxsplit=1)
                if not stack and first.lstrip("-").isdigit() and rest:
                    value, line = int(first), rest[0]
                stack.append(line.strip())
        if stack:
            blocks.append((tags, value, stack))
    return blocks


@needs_go
def test_pprof_traces(cpu: SampleSet, exported: dict[str, Path]) -> None:
    blocks = trace_blocks(pprof("-traces", exported["cpu"]))
    expected = [
        ({"thread": s.thread_name, "tid": str(s.tid)}, s.values[0],
         [ln.function + (" (inline)" if i < len(f.lines) - 1 else "")
          for f in s.frames for i, ln in enumerate(f.lines)])
        for s in cpu.samples
    ]
    key = repr
    assert sorted(blocks, key=key) == sorted(expected, key=key)
    heavy = [b for b in blocks if b[2][:3] == ["spin", "heavy", "work"]]
    assert heavy and all(tags["thread"] == "split-main" for tags, _, _ in heavy)


@needs_go
def test_pprof_tags_and_tagfocus(cpu: SampleSet, exported: dict[str, Path]) -> None:
    path = exported["cpu"]
    per_thread: Counter[str] = Counter()
    per_tid: Counter[int] = Counter()
    for sample in cpu.samples:
        per_thread[sample.thread_name] += sample.values[0]
        per_tid[sample.tid or 0] += sample.values[0]
    tags = pprof("-tags", path)
    # e.g. "  2324.0 (41.34%): split-busy" under "thread:", the same under "tid:" by number.
    shown = dict((name, float(value)) for value, name in
                 re.findall(r"^\s+([\d.]+) \([\d.]+%\): (\S+)$", tags, re.M))
    for name, count in per_thread.items():
        assert shown[name] == count, name
    for tid, count in per_tid.items():
        assert shown[str(tid)] == count, tid

    def focused(*args: str) -> int:
        text = pprof("-top", "-nodefraction=0", *args, path)
        return int(re.search(r"accounting for (-?\d+)", text).group(1))  # type: ignore[union-attr]

    for name in ("split-main", "split-busy", "split-late"):
        assert focused(f"-tagfocus=thread={name}") == per_thread[name], name
    tid, count = per_tid.most_common(1)[0]
    assert focused(f"-tagfocus=tid={tid}") == count
    assert focused("-tagignore=thread=split-late") == cpu.total(0) - per_thread["split-late"]
    late = top_rows(pprof("-top", "-tagfocus=thread=split-late", path))
    assert {"spin", "late_worker"} <= set(late)
    assert not {"heavy", "light", "work", "other_busy"} & set(late)


@needs_go
def test_pprof_diff_base(cpu: SampleSet, split_cpu_profile_1to1: Path,
                         exported: dict[str, Path]) -> None:
    base = load(split_cpu_profile_1to1, "cpu")
    # Our file with the base inside reads as pprof's own -diff_base of the two exports.
    ours = pprof("-top", "-nodefraction=0", exported["diff"])
    theirs = pprof("-top", "-nodefraction=0", f"-diff_base={exported['base']}", exported["cpu"])
    assert top_rows(ours) == top_rows(theirs)
    # Percentages are of the base, as pprof's diff reports do.
    assert f"of {base.total(0)} total" in ours
    rows = top_rows(ours)
    new, old = expected_rows(cpu, 0), expected_rows(base, 0)
    for function in rows:
        assert rows[function][1] == new.get(function, (0, 0))[1] - old.get(function, (0, 0))[1]
    # 3:1 against 1:1: heavy gained against light. (Compared with each other, not with 0:
    # on a loaded machine the second recording may simply get fewer samples.)
    assert rows["heavy"][1] > rows["light"][1]


# --- the same through the command line -----------------------------------------------------


def cli_export(profile: Path, kind: str, out: Path, *extra: str) -> Path:
    result = run_rsprof("export", str(profile), "--format", "pprof", "--kind", kind,
                        "-o", str(out), *extra)
    assert result.returncode == 0, result.stderr
    return out


def test_cli_export(tmp_path: Path, split_cpu_profile: Path, leaky_heap_profile: Path,
                    split_cpu_profile_1to1: Path, exported: dict[str, Path]) -> None:
    cpu = cli_export(split_cpu_profile, "cpu", tmp_path / "cpu.pb.gz")
    heap = cli_export(leaky_heap_profile, "heap", tmp_path / "heap.pb.gz")
    diff = cli_export(split_cpu_profile, "cpu", tmp_path / "diff.pb.gz",
                      "--diff-base", str(split_cpu_profile_1to1))
    for name, path in (("cpu", cpu), ("heap", heap), ("diff", diff)):
        assert parse(path) == parse(exported[name]), name
    if GO is not None:
        rows = top_rows(pprof("-top", "-nodefraction=0", "-sample_index=inuse_space", "-unit=B",
                              heap))
        assert rows["leak_site"][0] == LEAKY_TICKS * 4000
        assert 0.68 <= heavy_share(top_rows(pprof("-top", cpu))) <= 0.82



@needs_go
@pytest.mark.parametrize("filters", [
    ("--focus", "^heavy$"),
    ("--ignore", "heavy|other_busy"),
    ("--focus", "work", "--ignore", "light"),
    ("--hide", "^spin$"),
    ("--show", "^(heavy|light|work)$"),
    ("--focus", "split-main|work", "--hide", "libc"),
])
def test_filters_mean_what_pprof_means(split_cpu_profile: Path, exported: dict[str, Path],
                                       filters: tuple[str, ...]) -> None:
    """rsprof's filters on the profile == pprof's same-named options on our whole export."""
    # pprof names a function by its name alone; rsprof by name and module (the program's
    # `_start` and ld.so's are two rows): add those up, as pprof does. (The two are never in
    # one stack, so totals add too.)
    ours: dict[str, tuple[int, int]] = {}
    for r in top_json(split_cpu_profile, "cpu", *filters):
        flat, cum = ours.get(str(r["function"]), (0, 0))
        ours[str(r["function"])] = (flat + int(r["self"]), cum + int(r["total"]))
    pprof_flags = [f"-{flag.removeprefix('--')}={value}"
                   for flag, value in zip(filters[::2], filters[1::2], strict=True)]
    theirs = top_rows(pprof("-top", "-nodefraction=0", *pprof_flags, exported["cpu"]))
    assert ours == theirs


@needs_go
def test_line_granularity_matches_pprof_lines(split_cpu_profile: Path,
                                             exported: dict[str, Path]) -> None:
    rows = top_json(split_cpu_profile, "cpu", "--granularity", "lines")
    ours = {f"{r['function']} {r['file']}:{r['line']}": (r["self"], r["total"])
            for r in rows if str(r["file"]).endswith("split.c")}
    theirs = top_rows(pprof("-top", "-lines", "-nodefraction=0", exported["cpu"]))
    assert {"spin", "heavy", "light", "work", "main"} <= {name.split()[0] for name in ours}
    assert {name: theirs[name] for name in ours} == ours
