"""rsprof.tui.__main__: `python -m rsprof.tui FILE [--live]` hands its arguments to
run_tui and returns its status."""

from __future__ import annotations

import pytest
import rsprof.tui.__main__ as tui_main


@pytest.mark.parametrize(("argv", "expected"), [
    (["a.db"], ("a.db", False)),
    (["a.db", "--live"], ("a.db", True)),
    (["--live", "b.db"], ("b.db", True)),
])
def test_arguments(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                   expected: tuple[str, bool]) -> None:
    seen: list[tuple[str, bool]] = []

    def run_tui(file: str, *, live: bool = False) -> int:
        seen.append((file, live))
        return 7

    monkeypatch.setattr(tui_main, "run_tui", run_tui)
    monkeypatch.setattr("sys.argv", ["python -m rsprof.tui", *argv])
    assert tui_main.main() == 7
    assert seen == [expected]


@pytest.mark.parametrize("argv", [[], ["a.db", "b.db"], ["a.db", "--follow"]])
def test_usage_errors_exit_2(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    monkeypatch.setattr(tui_main, "run_tui", lambda *_a, **_k: pytest.fail("ran"))
    monkeypatch.setattr("sys.argv", ["python -m rsprof.tui", *argv])
    with pytest.raises(SystemExit) as exited:
        tui_main.main()
    assert exited.value.code == 2
