"""The Firefox Profiler export (`rsprof export -f firefox`) of real recorded profiles.

Two oracles. The structure fxprof-processed-profile 0.8 (samply's writer) serializes:
the same keys in every object and table, every column `length` long, every index in
range, `preprocessedProfileVersion` 66 and `meta.version` 24. And, when it is installed
(`npm install @firefox-devtools/profiler-cli`; found on PATH or by RSPROF_PROFILER_CLI),
the Firefox Profiler's own loading code: profiler-cli is the profiler's processing and
upgrading code bundled for node, and must load the file and count per thread the samples
rsprof recorded. The numbers themselves are checked against the profile's SQLite tables.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import run_rsprof
from rsprof.storage.firefox import breakpad_id, frame_category, write_firefox
from rsprof.storage.samples import CPU_SAMPLE_TYPES, Frame, Line, Sample, SampleSet
from test_export_flame import parse_folded

LEAK_BYTES = 60 * 4000  # leaky.c: leak_site() leaks 4000 B per tick, 60 ticks

# What fxprof-processed-profile 0.8 (samply) writes: the keys of each object, the columns
# of each table (besides `length`).
TOP_KEYS = {"meta", "libs", "shared", "threads", "pages", "profilerOverhead", "counters"}
META_KEYS = {"categories", "debug", "extensions", "interval", "preprocessedProfileVersion",
             "processType", "product", "oscpu", "sampleUnits", "startTime", "symbolicated",
             "pausedRanges", "version", "usesOnlyOneStackType", "sourceCodeIsNotOnSearchfox",
             "markerSchema"}
LIB_KEYS = {"name", "path", "debugName", "debugPath", "breakpadId", "codeId", "arch"}
THREAD_KEYS = {"name", "isMainThread", "pausedRanges", "pid", "processName",
               "processShutdownTime", "processStartupTime", "processType", "registerTime",
               "tid", "unregisterTime", "showMarkersInTimeline", "samples", "markers"}
SHARED_TABLES = {
    "stackTable": {"frame", "prefixOffset"},
    "frameTable": {"address", "category", "column", "func", "inlineDepth", "innerWindowID",
                   "line", "nativeSymbol", "originalLocation", "subcategory"},
    "funcTable": {"columnNumber", "isJS", "lineNumber", "name", "originalLocation",
                  "relevantForJS", "resource", "source"},
    "nativeSymbols": {"address", "functionSize", "libIndex", "name"},
    "resourceTable": {"host", "lib", "name", "type"},
    "sources": {"content", "filename", "id", "sourceMapURL", "startColumn", "startLine"},
    "sourceLocationTable": {"column", "line", "source"},
}
SAMPLE_COLUMNS = {"stack", "timeDeltas", "weight", "threadCPUDelta"}
MARKER_COLUMNS = {"category", "data", "endTime", "name", "phase", "startTime"}


def _table(table: dict[str, Any], columns: set[str], *scalars: str) -> int:
    assert set(table) == columns | {"length", *scalars}, sorted(table)
    length = table["length"]
    for column in columns:
        assert len(table[column]) == length, column
    return int(length)


def validate(profile: dict[str, Any]) -> None:
    """Fails unless `profile` has the shape fxprof-processed-profile serializes."""
    assert set(profile) == TOP_KEYS
    meta = profile["meta"]
    assert set(meta) == META_KEYS
    assert meta["preprocessedProfileVersion"] == 66 and meta["version"] == 24
    assert meta["sampleUnits"] == {"time": "ms", "eventDelay": "ms", "threadCPUDelta": "µs"}
    categories = meta["categories"]
    assert any(category["color"] == "grey" for category in categories)  # the default
    for category in categories:
        assert set(category) == {"name", "color", "subcategories"} and category["subcategories"]
    _table(meta["extensions"], {"baseURL", "id", "name"})
    for lib in profile["libs"]:
        assert set(lib) == LIB_KEYS
        assert len(lib["breakpadId"]) == 33
    shared = profile["shared"]
    assert set(shared) == {*SHARED_TABLES, "stringArray"}
    lengths = {name: _table(shared[name], columns) for name, columns in SHARED_TABLES.items()}
    strings = len(shared["stringArray"])
    assert all(isinstance(text, str) for text in shared["stringArray"])

    def within(values: list[Any], bound: int, *, optional: bool = False,
               none: int | None = None) -> None:
        for value in values:
            if (optional and value is None) or (none is not None and value == none):
                continue
            assert isinstance(value, int) and 0 <= value < bound, (value, bound)

    stacks, frames = shared["stackTable"], shared["frameTable"]
    within(stacks["frame"], lengths["frameTable"])
    for i, offset in enumerate(stacks["prefixOffset"]):
        assert 0 <= offset <= i  # 0: a root; else the prefix is stacks[i - offset]
    within(frames["func"], lengths["funcTable"])
    within(frames["category"], len(categories))
    within(frames["nativeSymbol"], lengths["nativeSymbols"], optional=True)
    within(frames["line"], 2**31, optional=True)
    funcs = shared["funcTable"]
    within(funcs["name"], strings)
    within(funcs["resource"], lengths["resourceTable"], none=-1)
    within(funcs["source"], lengths["sources"], optional=True)
    resources = shared["resourceTable"]
    within(resources["lib"], len(profile["libs"]))
    within(resources["name"], strings)
    within(shared["sources"]["filename"], strings)
    for thread in profile["threads"]:
        assert set(thread) == THREAD_KEYS
        assert isinstance(thread["tid"], str) and isinstance(thread["pid"], str)
        samples = thread["samples"]
        _table(samples, SAMPLE_COLUMNS, "weightType")
        assert samples["weightType"] in ("samples", "tracing-ms", "bytes")
        within(samples["stack"], lengths["stackTable"], optional=True)
        assert all(delta >= 0 for delta in samples["timeDeltas"])  # sorted by time
        _table(thread["markers"], MARKER_COLUMNS)


def _export(profile: Path, out: Path, *options: str) -> dict[str, Any]:
    result = run_rsprof("export", str(profile), "-f", "firefox", "-o", str(out), *options)
    assert result.returncode == 0, result.stderr
    opener = gzip.open if out.name.endswith(".gz") else open
    with opener(out, "rt", encoding="utf-8") as stream:
        document: dict[str, Any] = json.load(stream)
    validate(document)
    return document


def _stack_names(document: dict[str, Any], stack: int) -> list[str]:
    """Function names of a stack, root first."""
    shared = document["shared"]
    names = []
    index: int | None = stack
    while index is not None:
        frame = shared["stackTable"]["frame"][index]
        func = shared["frameTable"]["func"][frame]
        names.append(shared["stringArray"][shared["funcTable"]["name"][func]])
        offset = shared["stackTable"]["prefixOffset"][index]
        index = index - offset if offset else None
    return names[::-1]


def _times(document: dict[str, Any], thread: dict[str, Any]) -> list[float]:
    """Absolute Unix ms of each sample."""
    times, now = [], float(document["meta"]["startTime"])
    for delta in thread["samples"]["timeDeltas"]:
        now += delta
        times.append(now)
    return times


def _db(profile: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{profile}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_cpu_threads_and_weights(split_cpu_profile: Path, tmp_path: Path) -> None:
    document = _export(split_cpu_profile, tmp_path / "cpu.json")
    recorded = dict(_db(split_cpu_profile, "SELECT tid, SUM(count) FROM cpu_stack_samples"
                                           " GROUP BY tid"))
    names = dict(_db(split_cpu_profile, "SELECT tid, name FROM threads"))
    meta = dict(_db(split_cpu_profile, "SELECT key, value FROM meta"))
    threads = document["threads"]
    assert {int(t["tid"]): sum(t["samples"]["weight"]) for t in threads} == recorded
    for thread in threads:
        assert thread["name"] == names[int(thread["tid"])]
        assert thread["pid"] == meta["pid"] and thread["processName"] == meta["process_name"]
        assert thread["isMainThread"] == (thread["tid"] == meta["pid"])
        assert thread["samples"]["weightType"] == "samples"
        period_us = 1_000_000 // int(meta["cpu_freq_hz"])
        assert set(thread["samples"]["threadCPUDelta"]) == {period_us}
    assert threads[0]["isMainThread"]
    assert {t["name"] for t in threads} == {"split-main", "split-busy", "split-late"}
    assert document["meta"]["startTime"] == int(meta["start_time_ms"])
    assert document["meta"]["interval"] == pytest.approx(1000 / int(meta["cpu_freq_hz"]))
    assert document["meta"]["product"] == meta["process_name"]


def test_samples_lie_in_their_checkpoint(split_cpu_profile: Path, tmp_path: Path) -> None:
    """Each sample is inside the interval of the checkpoint that counted it, as many per
    checkpoint and thread as the recorder stored."""
    document = _export(split_cpu_profile, tmp_path / "cpu.json")
    meta = dict(_db(split_cpu_profile, "SELECT key, value FROM meta"))
    ends = _db(split_cpu_profile, "SELECT id, timestamp_ms FROM checkpoints ORDER BY id")
    intervals, previous = [], int(meta["start_time_ms"])
    for checkpoint_id, end in ends:
        intervals.append((checkpoint_id, previous, end))
        previous = end
    recorded = Counter({(tid, cid): count for tid, cid, count in _db(
        split_cpu_profile, "SELECT tid, checkpoint_id, SUM(count) FROM cpu_stack_samples"
                           " GROUP BY tid, checkpoint_id")})
    found: Counter[tuple[int, int]] = Counter()
    for thread in document["threads"]:
        for when in _times(document, thread):
            checkpoint = next(cid for cid, start, end in intervals
                              if start - 0.001 <= when <= end + 0.001)
            found[(int(thread["tid"]), checkpoint)] += 1
    assert found == recorded
    # split-late starts 1 s in: its first sample is not in the first checkpoint.
    late = next(t for t in document["threads"] if t["name"] == "split-late")
    assert _times(document, late)[0] - int(meta["start_time_ms"]) > 500


def test_stacks_equal_folded_per_thread(split_cpu_profile: Path, tmp_path: Path) -> None:
    document = _export(split_cpu_profile, tmp_path / "cpu.json")
    found: Counter[tuple[str, ...]] = Counter()
    for thread in document["threads"]:
        label = f"{thread['name']} ({thread['tid']})"
        for stack, weight in zip(thread["samples"]["stack"], thread["samples"]["weight"]):
            found[(label, *_stack_names(document, stack))] += weight
    result = run_rsprof("export", str(split_cpu_profile), "-f", "folded", "--per-thread",
                        "-o", "-")
    wanted: Counter[tuple[str, ...]] = Counter()
    for frames, count in parse_folded(result.stdout):
        wanted[tuple(frames)] += count
    assert found == wanted


def test_categories_and_libraries(split_cpu_profile: Path, tmp_path: Path) -> None:
    document = _export(split_cpu_profile, tmp_path / "cpu.json")
    shared = document["shared"]
    categories = [c["name"] for c in document["meta"]["categories"]]
    assert categories[:4] == ["Other", "User", "Kernel", "Python"]
    strings, funcs, frames = shared["stringArray"], shared["funcTable"], shared["frameTable"]
    by_name: dict[str, set[str]] = {}
    for func, category in zip(frames["func"], frames["category"]):
        name = strings[funcs["name"][func]]
        by_name.setdefault(name, set()).add(categories[category])
    assert by_name["spin"] == {"User"} and by_name["heavy"] == {"User"}
    if "[kernel]" in by_name:
        assert by_name["[kernel]"] == {"Kernel"}
    libs = {lib["name"]: lib for lib in document["libs"]}
    assert "libc.so.6" in libs and any(name.startswith("split") for name in libs)
    resource_of = {strings[funcs["name"][i]]: funcs["resource"][i]
                   for i in range(funcs["length"])}
    lib_of_spin = shared["resourceTable"]["lib"][resource_of["spin"]]
    assert document["libs"][lib_of_spin]["name"].startswith("split")
    source_of_spin = funcs["source"][funcs["name"].index(strings.index("spin"))]
    assert strings[shared["sources"]["filename"][source_of_spin]].endswith("split.c")
    for lib in document["libs"]:
        if lib["codeId"]:
            assert lib["breakpadId"] == breakpad_id(lib["codeId"])


def test_breakpad_id_from_build_id() -> None:
    # The pair in fxprof-processed-profile's own test snapshot (profile_without_js).
    assert breakpad_id("510d0a5c19eadf8043f203b4525be9be3dcb9554") == \
        "5C0A0D51EA1980DF43F203B4525BE9BE0"
    assert breakpad_id("") == "0" * 33


def test_python_and_kernel_frames_categorized() -> None:
    python = Frame(1, (0xFFFE << 48) | 5, "/app/main.py", 0, None,
                   (Line(1, "handler", "handler", "/app/main.py", 12),))
    kernel = Frame(2, 1, "", 0, None, (Line(2, "[kernel]", "[kernel]", "", 0),))
    native = Frame(3, 0x401000, "/usr/bin/app", 0x1000, None,
                   (Line(3, "main", "main", "main.c", 4),))
    unknown = Frame(4, 0x7000, "", 0, None, (Line(4, "0x7000", "0x7000", "", 0),))
    categories = [frame_category(f) for f in (python, kernel, native, unknown)]
    assert categories == [3, 2, 1, 0]  # Python, Kernel, User, Other
    samples = SampleSet("cpu", CPU_SAMPLE_TYPES, 0,
                        [Sample((kernel, python, native), [3, 30], 7, "main", pid=7,
                                interval_ms=(1000, 1010))],
                        1000, 1010, period_ns=10, meta={"pid": "7", "start_time_ms": "1000"},
                        process_names={7: "app"})
    out = io.StringIO()
    write_firefox(samples, out)
    document = json.loads(out.getvalue())
    validate(document)
    thread = document["threads"][0]
    assert thread["samples"]["timeDeltas"] == pytest.approx([10 / 6, 10 / 3, 10 / 3], abs=1e-3)
    funcs = document["shared"]["funcTable"]
    python_func = document["shared"]["stringArray"].index("handler")
    assert funcs["resource"][funcs["name"].index(python_func)] == -1  # a file, not a library


@pytest.mark.parametrize("options", [
    ("--since", "1s", "--until", "2s"),
    ("--focus", "heavy"),
    ("--hide", "spin"),
])
def test_options_select_as_folded(split_cpu_profile: Path, tmp_path: Path,
                                  options: tuple[str, ...]) -> None:
    document = _export(split_cpu_profile, tmp_path / "cpu.json", *options)
    result = run_rsprof("export", str(split_cpu_profile), "-f", "folded", "-o", "-", *options)
    wanted: Counter[tuple[str, ...]] = Counter()
    for frames, count in parse_folded(result.stdout):
        wanted[tuple(frames)] += count
    found: Counter[tuple[str, ...]] = Counter()
    for thread in document["threads"]:
        for stack, weight in zip(thread["samples"]["stack"], thread["samples"]["weight"]):
            found[tuple(_stack_names(document, stack))] += weight
    assert found == wanted and sum(found.values()) > 0
    if options[0] == "--since":
        start = document["meta"]["startTime"]
        for thread in document["threads"]:
            times = _times(document, thread)
            assert 700 <= times[0] - start and times[-1] - start <= 2300


def test_tid_and_gzip(split_cpu_profile: Path, tmp_path: Path) -> None:
    whole = _export(split_cpu_profile, tmp_path / "cpu.json")
    main = next(t for t in whole["threads"] if t["name"] == "split-main")
    packed = tmp_path / "main.json.gz"
    document = _export(split_cpu_profile, packed, "--tid", main["tid"])
    assert packed.read_bytes()[:2] == b"\x1f\x8b"
    assert [t["tid"] for t in document["threads"]] == [main["tid"]]
    assert document["threads"][0]["samples"]["weight"] == main["samples"]["weight"]
    assert document["threads"][0]["samples"]["timeDeltas"] == main["samples"]["timeDeltas"]


def test_heap_weighted_by_bytes(leaky_heap_profile: Path, tmp_path: Path) -> None:
    document = _export(leaky_heap_profile, tmp_path / "heap.json", "--kind", "heap")
    [thread] = document["threads"]
    samples = thread["samples"]
    assert samples["weightType"] == "bytes" and thread["name"] == "heap inuse_space"
    result = run_rsprof("export", str(leaky_heap_profile), "-f", "folded", "--kind", "heap",
                        "-o", "-")
    folded = parse_folded(result.stdout)
    assert sum(samples["weight"]) == sum(count for _, count in folded)
    leak = sum(weight for stack, weight in zip(samples["stack"], samples["weight"])
               if "leak_site" in _stack_names(document, stack))
    assert leak == LEAK_BYTES
    objects = _export(leaky_heap_profile, tmp_path / "objects.json", "--kind", "heap",
                      "--sample-index", "alloc_objects")
    assert objects["threads"][0]["samples"]["weightType"] == "samples"


# -- the Firefox Profiler's own loader ---------------------------------------------------


def _profiler_cli() -> list[str] | None:
    given = os.environ.get("RSPROF_PROFILER_CLI") or shutil.which("profiler-cli")
    if not given:
        return None
    node = shutil.which("node")
    return [node, given] if given.endswith(".js") and node else [given]


PROFILER_CLI = _profiler_cli()
needs_profiler_cli = pytest.mark.skipif(
    PROFILER_CLI is None,
    reason="profiler-cli not installed (npm install -g @firefox-devtools/profiler-cli)")


class _Session:
    """A profiler-cli daemon session of its own (sessions in a temporary folder)."""

    def __init__(self, folder: Path, name: str) -> None:
        assert PROFILER_CLI is not None
        self.command = [*PROFILER_CLI]
        self.name = name
        self.env = {**os.environ, "PROFILER_CLI_SESSION_DIR": str(folder),
                    "PROFILER_CLI_NO_SYMBOLICATE": "1"}

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*self.command, *args, "--session", self.name],
                                capture_output=True, text=True, timeout=180, env=self.env)
        assert result.returncode == 0 or not check, result.stdout + result.stderr
        return result

    def load(self, path: Path) -> None:
        result = self.run("load", str(path), check=False)
        if result.returncode != 0:
            # On a loaded machine the daemon can take longer to start than the client waits
            # (500 ms); it goes on loading, and answers once it has.
            assert "did not become ready" in result.stderr + result.stdout, result.stderr
            deadline = time.monotonic() + 120
            while self.run("status", check=False).returncode != 0:
                assert time.monotonic() < deadline, "profiler-cli never loaded the profile"
                time.sleep(1)

    def json(self, *args: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.run(*args, "--json").stdout)
        return found

    def stop(self) -> None:
        subprocess.run([*self.command, "stop", self.name], capture_output=True, timeout=60,
                       env=self.env)


@needs_profiler_cli
def test_firefox_profiler_loads_cpu(split_cpu_profile: Path, tmp_path: Path) -> None:
    out = tmp_path / "cpu.json.gz"
    _export(split_cpu_profile, out)
    recorded = dict(_db(split_cpu_profile, "SELECT tid, SUM(count) FROM cpu_stack_samples"
                                           " GROUP BY tid"))
    session = _Session(tmp_path / "sessions", "cpu")
    try:
        session.load(out)
        threads = session.json("thread", "list")["threads"]
        assert {int(t["tid"]) for t in threads} == set(recorded)
        for thread in threads:
            samples = session.json("thread", "samples", "--thread", thread["threadHandle"])
            assert samples["weightType"] == "samples"
            assert samples["categoryBreakdown"]["totalSamples"] == recorded[int(thread["tid"])]
            if thread["name"] == "split-main":
                totals = {f["name"].split("!")[-1]: f["totalSamples"]
                          for f in samples["topFunctionsByTotal"]}
                assert totals["heavy"] > totals["light"] > 0
    finally:
        session.stop()


@needs_profiler_cli
def test_firefox_profiler_loads_heap(leaky_heap_profile: Path, tmp_path: Path) -> None:
    out = tmp_path / "heap.json"
    _export(leaky_heap_profile, out, "--kind", "heap")
    session = _Session(tmp_path / "sessions", "heap")
    try:
        session.load(out)
        samples = session.json("thread", "samples")
        assert samples["weightType"] == "bytes"
        totals = {f["name"].split("!")[-1]: f["totalSamples"]
                  for f in samples["topFunctionsByTotal"]}
        assert totals["leak_site"] == LEAK_BYTES
    finally:
        session.stop()


def test_python_functions_in_both_exports(tmp_path: Path) -> None:
    """A CPython program: its Python functions are frames of category Python with their
    file and line and no library, in the Firefox export, and blue (category 1) boxes in the
    HTML flame graph."""
    from conftest import python_binary

    script = Path(__file__).parent.parent / "targets" / "pysplit.py"
    profile = tmp_path / "py.db"
    result = run_rsprof("run", "-q", "--no-heap", "--cpu-freq", "499", "-i", "250ms", "-o",
                        str(profile), "--", str(python_binary("debian-3.11")), str(script),
                        "1", timeout=120)
    assert result.returncode == 0, result.stderr
    document = _export(profile, tmp_path / "py.json")
    shared = document["shared"]
    strings, funcs, frames = shared["stringArray"], shared["funcTable"], shared["frameTable"]
    categories = [c["name"] for c in document["meta"]["categories"]]
    in_script: dict[str, set[tuple[str, bool, int]]] = {}
    for func, category, line in zip(frames["func"], frames["category"], frames["line"]):
        source = funcs["source"][func]
        if source is not None and strings[shared["sources"]["filename"][source]] == str(script):
            in_script.setdefault(strings[funcs["name"][func]], set()).add(
                (categories[category], bool(line and line > 0), funcs["resource"][func]))
    assert {"heavy", "light", "main", "<module>"} <= set(in_script)
    assert set().union(*in_script.values()) == {("Python", True, -1)}
    html = run_rsprof("export", str(profile), "-f", "html", "-o", str(tmp_path / "py.html"))
    assert html.returncode == 0, html.stderr
    text = (tmp_path / "py.html").read_text(encoding="utf-8")
    data = json.loads(text.split('id="rsprof-data">', 1)[1].split("</script>", 1)[0])
    nodes, names = data["nodes"], data["strings"]
    python_categories = {nodes["category"][i] for i in range(len(nodes["parent"]))
                         if names[nodes["file"][i]] == str(script)}
    assert python_categories == {1}
