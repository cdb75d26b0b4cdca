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
import errno
import os
import re
import stat
from array import array
from dataclasses import dataclass
from itertools import accumulate, islice, repeat
from operator import add, eq, itemgetter, lt, methodcaller

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


def namespace_pid(status: bytes) -> int | None:
    """The pid a process knows itself by: the last (innermost) of /proc/PID/status's NSpid
    line, None if there is none (kernels before 4.1)."""
    for line in status.splitlines():
        if line.startswith(b"NSpid:"):
            try:
                return int(line.split()[-1])
            except (ValueError, IndexError):
                return None
    return None


def perf_map_location(pid: int) -> tuple[str, str]:
    """Where the target's perf map is: (its root folder, the map's name in its /tmp).

    Always through /proc/PID/root, with the pid the target knows itself by (NSpid): a
    process in another mount namespace has a /tmp of its own even when its root is ours
    (systemd's PrivateTmp, a container sharing the root), and one in a pid namespace
    names the map after its own pid. The host's /tmp/perf-PID.map missed both."""
    ns_pid = None
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            ns_pid = namespace_pid(status.read(1 << 16))
    except OSError:
        pass
    return f"/proc/{pid}/root", f"perf-{pid if ns_pid is None else ns_pid}.map"


def open_in_root(root: str, name: str) -> tuple[int, tuple[int, int]]:
    """`<root>/tmp/<name>` opened for reading without leaving `root`: the folder is opened
    first, and neither `tmp` nor the map may be a symbolic link (an absolute link inside
    /proc/PID/root is resolved from our root, not the target's: root would read a file the
    target points it at). Non-blocking, so a FIFO is seen as one, not waited on.
    Returns the descriptor and the (device, inode) of that `tmp`; OSError (ELOOP or
    ENOTDIR for a link) if it cannot be opened so."""
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tmp_fd = os.open("tmp", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=root_fd)
        try:
            tmp = os.fstat(tmp_fd)
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=tmp_fd)
            return fd, (tmp.st_dev, tmp.st_ino)
        finally:
            os.close(tmp_fd)
    finally:
        os.close(root_fd)


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
    """The perf map of one process, read as it grows.

    Compact: per entry three 8-byte integers in arrays sorted by start (the start, the end,
    and where its line is in the file), about 24 bytes; a name is read back from the file
    and parsed only when a lookup finds its entry. A 2 M-entry map (180 MB) used to be one
    Python object per entry: rsprof's RSS went from 31 to 1034 MiB and the first
    checkpoint came 23 s after the start on this busy machine."""

    def __init__(self, pid: int, path: str | None = None, uid: int | None = None,
                 started: float | None = None, root: str | None = None,
                 name: str | None = None) -> None:
        """`path`: read that file (tests); else `<root>/tmp/<name>`: /proc/PID/root and
        perf-<the pid the target knows itself by>.map unless given."""
        self.pid = pid
        self._location: tuple[str, str] | None = None
        self._tmp_is_ours: bool | None = None  # the target's /tmp is this process's
        if path is None:
            found_root, found_name = perf_map_location(pid)
            self._location = (root or found_root, name or found_name)
            path = "/tmp/".join(self._location)
        self.path = path
        self.uid = _owner_uid(pid) if uid is None else uid
        # A map last written before the process started is an earlier process's with the
        # same pid (/tmp keeps them): never this one's names.
        self.started = started
        self.refused: str | None = None  # why the file was not read, once it was refused
        self.truncated: str | None = None  # set once a bound stopped the reading
        self.malformed = 0  # lines ignored
        self._identity: tuple[int, int] | None = None
        self._offset = 0  # bytes consumed
        self._partial = b""  # an incomplete last line, until its newline arrives
        self._skipping = False  # inside an over-long line
        self._reset(None)

    def __len__(self) -> int:
        return len(self._starts)

    def lookup(self, address: int) -> JitSymbol | None:
        starts = self._starts
        index = bisect.bisect_right(starts, address) - 1
        for position in range(index, max(-1, index - LOOK_BACK), -1):
            if address < self._ends[position]:
                return self._symbol(position)
        return None

    def _symbol(self, position: int) -> JitSymbol | None:
        """The entry at `position`, its name read back from the file (once)."""
        line_at = self._lines[position]
        found = self._names.get(line_at)
        if found is None:
            line = self._read_line(line_at)
            found = parse_line(line) if line is not None else None
            start = self._starts[position]
            if found is None or found.start != start:  # rewritten in place since: unnamed
                return None
            self._names[line_at] = found
        return found

    def _read_line(self, offset: int) -> bytes | None:
        fd = self._open()
        if fd is None:
            return None
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != self._identity:
                return None  # replaced since it was read: the next refresh starts over
            return os.pread(fd, MAX_LINE + 1, offset).split(b"\n", 1)[0]
        except OSError:
            return None
        finally:
            os.close(fd)

    def _open(self) -> int | None:
        try:
            if self._location is None:
                return os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                               | os.O_CLOEXEC)
            root, name = self._location
            try:
                fd, tmp = open_in_root(root, name)
            except FileNotFoundError:
                if os.path.exists(root) or self._tmp_is_ours is False:
                    raise
                # The process is gone (its last stacks are resolved after it exits): a
                # /tmp that was ours still holds its map.
                fd, tmp = open_in_root("/", name)
            if self._tmp_is_ours is None:
                ours = os.stat("/tmp")
                self._tmp_is_ours = tmp == (ours.st_dev, ours.st_ino)
            return fd
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):  # a symbolic link on the way
                self.refused = f"{self.path} is, or is in, a symbolic link"
            return None

    def refresh(self) -> bool:
        """Reads what was appended since the last call; True if entries were added or the
        file was replaced (its entries then start over)."""
        fd = self._open()
        if fd is None:
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
                changed = len(self._starts) > 0
                self._reset(identity)
            end = min(info.st_size, MAX_BYTES)
            if info.st_size > MAX_BYTES:
                self._cut(f"read its first {MAX_BYTES} of {info.st_size} bytes")
            new = _Entries()
            while self._offset < end and len(self._starts) + len(new) < MAX_ENTRIES:
                chunk = os.pread(fd, min(READ_CHUNK, end - self._offset), self._offset)
                if not chunk:
                    break
                self._feed(chunk, new)
            if len(new):
                self._merge(new)
            return changed or len(new) > 0
        finally:
            os.close(fd)

    def _cut(self, what: str) -> None:
        if self.truncated is None:
            self.truncated = f"{self.path}: {what}; JIT code past that is unnamed"

    def _reset(self, identity: tuple[int, int] | None) -> None:
        self._identity = identity
        self._offset = 0
        self._partial = b""
        self._skipping = False
        self._starts = array("Q")  # sorted
        self._ends = array("Q")
        self._lines = array("Q")  # file offset of each entry's line
        self._names: dict[int, JitSymbol] = {}

    def _feed(self, chunk: bytes, new: _Entries) -> None:
        """Takes the complete lines of `chunk` (after what was left of the last one); an
        incomplete last line waits for its newline. At MAX_ENTRIES the reading stops after
        the last line taken."""
        base = self._offset - len(self._partial)  # the file offset of text[0]
        text = self._partial + chunk
        self._offset += len(chunk)
        last = text.rfind(b"\n")
        complete, self._partial = text[:last + 1], text[last + 1:]
        if self._skipping and complete:  # the rest of an over-long line, to its newline
            skipped = complete.find(b"\n") + 1
            complete, base = complete[skipped:], base + skipped
            self._skipping = False
        if self._skipping:
            self._partial = b""
        elif len(self._partial) > MAX_LINE:
            self._partial = b""
            self._skipping = True
            self.malformed += 1
        if complete:
            room = MAX_ENTRIES - len(self._starts) - len(new)
            malformed, stopped_at = new.add_lines(complete[:-1], base, room)
            self.malformed += malformed
            if stopped_at is not None:
                self._offset, self._partial, self._skipping = stopped_at, b"", False
                self._cut(f"read its first {MAX_ENTRIES} entries")

    def _merge(self, new: _Entries) -> None:
        """Adds entries (in file order) to the sorted arrays; at one start, the later line
        replaces the earlier."""
        if len(new) * 8 < len(self._starts):  # a few more: placed by bisection
            self._insert(new)
            return
        if len(self._starts):  # old first: a later line wins at one start
            starts, ends, lines = (self._starts + new.starts, self._ends + new.ends,
                                   self._lines + new.lines)
        else:  # the first read: no copy
            starts, ends, lines = new.starts, new.ends, new.lines
        if not _strictly_increasing(starts):  # JIT code is often written in address order
            order = sorted(range(len(starts)), key=starts.__getitem__)  # stable
            starts = array("Q", map(starts.__getitem__, order))
            ends = array("Q", map(ends.__getitem__, order))
            lines = array("Q", map(lines.__getitem__, order))
            if any(map(eq, islice(starts, 1, None), starts)):
                keep = [i for i in range(len(starts))
                        if i + 1 == len(starts) or starts[i + 1] != starts[i]]
                starts = array("Q", map(starts.__getitem__, keep))
                ends = array("Q", map(ends.__getitem__, keep))
                lines = array("Q", map(lines.__getitem__, keep))
        self._starts, self._ends, self._lines = starts, ends, lines

    def _insert(self, new: _Entries) -> None:
        starts, ends, lines = array("Q"), array("Q"), array("Q")
        old_starts, old_ends, old_lines = self._starts, self._ends, self._lines
        at = 0  # the next old entry to copy
        for i in sorted(range(len(new)), key=new.starts.__getitem__):
            start = new.starts[i]
            if starts and starts[-1] == start:  # a later line at the same start
                ends[-1], lines[-1] = new.ends[i], new.lines[i]
                continue
            cut = bisect.bisect_left(old_starts, start, at)
            starts.extend(old_starts[at:cut])
            ends.extend(old_ends[at:cut])
            lines.extend(old_lines[at:cut])
            at = cut + (cut < len(old_starts) and old_starts[cut] == start)
            starts.append(start)
            ends.append(new.ends[i])
            lines.append(new.lines[i])
        starts.extend(old_starts[at:])
        ends.extend(old_ends[at:])
        lines.extend(old_lines[at:])
        self._starts, self._ends, self._lines = starts, ends, lines


def _strictly_increasing(values: array[int]) -> bool:
    return all(map(lt, values, islice(values, 1, None)))


_LAST_ADDRESS = (1 << 64) - 1
_SPLIT = methodcaller("split", None, 2)
_FIRST = itemgetter(0)
_SECOND = itemgetter(1)


class _Entries:
    """Entries in file order, three parallel arrays (start, end, line offset)."""

    def __init__(self) -> None:
        self.starts = array("Q")
        self.ends = array("Q")
        self.lines = array("Q")

    def __len__(self) -> int:
        return len(self.starts)

    def add_lines(self, body: bytes, base: int, room: int) -> tuple[int, int | None]:
        """The lines of `body` (no trailing newline), the first at file offset `base`, at
        most `room` of them: (lines malformed, the offset of the first line left when
        `room` cut, else None). A batch goes through C-level maps (no object kept per
        line); a batch with a bad line is done line by line, by parse_line's rules."""
        lines = body.split(b"\n")
        offsets = list(accumulate(map(add, map(len, lines), repeat(1)), initial=base))
        stopped_at = None
        if len(lines) > room:
            stopped_at = offsets[room]
            lines = lines[:room]
        if self._add_fast(lines, offsets):
            return 0, stopped_at
        return self._add_slow(lines, offsets), stopped_at

    def _add_fast(self, lines: list[bytes], offsets: list[int]) -> bool:
        try:
            if max(map(len, lines), default=0) > MAX_LINE:
                return False
            fields = list(map(_SPLIT, lines))
            if min(map(len, fields), default=3) != 3:
                return False
            starts = array("Q", map(int, map(_FIRST, fields), repeat(16)))
            sizes = array("Q", map(int, map(_SECOND, fields), repeat(16)))
            ends = array("Q", map(add, starts, sizes))  # OverflowError past 2^64
        except (ValueError, OverflowError):
            return False
        if len(starts) and (min(starts) == 0 or min(sizes) == 0):
            return False
        self.starts.extend(starts)
        self.ends.extend(ends)
        self.lines.extend(array("Q", offsets[:len(lines)]))
        return True

    def _add_slow(self, lines: list[bytes], offsets: list[int]) -> int:
        malformed = 0
        for line, offset in zip(lines, offsets):
            entry = parse_line(line) if len(line) <= MAX_LINE else None
            if entry is None:
                malformed += 1
                continue
            self.starts.append(entry.start)
            self.ends.append(min(entry.start + entry.size, _LAST_ADDRESS))
            self.lines.append(offset)
        return malformed
