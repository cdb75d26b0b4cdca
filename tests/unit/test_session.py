"""rsprof/session.py's rules that need no process: how the live TUI's exit stops a recording."""

from __future__ import annotations

import signal

import pytest

from rsprof.session import stopping_signal, tui_exit_reason


@pytest.mark.parametrize(("status", "reason"), [
    (0, "user-quit"),                        # q, Esc
    (130, "interrupted"),                    # Ctrl-C in the TUI
    (-signal.SIGHUP, "hangup"),              # the terminal closed: the TUI died of it first
    (-signal.SIGTERM, "terminated"),
    (-signal.SIGINT, "interrupted"),
    (1, "error: the TUI exited with status 1"),
    (-signal.SIGKILL, f"error: the TUI exited with status {-signal.SIGKILL}"),
    (-signal.SIGSEGV, f"error: the TUI exited with status {-signal.SIGSEGV}"),
])
def test_tui_exit_reason(status: int, reason: str) -> None:
    assert tui_exit_reason(status) == reason


def test_a_tui_ended_by_a_stopping_signal_stops_as_that_signal_would() -> None:
    """The session then ends as the signal itself would have ended it (no tail printed on a
    terminal that is gone, a `run` target stopped)."""
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        assert stopping_signal(tui_exit_reason(-sig)) == sig
