"""The output of a program `rsprof run` starts under the live TUI, kept.

With the TUI on the terminal, the program's stdout and stderr cannot go there too: they
would be drawn over the TUI and lost with it. They go to two pseudo-terminals rsprof reads
instead (a pty, not a pipe: the program still sees a terminal, so it buffers and colours as
it would), kept in memory (bounded), written into the profile at each checkpoint
(`target_output`, docs/schema.md), and their last lines are printed when the TUI ends.
Headless (`-q`, or no terminal) the program writes to rsprof's own stdout and stderr.
"""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

STREAMS = ("stdout", "stderr")
# Kept in memory for the profile (beyond: counted, not kept); the tail printed at the end.
MAX_KEPT_BYTES = 64 << 20
TAIL_LINES = 20
_READ_BYTES = 65536


@dataclass
class Chunk:
    time_ms: int
    stream: str
    data: bytes


@dataclass
class OutputCapture:
    """The read ends of the program's two ptys and what came out of them."""

    masters: dict[str, int]  # stream -> pty master fd
    slaves: dict[str, int]  # stream -> pty slave fd (the program's; closed once it has them)
    chunks: list[Chunk] = field(default_factory=list)
    dropped_bytes: int = 0
    _kept_bytes: int = 0
    _unsaved: int = 0  # chunks[_unsaved:] are not in the profile yet
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _readers: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def open(cls, terminal: IO[str] | None = None) -> OutputCapture:
        """Two ptys with the terminal's size and no output processing (a "\\n" stays one
        byte); raises OSError when none can be had."""
        masters: dict[str, int] = {}
        slaves: dict[str, int] = {}
        try:
            for stream in STREAMS:
                master, slave = os.openpty()
                masters[stream], slaves[stream] = master, slave
                attrs = termios.tcgetattr(slave)
                attrs[1] &= ~termios.OPOST  # oflag: no "\n" -> "\r\n"
                termios.tcsetattr(slave, termios.TCSANOW, attrs)
                size = _window_size(terminal or sys.stdout)
                if size is not None:
                    fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
                os.set_inheritable(slave, True)
        except OSError:
            for fd in (*masters.values(), *slaves.values()):
                os.close(fd)
            raise
        return cls(masters, slaves)

    def start(self) -> None:
        """Closes rsprof's copies of the slaves (the program holds its own now: the masters
        read EOF when it and its children have closed them) and starts reading."""
        for fd in self.slaves.values():
            os.close(fd)
        self.slaves = {}
        for stream, fd in self.masters.items():
            thread = threading.Thread(target=self._read, args=(stream, fd), daemon=True,
                                      name=f"rsprof-output-{stream}")
            thread.start()
            self._readers.append(thread)

    def _read(self, stream: str, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, _READ_BYTES)
            except OSError:  # EIO: every slave closed (the program and its children left)
                data = b""
            if not data:
                return
            with self._lock:
                if self._kept_bytes + len(data) > MAX_KEPT_BYTES:
                    self.dropped_bytes += len(data)
                    continue
                self._kept_bytes += len(data)
                self.chunks.append(Chunk(int(time.time() * 1000), stream, data))

    def save(self, add_output: Callable[[list[tuple[int, str, bytes]]], None]) -> None:
        """Hands what was read since the last save to the profile writer."""
        with self._lock:
            new = self.chunks[self._unsaved:]
            self._unsaved = len(self.chunks)
        add_output([(c.time_ms, c.stream, c.data) for c in new])

    def finish(self, timeout_s: float = 2.0) -> None:
        """Waits (bounded: a grandchild may hold a slave open) for the readers to reach the
        end of the output, then closes the masters."""
        deadline = time.monotonic() + timeout_s
        for thread in self._readers:
            thread.join(max(0.0, deadline - time.monotonic()))
        if all(not t.is_alive() for t in self._readers):
            for fd in self.masters.values():
                os.close(fd)
            self.masters = {}

    def print_tail(self, lines: int | None = TAIL_LINES) -> None:
        """The program's output after the TUI: its last `lines` lines (None: all of it),
        each stream to rsprof's own, in the order they were written."""
        with self._lock:
            chunks = list(self.chunks)
        pieces: list[tuple[str, bytes]] = []  # (stream, one line with its "\n")
        partial: dict[str, bytes] = {}
        for chunk in chunks:
            data = partial.pop(chunk.stream, b"") + chunk.data
            *whole, rest = data.split(b"\n")
            pieces.extend((chunk.stream, line + b"\n") for line in whole)
            if rest:
                partial[chunk.stream] = rest
        pieces.extend((stream, rest) for stream, rest in partial.items())
        shown = pieces if lines is None else pieces[-lines:]
        if len(shown) < len(pieces):
            print(f"rsprof: the program's last {len(shown)} lines of output ({len(pieces)}"
                  " in the profile's target_output table; --all-output prints them all):",
                  file=sys.stderr, flush=True)
        for stream, line in shown:
            out = sys.stdout if stream == "stdout" else sys.stderr
            out.buffer.write(line)
            out.flush()
        if self.dropped_bytes:
            print(f"rsprof: {self.dropped_bytes} bytes of the program's output were not kept"
                  f" (over {MAX_KEPT_BYTES >> 20} MiB)", file=sys.stderr, flush=True)


def _window_size(terminal: IO[str]) -> bytes | None:
    try:
        size = fcntl.ioctl(terminal.fileno(), termios.TIOCGWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    except (OSError, ValueError, AttributeError):
        return None
    return size
