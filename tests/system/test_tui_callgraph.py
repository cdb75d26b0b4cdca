"""The TUI's call-graph numbers (storage.live) against `rsprof top` and `rsprof peek`
(storage.analysis, storage.callgraph): the same words mean the same numbers."""

from __future__ import annotations

import sys
from pathlib import Path

from rsprof.storage.live import CallNode, LiveProfile
from rsprof.storage.reader import Profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))




def _walk(node: CallNode) -> list[CallNode]:
    out = [node]
    for child in node.children:
        out.extend(_walk(child))
    return out


def test_heap_tree_on_a_cpp_target_cuts_at_the_call_site(tmp_path: Path) -> None:
    """Real recording: std::string built inside keep_strings() (inlined library code) is
    charged to keep_strings in the allocation tree, as `rsprof top heap` charges it."""
    from conftest import build_target, run_rsprof
    from rsprof.storage.analysis import top_heap

    binary = build_target("heap_stl.cc", ("-O2",))
    out = tmp_path / "stl.db"
    result = run_rsprof("run", "-q", "-o", str(out), "--", str(binary), "1000")
    assert result.returncode == 0, result.stderr
    lp = LiveProfile(out)
    lp.refresh()
    selfs: dict[str, int] = {}
    for node in _walk(lp.heap_tree())[1:]:
        name = node.function.split("(")[0]
        selfs[name] = selfs.get(name, 0) + node.self_samples
    assert selfs["keep_strings"] == 1000 * 101
    assert not any(name.startswith("std::") and b for name, b in selfs.items()), selfs
    with Profile(out) as p:
        expected = {s.function.split("(")[0]: 0 for s in top_heap(p, limit=None)}
        for s in top_heap(p, limit=None):
            expected[s.function.split("(")[0]] += s.live_bytes
    assert {k: v for k, v in selfs.items() if v} == {k: v for k, v in expected.items() if v}


