"""`rsprof export`: one profile's samples to a file other tools read.

A regular file is written to a temporary file beside it and renamed into place, so a
failed export (full disk, bad filter) never leaves half a file under the requested name.
A device, a FIFO or standard output (`-o -`, `-o /dev/stdout`) is written into directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, cast

import click

from rsprof.options import value_index
from rsprof.storage.analysis import growing_sites, rank_cpu, rank_heap
from rsprof.storage.reader import Profile
from rsprof.storage.selection import SampleQuery, Selection, require_samples, select

FORMATS = ("pprof", "folded", "speedscope", "json", "csv", "html", "firefox")
SUFFIXES = {"pprof": ".pb.gz", "folded": ".folded", "speedscope": ".speedscope.json",
            "json": ".json", "csv": ".csv", "html": ".html", "firefox": ".firefox.json"}


class ExportError(click.ClickException):
    """Exit code 1 with one line: the output cannot be written or the options do not fit."""


def default_output(profile: Path, fmt: str, kind: str) -> Path:
    stem = profile.name.removesuffix(".db")
    return Path(f"{stem}.{kind}{SUFFIXES[fmt]}")


def export(
    profile_path: Path,
    *,
    fmt: str,
    query: SampleQuery,
    output: Path | None,
    base_path: Path | None = None,
    sample_index: str | None = None,
    per_thread: bool = False,
    granularity: str = "functions",
) -> tuple[str, Selection]:
    """Writes the export; returns where it went ('-' for stdout) and what was selected."""
    if fmt not in FORMATS:
        raise click.BadParameter(f"unknown format {fmt!r}: use {', '.join(FORMATS)}",
                                 param_hint="'--format'")
    if base_path is not None and fmt != "pprof":
        raise click.BadParameter("only the pprof format carries a diff base",
                                 param_hint="'--diff-base'")
    if fmt == "firefox" and query.kind in ("offcpu", "wall"):
        raise click.BadParameter("the firefox format carries CPU or heap samples only; use"
                                 " pprof, folded, speedscope or html for offcpu and wall",
                                 param_hint="'--kind'")
    if fmt == "firefox" and query.kind != "heap":
        # A timeline: samples per checkpoint, not merged over the range.
        query = dataclasses.replace(query, per_checkpoint=True)
    with Profile(profile_path) as profile:
        selection = select(profile, query)
        require_samples(selection, query, profile_path, profile.summary().duration_ms)
        table = fmt in ("json", "csv") and query.kind == "heap"
        growing = growing_sites(profile) if table else set()
    base = None
    if base_path is not None:
        with Profile(base_path) as base_profile:
            base = select(base_profile, query)
            require_samples(base, query, base_path)
    index = value_index(selection, sample_index)
    target = output if output is not None else default_output(profile_path, fmt, query.kind)
    # The Firefox Profiler opens gzipped files as they are: a name ending .gz asks for one.
    gzipped = fmt == "firefox" and target.name.endswith(".gz")
    binary = fmt == "pprof" or gzipped
    with _open_output(target, binary=binary) as out:
        if fmt == "pprof":
            from rsprof.storage.pprof.writer import write_pprof

            write_pprof(selection.samples, out,  # type: ignore[arg-type]
                        base=base.samples if base else None)
        elif fmt == "folded":
            from rsprof.storage.flame import write_folded

            write_folded(selection.samples, out,  # type: ignore[arg-type]
                         value_index=index, per_thread=per_thread)
        elif fmt == "speedscope":
            from rsprof.storage.flame import write_speedscope

            write_speedscope(selection.samples, out,  # type: ignore[arg-type]
                             value_index=index, name=profile_path.name)
        elif fmt == "html":
            from rsprof.storage.flamehtml import write_html

            write_html(selection.samples, out,  # type: ignore[arg-type]
                       value_index=index, per_thread=per_thread, source=profile_path.name)
        elif fmt == "firefox":
            from rsprof.storage.firefox import write_firefox

            if gzipped:
                with gzip.GzipFile(fileobj=cast(IO[bytes], out), mode="wb", mtime=0) as packed, \
                        io.TextIOWrapper(packed, encoding="utf-8", newline="") as text:
                    write_firefox(selection.samples, text, value_index=index)
            else:
                write_firefox(selection.samples, out,  # type: ignore[arg-type]
                              value_index=index)
        else:
            _write_table(selection, fmt, granularity, growing, out)  # type: ignore[arg-type]
    return str(target), selection


def _write_table(selection: Selection, fmt: str, granularity: str, growing: set[int],
                 out: IO[str]) -> None:
    from rsprof import render

    if selection.samples.kind != "heap":
        render.emit_rows(render.CPU_KEYS, rank_cpu(selection, granularity=granularity), fmt, out)
    else:
        heap = rank_heap(selection, growing, granularity=granularity)
        render.emit_rows(render.HEAP_KEYS, heap, fmt, out)


# Names that mean "this process's standard output" (renaming a file onto them would
# write nothing there).
_STDOUT_NAMES = {"-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"}


@contextlib.contextmanager
def _open_output(target: Path, *, binary: bool) -> Iterator[IO[bytes] | IO[str]]:
    """A regular file (or a new name) is written atomically: a temporary file beside it,
    renamed into place. Anything else that exists — a character device (/dev/null,
    /dev/full), a FIFO, a terminal, stdout — is written into directly, never replaced."""
    if str(target) in _STDOUT_NAMES:
        with _reporting(target, stdout=True):
            stream: IO[bytes] | IO[str] = sys.stdout.buffer if binary else sys.stdout
            yield stream
            stream.flush()
        return
    _refuse_foreign_link(target)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as error:
        raise ExportError(f"cannot write {target}: {error.strerror or error}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ExportError(f"cannot write {target}: it is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        with _reporting(target), open(target, "wb") as raw:
            with raw if binary else io.TextIOWrapper(raw, encoding="utf-8", newline="") as out:
                yield out
        return
    if target.is_symlink():
        target = Path(os.path.realpath(target))  # replace the file, keep the link
    folder = target.parent if str(target.parent) else Path(".")
    try:
        fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=folder)
    except OSError as error:
        raise ExportError(f"cannot write {target}: {error.strerror or error}") from None
    temp = Path(temp_name)
    try:
        raw = os.fdopen(fd, "wb")
        with raw if binary else io.TextIOWrapper(raw, encoding="utf-8", newline="") as out:
            yield out
        os.chmod(temp, 0o644 & ~_umask())
        temp.replace(target)
    except OSError as error:
        temp.unlink(missing_ok=True)
        raise ExportError(f"cannot write {target}: {error.strerror or error}") from None
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _refuse_foreign_link(target: Path) -> None:
    """A symbolic link at the output name is followed only when it is ours. Following one
    that another user planted (in /tmp, say) would let them aim root's export at any file:
    the rename below lands on the link's target, past the kernel's protected_symlinks."""
    try:
        link = os.lstat(target)
    except OSError:
        return  # no such name yet (or unreadable: the open below says so)
    if stat.S_ISLNK(link.st_mode) and link.st_uid != os.geteuid():
        raise ExportError(
            f"cannot write {target}: it is a symbolic link owned by another user (uid"
            f" {link.st_uid}); give the path it points to if that is meant")


@contextlib.contextmanager
def _reporting(target: Path, *, stdout: bool = False) -> Iterator[None]:
    """An OSError while writing a stream (ENOSPC from /dev/full, EPIPE) is one line."""
    try:
        yield
    except BrokenPipeError:
        _silence_stdout()
        raise
    except OSError as error:
        if stdout:
            _silence_stdout()
        raise ExportError(f"cannot write {target}: {error.strerror or error}") from None


def _silence_stdout() -> None:
    """Points stdout at /dev/null so the interpreter's final flush of data that cannot be
    written does not print a second error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
