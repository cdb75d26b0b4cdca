"""rsprof.render: the CLI's tables and machine formats (JSON, CSV, TSV) and `rsprof dump`'s
text, written to a captured stdout."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from rsprof.collector.dump import DumpFrame, ProcessDump, ThreadStack
from rsprof.storage.analysis import FunctionRow, HeapSiteRow
from rsprof.storage.reader import ProfileSummary

from rsprof.render import (
    CPU_KEYS,
    HEAP_KEYS,
    cpu_table,
    emit_rows,
    heap_table,
    human_bytes,
    process_dump,
    profile_list,
    query_result,
)


@pytest.fixture(autouse=True)
def plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.mark.parametrize(("value", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (1 << 20, "1.0 MiB"),
    (5 << 30, "5.0 GiB"), (5 << 40, "5120.0 GiB"), (-2048, "-2.0 KiB"),
])
def test_human_bytes(value: int, text: str) -> None:
    assert human_bytes(value) == text


CPU = [FunctionRow("work", "app.c", 10, "/bin/app", 6, 60.0, 9, 90.0),
       FunctionRow("memcpy", "", 0, "/lib/libc.so.6", 1, 10.0, 1, 10.0, "0x7f00")]
HEAP = [HeapSiteRow("leak", "leak.c", 5, "/bin/app", 4096, 8192, 4096, 2, 1, True)]


def test_keys_are_the_documented_contract() -> None:
    assert CPU_KEYS == ["function", "file", "line", "module", "self", "self_pct", "total",
                        "total_pct", "address"]
    assert HEAP_KEYS[:5] == ["function", "file", "line", "module", "live_bytes"]


def test_emit_rows_json_and_csv() -> None:
    out = io.StringIO()
    emit_rows(CPU_KEYS, CPU, "json", out)
    assert json.loads(out.getvalue())[1] == {
        "function": "memcpy", "file": "", "line": 0, "module": "/lib/libc.so.6", "self": 1,
        "self_pct": 10.0, "total": 1, "total_pct": 10.0, "address": "0x7f00"}
    out = io.StringIO()
    emit_rows(HEAP_KEYS, HEAP, "csv", out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert rows[0]["live_bytes"] == "4096" and rows[0]["growing"] == "True"


@pytest.mark.parametrize(("fmt", "expected"), [
    ("tsv", "a\tb\n1\tNULL\nx y z\tff00\n"),
    ("csv", "a,b\n1,\nx\ty\nz,ff00\n"),
    ("json", '[\n  {"a": 1, "b": null},\n  {"a": "x\\ty\\nz", "b": "ff00"}\n]\n'),
])
def test_query_result(fmt: str, expected: str) -> None:
    out = io.StringIO()
    query_result(["a", "b"], iter([(1, None), ("x\ty\nz", b"\xff\x00")]), fmt=fmt, out=out)
    text = out.getvalue()
    if fmt == "csv":
        assert list(csv.reader(io.StringIO(text))) == [["a", "b"], ["1", ""],
                                                       ["x\ty\nz", "ff00"]]
    else:
        assert text == expected


def test_query_result_with_no_rows() -> None:
    out = io.StringIO()
    query_result(["a"], iter([]), fmt="json", out=out)
    assert json.loads(out.getvalue()) == []


def test_tables_are_plain_with_no_color(capsys: pytest.CaptureFixture[str]) -> None:
    cpu_table(CPU, 10, note="filters kept 9")
    text = capsys.readouterr().out
    assert "\x1b[" not in text
    assert "10 samples; filters kept 9" in text
    assert "0x7f00 memcpy" in text and "app.c:10" in text and "60.0%" in text
    heap_table(HEAP)
    text = capsys.readouterr().out
    assert "4.0 KiB" in text and "▲ yes" in text and "leak.c:5" in text


def test_profile_list(capsys: pytest.CaptureFixture[str]) -> None:
    profile_list([])
    assert capsys.readouterr().err == "no profiles found\n"
    profile_list([], as_json=True)
    assert json.loads(capsys.readouterr().out) == []
    summary = ProfileSummary(path=Path("/p/app.db"), pid=42, process="app",
                             start_time_ms=None, duration_ms=3_723_000, samples=7,
                             lost_samples=0, state="abandoned")
    profile_list([summary])
    text = capsys.readouterr().out
    assert "app (42)" in text and "01:02:03 (abandoned)" in text and " ? " in f" {text} "


def test_process_dump(capsys: pytest.CaptureFixture[str]) -> None:
    dump = ProcessDump(42, "app", "app --flag", True, 1.26, [
        ThreadStack(42, "main", "futex", [DumpFrame("wait", "w.c", 3, "/bin/app", False),
                                          DumpFrame("run", "/s.py", 9, "/s.py", True)],
                    truncated=True),
        ThreadStack(43, "worker", None, [DumpFrame("memcpy", "", 0, "/lib/libc.so.6", False)]),
    ])
    process_dump(dump)
    assert capsys.readouterr().out == (
        "Process 42: app --flag\n"
        "2 threads, stopped 1.3 ms; Python frames read while stopped\n"
        "\nThread 42 \"main\" (waiting in futex)\n"
        "    wait (w.c:3)\n"
        "    run (/s.py:9)\n"
        "    [truncated]\n"
        "\nThread 43 \"worker\" (running)\n"
        "    memcpy (libc.so.6)\n")
    process_dump(dump, as_json=True)
    found = json.loads(capsys.readouterr().out)
    assert found["threads"][0]["state"] == "waiting in futex"
    assert found["threads"][0]["frames"][1] == {"function": "run", "file": "/s.py", "line": 9,
                                                "module": "/s.py", "python": True}
