"""The rsprof TUI application and its entry point `run_tui`."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from rsprof.storage.live import LiveProfile
from textual.app import App
from textual.binding import Binding, BindingType

from .main_screen import EXIT_INTERRUPTED, MainScreen
from .model import DataSource


class RsprofApp(App[int]):
    """Live (`live=True`: RECORDING / PAUSED) or VIEW mode over one profile file.

    `source` is what the UI reads (a `storage.live.LiveProfile`, or a fake in tests);
    `clock` returns Unix seconds and drives the elapsed time shown while recording.
    """

    CSS_PATH = "rsprof.tcss"
    # Ctrl-C stops the recording and quits (rsprof's README), instead of Textual's hint.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+c", "interrupt", "Stop", show=False, priority=True),
    ]
    TITLE = "rsprof"
    ENABLE_COMMAND_PALETTE = False

    def __init__(
        self,
        source: DataSource,
        *,
        live: bool = False,
        clock: Callable[[], float] = time.time,
        refresh_interval: float = 0.5,
    ) -> None:
        super().__init__()
        self.source = source
        self.live = live
        self.clock = clock
        self.refresh_interval = refresh_interval
        # The recording process that started this TUI (`rsprof.tui --live` only): when it
        # is no longer our parent, the file's "recording" state is stale.
        self.recorder_pid: int | None = None

    def on_mount(self) -> None:
        self.push_screen(MainScreen())

    async def action_quit(self) -> None:
        """Ctrl-Q (Textual's quit key) asks as q does while a live recording runs."""
        self.main.action_quit()

    def action_interrupt(self) -> None:
        """Ctrl-C: exit code 130 tells the recording session "interrupted" (it stops and
        finalizes the file); viewing a file, it just quits."""
        code = EXIT_INTERRUPTED if self.live else 0
        self.exit(code, return_code=code)

    @property
    def main(self) -> MainScreen:
        """The main screen (also while a modal screen is on top of it)."""
        return next(s for s in self.screen_stack if isinstance(s, MainScreen))


def run_tui(db_path: str, *, live: bool) -> int:
    """Runs the TUI on `db_path` until the user quits; returns the exit code (0).

    `live=True`: a recorder is writing the file now (RECORDING / PAUSED modes, follows new
    checkpoints, shows the target's CPU and RSS as the recorder stores them). `live=False`:
    VIEW mode, which still follows new checkpoints while the file's meta state is
    `recording`.
    """
    path = Path(db_path)
    deadline = time.monotonic() + 10
    while live and not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the recorder may not have created the file yet
    source = LiveProfile(path)
    # A key is read by Textual's input thread and handled on the UI thread; each needs the
    # GIL, which a worker building a snapshot or the chart may hold. Python makes a waiting
    # thread wait up to the switch interval (5 ms) before the holder must let go, per
    # hand-off: 1 ms keeps those waits out of the keys' latency.
    sys.setswitchinterval(0.001)
    try:
        app = RsprofApp(source, live=live)
        if live:
            app.recorder_pid = os.getppid()
        result = app.run()
    finally:
        source.close()
    return result or 0
