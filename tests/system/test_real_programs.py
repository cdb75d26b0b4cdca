"""Programs nobody here wrote, under `rsprof run` with heap tracking on (the default): each
must behave exactly as without rsprof (same exit code, same output) and the profile must
name it. Debian's binutils, GCC, Python, Perl, SQLite, tar, awk, xz, git and ripgrep are
built -O2 without frame pointers; several are multi-threaded (xz -T2, rg -j2) or start
other programs (gcc, sh)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from conftest import heap_rings, run_rsprof

pytestmark = pytest.mark.slow  # real programs (sqlite3, perl, git...) with and without rsprof

C_SOURCE = "int add(int a, int b) { return a + b; }\nint main(void) { return add(1, 2) - 3; }\n"
ASM_SOURCE = ".text\n.globl f\nf:\n  movl $42, %eax\n  ret\n"


def _workdir(tmp_path: Path) -> Path:
    (tmp_path / "t.c").write_text(C_SOURCE)
    (tmp_path / "t.s").write_text(ASM_SOURCE)
    data = hashlib.sha256(b"seed").digest() * 40000  # ~1.3 MB, compressible a little
    (tmp_path / "data.bin").write_bytes(data + bytes(range(256)) * 2000)
    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(30):
        (tree / f"f{i}.txt").write_text(("needle\n" if i % 3 == 0 else "hay\n") * 200)
    return tmp_path


# (name, argv, the output files to compare besides stdout)
PROGRAMS: list[tuple[str, list[str], list[str]]] = [
    ("as", ["as", "-o", "t_as.o", "t.s"], []),
    ("gcc -c", ["gcc", "-O2", "-c", "t.c", "-o", "t_cc.o"], []),
    ("gcc link (ld)", ["sh", "-c", "gcc -c t.c -o t_l.o && gcc t_l.o -o t_bin && ./t_bin"], []),
    ("python3", ["/usr/bin/python3", "-c",
                 "import json, re; print(json.dumps({'n': len(re.findall('a', 'banana'))}))"], []),
    ("perl", ["perl", "-e", 'print join(",", map { $_ * 2 } 1..50), "\\n"'], []),
    ("sqlite3", ["sqlite3", ":memory:",
                 "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<50000)"
                 " SELECT SUM(x) FROM c;"], []),
    ("tar", ["sh", "-c", "tar cf - tree | tar tf - | sort"], []),
    ("awk", ["awk", "BEGIN { s = 0; for (i = 0; i < 300000; i++) s += i % 7; print s }"], []),
    ("xz -T2", ["sh", "-c", "xz -T2 -6 -c data.bin | sha256sum"], []),
    ("rg -j2", ["sh", "-c", "rg -j2 -c needle tree | sort"], []),
    ("git", ["sh", "-c", "git hash-object data.bin && git --version"], []),
    ("shell loop", ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done; echo ok"], []),
]


@pytest.mark.parametrize(("name", "argv", "_files"), PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_program_runs_unchanged_under_rsprof(
    name: str, argv: list[str], _files: list[str], tmp_path: Path
) -> None:
    tools = {"rg -j2": "rg", "sqlite3": "sqlite3", "xz -T2": "xz", "git": "git", "perl": "perl"}
    tool = tools.get(name)
    if tool is not None and shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (apt-get install {tool})")
    work = _workdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    started = time.monotonic()
    plain = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=120, env=env)
    plain_s = time.monotonic() - started
    out = tmp_path / "profile.db"
    started = time.monotonic()
    result = run_rsprof("run", "-q", "--cpu-freq", "999", "-o", str(out), "--", *argv,
                        cwd=work, timeout=240)
    profiled_s = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    # Within twice its own time plus rsprof's start-up (an interpreter; generous on a busy
    # machine). bench/bench_matrix.py has the figures.
    assert profiled_s < 2 * plain_s + 10, (profiled_s, plain_s)
    assert f"target exited with code {plain.returncode}" in result.stderr, result.stderr
    # The program's own output reaches its stdout unchanged (rsprof -q writes to stderr).
    assert result.stdout == plain.stdout, (result.stdout, plain.stdout)
    db = sqlite3.connect(out)
    assert db.execute("SELECT value FROM meta WHERE key = 'state'").fetchone()[0] == "finished"
    commands = " ".join(c for (c,) in db.execute("SELECT command FROM processes") if c)
    assert argv[0].rsplit("/", 1)[-1] in commands, commands
    # Every process allocates: its heap sites are in the profile (children's too).
    sites = db.execute("SELECT COUNT(*) FROM heap_site_samples").fetchone()[0]
    assert sites > 0
    # No ring is left behind in /dev/shm by any process of the run.
    pids = {pid for (pid,) in db.execute("SELECT DISTINCT pid FROM processes")}
    left = [pid for pid in pids if heap_rings(pid)]
    assert not left, left
