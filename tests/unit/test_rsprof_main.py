"""rsprof.__main__: `python -m rsprof` runs the CLI's main and exits with its status."""

from __future__ import annotations

import runpy
import sys

import pytest

import rsprof.cli


@pytest.mark.parametrize("status", [0, 2, 130])
def test_python_m_rsprof_exits_with_mains_status(monkeypatch: pytest.MonkeyPatch,
                                                 status: int) -> None:
    calls: list[int] = []

    def main() -> int:
        calls.append(1)
        return status

    monkeypatch.setattr(rsprof.cli, "main", main)
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("rsprof", run_name="__main__")
    assert exited.value.code == status
    assert calls == [1]


def test_importing_it_runs_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rsprof.cli, "main", lambda: 3)
    monkeypatch.delitem(sys.modules, "rsprof.__main__", raising=False)
    with pytest.raises(SystemExit) as exited:
        from rsprof import __main__  # noqa: F401
    assert exited.value.code == 3
