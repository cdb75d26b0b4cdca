"""A self-contained interactive flame graph: one HTML file with the call tree as JSON and
the code that draws it inline (no network, no CDN), opened offline in any browser.

The tree is aggregated here, once, so the page only draws: samples merged by path of
function names (the granularity of `rsprof top` and the folded export; one node per
inline level), each node with its self and total values and the source line carrying most
of its weight. The page (storage/flamegraph.html) draws only the boxes wider than a pixel,
so it stays fast for tens of thousands of distinct stacks.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any, TextIO

from rsprof.storage.callsite import is_python_address
from rsprof.storage.flame import thread_label
from rsprof.storage.samples import Frame, SampleSet, is_kernel_frame

# Node categories, as the page colours them (HUES in flamegraph.html).
NATIVE, PYTHON, KERNEL, OTHER = range(4)
DATA_MARK = "/*RSPROF_DATA*/"
TITLE_MARK = "/*RSPROF_TITLE*/"


class _Node:
    """One call path's last function. A plain class: a large profile makes a million of
    them, and a dataclass with default factories takes several times as long to create."""

    __slots__ = ("category", "children", "file", "lines", "name", "self_value", "total")

    def __init__(self, name: str, file: str, category: int) -> None:
        self.name = name
        self.file = file
        self.category = category
        self.self_value = 0
        self.total = 0
        self.lines: dict[int, int] = {}  # source line -> weight
        self.children: dict[tuple[str, str], _Node] = {}


def _category(frame: Frame) -> int:
    if is_kernel_frame(frame):
        return KERNEL
    if is_python_address(frame.address):
        return PYTHON
    return NATIVE if frame.module else OTHER


def build_tree(samples: SampleSet, value_index: int, *, per_thread: bool = False) -> _Node:
    """The call tree of `samples` weighted by `value_index`, root first; children keyed by
    (function, file), so two static functions of one name in two files stay apart."""
    root = _Node("all", "", OTHER)
    for sample in samples.samples:
        value = sample.values[value_index]
        if value <= 0 or not sample.frames:
            continue
        node = root
        node.total += value
        if per_thread and sample.tid is not None:
            label = thread_label(sample)
            node = node.children.setdefault((label, ""), _Node(label, "", OTHER))
            node.total += value
        for frame in reversed(sample.frames):
            category = _category(frame)
            for line in reversed(frame.lines):
                name = line.function or "[unknown]"
                key = (name, line.file)
                child = node.children.get(key)
                if child is None:
                    child = node.children[key] = _Node(name, line.file, category)
                child.total += value
                if line.line > 0:
                    child.lines[line.line] = child.lines.get(line.line, 0) + value
                node = child
        node.self_value += value
    return root


def tree_data(root: _Node) -> dict[str, Any]:
    """The tree as the page reads it: parallel arrays in pre-order (parents first, children
    by name as flamegraph.pl sorts them), names and files as indexes into `strings`."""
    strings: list[str] = []
    string_index: dict[str, int] = {}

    def intern(text: str) -> int:
        index = string_index.get(text)
        if index is None:
            index = string_index[text] = len(strings)
            strings.append(text)
        return index

    columns: dict[str, list[int]] = {key: [] for key in
                                     ("name", "file", "line", "category", "parent", "self",
                                      "total")}
    todo: list[tuple[_Node, int]] = [(root, -1)]
    while todo:
        node, parent = todo.pop()
        index = len(columns["parent"])
        columns["name"].append(intern(node.name))
        columns["file"].append(intern(node.file))
        line = max(node.lines.items(), key=lambda item: (item[1], -item[0]))[0] if node.lines else 0
        columns["line"].append(line)
        columns["category"].append(node.category)
        columns["parent"].append(parent)
        columns["self"].append(node.self_value)
        columns["total"].append(node.total)
        # Pushed in reverse so they are numbered in name order.
        for key in sorted(node.children, reverse=True):
            todo.append((node.children[key], index))
    return {"strings": strings, "nodes": columns}


def write_html(samples: SampleSet, out: TextIO, *, value_index: int | None = None,
               per_thread: bool = False, source: str = "") -> None:
    """The page for `samples`; `source` (the profile's file name) goes in the subtitle."""
    index = samples.default_index if value_index is None else value_index
    if not 0 <= index < len(samples.sample_types):
        raise ValueError(f"sample index {index} out of range for a {samples.kind} profile")
    sample_type, unit = samples.sample_types[index]
    process = samples.meta.get("process_name", "") or "profile"
    pid = samples.meta.get("pid", "")
    what = {"cpu": "CPU", "offcpu": "off-CPU", "wall": "wall-clock"}.get(samples.kind, "heap")
    title = f"{process}{f' (pid {pid})' if pid else ''}: {what} {sample_type}"
    seconds = max(0, samples.end_ms - samples.start_ms) / 1000
    subtitle = " · ".join(part for part in (source, f"{seconds:.1f} s", f"{sample_type} ({unit})")
                          if part)
    data = {
        "title": title,
        "subtitle": subtitle,
        "kind": samples.kind,
        "sampleType": sample_type,
        "unit": unit,
        "countName": "objects" if samples.kind == "heap" else "samples",
        **tree_data(build_tree(samples, index, per_thread=per_thread)),
    }
    # "</" and "<!--" inside a script element would end it or confuse the parser: JSON
    # allows the escape \u003c for "<" anywhere.
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
    page = resources.files("rsprof.storage").joinpath("flamegraph.html").read_text("utf-8")
    head, _, tail = page.partition(DATA_MARK)  # the title mark is in `head`
    out.write(head.replace(TITLE_MARK, html.escape(title)))
    out.write(text)
    out.write(tail)
