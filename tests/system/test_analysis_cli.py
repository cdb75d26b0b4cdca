"""pprof-style analysis on the CLI against profiles of real targets with a known split:
top's filters, granularity, thread and time range; traces; peek; diff; JSON/CSV export."""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    LEAKY_THREADS,
    LEAKY_TICKS,
    assert_share,
    read_pty,
    rsprof_env,
    run_rsprof,
    top_json,
)


def _by_function(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(r["function"]): r for r in rows}


def _close(a: int, b: int) -> bool:
    """Equal but for the odd sample frame-pointer unwinding gets wrong: one taken on a
    function's prologue or epilogue instruction skips its direct caller (perf's too)."""
    return abs(int(a) - int(b)) <= max(3, int(b) // 200)


def _json(*args: str) -> Any:
    result = run_rsprof(*args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _thread_ids(profile: Path) -> dict[str, int]:
    result = run_rsprof("query", str(profile), "SELECT name, tid FROM threads", "--json")
    assert result.returncode == 0, result.stderr
    return {row["name"]: row["tid"] for row in json.loads(result.stdout)}


def test_focus_keeps_only_samples_through_the_function(split_cpu_profile: Path) -> None:
    whole = _by_function(top_json(split_cpu_profile, "cpu"))
    focused = _by_function(top_json(split_cpu_profile, "cpu", "--focus", "^heavy$"))
    assert {"heavy", "spin", "work"} <= focused.keys()
    assert not {"light", "other_busy", "late_worker"} & focused.keys()
    # Every sample through heavy is kept, and percentages stay of the whole profile.
    assert focused["heavy"]["total"] == whole["heavy"]["total"]
    assert _close(focused["spin"]["total"], whole["heavy"]["total"])
    assert focused["heavy"]["total_pct"] == whole["heavy"]["total_pct"]
    # rsprof's --filter (accepted and ignored there) is the same option here.
    assert top_json(split_cpu_profile, "cpu", "--filter", "^heavy$") == list(focused.values())


def test_ignore_drops_samples_through_the_function(split_cpu_profile: Path) -> None:
    whole = _by_function(top_json(split_cpu_profile, "cpu"))
    rows = _by_function(top_json(split_cpu_profile, "cpu", "--ignore", "heavy|other_busy"))
    assert "heavy" not in rows and "other_busy" not in rows
    assert rows["light"]["total"] == whole["light"]["total"]
    assert _close(rows["work"]["total"], whole["light"]["total"])  # work() minus heavy()
    # Ignore wins over focus, as in pprof.
    both = _by_function(top_json(split_cpu_profile, "cpu", "--focus", "work",
                                 "--ignore", "light"))
    assert "light" not in both and _close(both["work"]["total"], whole["heavy"]["total"])


def test_hide_moves_self_time_to_the_caller(split_cpu_profile: Path) -> None:
    whole = _by_function(top_json(split_cpu_profile, "cpu"))
    # [kernel]: samples taken in kernel mode (an interrupt, a fault) on top of spin.
    rows = _by_function(top_json(split_cpu_profile, "cpu", "--hide", r"^(spin|\[kernel\])$"))
    assert "spin" not in rows
    for caller in ("heavy", "light", "other_busy", "late_worker"):
        assert rows[caller]["self"] == whole[caller]["total"], caller


def test_show_keeps_only_matching_frames(split_cpu_profile: Path) -> None:
    rows = _by_function(top_json(split_cpu_profile, "cpu", "--show", "^(heavy|light)$"))
    assert set(rows) == {"heavy", "light"}
    assert_share(rows["heavy"]["self"], rows["light"]["self"], 0.75)


def test_tid_selects_one_thread(split_cpu_profile: Path) -> None:
    tids = _thread_ids(split_cpu_profile)
    rows = _by_function(top_json(split_cpu_profile, "cpu", "--tid", str(tids["split-busy"])))
    assert "other_busy" in rows and "heavy" not in rows and "late_worker" not in rows
    # Percentages are of that thread's samples.
    assert sum(float(r["self_pct"]) for r in rows.values()) == pytest.approx(100, abs=0.1)
    assert float(rows["busy_main"]["total_pct"]) >= 99


def test_time_range_selects_checkpoints(split_cpu_profile: Path) -> None:
    # split-late starts 1 s after the program; checkpoints are 250 ms.
    early = _by_function(top_json(split_cpu_profile, "cpu", "--until", "750ms"))
    late = _by_function(top_json(split_cpu_profile, "cpu", "--since", "1.75s"))
    whole = _by_function(top_json(split_cpu_profile, "cpu"))
    assert "late_worker" not in early and "late_worker" in late
    assert early["work"]["total"] + late["work"]["total"] < whole["work"]["total"]
    # Shares inside a window are still the program's 3:1.
    assert_share(late["heavy"]["total"], late["light"]["total"], 0.75)


def test_granularities(split_cpu_profile: Path) -> None:
    lines = top_json(split_cpu_profile, "cpu", "--granularity", "lines")
    spin_lines = [r for r in lines if r["function"] == "spin"]
    assert spin_lines and all(r["line"] > 0 for r in spin_lines)
    assert sum(int(r["self"]) for r in spin_lines) == _by_function(
        top_json(split_cpu_profile, "cpu"))["spin"]["self"]
    files = top_json(split_cpu_profile, "cpu", "-g", "files")
    split_file = next(r for r in files if str(r["file"]).endswith("split.c"))
    assert split_file["function"] == "" and float(split_file["self_pct"]) > 95
    addresses = top_json(split_cpu_profile, "cpu", "-g", "addresses", "-n", "5")
    assert all(str(r["address"]).startswith("0x") for r in addresses)
    assert addresses[0]["function"] == "spin"


def test_traces_list_distinct_stacks_with_threads(split_cpu_profile: Path) -> None:
    traces = _json("traces", str(split_cpu_profile), "--json")
    assert isinstance(traces, list)
    total = sum(t["value"] for t in traces)
    assert total == sum(int(r["self"]) for r in top_json(split_cpu_profile, "cpu"))
    heaviest = {tuple(t["stack"][:4]): t for t in traces if t["thread"] == "split-main"}
    assert ("spin", "heavy", "work", "main") in heaviest
    assert [t["value"] for t in traces] == sorted((t["value"] for t in traces), reverse=True)
    text = run_rsprof("traces", str(split_cpu_profile), "-n", "1")
    assert text.returncode == 0 and "thread:" in text.stdout and "| spin" in text.stdout


def test_peek_shows_callers_and_callees_with_weights(split_cpu_profile: Path) -> None:
    [work] = _json("peek", str(split_cpu_profile), "^work$", "--json")
    callees = {e["name"]: e["value"] for e in work["callees"]}
    callers = {e["name"]: e["value"] for e in work["callers"]}
    assert set(callees) == {"heavy", "light"}
    assert_share(callees["heavy"], callees["light"], 0.75)
    assert _close(callers["main"], work["total"])
    assert sum(callees.values()) == work["total"] - work["flat"]
    text = run_rsprof("peek", str(split_cpu_profile), "^work$")
    assert "caller" in text.stdout and "callee" in text.stdout and "heavy" in text.stdout


def test_diff_reports_share_changes_biggest_first(
    split_cpu_profile: Path, split_cpu_profile_1to1: Path
) -> None:
    # OLD heavy:light = 1:1, NEW 3:1 under work(): heavy's share rises, light's falls.
    result = _json("diff", str(split_cpu_profile_1to1), str(split_cpu_profile),
                   "--json", "-n", "0")
    assert isinstance(result, dict)  # one object, as --help says (it was a 1-element list)
    cpu = {d["function"]: d for d in result["cpu"]}
    # heavy - light went from 0 to half of the main thread's share (a third of the samples
    # or so, less on a loaded machine): compared with each other, not with fixed shares.
    assert cpu["heavy"]["delta_total_pct"] - cpu["light"]["delta_total_pct"] > 5
    assert cpu["heavy"]["status"] == "" and "heap" not in result
    deltas = [abs(d["delta_self_pct"]) for d in result["cpu"]]
    assert deltas == sorted(deltas, reverse=True)
    text = run_rsprof("diff", str(split_cpu_profile_1to1), str(split_cpu_profile))
    assert text.returncode == 0 and "▲" in text.stdout and "▼" in text.stdout


def test_diff_marks_new_and_gone(split_cpu_profile: Path, leaky_heap_profile: Path) -> None:
    result = _json("diff", str(leaky_heap_profile), str(split_cpu_profile),
                   "--json", "-n", "0", "--kind", "cpu")
    cpu = {d["function"]: d for d in result["cpu"]}
    assert cpu["heavy"]["status"] == "new" and cpu["heavy"]["old_total_pct"] == 0
    back = _json("diff", str(split_cpu_profile), str(leaky_heap_profile),
                 "--json", "-n", "0", "--kind", "cpu")
    assert {d["function"]: d["status"] for d in back["cpu"]}["heavy"] == "gone"


def test_heap_filters_and_windows(leaky_heap_profile: Path) -> None:
    leak = _by_function(top_json(leaky_heap_profile, "heap", "--focus", "leak_site"))
    assert set(leak) == {"leak_site"}
    assert leak["leak_site"]["live_bytes"] == LEAKY_TICKS * 4000
    assert leak["leak_site"]["alloc_count"] == LEAKY_TICKS
    # Ignoring the worker threads' entry point drops thread_leak only.
    rest = _by_function(top_json(leaky_heap_profile, "heap", "--ignore", "worker"))
    assert "thread_leak" not in rest and rest["keep_site"]["live_bytes"] == 123457
    # A window: what leaked in it is a part, what is live at its end includes the past.
    window = _by_function(top_json(leaky_heap_profile, "heap", "--since", "400ms",
                                   "--until", "1s"))
    part = window["leak_site"]
    assert 0 < int(part["total_alloc_bytes"]) < LEAKY_TICKS * 4000
    assert int(part["live_bytes"]) > int(part["total_alloc_bytes"])
    traces = _json("traces", str(leaky_heap_profile), "--kind", "heap", "--json")
    by_leaf = {t["stack"][0]: t["value"] for t in traces}
    assert by_leaf["thread_leak"] == LEAKY_TICKS * LEAKY_THREADS * 64
    [peeked] = _json("peek", str(leaky_heap_profile), "^leak_site$", "--kind", "heap",
                     "--sample-index", "alloc_objects", "--json")
    assert peeked["flat"] == LEAKY_TICKS and peeked["callers"][0]["name"] == "main"


def test_export_json_and_csv_match_top(split_cpu_profile: Path, tmp_path: Path) -> None:
    out = tmp_path / "top.json"
    result = run_rsprof("export", str(split_cpu_profile), "-f", "json", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == top_json(split_cpu_profile, "cpu")
    missing = run_rsprof("export", str(tmp_path / "missing.db"), "-o", str(tmp_path / "m"))
    assert missing.returncode == 6 and "no such file" in missing.stderr
    csv_out = run_rsprof("export", str(split_cpu_profile), "-f", "csv", "-o", "-",
                         "--focus", "heavy")
    assert csv_out.returncode == 0, csv_out.stderr
    rows = list(csv.DictReader(io.StringIO(csv_out.stdout)))
    functions = {r["function"] for r in rows}
    assert {"heavy", "spin", "work", "main"} <= functions and "light" not in functions
    assert int(rows[0]["self"]) > 0 and set(rows[0]) == set(json.loads(out.read_text())[0])


def test_bad_input_gets_one_clear_line(split_cpu_profile: Path, tmp_path: Path) -> None:
    cases = [
        (("export", str(split_cpu_profile), "-f", "xml"), 2, "unknown format 'xml'"),
        (("export", str(split_cpu_profile), "-o", "/proc/1/nope/out.pb.gz"), 1, "cannot write"),
        (("export", str(split_cpu_profile), "-o", str(tmp_path)), 1, "is a directory"),
        (("export", str(split_cpu_profile), "--kind", "heap", "-o", str(tmp_path / "h")), 1,
         "no heap data"),
        (("export", str(split_cpu_profile), "--since", "100s", "-o", str(tmp_path / "c")), 1,
         "no CPU samples in the time range --since 100s; the recording lasts"),
        (("export", str(split_cpu_profile), "--focus", "no_such_fn", "-o", str(tmp_path / "f")),
         1, "kept no samples"),
        (("top", "cpu", str(split_cpu_profile), "--focus", "("), 2, "not a valid regex"),
        (("top", "cpu", str(split_cpu_profile), "--since", "2s", "--until", "1s"), 2,
         "later than --since"),
        (("top", "cpu", str(split_cpu_profile), "--since", "soon"), 2, "not a duration"),
        (("peek", str(split_cpu_profile), "work", "--sample-index", "bogus"), 2,
         "unknown sample index"),
        (("export", str(split_cpu_profile), "-f", "folded", "--diff-base",
          str(split_cpu_profile)), 2, "only the pprof format"),
    ]
    for args, code, message in cases:
        result = run_rsprof(*args)
        assert result.returncode == code, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())  # failed exports leave no file behind


def test_sql_views_answer_what_top_answers(
    split_cpu_profile: Path, leaky_heap_profile: Path, tmp_path: Path
) -> None:
    top = _by_function(top_json(split_cpu_profile, "cpu"))
    rows = _json("query", str(split_cpu_profile),
                 "SELECT function, self, total, self_pct, total_pct FROM cpu_functions", "--json")
    view = {r["function"]: r for r in rows}
    for name in ("spin", "heavy", "light", "work", "main"):
        assert (view[name]["self"], view[name]["total"]) == (
            top[name]["self"], top[name]["total"]), name
    threads = _json("query", str(split_cpu_profile),
                    "SELECT name, samples FROM cpu_threads", "--json")
    assert {"split-main", "split-busy", "split-late"} <= {t["name"] for t in threads}
    assert sum(t["samples"] for t in threads) == sum(int(r["self"]) for r in top.values())
    [leak] = _json("query", str(leaky_heap_profile),
                   "SELECT leaked_bytes, leaked_count FROM heap_sites"
                   " WHERE function = 'leak_site'", "--json")
    assert (leak["leaked_bytes"], leak["leaked_count"]) == (LEAKY_TICKS * 4000, LEAKY_TICKS)
    # A file written before the views existed still has them in `rsprof query`.
    old = tmp_path / "old.db"
    old.write_bytes(split_cpu_profile.read_bytes())
    conn = sqlite3.connect(old)
    for name in ("cpu_functions", "cpu_threads", "heap_sites"):
        conn.execute(f"DROP VIEW {name}")
    conn.commit()
    conn.close()
    again = _json("query", str(old), "SELECT function, total FROM cpu_functions", "--json")
    assert {r["function"]: r["total"] for r in again}["work"] == top["work"]["total"]


def test_reports_read_the_newest_profile_here_without_a_file(split_cpu_profile: Path,
                                                             tmp_path: Path) -> None:
    """As `view` does: `rsprof run -- app && rsprof top cpu` reads what was just recorded.
    `peek REGEX` alone is the regex; an empty folder says to give a FILE (exit 6)."""
    here = tmp_path / "here"
    here.mkdir()
    shutil.copy(split_cpu_profile, here / "split.db")
    with_file = run_rsprof("top", "cpu", str(split_cpu_profile), "--json", "-n", "0")
    without = run_rsprof("top", "cpu", "--json", "-n", "0", cwd=here)
    assert without.returncode == 0, without.stderr
    assert json.loads(without.stdout) == json.loads(with_file.stdout)
    traced = run_rsprof("traces", "--json", "-n", "3", cwd=here)
    assert traced.returncode == 0 and json.loads(traced.stdout), traced.stderr
    peeked = run_rsprof("peek", "heavy", "--json", cwd=here)
    assert peeked.returncode == 0, peeked.stderr
    assert [e["function"] for e in json.loads(peeked.stdout)] == ["heavy"]
    exported = run_rsprof("export", "-f", "folded", cwd=here)
    assert exported.returncode == 0, exported.stderr
    assert (here / "split.cpu.folded").read_text().count("heavy") > 0
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (("top", "cpu"), ("traces",), ("peek", "heavy"), ("export",)):
        result = run_rsprof(*args, cwd=empty)
        assert result.returncode == 6, (args, result.stderr)
        assert result.stderr.strip() == "rsprof: error: no profile in this folder; give a FILE"


@pytest.mark.parametrize(("args", "said"), [
    (("top", "cpu", "--since", "100s"),
     "no CPU samples in the time range --since 100s; the recording lasts"),
    (("top", "cpu", "--tid", "1"), "no CPU samples of thread 1"),
    (("traces", "--until", "0s"), "no CPU samples in the time range --until 0s"),
    (("peek", "heavy", "--focus", "no_such_function"),
     "the filters (focus=no_such_function) kept no samples"),
])
def test_an_empty_selection_says_why(split_cpu_profile: Path, args: tuple[str, ...],
                                     said: str) -> None:
    """Not an error (exit 0, the empty table or []), but one line on stderr saying what was
    asked for: an empty table alone reads as "nothing ran"."""
    at = 2 if args[0] == "top" else 1  # FILE after `top cpu`, else after the command
    result = run_rsprof(*args[:at], str(split_cpu_profile), *args[at:])
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rsprof: {said}"), result.stderr


def _on_a_terminal(args: tuple[str, ...], env: dict[str, str]) -> str:
    """What `rsprof ARGS` writes to stdout when stdout is a terminal (a pty)."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-P", "-m", "rsprof", *args],
                            stdin=subprocess.DEVNULL, stdout=secondary,
                            stderr=subprocess.DEVNULL, env={**rsprof_env(), **env})
    os.close(secondary)
    try:
        said = read_pty(primary)
    finally:
        os.close(primary)
        proc.wait(timeout=60)
    return said.decode()


def test_no_color_writes_no_escape_sequence(split_cpu_profile: Path) -> None:
    """NO_COLOR (no-color.org) on a terminal: not even bold headers."""
    args = ("top", "cpu", str(split_cpu_profile), "-n", "0")
    styled = _on_a_terminal(args, {"TERM": "xterm-256color"})
    assert "\x1b[1m" in styled and "heavy" in styled  # the test can fail: bold is there
    plain = _on_a_terminal(args, {"TERM": "xterm-256color", "NO_COLOR": "1"})
    assert "\x1b[" not in plain and "heavy" in plain, plain


@pytest.mark.parametrize(("words", "offered"), [
    ("rsprof top ", ["cpu", "heap", "offcpu", "wall"]),
    ("rsprof top h", ["heap"]),
    ("rsprof export -f ", ["pprof", "folded", "speedscope", "json", "csv", "html", "firefox"]),
    ("rsprof export -f f", ["folded", "firefox"]),
    ("rsprof traces --kind ", ["cpu", "heap", "offcpu", "wall"]),
])
def test_completion_offers_kinds_and_formats(words: str, offered: list[str]) -> None:
    """Click's bash completion, as README's `eval "$(_RSPROF_COMPLETE=bash_source rsprof)"`
    asks it: KIND of `top` and the export formats, not only the Choice options."""
    result = subprocess.run(
        [sys.executable, "-P", "-m", "rsprof"], capture_output=True, text=True, timeout=60,
        env={**rsprof_env(), "_RSPROF_COMPLETE": "bash_complete", "COMP_WORDS": words,
             "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))})
    assert result.returncode == 0, result.stderr
    got = [line.split(",", 1)[1] for line in result.stdout.splitlines()]
    assert sorted(got) == sorted(offered), result.stdout


def test_hide_runtime_puts_the_programs_functions_first(split_cpu_profile: Path) -> None:
    """--hide-runtime (storage/runtime.py): no start-up frame in top, traces or folded
    stacks; no sample lost (the same total, each function's self time unchanged). A
    function inlined into a start-up frame (glibc's advise_stack_range in start_thread, at a
    thread's exit) goes with that frame: only those, and never with self time.

    A stack made only of start-up frames keeps its leaf (the sample is never lost): a new
    thread sampled in clone3 or start_thread before it calls anything. CI caught one such
    sample beside four CPU hogs; such a leaf stays, with only its own samples."""
    plain = {r["function"]: r for r in top_json(split_cpu_profile, "cpu")}
    folded = {r["function"]: r for r in top_json(split_cpu_profile, "cpu", "--hide-runtime")}
    startup = {"_start", "__libc_start_main_impl", "__libc_start_call_main", "start_thread",
               "clone3"}
    assert startup & set(plain), sorted(plain)
    lone_leaves = startup & set(folded)
    assert all(folded[name]["total"] == folded[name]["self"] == plain[name]["self"] > 0
               for name in lone_leaves), {name: folded[name] for name in lone_leaves}
    assert sum(folded[name]["self"] for name in lone_leaves) <= 3, sorted(folded)
    gone = set(plain) - set(folded) - startup
    assert all(plain[name]["self"] == 0 for name in gone), gone
    assert {name: r["self"] for name, r in folded.items()} == {
        name: r["self"] for name, r in plain.items()
        if name not in (startup - lone_leaves) | gone}
    assert folded["work"]["total"] == plain["work"]["total"]
    exported = run_rsprof("export", str(split_cpu_profile), "-f", "folded", "-o", "-",
                          "--hide-runtime")
    assert exported.returncode == 0, exported.stderr
    # A lone start-up leaf is its stack's root too.
    roots = {line.split(";", 1)[0] for line in exported.stdout.splitlines()}
    assert roots and not roots & (startup - lone_leaves), roots
    assert sum(int(line.rsplit(" ", 1)[1]) for line in exported.stdout.splitlines()) == sum(
        r["self"] for r in plain.values())
