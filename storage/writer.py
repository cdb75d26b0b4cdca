"""The one writer of profile files.

The recorder hands it symbolized frames, stacks and per-checkpoint counts; it assigns
row ids, keeps them in memory so each frame, stack and location is inserted once, and
commits once per checkpoint so readers (and a recorder killed with -9) always see whole
checkpoints.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from rsprof.storage.errors import ProfileError, ProfileExists, ProfileLocked, StorageFullError
from rsprof.storage.intern import InternTable
from rsprof.storage.schema import (
    READABLE_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
    create_schema,
)


@dataclass(slots=True)
class HeapDelta:
    """Activity of one allocating stack in one checkpoint interval."""

    alloc_bytes: int = 0
    alloc_count: int = 0
    free_bytes: int = 0
    free_count: int = 0

    def add(self, other: HeapDelta) -> None:
        self.alloc_bytes += other.alloc_bytes
        self.alloc_count += other.alloc_count
        self.free_bytes += other.free_bytes
        self.free_count += other.free_count


class HeapCallSite(NamedTuple):
    """Where an allocating stack's call site is (the first user frame, `storage.callsite`'s
    rules), chosen once when the stack is recorded: frame `position` in the stack (0 is the
    leaf), `inline_depth` in that frame's inline chain, and the site's location."""

    position: int
    inline_depth: int
    location_id: int


@dataclass(slots=True)
class Checkpoint:
    timestamp_ms: int
    samples: int = 0
    lost_samples: int = 0
    cpu: Mapping[tuple[int, int], int] = field(default_factory=dict)  # (stack_id, tid) -> count
    # (pid, tid) -> stack_id -> delta: heap activity by the process and thread that
    # allocated (a free is charged to the allocating thread, whichever thread freed it)
    heap: Mapping[tuple[int, int], Mapping[int, HeapDelta]] = field(default_factory=dict)
    # stack_id -> its call site, for every heap stack in `heap` (stored once per stack)
    heap_call_sites: Mapping[int, HeapCallSite] = field(default_factory=dict)
    heap_events: int = 0
    heap_lost_events: int = 0
    threads: Mapping[int, str | None] = field(default_factory=dict)  # tids seen -> name shown
    thread_comms: Mapping[int, str | None] = field(default_factory=dict)  # tid -> kernel name
    thread_pids: Mapping[int, int] = field(default_factory=dict)  # tid -> its process's pid
    exited_threads: Iterable[int] = ()
    target_cpu_pct: float | None = None
    target_rss_bytes: int | None = None


_SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
_LINK_REFUSED = "cannot write {}: it is a symbolic link; rsprof does not write through links"


def _open_fds() -> set[int]:
    """This process's descriptors, without the one used to list them (which is free again
    afterwards, and the next open may get its number)."""
    listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return {int(name) for name in os.listdir(listing)} - {listing}
    finally:
        os.close(listing)


def _is_disk_full(error: sqlite3.Error) -> bool:
    text = str(error).lower()
    return "disk is full" in text or "disk i/o error" in text or "no space" in text


class ProfileWriter:
    """Creates (or appends to) a profile file and writes it checkpoint by checkpoint."""

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None
        self.created = False
        try:
            info: os.stat_result | None = os.lstat(self.path)
        except FileNotFoundError:
            info = None
        except OSError as error:  # a name too long, a component that is not a folder
            raise ProfileError(f"cannot write {self.path}: {error.strerror or error}") from None
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise ProfileError(_LINK_REFUSED.format(self.path))
        if info is not None and not append:
            raise ProfileExists(f"{self.path} already exists")
        try:
            if info is None:
                self._create()
            else:
                self._lock()  # before SQLite touches a file another recorder writes
            self._check_side_files()
            self.conn = self._connect()
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            if append and self._has_tables():
                self._check_appendable()
            create_schema(self.conn)
        except sqlite3.Error as error:
            self.abandon()
            raise self._storage_error(error) from error
        except BaseException:
            self.abandon()
            raise
        # ids of modules, locations, frames and stacks: interned in memory by the
        # symbolizer, stored with the next checkpoint (commit)
        self.ids = InternTable()
        self._known_threads: set[int] = set()
        self._heap_stacks: set[int] = set()  # stacks whose call site is stored
        self._load_existing()

    # -- setup ---------------------------------------------------------------------------

    def _create(self) -> None:
        """Creates the profile before SQLite sees it: O_EXCL never follows a symbolic link
        (a dangling one planted under the name fails with EEXIST instead of creating its
        target, which SQLite's own open would do), and nobody else's file is reused.
        Mode 0644 minus the umask: what SQLite would have used, so `rsprof view` by
        another user still works where the umask allows it."""
        flags = os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o644)
        except FileExistsError:
            # Created (a link, most likely) between the lstat and here.
            if os.path.islink(self.path):
                raise ProfileError(_LINK_REFUSED.format(self.path)) from None
            raise ProfileExists(f"{self.path} already exists") from None
        except OSError as error:  # read-only file system, no such folder, no permission
            raise ProfileError(f"cannot write {self.path}: {error.strerror or error}") from None
        self.created = True
        self._hold_lock(fd)

    def _lock(self) -> None:
        """One recorder per file: an exclusive flock on the profile for the writer's
        lifetime (flock locks are separate from SQLite's POSIX byte-range locks, so readers
        are unaffected). The descriptor is closed only after the connection: closing any
        descriptor of a file drops this process's POSIX locks on it."""
        try:
            # O_NONBLOCK: a FIFO under the name must not hang the open.
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise ProfileError(_LINK_REFUSED.format(self.path)) from None
            raise ProfileError(f"cannot write {self.path}: {error.strerror or error}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ProfileError(f"cannot write {self.path}: not a regular file")
        self._hold_lock(fd)

    def _hold_lock(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ProfileLocked(
                f"{self.path} is being recorded by another rsprof; wait for it to finish or"
                " write to another file"
            ) from None
        except OSError:
            pass  # a file system without flock: no lock, as before
        self._lock_fd = fd

    def _check_side_files(self) -> None:
        """SQLite's -wal, -shm and -journal beside the profile. SQLite (3.40 here) opens
        them with O_NOFOLLOW, so a link planted there makes a write fail with "unable to
        open database file"; this says which file and why, before anything is written.
        Beside a file just created, any of them is left from another file (a stale WAL
        would be replayed into the new profile): refused too. Beside a profile being
        appended to, regular ones are its own (a recorder killed with -9 leaves its WAL)."""
        for suffix in _SIDE_SUFFIXES:
            side = f"{self.path}{suffix}"
            try:
                info = os.lstat(side)
            except FileNotFoundError:
                continue
            except OSError as error:
                raise ProfileError(f"cannot write {self.path}: {side}: "
                                   f"{error.strerror or error}") from None
            if stat.S_ISLNK(info.st_mode):
                raise ProfileError(
                    f"cannot write {self.path}: {side} is a symbolic link; rsprof does not"
                    " write through links (remove it or write elsewhere)")
            if self.created or not stat.S_ISREG(info.st_mode):
                raise ProfileError(
                    f"cannot write {self.path}: {side} already exists and is not this"
                    " profile's (remove it or write elsewhere)")

    def _connect(self) -> sqlite3.Connection:
        """SQLite opens the file by name: mode=rw so it never creates one (the file exists,
        made by _create), and the descriptor it opened is checked to be the very file
        locked above. A name swapped for a link to another file in between (a folder
        others can write to) is refused before a byte is written."""
        before = _open_fds()
        uri = f"{self.path.absolute().as_uri()}?mode=rw"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            assert self._lock_fd is not None
            mine = os.fstat(self._lock_fd)
            for fd in _open_fds() - before:
                try:
                    info = os.stat(f"/proc/self/fd/{fd}")
                except OSError:
                    continue
                if (info.st_dev, info.st_ino) == (mine.st_dev, mine.st_ino):
                    return conn
            raise ProfileError(
                f"cannot write {self.path}: the file was replaced while it was being opened")
        except BaseException:
            conn.close()
            raise

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def abandon(self) -> None:
        """Gives the file up after a failure before anything was recorded: closes it and,
        if this writer created it, removes it (no 0-byte or empty profile is left). unlink
        never follows a link, so a planted one is removed, never its target."""
        conn = getattr(self, "conn", None)
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._unlock()
        if self.created:
            # Side files only if SQLite may have made them (the check above passed).
            suffixes = ("", *_SIDE_SUFFIXES) if conn is not None else ("",)
            for suffix in suffixes:
                try:
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)
                except OSError:
                    pass  # a read-only file system: nothing was made there either

    def _has_tables(self) -> bool:
        row = self.conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type='table'"
        ).fetchone()
        return bool(row and row[0])

    def _check_appendable(self) -> None:
        try:
            row = self.conn.execute(
                "SELECT value FROM meta WHERE key='schema_version'"
            ).fetchone()
        except sqlite3.Error:
            row = None
        if row is not None and row[0] in READABLE_SCHEMA_VERSIONS and row[0] != str(
                SCHEMA_VERSION):
            raise ProfileError(f"{self.path} was written by an older rsprof (profile schema"
                               f" {row[0]}): record into a new file to compare the two")
        if row is None or row[0] != str(SCHEMA_VERSION):
            raise ProfileError(f"{self.path} is not an rsprof profile of schema {SCHEMA_VERSION}")

    def _load_existing(self) -> None:
        """On append, learn the ids already in the file so nothing is inserted twice."""
        self.ids = InternTable.load(self.conn)
        self._known_threads = {tid for (tid,) in self.conn.execute("SELECT tid FROM threads")}
        self._heap_stacks = {sid for (sid,) in self.conn.execute(
            "SELECT stack_id FROM heap_call_sites")}

    # -- ids -----------------------------------------------------------------------------

    def set_meta(self, values: Mapping[str, object]) -> None:
        self._execute_many(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            [(key, None if value is None else str(value)) for key, value in values.items()],
        )

    # -- checkpoints ---------------------------------------------------------------------

    def write_checkpoint(self, checkpoint: Checkpoint) -> int:
        """Writes one interval and commits everything pending with it."""
        cursor = self._execute(
            "INSERT INTO checkpoints (timestamp_ms, samples, lost_samples, heap_events,"
            " heap_lost_events, target_cpu_pct, target_rss_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                checkpoint.timestamp_ms,
                checkpoint.samples,
                checkpoint.lost_samples,
                checkpoint.heap_events,
                checkpoint.heap_lost_events,
                checkpoint.target_cpu_pct,
                checkpoint.target_rss_bytes,
            ),
        )
        cid = int(cursor.lastrowid or 0)
        self._execute_many(
            "INSERT INTO cpu_stack_samples (checkpoint_id, stack_id, tid, count) VALUES (?,?,?,?)",
            [(cid, sid, tid, count) for (sid, tid), count in checkpoint.cpu.items() if count],
        )
        self._execute_many(
            "INSERT INTO cpu_samples (checkpoint_id, location_id, count) VALUES (?, ?, ?)",
            [(cid, lid, count) for lid, count in self._self_by_location(checkpoint).items()],
        )
        self._write_heap(cid, checkpoint)
        self._write_threads(cid, checkpoint)
        self.commit()
        return cid

    def _self_by_location(self, checkpoint: Checkpoint) -> dict[int, int]:
        counts: dict[int, int] = {}
        for (stack_id, _tid), count in checkpoint.cpu.items():
            location = self.ids.stack_leaf_location.get(stack_id)
            if location is not None and count:
                counts[location] = counts.get(location, 0) + count
        return counts

    def _write_heap(self, cid: int, checkpoint: Checkpoint) -> None:
        if not checkpoint.heap:
            return
        new_sites = [
            (sid, *site) for sid, site in checkpoint.heap_call_sites.items()
            if sid not in self._heap_stacks
        ]
        self._execute_many(
            "INSERT OR IGNORE INTO heap_call_sites (stack_id, position, inline_depth,"
            " location_id) VALUES (?, ?, ?, ?)", new_sites)
        self._heap_stacks.update(row[0] for row in new_sites)
        self._execute_many(
            "INSERT INTO heap_deltas (checkpoint_id, stack_id, pid, tid, alloc_bytes,"
            " alloc_count, free_bytes, free_count) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (cid, sid, pid, tid, d.alloc_bytes, d.alloc_count, d.free_bytes, d.free_count)
                for (pid, tid), deltas in checkpoint.heap.items()
                for sid, d in deltas.items()
            ],
        )
        # A thread that allocated but was never sampled still gets its threads row, so the
        # thread picker and `--tid` know it (name unknown: the shim records only the tid).
        for pid, tid in checkpoint.heap:
            if tid and tid not in self._known_threads and tid not in checkpoint.threads:
                self._known_threads.add(tid)
                self._execute(
                    "INSERT OR IGNORE INTO threads (tid, name, first_checkpoint_id,"
                    " last_checkpoint_id, pid) VALUES (?, NULL, ?, ?, ?)",
                    (tid, cid, cid, pid),
                )

    def _write_threads(self, cid: int, checkpoint: Checkpoint) -> None:
        for tid, name in checkpoint.threads.items():
            pid = checkpoint.thread_pids.get(tid)
            comm = checkpoint.thread_comms.get(tid, name)
            if tid in self._known_threads:
                self._execute(
                    "UPDATE threads SET last_checkpoint_id = ?, name = COALESCE(?, name),"
                    " comm = COALESCE(?, comm), pid = COALESCE(?, pid) WHERE tid = ?",
                    (cid, name, comm, pid, tid),
                )
            else:
                self._known_threads.add(tid)
                self._execute(
                    "INSERT INTO threads (tid, name, comm, first_checkpoint_id,"
                    " last_checkpoint_id, pid) VALUES (?, ?, ?, ?, ?, ?)",
                    (tid, name, comm, cid, cid, pid),
                )
        self._execute_many(
            "UPDATE threads SET exited = 1 WHERE tid = ?",
            [(tid,) for tid in checkpoint.exited_threads],
        )

    # -- processes -----------------------------------------------------------------------

    def add_process(
        self, pid: int, ppid: int | None, parent_id: int | None, command: str | None
    ) -> int:
        """One row per process image (a process between two execs); returns its id."""
        cursor = self._execute(
            "INSERT INTO processes (pid, ppid, parent_id, command, first_checkpoint_id)"
            " VALUES (?, ?, ?, ?, (SELECT MAX(id) FROM checkpoints))",
            (pid, ppid, parent_id, command),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def update_process(
        self, process_id: int, *, command: str | None = None, exited: bool = False
    ) -> None:
        self._execute(
            "UPDATE processes SET command = COALESCE(?, command), exited = MAX(exited, ?)"
            " WHERE id = ?",
            (command, int(exited), process_id),
        )

    # -- finishing -----------------------------------------------------------------------

    def finish(self, stop_reason: str, extra_meta: Mapping[str, object] | None = None) -> None:
        """Marks the profile finished and folds the WAL back into the main file."""
        values: dict[str, object] = {
            "state": "finished",
            "stop_reason": stop_reason,
            "end_time_ms": int(time.time() * 1000),
        }
        values.update(extra_meta or {})
        self.set_meta(values)
        self.commit()
        try:
            # WAL is for readers following a recording; a finished file is one plain file,
            # which read-only openers (query, view, list) leave without -wal/-shm companions.
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self.conn.execute("PRAGMA journal_mode=DELETE")
        except sqlite3.Error:
            pass  # a reader still holds the file open: it stays in WAL mode, nothing lost
        self.conn.close()
        self._unlock()

    def add_output(self, chunks: Sequence[tuple[int, str, bytes]]) -> None:
        """Appends what the launched target wrote, (time_ms, 'stdout' | 'stderr', bytes) in
        the order it was read, and commits (docs/schema.md `target_output`)."""
        if not chunks:
            return
        self._execute_many("INSERT INTO target_output (time_ms, stream, data) VALUES (?, ?, ?)",
                           list(chunks))
        self.commit()

    def commit(self) -> None:
        """Stores the interned rows new since the last commit, and commits."""
        rows = self.ids.take()
        try:
            if rows:
                if not self.conn.in_transaction:
                    self.conn.execute("BEGIN")
                rows.store(self.conn)
            if self.conn.in_transaction:
                self.conn.execute("COMMIT")
        except sqlite3.Error as error:
            raise self._storage_error(error) from error

    def close(self) -> None:
        try:
            self.commit()
        finally:
            self.conn.close()
            self._unlock()

    # -- plumbing ------------------------------------------------------------------------

    def _storage_error(self, error: sqlite3.Error) -> Exception:
        if _is_disk_full(error):
            return StorageFullError(f"cannot write {self.path}: disk is full ({error})")
        for suffix in _SIDE_SUFFIXES:  # planted after the check: SQLite refused to follow it
            if os.path.islink(f"{self.path}{suffix}"):
                return ProfileError(
                    f"cannot write {self.path}: {self.path}{suffix} is a symbolic link;"
                    " rsprof does not write through links")
        return ProfileError(f"cannot write {self.path}: {error}")

    def _execute(self, sql: str, params: Sequence[object] = ()) -> sqlite3.Cursor:
        try:
            if not self.conn.in_transaction:
                self.conn.execute("BEGIN")
            return self.conn.execute(sql, params)
        except sqlite3.Error as error:
            raise self._storage_error(error) from error

    def _execute_many(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        try:
            if not self.conn.in_transaction:
                self.conn.execute("BEGIN")
            self.conn.executemany(sql, rows)
        except sqlite3.Error as error:
            raise self._storage_error(error) from error
