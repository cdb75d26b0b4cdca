"""rsprof.report_commands: top, traces, peek, diff and export as click commands, run in this
process on a synthetic profile (no rsprof process started): what each prints, and what it
says on stderr when a selection is empty."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from rsprof.report_commands import COMMANDS, diff, export_command, peek, top, traces
from unit.synthetic import Synth, small_profile


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_profile(tmp_path_factory.mktemp("reports") / "app.db")


def run(command: click.Command, *args: Any) -> tuple[int, str, str]:
    result = CliRunner().invoke(command, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def test_top_cpu_json(profile: Path) -> None:
    code, out, err = run(top, "cpu", profile, "--json")
    assert (code, err) == (0, "")
    rows = {r["function"]: (r["self"], r["total"], r["total_pct"]) for r in json.loads(out)}
    assert rows == {"work": (60, 90, 90.0), "parse": (30, 40, 40.0), "memcpy": (10, 10, 10.0),
                    "main": (0, 100, 100.0)}


@pytest.mark.parametrize(("args", "functions"), [
    (["--tid", "2"], {"memcpy", "parse", "main"}),
    (["--focus", "parse", "--hide", "main"], {"memcpy", "parse", "work"}),
    (["--granularity", "files"], {""}),
    (["-n", "1"], {"work"}),
    (["--threshold", "20"], {"work", "parse"}),
])
def test_top_cpu_options(profile: Path, args: list[str], functions: set[str]) -> None:
    code, out, _err = run(top, "cpu", profile, "--json", *args)
    assert code == 0
    assert {r["function"] for r in json.loads(out)} == functions


def test_top_heap(profile: Path) -> None:
    code, out, _err = run(top, "heap", profile, "--csv")
    assert code == 0
    header, *lines = out.splitlines()
    assert header.startswith("function,file,line,module,live_bytes")
    assert lines[0].startswith("leak,leak.c,5,") and ",10000,10000,0,10,0," in lines[0]


@pytest.mark.parametrize(("args", "said"), [
    (["--focus", "nothing-is-called-so"], "the filters (focus=nothing-is-called-so) kept no"),
    (["--since", "100s"], "no CPU samples in the time range --since 100s; the recording"),
    (["--tid", "99"], "no CPU samples of thread 99"),
])
def test_an_empty_selection_is_said_not_failed(profile: Path, args: list[str],
                                               said: str) -> None:
    code, out, err = run(top, "cpu", profile, "--json", *args)
    assert (code, json.loads(out)) == (0, [])
    assert said in err


def test_usage_errors(profile: Path) -> None:
    assert run(top, "cpu", profile, "--json", "--csv")[0] == 2
    assert run(top, "memory", profile)[0] == 2


def test_heap_of_a_cpu_only_profile_says_how(tmp_path: Path) -> None:
    synth = Synth(tmp_path / "cpu.db", meta={"heap_mode": "none"})
    synth.checkpoint({(synth.stack("work"), 1): 1})
    code, out, err = run(top, "heap", synth.finish(), "--json")
    assert (code, json.loads(out)) == (0, [])
    assert "rsprof run" in err


def test_traces(profile: Path) -> None:
    code, out, _err = run(traces, profile, "--json", "-g", "functions")
    assert code == 0
    assert [(t["value"], t["thread"], t["stack"]) for t in json.loads(out)] == [
        (60, "main-thread", ["work", "main"]),
        (30, "main-thread", ["parse", "work", "main"]),
        (10, "worker", ["memcpy", "parse", "main"]),
    ]


def test_peek(profile: Path) -> None:
    code, out, _err = run(peek, profile, "^parse$", "--json")
    assert code == 0
    (found,) = json.loads(out)
    assert (found["flat"], found["total"]) == (30, 40)
    assert {c["name"]: c["value"] for c in found["callers"]} == {"work": 30, "main": 10}
    assert {c["name"]: c["value"] for c in found["callees"]} == {"memcpy": 10}
    code, _out, err = run(peek, profile, "^nothing$")
    assert code == 0 and "no function matches '^nothing$'" in err
    assert run(peek, profile, "(")[0] == 2


def test_diff_of_a_profile_with_itself(profile: Path) -> None:
    code, out, _err = run(diff, profile, profile, "--json")
    assert code == 0
    found = json.loads(out)
    assert {d["delta_self_pct"] for d in found["cpu"]} == {0.0}
    assert {d["delta_inuse_bytes"] for d in found["heap"]} == {0}


def test_export(profile: Path, tmp_path: Path) -> None:
    target = tmp_path / "out.folded"
    code, _out, err = run(export_command, profile, "-f", "folded", "-o", target,
                          "--tid", "2")
    assert code == 0
    assert target.read_text() == "main;parse;memcpy 10\n"
    assert "wrote" in err and "folded" in err


def test_every_command_is_listed() -> None:
    assert {c.name for c in COMMANDS} == {"top", "traces", "peek", "diff", "export"}
