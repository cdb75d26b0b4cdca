"""Flame-graph exports (folded stacks, speedscope) of real recorded profiles, read back and
checked against what the targets are known to do."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_share, run_rsprof
from rsprof.storage.flame import write_folded, write_speedscope
from rsprof.storage.reader import Profile
from rsprof.storage.samples import SampleSet, load_samples

LEAK_BYTES = 60 * 4000  # leaky.c: leak_site() leaks 4000 B per tick, 60 ticks
KEEP_BYTES = 123457
# split.c: heavy() spins 3 units for each unit of light().
HEAVY_TO_LIGHT = 3.0


def _load(path: Path, kind: str) -> SampleSet:
    with Profile(path) as profile:
        return load_samples(profile, kind)


def _folded(samples: SampleSet, **options: Any) -> str:
    out = io.StringIO()
    write_folded(samples, out, **options)
    return out.getvalue()


def _speedscope(samples: SampleSet, **options: Any) -> dict[str, Any]:
    out = io.StringIO()
    write_speedscope(samples, out, **options)
    document: dict[str, Any] = json.loads(out.getvalue())
    return document


def parse_folded(text: str) -> list[tuple[list[str], int]]:
    """Reads folded stacks the way flamegraph.pl does: the count follows the last space."""
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        assert stack and count.isdigit(), f"not a folded line: {line!r}"
        stacks.append((stack.split(";"), int(count)))
    return stacks


def _weight_under(stacks: list[tuple[list[str], int]], function: str) -> int:
    return sum(count for frames, count in stacks if function in frames)


def _is_chain(frames: list[str], chain: list[str]) -> bool:
    """`chain` appears in `frames` as consecutive frames, in this order."""
    return any(frames[i:i + len(chain)] == chain for i in range(len(frames)))


@pytest.fixture(scope="module")
def cpu(split_cpu_profile: Path) -> SampleSet:
    return _load(split_cpu_profile, "cpu")


@pytest.fixture(scope="module")
def heap(leaky_heap_profile: Path) -> SampleSet:
    return _load(leaky_heap_profile, "heap")


# -- folded ------------------------------------------------------------------------------


def test_folded_cpu_split_and_total(cpu: SampleSet) -> None:
    text = _folded(cpu)
    stacks = parse_folded(text)
    assert sum(count for _, count in stacks) == cpu.total() > 0
    heavy, light = _weight_under(stacks, "heavy"), _weight_under(stacks, "light")
    assert_share(heavy, light, HEAVY_TO_LIGHT / (HEAVY_TO_LIGHT + 1))
    # Root first: main calls work calls heavy calls spin, never the reverse.
    assert any(_is_chain(frames, ["main", "work", "heavy", "spin"]) for frames, _ in stacks)
    assert not any(_is_chain(frames, ["spin", "heavy"]) for frames, _ in stacks)
    # One line per distinct stack, in a stable order.
    keys = [";".join(frames) for frames, _ in stacks]
    assert keys == sorted(set(keys))
    assert _folded(cpu) == text


def test_folded_value_index_scales_by_period(cpu: SampleSet) -> None:
    counts = dict((";".join(f), c) for f, c in parse_folded(_folded(cpu)))
    nanos = dict((";".join(f), c) for f, c in parse_folded(_folded(cpu, value_index=1)))
    assert nanos == {stack: count * cpu.period_ns for stack, count in counts.items()}


def test_folded_per_thread_roots(cpu: SampleSet) -> None:
    stacks = parse_folded(_folded(cpu, per_thread=True))
    assert sum(count for _, count in stacks) == cpu.total()
    threads = {s.thread_name: s.tid for s in cpu.samples}
    main_root = f"split-main ({threads['split-main']})"
    assert {"split-main", "split-busy", "split-late"} <= threads.keys()
    under_main = [(frames, count) for frames, count in stacks if frames[0] == main_root]
    assert _weight_under(under_main, "work") > 0
    assert _weight_under(under_main, "other_busy") == 0
    busy_root = f"split-busy ({threads['split-busy']})"
    assert _weight_under([s for s in stacks if s[0][0] == busy_root], "other_busy") > 0
    # Without per_thread, the same stacks merge across threads: fewer or equal lines.
    assert len(parse_folded(_folded(cpu))) <= len(stacks)


def test_folded_heap_inuse_is_exact(heap: SampleSet) -> None:
    inuse = heap.value_index("inuse_space")
    stacks = parse_folded(_folded(heap, value_index=inuse))
    assert _weight_under(stacks, "leak_site") == LEAK_BYTES
    assert _weight_under(stacks, "keep_site") == KEEP_BYTES
    # churn_site frees all it allocates: nothing in use, so no line at all.
    assert _weight_under(stacks, "churn_site") == 0
    assert sum(count for _, count in stacks) == heap.total(inuse)
    # Heap stacks end at the call site, not inside malloc or the shim.
    assert any(frames[-1] == "leak_site" for frames, _ in stacks)
    allocated = parse_folded(_folded(heap, value_index=heap.value_index("alloc_space")))
    assert _weight_under(allocated, "churn_site") == 60 * 777


def test_folded_escapes_separators(cpu: SampleSet) -> None:
    """Names with `;` or newlines cannot break the format; spaces survive."""
    from dataclasses import replace

    sample = cpu.samples[0]
    leaf = sample.frames[0]
    odd = replace(leaf.lines[0], function="ns::f<a;b>\n(int x)")
    frames = (replace(leaf, lines=(odd, *leaf.lines[1:])), *sample.frames[1:])
    weird = replace(cpu, samples=[replace(sample, frames=frames, values=[7, 7])])
    (stack, count), = parse_folded(_folded(weird))
    assert count == 7 and stack[-1] == "ns::f<a:b> (int x)"


# -- speedscope --------------------------------------------------------------------------

# The parts of https://www.speedscope.app/file-format-schema.json a sampled export uses.
SPEEDSCOPE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["$schema", "shared", "profiles"],
    "properties": {
        "$schema": {"const": "https://www.speedscope.app/file-format-schema.json"},
        "shared": {
            "type": "object",
            "required": ["frames"],
            "properties": {"frames": {"type": "array", "items": {
                "type": "object", "required": ["name"],
                "properties": {"name": {"type": "string"}, "file": {"type": "string"},
                               "line": {"type": "number"}, "col": {"type": "number"}},
            }}},
        },
        "profiles": {"type": "array", "items": {
            "type": "object",
            "required": ["type", "name", "unit", "startValue", "endValue", "samples", "weights"],
            "properties": {
                "type": {"const": "sampled"},
                "name": {"type": "string"},
                "unit": {"enum": ["none", "nanoseconds", "microseconds", "milliseconds",
                                  "seconds", "bytes"]},
                "startValue": {"type": "number"},
                "endValue": {"type": "number"},
                "samples": {"type": "array",
                            "items": {"type": "array", "items": {"type": "number"}}},
                "weights": {"type": "array", "items": {"type": "number"}},
            },
        }},
        "name": {"type": "string"},
        "activeProfileIndex": {"type": "number"},
        "exporter": {"type": "string"},
    },
}


def check_speedscope(document: dict[str, Any]) -> None:
    """Schema, plus what the schema cannot say: indices in range, one weight per sample,
    endValue not before startValue."""
    try:
        import jsonschema
    except ImportError:  # the hand checks below still apply
        jsonschema = None
    if jsonschema is not None:
        jsonschema.validate(document, SPEEDSCOPE_SCHEMA)
    assert document["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = document["shared"]["frames"]
    assert all(isinstance(frame["name"], str) and frame["name"] for frame in frames)
    for profile in document["profiles"]:
        assert profile["type"] == "sampled"
        assert len(profile["samples"]) == len(profile["weights"])
        assert all(weight > 0 for weight in profile["weights"])
        assert profile["endValue"] - profile["startValue"] == sum(profile["weights"])
        for stack in profile["samples"]:
            assert stack and all(0 <= i < len(frames) for i in stack)
    assert 0 <= document["activeProfileIndex"] < len(document["profiles"])


def _names(document: dict[str, Any], stack: list[int]) -> list[str]:
    return [document["shared"]["frames"][i]["name"] for i in stack]


def test_speedscope_cpu_profiles_per_thread(cpu: SampleSet) -> None:
    from rsprof import __version__

    document = _speedscope(cpu, name="split run")
    check_speedscope(document)
    assert document["name"] == "split run"
    assert document["exporter"] == f"rsprof@{__version__}"
    profiles = document["profiles"]
    threads = {s.tid: s.thread_name for s in cpu.samples}
    assert [p["name"] for p in profiles] == [p["name"] for p in sorted(
        profiles, key=lambda p: -sum(p["weights"]))]
    assert {p["name"] for p in profiles} == {f"{n} ({tid})" for tid, n in threads.items()}
    per_thread = {tid: sum(s.values[0] for s in cpu.samples if s.tid == tid) for tid in threads}
    for profile in profiles:
        tid = int(profile["name"].rsplit("(", 1)[1].rstrip(")"))
        assert sum(profile["weights"]) == per_thread[tid]
        assert profile["unit"] == "none"
    assert sum(sum(p["weights"]) for p in profiles) == cpu.total()

    main = next(p for p in profiles if p["name"].startswith("split-main ("))
    stacks = [(_names(document, s), w) for s, w in zip(main["samples"], main["weights"])]
    heavy, light = _weight_under(stacks, "heavy"), _weight_under(stacks, "light")
    assert_share(heavy, light, HEAVY_TO_LIGHT / (HEAVY_TO_LIGHT + 1))
    assert any(_is_chain(names, ["main", "work", "heavy", "spin"]) for names, _ in stacks)
    # Function-granular frames: one `spin` frame whatever line the samples hit.
    assert [f["name"] for f in document["shared"]["frames"]].count("spin") == 1
    spin = next(f for f in document["shared"]["frames"] if f["name"] == "spin")
    assert spin["file"].endswith("split.c") and spin["line"] > 0


def test_speedscope_cpu_nanoseconds(cpu: SampleSet) -> None:
    document = _speedscope(cpu, value_index=cpu.value_index("cpu"))
    check_speedscope(document)
    assert {p["unit"] for p in document["profiles"]} == {"nanoseconds"}
    total = sum(sum(p["weights"]) for p in document["profiles"])
    assert total == cpu.total() * cpu.period_ns


def test_speedscope_heap_single_profile(heap: SampleSet) -> None:
    document = _speedscope(heap)
    check_speedscope(document)
    (profile,) = document["profiles"]
    assert profile["unit"] == "bytes"
    assert "inuse_space" in profile["name"]
    stacks = [(_names(document, s), w) for s, w in zip(profile["samples"], profile["weights"])]
    assert _weight_under(stacks, "leak_site") == LEAK_BYTES
    assert _weight_under(stacks, "keep_site") == KEEP_BYTES
    assert sum(profile["weights"]) == heap.total()
    counts = _speedscope(heap, value_index=heap.value_index("inuse_objects"))
    assert counts["profiles"][0]["unit"] == "none"


# -- command line ------------------------------------------------------------------------


def _export_available() -> bool:
    return run_rsprof("export", "--help").returncode == 0


@pytest.fixture(scope="module")
def cli() -> None:
    if not _export_available():
        pytest.skip("`rsprof export` is not in the installed package yet")


@pytest.mark.usefixtures("cli")
def test_cli_folded_to_stdout_matches_library(split_cpu_profile: Path, cpu: SampleSet) -> None:
    result = run_rsprof("export", str(split_cpu_profile), "--format", "folded", "-o", "-")
    assert result.returncode == 0, result.stderr
    assert result.stdout == _folded(cpu)


@pytest.mark.usefixtures("cli")
def test_cli_heap_folded_sample_index(leaky_heap_profile: Path, tmp_path: Path) -> None:
    out = tmp_path / "heap.folded"
    result = run_rsprof("export", str(leaky_heap_profile), "--format", "folded", "--kind",
                        "heap", "--sample-index", "inuse_space", "-o", str(out))
    assert result.returncode == 0, result.stderr
    stacks = parse_folded(out.read_text())
    assert _weight_under(stacks, "leak_site") == LEAK_BYTES


@pytest.mark.usefixtures("cli")
def test_cli_speedscope_file(split_cpu_profile: Path, tmp_path: Path) -> None:
    out = tmp_path / "split.speedscope.json"
    result = run_rsprof("export", str(split_cpu_profile), "--format", "speedscope",
                        "-o", str(out))
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    check_speedscope(document)
    assert any(p["name"].startswith("split-main (") for p in document["profiles"])


@pytest.mark.usefixtures("cli")
def test_cli_unknown_sample_index_is_usage_error(split_cpu_profile: Path) -> None:
    result = run_rsprof("export", str(split_cpu_profile), "--format", "folded",
                        "--sample-index", "inuse_space", "-o", "-")
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "inuse_space" in result.stderr


@pytest.mark.usefixtures("cli")
def test_cli_folded_per_thread_and_focus(split_cpu_profile: Path) -> None:
    result = run_rsprof("export", str(split_cpu_profile), "-f", "folded", "--per-thread",
                        "--focus", "^heavy$", "-o", "-")
    assert result.returncode == 0, result.stderr
    stacks = parse_folded(result.stdout)
    assert stacks and all("heavy" in frames for frames, _ in stacks)
    assert {frames[0].rsplit(" (", 1)[0] for frames, _ in stacks} == {"split-main"}
