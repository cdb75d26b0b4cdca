"""Python frames read from outside a running CPython (PyFrameReader): the offsets table
against each installed version's own headers, then real interpreters read while they run."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import BUILD_DIR, assert_share
from rsprof.collector.pyframes import LAYOUTS, find_runtime, open_reader, split_python

from rsprof._native import PyFrameReader

TARGETS = Path(__file__).parent.parent / "targets"
SCRIPT = TARGETS / "pysplit.py"
PYENV = Path.home() / ".pyenv/versions"

# (interpreter, prefix holding include/python3.X); Debian's python3 is 3.11.
PYTHONS = {
    "debian-3.11": (Path("/usr/bin/python3.11"), Path("/usr")),
    "pyenv-3.11": (PYENV / "3.11.7/bin/python3.11", PYENV / "3.11.7"),
    "pyenv-3.12": (PYENV / "3.12.1/bin/python3.12", PYENV / "3.12.1"),
    "pyenv-3.13": (PYENV / "3.13.0/bin/python3.13", PYENV / "3.13.0"),
}


def _python(name: str) -> Path:
    binary = PYTHONS[name][0]
    if not binary.exists():
        pytest.skip(f"{binary} is not installed")
    return binary


def _version(binary: Path) -> str:
    return subprocess.run([str(binary), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("name", sorted(PYTHONS))
def test_offsets_table_matches_the_headers(name: str) -> None:
    """tests/targets/pyoffsets.c compiled against the version's internal headers prints the
    offsets the reader must use; the shipped table must say the same."""
    binary, prefix = PYTHONS[name]
    if not binary.exists():
        pytest.skip(f"{binary} is not installed")
    version = _version(binary)
    include = prefix / "include" / f"python{version}"
    if not (include / "internal" / "pycore_frame.h").exists():
        pytest.skip(f"no internal headers in {include} (python{version}-dev)")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    exe = BUILD_DIR / f"pyoffsets-{name}"
    subprocess.run(["gcc", f"-I{include}", f"-I{include}/internal", "-o", str(exe),
                    str(TARGETS / "pyoffsets.c")], check=True)
    printed = json.loads(subprocess.run([str(exe)], capture_output=True, text=True,
                                        check=True).stdout)
    major, minor = map(int, version.split("."))
    assert LAYOUTS[(major, minor)] == printed


def _start(binary: Path, *args: str,
           script: Path = SCRIPT) -> tuple[subprocess.Popen[str], list[int]]:
    """`binary script *args`, once it printed `ready [TID ...]`: the process and the tids."""
    proc = subprocess.Popen([str(binary), str(script), *args], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not (line and line[0] == "ready"):
        _stop(proc)
    assert line and line[0] == "ready", line
    return proc, [int(tid) for tid in line[1:]]


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()


def _def_lines(source: list[str]) -> dict[str, range]:
    """1-based lines of each top-level function: its def line to its last body line."""
    starts = [(i + 1, line.split("(")[0][4:]) for i, line in enumerate(source)
              if line.startswith("def ")]
    ends = [start for start, _ in starts[1:]] + [len(source) + 1]
    spans = {}
    for (start, name), end in zip(starts, ends):
        last = max(i for i in range(start, end) if source[i - 1].strip())
        spans[name] = range(start, last + 1)
    return spans


SOURCE = SCRIPT.read_text().splitlines()
SPANS = _def_lines(SOURCE)
FIRST_LINES = {name: span.start for name, span in SPANS.items()} | {"<module>": 1}
BODIES = {name: range(span.start + 1, span.stop) for name, span in SPANS.items()}
MODULE_LINE = next(i + 1 for i, line in enumerate(SOURCE) if line.strip() == "main(seconds)")


@pytest.mark.parametrize("name", ["debian-3.11", "pyenv-3.12", "pyenv-3.13"])
def test_reader_sees_the_python_stack_and_the_split(name: str) -> None:
    binary = _python(name)
    proc, _ = _start(binary, "30")
    try:
        runtime = find_runtime(proc.pid)
        assert runtime is not None and runtime.supported, runtime
        assert ".".join(map(str, runtime.version[:2])) == _version(binary)
        reader = open_reader(proc.pid)
        assert reader is not None
        assert reader.threads() == [proc.pid]
        chains: Counter[tuple[str, ...]] = Counter()
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            frames = reader.frames(proc.pid)
            if frames is None:
                continue
            for frame in frames:
                assert frame.file == str(SCRIPT), frame
                assert frame.first_line == FIRST_LINES[frame.function], frame
                if frame.function in BODIES:
                    # A frame just pushed is at its RESUME, which CPython puts on the def line.
                    assert (frame.line in BODIES[frame.function]
                            or frame.line == frame.first_line), frame
                else:
                    assert frame.line == MODULE_LINE, frame  # <module> waits in main(seconds)
            chains[tuple(frame.function for frame in frames)] += 1
            # Python-to-Python calls run inside the evaluator call that runs <module>.
            assert [frame.entry for frame in frames] == [False] * (len(frames) - 1) + [True]
            time.sleep(0.001)
        expected = {("heavy", "main", "<module>"), ("light", "main", "<module>"),
                    ("main", "<module>")}  # main itself, e.g. calling time.monotonic
        assert set(chains) <= expected, chains
        heavy = chains[("heavy", "main", "<module>")]
        light = chains[("light", "main", "<module>")]
        assert_share(heavy, light, 0.75, floor=0.08)
        # Races with the running target are dropped and counted, rarely.
        assert reader.dropped <= 0.1 * reader.walks, (reader.dropped, reader.walks)
        assert reader.frames(1) is None  # no such thread in the interpreter
    finally:
        _stop(proc)


@pytest.mark.parametrize("name", ["debian-3.11", "pyenv-3.13"])
def test_each_thread_has_its_own_frames(name: str) -> None:
    proc, workers = _start(_python(name), "30", "threads")
    try:
        reader = open_reader(proc.pid)
        assert reader is not None
        assert sorted(reader.threads()) == sorted([proc.pid, *workers])
        heavy_tid, light_tid = workers
        seen: dict[int, Counter[str]] = {heavy_tid: Counter(), light_tid: Counter()}
        for _ in range(300):
            for tid in workers:
                frames = reader.frames(tid)
                if frames:
                    seen[tid][frames[0].function] += 1
                    assert frames[-1].function == "Thread._bootstrap"
                    assert "Thread.run" in [frame.function for frame in frames]
                    assert frames[-1].file.endswith("threading.py")
        assert set(seen[heavy_tid]) <= {"heavy", "spin"} and seen[heavy_tid]["heavy"] > 0, seen
        assert set(seen[light_tid]) <= {"light", "spin"} and seen[light_tid]["light"] > 0, seen
        main = reader.frames(proc.pid)  # joining: main waits in <module>
        assert main is not None and main[-1].function == "<module>", main
    finally:
        _stop(proc)


def test_garbage_layouts_and_addresses_never_crash() -> None:
    """Wrong offsets or addresses make the reader follow garbage pointers through a live
    process: it must answer None or some list, never crash or loop, and stay bounded."""
    proc, _ = _start(Path(sys.executable) if sys.version_info[:2] in LAYOUTS
                     else _python("debian-3.11"), "30")
    try:
        runtime = find_runtime(proc.pid)
        assert runtime is not None
        good = LAYOUTS[runtime.version[:2]]
        rng = random.Random(14)
        started = time.monotonic()
        for trial in range(300):
            offsets = dict(good)
            for key in rng.sample(sorted(offsets), rng.randint(1, 4)):
                if offsets[key] >= 0:
                    offsets[key] = rng.choice([0, 8, 16, 24, offsets[key] + 8, offsets[key] - 8])
            address = runtime.runtime if trial % 3 else rng.randrange(1 << 47)
            try:
                reader = PyFrameReader(proc.pid, address, runtime.code_type,
                                       runtime.unicode_type, offsets)
            except ValueError:
                continue  # refused as inconsistent: fine
            result = reader.frames(proc.pid)
            assert result is None or isinstance(result, list)
            reader.threads()
        assert time.monotonic() - started < 10
    finally:
        _stop(proc)
    with pytest.raises(ValueError):
        PyFrameReader(proc.pid, 1, 1, 1, {"frame_code": 0})


def test_not_python_and_gone_processes() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert find_runtime(sleeper.pid) is None
        assert open_reader(sleeper.pid) is None
    finally:
        sleeper.kill()
        sleeper.wait()
    proc, _ = _start(_python("debian-3.11"), "30")
    reader = open_reader(proc.pid)
    assert reader is not None
    _stop(proc)
    with pytest.raises(ProcessLookupError):
        reader.frames(proc.pid)
    with pytest.raises(OSError):
        open_reader(proc.pid)
    assert os.path.exists(SCRIPT)


@pytest.mark.parametrize("name", ["debian-3.11", "pyenv-3.13"])
def test_a_launched_interpreter_is_read_before_it_starts_and_found_without_parsing(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rsprof run` looks at the program before starting it (program_runs_python): the
    interpreter in it, or the libpython it links (its RUNPATH, as ld.so finds it), is
    parsed then, so that finding it in the running process (through /proc/PID/root, another
    path to the same file) parses nothing: samples taken before it is found get no Python
    frames."""
    from rsprof.collector import pyframes

    monkeypatch.setattr(pyframes, "_ELF_PYTHONS", {})
    assert pyframes.program_runs_python(str(_python(name)))
    parsed = list(pyframes._ELF_PYTHONS.values())
    assert any(found is not None and found.version[:2] >= (3, 11) for found in parsed), parsed
    reads: list[str] = []
    original = pyframes._read_elf_python
    def counted(path: str) -> object:
        reads.append(path)
        return original(path)

    monkeypatch.setattr(pyframes, "_read_elf_python", counted)
    proc, _ = _start(_python(name), "30")
    try:
        runtime = find_runtime(proc.pid)
        assert runtime is not None and runtime.layout is not None
        assert reads == [], reads
    finally:
        _stop(proc)


def test_python313_debug_offsets_agree_with_the_table() -> None:
    """3.13 publishes its offsets in _PyRuntime (_Py_DebugOffsets); the reader takes them
    from the file and they must say what the headers say."""
    import struct

    from rsprof.collector.pyframes import debug_offsets_layout
    from rsprof.collector.symbols.elf import ElfFile

    _python("pyenv-3.13")
    library = PYENV / "3.13.0/lib/libpython3.13.so.1.0"
    elf = ElfFile(str(library))
    start = elf.vaddr_to_file_offset(
        next(s.value for s in elf.symbols() if s.name == "_PyRuntime"))
    data = bytes(elf.data[start:start + 8 + 8 * 72])
    assert debug_offsets_layout(data, (3, 13, 0)) == LAYOUTS[(3, 13)]
    assert debug_offsets_layout(data, (3, 12, 1)) is None  # only 3.13's format is known
    assert debug_offsets_layout(b"xdebugpz" + data[8:], (3, 13, 0)) is None
    free_threaded = data[:16] + struct.pack("<Q", 1) + data[24:]
    assert debug_offsets_layout(free_threaded, (3, 13, 0)) is None
    proc, _ = _start(_python("pyenv-3.13"), "30")
    try:
        runtime = find_runtime(proc.pid)
        assert runtime is not None and runtime.layout == LAYOUTS[(3, 13)]
    finally:
        _stop(proc)


UNICODE_SCRIPT = '''
import sys, time

class Outer:
    def méthode(self):
        def 計算():
            s = 0
            for i in range(20000):
                s += i
            return s
        return 計算()

print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    Outer().méthode()
'''


@pytest.mark.parametrize("name", ["debian-3.11", "pyenv-3.13"])
def test_qualified_and_non_ascii_names_and_ids(name: str, tmp_path: Path) -> None:
    """Names of every str kind (ASCII, Latin-1, BMP) come out right, as qualnames; walk()
    gives the same frames as ids, resolved by functions(); two Python threads may read at
    once."""
    import threading

    script = tmp_path / "unicode_names.py"
    script.write_text(UNICODE_SCRIPT, encoding="utf-8")
    proc, _ = _start(_python(name), "30", script=script)
    try:
        reader = open_reader(proc.pid)
        assert reader is not None
        seen: Counter[tuple[str, ...]] = Counter()
        errors: list[BaseException] = []

        def read() -> None:
            try:
                for _ in range(300):
                    frames = reader.frames(proc.pid)
                    if frames:
                        seen[tuple(frame.function for frame in frames)] += 1
            except BaseException as error:  # surfaced below
                errors.append(error)

        readers = [threading.Thread(target=read) for _ in range(2)]
        for thread in readers:
            thread.start()
        for thread in readers:
            thread.join()
        assert not errors, errors
        inner = ("Outer.méthode.<locals>.計算", "Outer.méthode", "<module>")
        assert seen[inner] > 0, seen
        assert set(seen) <= {inner, inner[1:], inner[2:]}, seen
        for _ in range(100):
            walked = reader.walk(proc.pid)
            if walked:
                names = {fid: fname for fid, fname, _, _ in reader.functions()}
                assert tuple(names[fid] for fid, _, _ in walked) in {inner, inner[1:], inner[2:]}
                assert [entry for _, _, entry in walked][-1] is True
        assert {file for _, _, file, _ in reader.functions()} == {str(script)}
    finally:
        _stop(proc)


SLEEPY_SCRIPT = '''
import sys, threading, time


class K:
    def method(self):
        return deep(3)


def deep(n):
    if n:
        return deep(n - 1)
    time.sleep(60)


def side():
    K().method()


threading.Thread(target=side, name="side", daemon=True).start()
print("ready", flush=True)
K().method()
'''


@pytest.mark.parametrize("name", ["debian-3.11", "pyenv-3.12", "pyenv-3.13"])
def test_agrees_with_py_spy_dump(name: str, tmp_path: Path) -> None:
    """py-spy (the oracle) and the reader on the same still process: every thread, every
    frame, names (py-spy 0.4 prints qualnames too) and lines."""
    import re
    import shutil

    py_spy = shutil.which("py-spy")
    if py_spy is None:
        pytest.skip("py-spy is not installed (pip install py-spy)")
    script = tmp_path / "sleepy.py"
    script.write_text(SLEEPY_SCRIPT)
    proc, _ = _start(_python(name), script=script)
    try:
        reader = open_reader(proc.pid)
        assert reader is not None
        tids = reader.threads()
        assert len(tids) == 2
        deadline = time.monotonic() + 5
        ours: dict[int, list[tuple[str, int]]] = {}
        while time.monotonic() < deadline and len(ours) < 2:  # until both are asleep
            for tid in tids:
                frames = reader.frames(tid)
                if frames and frames[0].function == "deep" and frames[0].line == 13:
                    assert all(frame.file == str(script) for frame in frames[:5])
                    ours[tid] = [(frame.function, frame.line) for frame in frames]
            time.sleep(0.02)
        dump = subprocess.run([py_spy, "dump", "--pid", str(proc.pid), "--nonblocking"],
                              capture_output=True, text=True, timeout=30)
        assert dump.returncode == 0, dump.stderr
        theirs: dict[int, list[tuple[str, int]]] = {}
        current: list[tuple[str, int]] = []
        for line in dump.stdout.splitlines():
            thread = re.match(r"Thread (0x[0-9A-Fa-f]+|\d+)", line)
            if thread:
                current = theirs.setdefault(int(thread.group(1), 0), [])
            frame = re.match(r"\s+(\S+) \((.+):(\d+)\)$", line)
            if frame:
                current.append((frame.group(1), int(frame.group(3))))
        assert theirs == ours, dump.stdout
    finally:
        _stop(proc)


def test_splice_plan_pairs_evaluator_frames_with_python_groups() -> None:
    from rsprof.collector.pyframes import splice_plan

    # long_add <- _PyEval(heavy, main, <module>) <- PyRun_... <- main
    assert splice_plan([False, True, False, False], [False, False, True]) == [
        ("native", 0), ("python", 0), ("python", 1), ("python", 2), ("native", 2),
        ("native", 3)]
    # Two evaluator calls (a C callback in between): innermost group to innermost one.
    assert splice_plan([True, False, True, False], [False, True, True]) == [
        ("python", 0), ("python", 1), ("native", 1), ("python", 2), ("native", 3)]
    assert splice_plan([False, False], []) == [("native", 0), ("native", 1)]
    assert splice_plan([True, False], [False, False]) is None  # no entry frame: cut
    assert splice_plan([True, True], [True]) is None  # native deeper than Python
    assert splice_plan([True], [True, True]) is None  # Python deeper than native
    # Read at sample time (BPF): one group fewer is the innermost evaluator between frames
    # (a generator that yielded back to sum()): it stays native, the outer one pairs.
    assert splice_plan([True, False, True, False], [False, True], at_sample=True) == [
        ("native", 0), ("native", 1), ("python", 0), ("python", 1), ("native", 3)]
    assert splice_plan([True, True], [True], at_sample=True) == [("native", 0), ("python", 0)]
    assert splice_plan([True, True, True], [True], at_sample=True) is None  # two short
    assert splice_plan([True], [False], at_sample=True) is None  # no entry frame: cut


def test_stack_words_are_the_documented_ones() -> None:
    """The stack words' encoding (native/stackwords.h, exported to split_python) is the one
    docs/native.md documents: native addresses, 0xFFFFFFFFFFFFFFF0, then per Python frame
    1 << 63 | entry << 62 | function id << 32 | line (signed), innermost first."""
    native = (0x401000, 0x7F0000402000)
    words = (0xFFFFFFFFFFFFFFF0, 1 << 63 | 1 << 62 | 7 << 32 | 42,
             1 << 63 | (1 << 18) - 1 << 32 | (-1 & 0xFFFFFFFF))
    assert split_python((*native, *words)) == (native, [(7, 42, True), ((1 << 18) - 1, -1, False)])
    assert split_python(native) == (native, [])


DEEP_SCRIPT = '''
import sys, time


def leaf():
    time.sleep(60)


def gen():
    yield leaf()


def keyed(x):
    return next(gen())


def deep(n):
    if n:
        return deep(n - 1)
    return sorted([1], key=keyed)


print("ready", flush=True)
deep(int(sys.argv[1]))
'''


@pytest.mark.parametrize("name", ["debian-3.11", "pyenv-3.12", "pyenv-3.13"])
def test_deep_stack_agrees_with_py_spy_dump_in_few_reads(name: str, tmp_path: Path) -> None:
    """A walk reads its frames through a window of frame memory and every code header in one
    call (native/pyframes.c): a 600-deep stack (its data stack spans several chunks and
    many windows), a generator frame (in its object, outside the data stack) and frames
    entered from C (`sorted(key=)`, `next()`) must come out as py-spy reads them, frame by
    frame, entry flags included; and in far fewer reads than frames."""
    import re
    import shutil

    py_spy = shutil.which("py-spy")
    if py_spy is None:
        pytest.skip("py-spy is not installed (pip install py-spy)")
    script = tmp_path / "deep.py"
    script.write_text(DEEP_SCRIPT)
    proc, _ = _start(_python(name), "600", script=script)
    try:
        reader = open_reader(proc.pid)
        assert reader is not None
        deadline = time.monotonic() + 10
        frames = None
        while time.monotonic() < deadline:  # until it sleeps in leaf
            frames = reader.frames(proc.pid)
            if frames and frames[0].function == "leaf" and frames[0].line == 6:
                break
            time.sleep(0.02)
        assert frames and frames[0].function == "leaf", frames
        reads = reader.reads
        again = reader.frames(proc.pid)
        assert again == frames
        assert reader.reads - reads <= len(frames) // 8, (reader.reads - reads, len(frames))
        ours = [(frame.function, frame.line) for frame in frames]
        assert [frame.function for frame in frames[:4]] == ["leaf", "gen", "keyed", "deep"]
        assert len(frames) == 4 + 600 + 1  # leaf gen keyed, 601 deep, <module>
        # Entered from C: the generator (next()), the key function (sorted()), <module>.
        assert [frame.entry for frame in frames] == [False, True, True] + [False] * 601 + [True]
        dump = subprocess.run([py_spy, "dump", "--pid", str(proc.pid), "--nonblocking"],
                              capture_output=True, text=True, timeout=60)
        assert dump.returncode == 0, dump.stderr
        theirs = [(m.group(1), int(m.group(2))) for m in
                  (re.match(r"\s+(\S+) \(.+:(\d+)\)$", line) for line in dump.stdout.splitlines())
                  if m]
        assert theirs == ours, dump.stdout[:2000]
    finally:
        _stop(proc)
