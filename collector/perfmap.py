"""Names for JIT code: the target's `/tmp/perf-PID.map`.

JIT compilers that want profilers to name their code (V8 with `--perf-basic-prof`,
CPython 3.12+ with `-X perf`, the JVM through perf-map-agent, ...) append one line per
code object: `START SIZE NAME`, both numbers in hex. The file grows while the program runs,
so it is read incrementally: only the bytes appended since the last read, and only when a
lookup misses (docs/symbols.md, "perf maps").

The file belongs to the target, so it is untrusted input: symbolic links, FIFOs and other
non-regular files, and files owned by another user than the target's, are refused; lines
are bounded in length and malformed ones ignored; the number of entries and the bytes
read are bounded, so a hostile or runaway map costs a fixed amount of memory.
"""

from __future__ import annotations

import bisect
import os
import re
import stat
from dataclasses import dataclass

STALE_SLACK_S = 2.0  # the start time is known to about a second
MAX_LINE = 4096  # longer lines (and the rest of them) are skipped
MAX_ENTRIES = 2_000_000
MAX_BYTES = 256 << 20  # read at most this much of one file
READ_CHUNK = 1 << 20
# An address is looked up among this many entries starting at or below it, so an entry
# inside a bigger, older one does not hide the older one's other addresses.
LOOK_BACK = 8

# V8 (`--perf-basic-prof`): `JS:*name file:line:column`, `~` interpreted, `^` baseline,
# `+`/`*` optimized; older versions say `LazyCompile:`/`Function:`/`Script:`.
_V8 = re.compile(r"^(JS|LazyCompile|Function|Script|Eval):([~^+*-]?)(\S*) (.+):(\d+):(\d+)$")
# CPython (`-X perf`): `py::qualname:file`.
_PYTHON = re.compile(r"^py::([^:]+):(.*)$")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")

# Mappings whose code can only be named by a perf map: no file to read symbols from.
_ANONYMOUS = ("[anon]", "//anon", "/dev/zero")
_ANONYMOUS_PREFIXES = ("[anon:", "/memfd:", "/anon_hugepage")


def is_anonymous(path: str) -> bool:
    return path in _ANONYMOUS or path.startswith(_ANONYMOUS_PREFIXES)


@dataclass(frozen=True, slots=True)
class JitSymbol:
    """One perf map entry, with the function, file and line read out of the known formats;
    `raw` is the name as written (kept as the location's system name)."""

    start: int
    size: int
    raw: str
    function: str
    file: str
    line: int


def parse_name(start: int, size: int, raw: str) -> JitSymbol:
    v8 = _V8.match(raw)
    if v8 is not None:
        return JitSymbol(start, size, raw, v8.group(3) or "(anonymous)", v8.group(4),
                         int(v8.group(5)))
    python = _PYTHON.match(raw)
    if python is not None:
        return JitSymbol(start, size, raw, python.group(1), python.group(2), 0)
    return JitSymbol(start, size, raw, raw, "", 0)


def parse_line(line: bytes) -> JitSymbol | None:
    """`START SIZE NAME` (hex, an optional 0x), else None."""
    parts = line.split(None, 2)
    if len(parts) != 3:
        return None
    try:
        start = int(parts[0], 16)
        size = int(parts[1], 16)
    except ValueError:
        return None
    if size <= 0 or start <= 0 or start + size > 1 << 64:
        return None
    raw = _UNPRINTABLE.sub("?", parts[2].strip().decode("utf-8", "replace"))
    if not raw:
        return None
    return parse_name(start, size, raw)


def perf_map_path(pid: int) -> str:
    """The target's `/tmp/perf-<pid>.map` as this process can open it: through
    /proc/PID/root, with the pid the target knows itself by, when it runs in another mount
    or pid namespace (a container); else the plain path, which outlives the target."""
    try:
        theirs = os.stat(f"/proc/{pid}/root/")
        ours = os.stat("/")
    except OSError:
        return f"/tmp/perf-{pid}.map"
    ns_pid = pid
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status.read(1 << 16).splitlines():
                if line.startswith(b"NSpid:"):
                    ns_pid = int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino) and ns_pid == pid:
        return f"/tmp/perf-{pid}.map"
    return f"/proc/{pid}/root/tmp/perf-{ns_pid}.map"


def process_start_time(pid: int) -> float | None:
    """When `pid` started (seconds since the epoch, to about a second: the boot time is in
    whole seconds), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            ticks = int(stat_file.read(4096).rpartition(b")")[2].split()[19])
        with open("/proc/stat", "rb") as machine:
            boot = next(int(line.split()[1]) for line in machine if line.startswith(b"btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _owner_uid(pid: int) -> int:
    """The target's uid (its /proc entry's owner); ours if it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return os.geteuid()


class PerfMap:
    """The perf map of one process, read as it grows."""

    def __init__(self, pid: int, path: str | None = None, uid: int | None = None,
                 started: float | None = None) -> None:
        self.pid = pid
        self.path = path or perf_map_path(pid)
        self.uid = _owner_uid(pid) if uid is None else uid
        # A map last written before the process started is an earlier process's with the
        # same pid (/tmp keeps them): never this one's names.
        self.started = started
        self.refused: str | None = None  # why the file was not read, once it was refused
        self.malformed = 0  # lines ignored
        self._identity: tuple[int, int] | None = None
        self._offset = 0  # bytes consumed
        self._partial = b""  # an incomplete last line, until its newline arrives
        self._skipping = False  # inside an over-long line
        self._entries: dict[int, JitSymbol] = {}
        self._starts: list[int] = []

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, address: int) -> JitSymbol | None:
        index = bisect.bisect_right(self._starts, address) - 1
        for position in range(index, max(-1, index - LOOK_BACK), -1):
            entry = self._entries[self._starts[position]]
            if address < entry.start + entry.size:
                return entry
        return None

    def refresh(self) -> bool:
        """Reads what was appended since the last call; True if entries were added or the
        file was replaced (its entries then start over)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as error:
            if error.errno == 40:  # ELOOP: a symbolic link under the name
                self.refused = f"{self.path} is a symbolic link"
            return False
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self.refused = f"{self.path} is not a regular file"
                return False
            if info.st_uid != self.uid:
                self.refused = (
                    f"{self.path} is owned by uid {info.st_uid}, not by the target's {self.uid}"
                )
                return False
            if self.started is not None and info.st_mtime < self.started - STALE_SLACK_S:
                self.refused = f"{self.path} is older than process {self.pid} (an earlier one's)"
                return False
            self.refused = None
            changed = False
            identity = (info.st_dev, info.st_ino)
            if identity != self._identity or info.st_size < self._offset:
                changed = bool(self._entries)
                self._reset(identity)
            end = min(info.st_size, MAX_BYTES)
            added = 0
            while self._offset < end:
                chunk = os.pread(fd, min(READ_CHUNK, end - self._offset), self._offset)
                if not chunk:
                    break
                self._offset += len(chunk)
                added += self._feed(chunk)
            if added:
                self._starts = sorted(self._entries)
            return changed or added > 0
        finally:
            os.close(fd)

    def _reset(self, identity: tuple[int, int]) -> None:
        self._identity = identity
        self._offset = 0
        self._partial = b""
        self._skipping = False
        self._entries = {}
        self._starts = []

    def _feed(self, chunk: bytes) -> int:
        added = 0
        lines = chunk.split(b"\n")
        tail = lines.pop()  # after the last newline: incomplete
        for index, line in enumerate(lines):
            if index == 0:
                if self._skipping:
                    self._skipping = False
                    self._partial = b""
                    continue
                line = self._partial + line
                self._partial = b""
            if len(line) > MAX_LINE:
                self.malformed += 1
                continue
            entry = parse_line(line)
            if entry is None:
                self.malformed += 1
                continue
            if len(self._entries) >= MAX_ENTRIES and entry.start not in self._entries:
                continue
            self._entries[entry.start] = entry  # a later entry at the same start replaces it
            added += 1
        if lines:
            self._partial = b""
        if self._skipping:
            return added
        self._partial += tail
        if len(self._partial) > MAX_LINE:
            self._partial = b""
            self._skipping = True
            self.malformed += 1
        return added
