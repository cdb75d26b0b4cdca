"""`rsprof demo`, the README's first command, runs headless and tells the truth about the demo."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import assert_share, run_rsprof


def test_demo_headless_summary(tmp_path: Path) -> None:
    result = run_rsprof("demo", "-q", "-d", "3s", "-o", str(tmp_path / "demo.db"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name in ("compute_hashes", "multiply_matrices", "parse_requests"):
        assert name in result.stdout
    assert "rsprof view" in result.stderr
    rows = json.loads(run_rsprof("top", "cpu", str(tmp_path / "demo.db"), "--json", "-n", "0")
                      .stdout)
    by_name = {row["function"]: row for row in rows}
    # demo-hash spends 3 ms of CPU in compute_hashes for every 1 in checksum_block.
    hashes, checksum = by_name["compute_hashes"]["total"], by_name["checksum_block"]["total"]
    assert_share(hashes, checksum, 0.75, floor=0.07)
    threads = run_rsprof("query", str(tmp_path / "demo.db"), "SELECT name FROM threads")
    assert {"demo-hash", "demo-matrix"} <= set(threads.stdout.split())
    # rsprof's own shim is in no stack: its pthread_create wrapper (thread_trampoline) was
    # under every thread, 77 % Total on the first screen (collector/shimframes.py).
    assert "thread_trampoline" not in result.stdout
    assert "thread_trampoline" not in by_name
    assert not [row for row in rows if "librsprof_heap" in row["module"]]
    # The demo's source ships beside it and its rows name that file, which exists (it
    # named pip's deleted build folder: /tmp/pip-req-build-*/native/demo/demo.c).
    demo_rows = [by_name[name] for name in ("compute_hashes", "spin_for", "parse_requests")]
    for row in demo_rows:
        assert row["file"].endswith("rsprof/bin/demo.c") and Path(row["file"]).is_file(), row


def test_demo_help_lists_what_a_demo_uses() -> None:
    """-a, --follow, --python and --stack-bytes make no sense for a 5 s native demo: its
    help leaves them out (they are still accepted, as for `run`)."""
    result = run_rsprof("demo", "--help")
    assert result.returncode == 0, result.stderr
    for hidden in ("--append", "--follow", "--python", "--stack-bytes"):
        assert hidden not in result.stdout, hidden
    for shown in ("--duration", "--output", "--quiet", "--cpu-freq"):
        assert shown in result.stdout, shown
