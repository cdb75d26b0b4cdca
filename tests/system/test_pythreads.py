"""Python thread names (collector/pythreads.py): the chain sys.modules -> threading._active
-> Thread.__dict__["_name"] on synthetic interpreter memory for each version's layout, then
real interpreters recorded by rsprof (3.11, 3.12, 3.13), compared with what the program
says its threads are and with `py-spy dump`."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PYENV, TARGETS, build_target, python_binary, run_rsprof, start_rsprof
from rsprof.collector.pyframes import find_runtime, open_reader
from rsprof.storage.pprof import profile_pb2 as pb
from rsprof.tui.screens import ThreadPicker
from rsprof.tui.widgets.header import ProfileHeader
from textual.widgets import OptionList
from tui_fixture import make_app, settle

SCRIPT = TARGETS / "pythreads.py"
VERSIONS = ["debian-3.11", "pyenv-3.12", "pyenv-3.13"]

# -- synthetic interpreter memory ---------------------------------------------------------

DICT_TYPE, LONG_TYPE, UNICODE_TYPE = 0x7000_0000_1000, 0x7000_0000_2000, 0x7000_0000_3000




MANAGED, INLINE = 1 << 4, 1 << 2






def _threads(profile: Path) -> dict[int, tuple[str, str]]:
    with sqlite3.connect(f"file:{profile}?mode=ro", uri=True) as db:
        return {tid: (name, comm) for tid, name, comm
                in db.execute("SELECT tid, name, comm FROM threads")}


def _expected(stdout: str) -> dict[int, tuple[int, str]]:
    """{native id: (ident, last name)} from the target's lines."""
    found: dict[int, tuple[int, str]] = {}
    for line in stdout.splitlines():
        if line.startswith("["):
            for native, ident, name in json.loads(line):
                found[native] = (ident, name)
    return found


def _kernel_name(binary: Path) -> str:
    return binary.resolve().name[:15]


@pytest.fixture(scope="module", params=VERSIONS)
def named_profile(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, str]]:
    binary = python_binary(request.param)
    out = tmp_path_factory.mktemp("pythreads") / "named.db"
    result = run_rsprof("run", "-q", "-i", "100ms", "--cpu-freq", "499", "-o", str(out), "--",
                        str(binary), str(SCRIPT), "names", "2.5", timeout=180)
    assert result.returncode == 0, result.stderr
    yield request.param, out, result.stdout


def test_named_threads_executor_and_rename_are_stored(
        named_profile: tuple[str, Path, str]) -> None:
    """Every thread threading knows has its Python name in `threads.name`, its kernel name
    in `comm`; the thread renamed while it ran has its new name."""
    name, profile, stdout = named_profile
    expected = _expected(stdout)
    stored = _threads(profile)
    comm = _kernel_name(python_binary(name))
    assert {tid: stored.get(tid) for tid in expected} == {
        tid: (want, comm) for tid, (_, want) in expected.items()}
    names = sorted(want for _, want in expected.values())
    assert names == sorted(["MainThread", "renamed-now", "pool_0", "pool_1", "pool_2",
                            "asyncio-runner", "asyncio_0",
                            *(f"CustomThreadName-{i}" for i in range(10))])


def test_exports_and_reports_name_threads_by_their_python_names(
        named_profile: tuple[str, Path, str], tmp_path: Path) -> None:
    _, profile, stdout = named_profile
    expected = {tid: want for tid, (_, want) in _expected(stdout).items()}
    # (a thread the program did not list, e.g. asyncio's short-lived _do_shutdown at exit,
    # may be sampled too: only the listed ones are checked)
    with sqlite3.connect(f"file:{profile}?mode=ro", uri=True) as db:
        sampled = {tid: name for tid, name, samples in
                   db.execute("SELECT tid, name, samples FROM cpu_threads")
                   if samples and tid in expected}
    assert sampled == {tid: expected[tid] for tid in sampled}
    assert any(name.startswith("CustomThreadName-") for name in sampled.values())
    labels = {f"{name} ({tid})" for tid, name in sampled.items()}

    def listed(names: set[str]) -> set[str]:
        return {n for n in names if int(n.rsplit("(", 1)[1].rstrip(")")) in expected}

    folded = run_rsprof("export", str(profile), "-f", "folded", "--per-thread", "-o", "-")
    assert folded.returncode == 0, folded.stderr
    assert listed({line.split(";", 1)[0] for line in folded.stdout.splitlines()}) == labels

    speedscope = tmp_path / "s.json"
    result = run_rsprof("export", str(profile), "-f", "speedscope", "-o", str(speedscope))
    assert result.returncode == 0, result.stderr
    assert listed({p["name"] for p in json.loads(speedscope.read_text())["profiles"]}) == labels

    pprof = tmp_path / "cpu.pb.gz"
    result = run_rsprof("export", str(profile), "-o", str(pprof))
    assert result.returncode == 0, result.stderr
    decoded = pb.Profile.FromString(gzip.decompress(pprof.read_bytes()))
    table = decoded.string_table
    tagged = set()
    for sample in decoded.sample:
        tags = {table[lab.key]: table[lab.str] if lab.str else lab.num for lab in sample.label}
        if tags.get("tid") in expected:
            tagged.add((tags["tid"], tags["thread"]))
    assert tagged == set(sampled.items())

    traces = run_rsprof("traces", str(profile), "--json", "-n", "0")
    assert traces.returncode == 0, traces.stderr
    assert {(t["tid"], t["thread"]) for t in json.loads(traces.stdout)
            if t["tid"] in expected} == set(sampled.items())


@pytest.mark.parametrize("name", VERSIONS)
def test_reused_idents_get_the_new_threads_names(name: str, tmp_path: Path) -> None:
    """Named threads started and joined round after round: the same idents (pthread_t)
    come back with other kernel tids, and each tid keeps its own round's name."""
    binary = python_binary(name)
    out = tmp_path / "loop.db"
    result = run_rsprof("run", "-q", "-i", "50ms", "-o", str(out), "--", str(binary),
                        str(SCRIPT), "loop", "6", timeout=180)
    assert result.returncode == 0, result.stderr
    expected = _expected(result.stdout)
    idents = [ident for ident, _ in expected.values()]
    assert len(set(idents)) < len(idents), "the test needs idents that come back"
    stored = _threads(out)
    assert {tid: stored[tid][0] for tid in expected} == {
        tid: want for tid, (_, want) in expected.items()}


@pytest.mark.parametrize("name", VERSIONS)
def test_attach_names_agree_with_py_spy_dump(name: str, tmp_path: Path) -> None:
    """`rsprof -p` on a running program: the names it stores are those `py-spy dump`
    prints for the same kernel tids."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        pytest.skip("py-spy is not installed (pip install py-spy)")
    binary = python_binary(name)
    proc = subprocess.Popen([str(binary), str(SCRIPT), "names", "30"], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # all started
        proc.stdout.readline()  # renamed
        out = tmp_path / "attach.db"
        recorder = start_rsprof("-p", str(proc.pid), "-q", "-d", "1500ms", "-i", "250ms",
                                "-o", str(out))
        _, err = recorder.communicate(timeout=60)
        assert recorder.returncode == 0, err
        dump = subprocess.run([py_spy, "dump", "--pid", str(proc.pid), "--nonblocking"],
                              capture_output=True, text=True, timeout=30)
        assert dump.returncode == 0, dump.stderr
    finally:
        proc.kill()
        proc.wait()
    theirs = {int(tid): thread for tid, thread
              in re.findall(r'^Thread (\d+) \([\w+]+\): "(.*)"$', dump.stdout, re.M)}
    assert len(theirs) == 17, dump.stdout
    ours = {tid: stored for tid, (stored, _) in _threads(out).items()}
    assert {tid: ours.get(tid) for tid in theirs} == theirs


def test_other_programs_and_versions_keep_the_kernel_names(tmp_path: Path) -> None:
    """A native program, --python=off, and a Python rsprof does not read (3.10): comm."""
    native = build_target("many_threads.c")
    out = tmp_path / "native.db"
    result = run_rsprof("run", "-q", "-d", "1s", "-i", "100ms", "-o", str(out), "--",
                        str(native), "4", "1")
    assert result.returncode == 0, result.stderr
    stored = _threads(out)
    assert stored and all(name == comm for name, comm in stored.values())

    binary = python_binary("debian-3.11")
    off = tmp_path / "off.db"
    result = run_rsprof("run", "-q", "-i", "100ms", "--python=off", "-o", str(off), "--",
                        str(binary), str(SCRIPT), "names", "1.2")
    assert result.returncode == 0, result.stderr
    stored = _threads(off)
    # (a thread gone before it was looked at has no name: None)
    assert len(stored) >= 17 and {name for name, _ in stored.values()} - {None} == {"python3.11"}

    old = sorted(PYENV.glob("3.10.*/bin/python3.10"))
    if not old:
        pytest.skip("no Python 3.10 to try")
    legacy = tmp_path / "legacy.db"
    result = run_rsprof("run", "-q", "-i", "100ms", "-o", str(legacy), "--",
                        str(old[-1]), str(SCRIPT), "names", "1.2")
    assert result.returncode == 0, result.stderr
    stored = _threads(legacy)
    assert len(stored) >= 17 and {name for name, _ in stored.values()} - {None} == {"python3.10"}


def test_tui_thread_picker_and_header_show_python_names(
        named_profile: tuple[str, Path, str]) -> None:
    """The picker lists each thread by its Python name, columns aligned past the kernel's
    15 characters; the header names the thread picked."""
    _, profile, stdout = named_profile
    expected = {tid: want for tid, (_, want) in _expected(stdout).items()}

    async def main() -> None:
        app = make_app(profile)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("t")
            await settle(pilot)
            assert isinstance(app.screen, ThreadPicker)
            options = app.screen.query_one(OptionList)
            labels = [str(options.get_option_at_index(i).prompt)
                      for i in range(1, options.option_count)]
            shown = {int(label.split()[0]): label.split()[1] for label in labels}
            assert {tid: shown.get(tid) for tid in expected} == expected
            assert len({label.index(" samples") for label in labels}) == 1  # aligned
            await pilot.press("j", "enter")
            await settle(pilot)
            tid = app.main.state.thread
            assert tid is not None
            assert f"thread {tid} {expected[tid]}" in app.main.query_one(ProfileHeader).plain

    asyncio.run(main())


EXEC_SCRIPT = '''
import os, threading, time
threading.Thread(target=time.sleep, args=(0.5,), name="before-exec").start()
time.sleep(1.5)
os.execv("/bin/sleep", ["sleep", "1"])
'''


def test_a_thread_whose_program_execs_takes_the_new_programs_name(tmp_path: Path) -> None:
    """MainThread (read while Python ran) becomes `sleep` once the process execs it."""
    script = tmp_path / "execs.py"
    script.write_text(EXEC_SCRIPT)
    out = tmp_path / "exec.db"
    result = run_rsprof("run", "-q", "-i", "100ms", "-o", str(out), "--",
                        str(python_binary("debian-3.11")), str(script))
    assert result.returncode == 0, result.stderr
    stored = _threads(out)
    names = sorted(name for name, _ in stored.values())
    assert names == ["before-exec", "sleep"], stored


@pytest.mark.parametrize("name", VERSIONS)
def test_reader_thread_idents_read_and_string(name: str) -> None:
    """PyFrameReader's three calls on a live interpreter: (native id, ident) pairs as the
    program sees them; bounded reads that say None instead of failing."""
    proc = subprocess.Popen([str(python_binary(name)), str(SCRIPT), "names", "30"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        listed = {(native, ident) for native, ident, _ in json.loads(proc.stdout.readline())}
        reader = open_reader(proc.pid)
        assert reader is not None
        assert listed <= set(reader.thread_idents())
        assert reader.read(0, 8) is None and reader.read((1 << 64) - 4, 8) is None
        assert reader.read(8, 0) == b""
        with pytest.raises(ValueError):
            reader.read(0x1000, (256 << 10) + 1)
        runtime = find_runtime(proc.pid)
        assert runtime is not None and runtime.layout is not None
        head = reader.read(runtime.runtime, 64)
        assert head is not None and len(head) == 64
        assert reader.string(runtime.runtime) is None  # not a str
        assert reader.string(0) is None
    finally:
        proc.kill()
        proc.wait()
