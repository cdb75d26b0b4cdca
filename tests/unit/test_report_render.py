"""rsprof.report_render: the text of traces, peek and diff (pprof-like), and their JSON."""

from __future__ import annotations

import json

import pytest
from rsprof.storage.callgraph import Edge, Peek, Trace
from rsprof.storage.diff import CpuDelta, HeapDelta
from rsprof.storage.granularity import Entry

from rsprof.report_render import _arrow, _arrow_bytes, _value, cpu_diff, heap_diff, peek, traces

WORK = Entry("work", "app.c", 10, "/bin/app")
MAIN = Entry("main", "main.c", 3, "/bin/app")
PARSE = Entry("parse", "", 0, "/bin/app")


@pytest.fixture(autouse=True)
def plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.mark.parametrize(("value", "unit", "text"), [
    (12, "count", "12"), (1_500_000_000, "nanoseconds", "1.50s"), (10, "nanoseconds", "0.00s"),
    (2048, "bytes", "2.0 KiB"), (5, "bytes", "5 B"),
])
def test_value(value: int, unit: str, text: str) -> None:
    assert _value(value, unit) == text


@pytest.mark.parametrize(("delta", "text"), [(0, "0.0%"), (1.25, "▲ +1.2%"), (-3, "▼ -3.0%")])
def test_arrow(delta: float, text: str) -> None:
    assert _arrow(delta, "%") == text


@pytest.mark.parametrize(("delta", "text"), [(0, "0 B"), (2048, "▲ +2.0 KiB"),
                                             (-100, "▼ -100 B")])
def test_arrow_bytes(delta: int, text: str) -> None:
    assert _arrow_bytes(delta) == text


FOUND = [Trace(60, 60.0, 1, "main-thread", [WORK, MAIN]),
         Trace(10, 10.0, None, "", [PARSE, WORK, MAIN])]


def test_traces_text(capsys: pytest.CaptureFixture[str]) -> None:
    traces(FOUND, "count", 100, 3, as_json=False)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "3 distinct stacks, the heaviest 2 shown, 100 in all"
    assert out[1] == out[5] == out[-1] == "-" * 11 + "+" + "-" * 60
    assert out[2] == "   thread: | main-thread (1)"
    assert out[3] == "  60 60.0% | work app.c:10"
    assert out[4] == "           | main main.c:3"
    assert out[6] == "  10 10.0% | parse"  # no thread line for merged threads


def test_traces_json_and_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    traces(FOUND, "count", 100, 2, as_json=True)
    found = json.loads(capsys.readouterr().out)
    assert found[0] == {"value": 60, "percent": 60.0, "tid": 1, "thread": "main-thread",
                        "stack": ["work app.c:10", "main main.c:3"]}
    traces([], "count", 0, 0, as_json=False)
    assert capsys.readouterr().out == "0 distinct stacks, 0 in all\n"


def test_peek_text(capsys: pytest.CaptureFixture[str]) -> None:
    item = Peek(WORK, 60, 60.0, 90, 90.0, [Edge(MAIN, 90, 100.0)], [Edge(PARSE, 30, 33.3)])
    peek([item], "count", as_json=False)
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[0] == "work app.c:10: flat 60 (60.0%), total 90 (90.0%)"
    body = [line.split() for line in lines[2:]]
    assert body == [["caller", "90", "100.0%", "main", "main.c:3"],
                    ["▶", "90", "100.0%", "work", "app.c:10"],
                    ["callee", "30", "33.3%", "parse"]]


def test_diff_tables(capsys: pytest.CaptureFixture[str]) -> None:
    cpu_diff([CpuDelta("work", 60.0, 20.0, -40.0, 60.0, 20.0, -40.0, ""),
              CpuDelta("new_fn", 0.0, 5.0, 5.0, 0.0, 5.0, 5.0, "new")])
    text = capsys.readouterr().out
    assert "CPU share by function (NEW - OLD)" in text
    assert "▼ -40.0%" in text and "▲ +5.0%" in text and "new" in text
    assert "\x1b[" not in text
    heap_diff([HeapDelta("leak", 0, 4096, 4096, 0, 8192, 8192, "new")])
    text = capsys.readouterr().out
    assert "▲ +4.0 KiB" in text and "▲ +8.0 KiB" in text and "0 B" in text
