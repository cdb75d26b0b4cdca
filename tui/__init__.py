"""rsprof's terminal UI (Textual). `run_tui` is the entry point the CLI calls."""

from __future__ import annotations


def run_tui(db_path: str, *, live: bool) -> int:
    """Runs the TUI on a profile file; see `tui.app.run_tui`."""
    from .app import run_tui as _run_tui

    return _run_tui(db_path, live=live)


__all__ = ["run_tui"]
