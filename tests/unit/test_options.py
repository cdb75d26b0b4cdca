"""rsprof.options: the sample options shared by top, traces, peek, diff and export, parsed
by click in this process, and the query they build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from rsprof.storage.errors import ProfileError
from rsprof.storage.reader import Profile
from rsprof.storage.samples import TimeRange
from rsprof.storage.selection import SampleQuery, select

from rsprof.options import (
    build_query,
    check_kind,
    granularity_option,
    profile_file,
    sample_options,
    value_index,
)
from unit.synthetic import START_MS, small_profile

QUERIES: list[Any] = []


@click.command()
@granularity_option("lines")
@sample_options
def command(granularity: str, **options: Any) -> None:
    QUERIES.append((granularity, build_query("cpu", options)))


def parse(*args: str) -> tuple[int, str, Any]:
    QUERIES.clear()
    result = CliRunner().invoke(command, list(args))
    return result.exit_code, result.output, QUERIES[0] if QUERIES else None


@pytest.mark.parametrize(("args", "expected"), [
    ([], SampleQuery()),
    (["--since", "2s", "--until", "1m"], SampleQuery(time_range=TimeRange(2.0, 60.0))),
    (["--since", "0"], SampleQuery(time_range=TimeRange(0.0, None))),
    (["--tid", "5", "--pid", "7"], SampleQuery(tid=5, pid=7)),
])
def test_queries(args: list[str], expected: SampleQuery) -> None:
    code, output, found = parse(*args)
    assert code == 0, output
    assert found == ("lines", expected)


@pytest.mark.parametrize(("args", "filters"), [
    (["--focus", "a|b", "--hide", "^std::"], "focus=a|b; hide=^std::"),
    (["--filter", "x"], "focus=x"),  # the original rsprof's name
    (["--ignore", "i", "--show", "s", "--hide-runtime"], "ignore=i; show=s; hide-runtime"),
])
def test_filters(args: list[str], filters: str) -> None:
    code, output, found = parse(*args)
    assert code == 0, output
    assert found[1].filters.describe() == filters


@pytest.mark.parametrize(("args", "message"), [
    (["--since", "5s", "--until", "5s"], "must be later than --since"),
    (["--since", "10s", "--until", "2s"], "must be later than --since"),
    (["--since", "soon"], "is not a duration"),
    (["--until", "-1s"], "is not a duration"),
    (["--focus", "("], "--focus '(' is not a valid regex"),
    (["--tid", "0"], "0 is not in the range"),
    (["--pid", "2147483648"], "is not in the range"),
    (["-g", "symbols"], "'symbols' is not one of"),
])
def test_usage_errors(args: list[str], message: str) -> None:
    code, output, _found = parse(*args)
    assert code == 2
    assert message in output


@pytest.mark.parametrize(("kind", "ok"), [("cpu", True), ("heap", True), ("mem", False),
                                          ("CPU", False)])
def test_check_kind(kind: str, ok: bool) -> None:
    if ok:
        assert check_kind(kind) == kind
    else:
        with pytest.raises(click.BadParameter, match="use cpu or heap"):
            check_kind(kind)


def test_profile_file_is_the_given_one_or_the_newest_here(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProfileError, match="no profile in this folder"):
        profile_file(None)
    # newest by when the recording started, not by name or modification time
    new = small_profile(tmp_path / "a.db", {"start_time_ms": START_MS + 60_000})
    old = small_profile(tmp_path / "b.db")
    (tmp_path / "notes.db").write_text("not a profile")
    assert profile_file(None).resolve() == new.resolve()
    assert profile_file(old) == old


def test_value_index(tmp_path: Path) -> None:
    with Profile(small_profile(tmp_path / "p.db")) as profile:
        selection = select(profile, SampleQuery())
    assert value_index(selection, None) == 0
    assert value_index(selection, "cpu") == 1
    assert value_index(selection, "1") == 1
    with pytest.raises(click.BadParameter, match="unknown sample index 'inuse_space'"):
        value_index(selection, "inuse_space")
