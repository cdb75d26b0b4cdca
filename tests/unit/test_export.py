"""rsprof.export: what `rsprof export` writes and where: formats and their refusals, the
default name, atomic replacement of a regular file, writing into devices, no write through
another user's symbolic link."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import pytest
from rsprof.storage.filters import FrameFilter
from rsprof.storage.selection import EmptySelection, SampleQuery

from rsprof.export import FORMATS, SUFFIXES, ExportError, default_output, export
from unit.synthetic import small_profile


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_profile(tmp_path_factory.mktemp("export") / "app.db")


@pytest.mark.parametrize(("name", "fmt", "kind", "output"), [
    ("app.db", "pprof", "cpu", "app.cpu.pb.gz"),
    ("app.db", "folded", "heap", "app.heap.folded"),
    ("run.1.db", "speedscope", "cpu", "run.1.cpu.speedscope.json"),
    ("noext", "firefox", "cpu", "noext.cpu.firefox.json"),
    ("x.db.db", "csv", "heap", "x.db.heap.csv"),
])
def test_default_output(name: str, fmt: str, kind: str, output: str) -> None:
    assert default_output(Path("/some/where") / name, fmt, kind) == Path(output)
    assert set(SUFFIXES) == set(FORMATS)


def test_folded_is_the_selection(profile: Path, tmp_path: Path) -> None:
    target = tmp_path / "cpu.folded"
    where, selection = export(profile, fmt="folded", query=SampleQuery(), output=target)
    assert where == str(target)
    lines = dict(line.rsplit(" ", 1) for line in target.read_text().splitlines())
    assert {stack: int(n) for stack, n in lines.items()} == {
        "main;work": 60, "main;work;parse": 30, "main;parse;memcpy": 10}
    assert selection.samples.total() == 100
    focused = tmp_path / "focused.folded"
    export(profile, fmt="folded", output=focused,
           query=SampleQuery(filters=FrameFilter.compile(focus="memcpy")))
    assert focused.read_text() == "main;parse;memcpy 10\n"


def test_json_table_of_heap(profile: Path, tmp_path: Path) -> None:
    target = tmp_path / "heap.json"
    export(profile, fmt="json", query=SampleQuery("heap"), output=target)
    rows = {row["function"]: row for row in json.loads(target.read_text())}
    assert (rows["leak"]["live_bytes"], rows["churn"]["live_bytes"]) == (10_000, 0)


def test_refusals(profile: Path, tmp_path: Path) -> None:
    with pytest.raises(click.BadParameter, match="unknown format 'svg'"):
        export(profile, fmt="svg", query=SampleQuery(), output=tmp_path / "x")
    with pytest.raises(click.BadParameter, match="only the pprof format carries a diff base"):
        export(profile, fmt="folded", query=SampleQuery(), output=tmp_path / "x",
               base_path=profile)
    nothing = SampleQuery(filters=FrameFilter.compile(focus="nothing-has-this-name"))
    with pytest.raises(EmptySelection, match="kept no samples"):
        export(profile, fmt="folded", query=nothing, output=tmp_path / "x")
    with pytest.raises(ExportError, match="it is a directory"):
        export(profile, fmt="folded", query=SampleQuery(), output=tmp_path)
    with pytest.raises(ExportError, match="cannot write"):
        export(profile, fmt="folded", query=SampleQuery(), output=tmp_path / "no" / "dir")
    assert not list(tmp_path.iterdir())  # nothing half-written was left


def test_a_regular_file_is_replaced_and_a_device_written_into(profile: Path,
                                                              tmp_path: Path) -> None:
    target = tmp_path / "cpu.folded"
    target.write_text("old")
    os.chmod(target, 0o600)
    export(profile, fmt="folded", query=SampleQuery(), output=target)
    assert "main;work 60" in target.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["cpu.folded"]  # no temporary left
    link = tmp_path / "link.folded"
    link.symlink_to(target)
    export(profile, fmt="folded", query=SampleQuery(), output=link)
    assert link.is_symlink()  # the link is kept, the file it names replaced
    export(profile, fmt="folded", query=SampleQuery(), output=Path(os.devnull))


def test_another_users_link_is_not_followed(profile: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "planted.folded"
    link.symlink_to(victim)
    try:
        os.lchown(link, 12345, 12345)
    except PermissionError:
        pytest.skip("giving a link to another user needs root")
    with pytest.raises(ExportError, match="symbolic link owned by another user"):
        export(profile, fmt="folded", query=SampleQuery(), output=link)
    assert victim.read_text() == "keep"
