"""The interactive HTML flame graph (`rsprof export -f html`) of real recorded profiles: the
page is one file that references nothing on the network, its embedded call tree holds the
same numbers as the folded export and `rsprof top` for the same selection, and (with node)
the page's own tree, search and layout code gives those numbers too."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from conftest import run_rsprof, top_json
from rsprof.storage.flamehtml import write_html
from rsprof.storage.samples import CPU_SAMPLE_TYPES, Frame, Line, Mapping, Sample, SampleSet
from test_export_flame import parse_folded

LEAK_BYTES = 60 * 4000  # leaky.c: leak_site() leaks 4000 B per tick, 60 ticks
NODE = shutil.which("node")


class _Page(HTMLParser):
    """The page's script and link elements, and the text of each script."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: dict[str, str] = {}
        self._script: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._script = dict(attrs).get("id") or f"script{len(self.scripts)}"
            self.scripts[self._script] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self.scripts[self._script] += data


def _export_html(profile: Path, out: Path, *options: str) -> tuple[_Page, dict[str, Any]]:
    result = run_rsprof("export", str(profile), "-f", "html", "-o", str(out), *options)
    assert result.returncode == 0, result.stderr
    page = _Page()
    page.feed(out.read_text(encoding="utf-8"))
    data: dict[str, Any] = json.loads(page.scripts["rsprof-data"])
    return page, data


def _folded(profile: Path, *options: str) -> list[tuple[list[str], int]]:
    result = run_rsprof("export", str(profile), "-f", "folded", "-o", "-", *options)
    assert result.returncode == 0, result.stderr
    return parse_folded(result.stdout)


def _paths(data: dict[str, Any]) -> Counter[tuple[str, ...]]:
    """Every root-to-node path with a self value, as the folded format writes stacks (the
    tree's synthetic root left out)."""
    nodes, strings = data["nodes"], data["strings"]
    paths: list[tuple[str, ...]] = []
    found: Counter[tuple[str, ...]] = Counter()
    for i, parent in enumerate(nodes["parent"]):
        paths.append(() if parent < 0 else (*paths[parent], strings[nodes["name"][i]]))
        if nodes["self"][i]:
            found[paths[i]] += nodes["self"][i]
    return found


def _folded_paths(stacks: list[tuple[list[str], int]]) -> Counter[tuple[str, ...]]:
    found: Counter[tuple[str, ...]] = Counter()
    for frames, count in stacks:
        found[tuple(frames)] += count
    return found


def _function_totals(data: dict[str, Any]) -> Counter[str]:
    """Per function name, the weight of the samples it is on (a recursive call counted once),
    as `rsprof top`'s total column counts."""
    nodes, strings = data["nodes"], data["strings"]
    names = [strings[n] for n in nodes["name"]]
    totals: Counter[str] = Counter()
    above: list[frozenset[str]] = []
    for i, parent in enumerate(nodes["parent"]):
        callers = frozenset() if parent < 0 else above[parent] | {names[parent]}
        above.append(callers)
        if parent >= 0 and names[i] not in callers:
            totals[names[i]] += nodes["total"][i]
    return totals


def _check_tree(data: dict[str, Any]) -> None:
    """Parents come first and every total is its self plus its children's totals."""
    nodes = data["nodes"]
    count = len(nodes["parent"])
    for column in nodes.values():
        assert len(column) == count
    children_total = [0] * count
    for i, parent in enumerate(nodes["parent"]):
        assert (parent == -1) == (i == 0) and parent < i
        if parent >= 0:
            children_total[parent] += nodes["total"][i]
    for i in range(count):
        assert nodes["total"][i] == nodes["self"][i] + children_total[i]


def test_page_is_self_contained(split_cpu_profile: Path, tmp_path: Path) -> None:
    page, data = _export_html(split_cpu_profile, tmp_path / "cpu.html")
    text = (tmp_path / "cpu.html").read_text(encoding="utf-8")
    for tag, attrs in page.tags:
        if tag in ("script", "link", "img", "iframe"):
            # Inline only: nothing is loaded from anywhere, online or not.
            assert not attrs.get("src") and not attrs.get("href"), (tag, attrs)
    assert not re.search(r"<(script|link)[^>]*https?://", text)
    assert {"rsprof-data", "rsprof-model", "rsprof-view"} <= page.scripts.keys()
    assert "CPU samples" in data["title"] and "(pid " in data["title"]
    assert "<title>" in text and "CPU samples</title>" in text


def test_cpu_tree_equals_folded_and_top(split_cpu_profile: Path, tmp_path: Path) -> None:
    _, data = _export_html(split_cpu_profile, tmp_path / "cpu.html")
    _check_tree(data)
    stacks = _folded(split_cpu_profile)
    assert data["nodes"]["total"][0] == sum(count for _, count in stacks) > 0
    assert _paths(data) == _folded_paths(stacks)
    # Function totals: rsprof top's total column (functions of one name summed over files).
    top: Counter[str] = Counter()
    for row in top_json(split_cpu_profile, "cpu"):
        top[row["function"]] += row["total"]
    totals = _function_totals(data)
    assert {name: totals[name] for name in top} == dict(top)
    for name in ("heavy", "light", "work", "spin"):
        assert totals[name] > 0


def test_heap_tree_is_exact(leaky_heap_profile: Path, tmp_path: Path) -> None:
    _, data = _export_html(leaky_heap_profile, tmp_path / "heap.html", "--kind", "heap")
    _check_tree(data)
    assert data["unit"] == "bytes" and data["sampleType"] == "inuse_space"
    assert "heap inuse_space" in data["title"]
    stacks = _folded(leaky_heap_profile, "--kind", "heap")
    assert _paths(data) == _folded_paths(stacks)
    totals = _function_totals(data)
    assert totals["leak_site"] == LEAK_BYTES
    live = sum(row["live_bytes"] for row in top_json(leaky_heap_profile, "heap"))
    assert data["nodes"]["total"][0] == live


@pytest.mark.parametrize("options", [
    ("--per-thread",),
    ("--focus", "heavy"),
    ("--ignore", "light", "--hide", "spin"),
    ("--since", "1s", "--until", "2s"),
    ("--sample-index", "cpu"),
    ("--per-thread", "--show", "^(main|work|heavy|light|late_worker)$"),
])
def test_options_select_as_folded(split_cpu_profile: Path, tmp_path: Path,
                                  options: tuple[str, ...]) -> None:
    _, data = _export_html(split_cpu_profile, tmp_path / "cpu.html", *options)
    _check_tree(data)
    assert _paths(data) == _folded_paths(_folded(split_cpu_profile, *options))


def test_tid_selects_one_thread(split_cpu_profile: Path, tmp_path: Path) -> None:
    folded = _folded(split_cpu_profile, "--per-thread")
    label = next(frames[0] for frames, _ in folded if frames[0].startswith("split-late"))
    tid = label.rsplit("(", 1)[1].rstrip(")")
    _, data = _export_html(split_cpu_profile, tmp_path / "late.html", "--tid", tid)
    late = sum(count for frames, count in folded if frames[0] == label)
    assert data["nodes"]["total"][0] == late > 0
    assert "late_worker" in _function_totals(data)
    assert "heavy" not in _function_totals(data)


def test_escapes_names_that_would_end_the_script(tmp_path: Path) -> None:
    line = Line(1, "operator</script><b>x", "x", "a<!--.c", 3)
    frame = Frame(1, 0x1000, "/bin/x", 0x1000, Mapping(1, 0, 0x2000, 0, "/bin/x", ""), (line,))
    samples = SampleSet("cpu", CPU_SAMPLE_TYPES, 0, [Sample((frame,), [5, 50], 7, "t")], 0, 1,
                        period_ns=10, meta={"process_name": "</title>app", "pid": "7"})
    out = io.StringIO()
    write_html(samples, out)
    page = _Page()
    page.feed(out.getvalue())
    data = json.loads(page.scripts["rsprof-data"])
    assert "operator</script><b>x" in data["strings"]
    assert "<title>&lt;/title&gt;app" in out.getvalue()


def _synthetic(stacks: int) -> SampleSet:
    """`stacks` distinct stacks over 400 functions, 17 to 39 frames deep, sharing prefixes
    as real ones do: level k of stack n depends on n's top k bits, so the tree has 2**k
    nodes at level k down to 2**16 and one chain per stack below."""
    mapping = Mapping(1, 0x1000, 0x100000, 0, "/usr/bin/app", "")
    frames = [Frame(i, 0x1000 + i, "/usr/bin/app", i, mapping,
                    (Line(i, f"function_{i}", f"function_{i}", f"src/file_{i % 40}.c", i),))
              for i in range(400)]
    samples = []
    for n in range(stacks):
        depth = 17 + n % 23
        root_first = [frames[((n >> max(0, 16 - k)) * 2654435761 + k) % 400]
                      for k in range(depth)]
        samples.append(Sample(tuple(reversed(root_first)), [1 + n % 5, 0], 1, "main"))
    return SampleSet("cpu", CPU_SAMPLE_TYPES, 0, samples, 0, 1000, period_ns=1,
                     meta={"process_name": "app", "pid": "1"})


def test_fifty_thousand_stacks_stay_fast(tmp_path: Path) -> None:
    samples = _synthetic(50_000)
    started = time.monotonic()
    out = tmp_path / "big.html"
    with out.open("w", encoding="utf-8") as stream:
        write_html(samples, stream)
    elapsed = time.monotonic() - started
    page = _Page()
    page.feed(out.read_text(encoding="utf-8"))
    data = json.loads(page.scripts["rsprof-data"])
    assert data["nodes"]["total"][0] == samples.total()
    assert elapsed < 120, f"writing took {elapsed:.1f} s"
    if NODE:
        result = _run_model(out, "layout-timing")
        assert result["boxes"] <= result["nodes"]
        # Only boxes wider than a pixel are laid out: a few thousand of the ~650k nodes.
        assert result["boxes"] < 20_000 and result["layoutMs"] < 5000, result


# -- the page's own code, run by node ---------------------------------------------------

_MODEL_RUNNER = r"""
const fs = require("fs");
const [page, command, argument] = process.argv.slice(2);
const text = fs.readFileSync(page, "utf8");
const script = (id) =>
  text.match(new RegExp('<script[^>]*id="' + id + '"[^>]*>([\\s\\S]*?)</script>'))[1];
const data = JSON.parse(script("rsprof-data"));
const sandbox = { exports: {} };
new Function("module", script("rsprof-model"))(sandbox);
const model = sandbox.exports;
let started = Date.now();
const tree = model.buildTree(data);
const buildMs = Date.now() - started;
let out;
if (command === "search") {
  const found = model.search(tree, argument);
  out = { weight: found.weight, total: found.total, matched: found.matched.size,
          names: [...new Set([...found.matched].map((n) => n.name))],
          share: model.percent(found.weight, tree.root.total) };
} else if (command === "layout") {
  const width = Number(argument);
  const boxes = model.layout(tree, tree.root, width, 1);
  const zoomTo = tree.nodes.find((n) => n.name === "heavy");
  const zoomed = model.layout(tree, zoomTo, width, 1);
  out = { root: tree.root.total, maxDepth: tree.maxDepth,
          boxes: boxes.map((b) => [b.node.name, b.x, b.width, b.depth]),
          zoomed: zoomed.map((b) => [b.node.name, b.x, b.width, b.depth, b.caller]) };
} else {
  started = Date.now();
  const boxes = model.layout(tree, tree.root, 1920, 1);
  out = { buildMs, layoutMs: Date.now() - started, boxes: boxes.length,
          nodes: tree.nodes.length };
}
console.log(JSON.stringify(out));
"""


def _run_model(page: Path, command: str, argument: str = "") -> dict[str, Any]:
    assert NODE
    runner = page.parent / "run_model.cjs"
    runner.write_text(_MODEL_RUNNER)
    result = subprocess.run([NODE, str(runner), str(page), command, argument],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")


@needs_node
def test_page_scripts_parse(split_cpu_profile: Path, tmp_path: Path) -> None:
    page, _ = _export_html(split_cpu_profile, tmp_path / "cpu.html")
    for name in ("rsprof-model", "rsprof-view"):
        script = tmp_path / f"{name}.js"
        script.write_text(page.scripts[name])
        result = subprocess.run([str(NODE), "--check", str(script)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stderr


@needs_node
def test_page_search_share_equals_folded(split_cpu_profile: Path, tmp_path: Path) -> None:
    _export_html(split_cpu_profile, tmp_path / "cpu.html")
    stacks = _folded(split_cpu_profile)
    total = sum(count for _, count in stacks)
    for query, wanted in (("heavy", {"heavy"}), ("^(heavy|light)$", {"heavy", "light"}),
                          ("SPIN", {"spin"}), ("split\\.c", None)):
        found = _run_model(tmp_path / "cpu.html", "search", query)
        pattern = re.compile(query, re.IGNORECASE)
        weight = sum(count for frames, count in stacks
                     if any(pattern.search(frame) for frame in frames))
        if wanted is not None:
            assert set(found["names"]) == wanted
            assert found["weight"] == weight > 0
        else:  # a file matches: every function defined in split.c
            assert {"heavy", "light", "spin", "work"} <= set(found["names"])
        assert found["total"] == total
        assert found["share"] == f"{100 * found['weight'] / total:.2f}%"


@needs_node
def test_page_layout_draws_wide_frames_and_zooms(split_cpu_profile: Path,
                                                  tmp_path: Path) -> None:
    _, data = _export_html(split_cpu_profile, tmp_path / "cpu.html")
    found = _run_model(tmp_path / "cpu.html", "layout", "1000")
    assert found["root"] == data["nodes"]["total"][0]
    boxes = found["boxes"]
    assert boxes[0] == ["all", 0, pytest.approx(1000), 0]
    assert all(width >= 1 for _, _, width, _ in boxes)
    assert all(x + width <= 1000 + 1e-6 for _, x, width, _ in boxes)
    # Zoomed into heavy(): its callers above it at full width, heavy itself at full width.
    zoomed = found["zoomed"]
    callers = [box for box in zoomed if box[4]]
    assert [name for name, *_ in callers][:1] == ["all"]
    focus = next(box for box in zoomed if not box[4])
    assert focus[:3] == ["heavy", 0, pytest.approx(1000)]
    assert focus[3] == len(callers)


# -- the whole page in jsdom: the view's wiring, with a 2D context that records calls -----

_VIEW_DRIVER = r"""
const { JSDOM } = require("jsdom");
const fs = require("fs");
const calls = [];
const dom = new JSDOM(fs.readFileSync(process.argv[2], "utf8"), {
  runScripts: "dangerously", pretendToBeVisual: true,
  beforeParse(window) {
    window.HTMLCanvasElement.prototype.getContext = () => new Proxy({}, {
      get: (target, name) => name in target ? target[name]
        : (...args) => calls.push([name, ...args]),
      set: (target, name, value) => { target[name] = value; calls.push(["set", name, value]);
                                      return true; },
    });
    Object.defineProperty(window.Element.prototype, "clientWidth", { get: () => 1000 });
  },
});
(async () => {
const w = dom.window, d = w.document, canvas = d.getElementById("canvas");
canvas.getBoundingClientRect = () => ({ left: 0, top: 0 });
const labels = () => calls.filter((c) => c[0] === "fillText").map((c) => c[1]);
const tooltipAt = (x, y) => {
  canvas.dispatchEvent(new w.MouseEvent("mousemove", { clientX: x, clientY: y }));
  return d.getElementById("tooltip").textContent;
};
const out = { title: d.title, heading: d.getElementById("title").textContent,
              subtitle: d.getElementById("subtitle").textContent, labels: labels() };
out.rootTooltip = tooltipAt(500, 9);
const query = process.argv[3];
calls.length = 0;
const input = d.getElementById("search");
input.value = query;
input.dispatchEvent(new w.Event("input"));
await new Promise((resolve) => setTimeout(resolve, 300));  // the page waits for typing to pause
out.match = d.getElementById("match").textContent;
out.highlighted = calls.filter((c) => c[0] === "set" && c[1] === "fillStyle"
                               && c[2] === "#e040c0").length;
// Click the first box of the searched function, found with the page's own layout.
const tree = w.FlameModel.buildTree(JSON.parse(d.getElementById("rsprof-data").textContent));
const box = w.FlameModel.layout(tree, tree.root, 1000, 1)
  .find((b) => w.FlameModel.pattern(query).test(b.node.name));
calls.length = 0;
canvas.dispatchEvent(new w.MouseEvent("click", { clientX: box.x + box.width / 2,
                                                 clientY: box.depth * 18 + 9 }));
out.zoomedLabels = labels();
out.zoomedTooltip = tooltipAt(500, box.depth * 18 + 9);
out.zoomedName = box.node.name;
calls.length = 0;
d.dispatchEvent(new w.KeyboardEvent("keydown", { key: "Escape" }));
out.resetLabels = labels();
console.log(JSON.stringify(out));
})();
"""


def _jsdom_node_path() -> str | None:
    """Where jsdom is installed (npm's global folder or RSPROF_NODE_PATH), if it is."""
    if NODE is None:
        return None
    folders = [os.environ.get("RSPROF_NODE_PATH", "")]
    npm = shutil.which("npm")
    if npm:
        root = subprocess.run([npm, "root", "-g"], capture_output=True, text=True, timeout=60)
        folders.append(root.stdout.strip())
    for folder in filter(None, folders):
        if (Path(folder) / "jsdom" / "package.json").exists():
            return folder
    return None


JSDOM_PATH = _jsdom_node_path()


def _drive(page: Path, query: str) -> dict[str, Any]:
    assert NODE and JSDOM_PATH
    driver = page.parent / "drive_view.cjs"
    driver.write_text(_VIEW_DRIVER)
    result = subprocess.run([NODE, str(driver), str(page), query], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "NODE_PATH": JSDOM_PATH})
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


@pytest.mark.skipif(JSDOM_PATH is None, reason="node or jsdom not installed (npm i -g jsdom)")
def test_page_view_searches_zooms_and_resets(split_cpu_profile: Path, tmp_path: Path) -> None:
    _, data = _export_html(split_cpu_profile, tmp_path / "cpu.html")
    total = data["nodes"]["total"][0]
    view = _drive(tmp_path / "cpu.html", "^heavy$")
    assert view["title"] == view["heading"] == data["title"]
    assert "cpu.html" not in view["subtitle"] and "samples (count)" in view["subtitle"]
    assert view["labels"][0] == "all"
    assert view["rootTooltip"].startswith("all\n") and f"total {total:,} samples" in \
        view["rootTooltip"] and "(100.00% of all)" in view["rootTooltip"]
    heavy = sum(count for frames, count in _folded(split_cpu_profile) if "heavy" in frames)
    assert view["match"] == f"matched {heavy:,} samples ({100 * heavy / total:.2f}%)"
    assert view["highlighted"] >= 1
    # Zoomed into heavy(): its callers, then heavy at full width with its callees.
    assert view["zoomedName"] == "heavy"
    assert view["zoomedLabels"][:2] == ["all", "_start"] and "heavy" in view["zoomedLabels"]
    assert view["zoomedTooltip"].startswith("heavy\n")
    assert "100.00% of the zoomed frame" in view["zoomedTooltip"]
    assert "late_worker" not in view["zoomedLabels"]
    assert view["resetLabels"][0] == "all" and "late_worker" in view["resetLabels"]


@pytest.mark.skipif(JSDOM_PATH is None, reason="node or jsdom not installed (npm i -g jsdom)")
def test_page_view_heap_in_bytes(leaky_heap_profile: Path, tmp_path: Path) -> None:
    _export_html(leaky_heap_profile, tmp_path / "heap.html", "--kind", "heap")
    view = _drive(tmp_path / "heap.html", "leak_site")
    assert "heap inuse_space" in view["title"]
    assert view["match"].startswith("matched 234.4 KiB (")  # 240000 B
