"""Finding the target process and reading what /proc says about it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil
from rsprof.collector.errors import NotProfilable, PermissionDenied, ProcessNotFound

# PF_KTHREAD in /proc/PID/stat's flags field (include/linux/sched.h).
_PF_KTHREAD = 0x00200000


@dataclass(frozen=True, slots=True)
class Target:
    pid: int
    name: str
    exe: str
    cmdline: str


def _stat_flags(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The name in parentheses may contain spaces; fields resume after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[6])


def is_alive(pid: int) -> bool:
    """A process that exists and is not a zombie (pid reuse aside, which EXIT records cover)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return stat.rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def target_from_pid(pid: int) -> Target:
    """Validates that PID is a live user-space process we may sample."""
    if pid <= 0:
        raise ProcessNotFound(f"no process with PID {pid}")
    try:
        proc = psutil.Process(pid)
        name = proc.name()
        status = proc.status()
    except psutil.NoSuchProcess:
        raise ProcessNotFound(f"no process with PID {pid}") from None
    except psutil.AccessDenied as error:
        raise PermissionDenied(f"cannot inspect PID {pid}: permission denied") from error
    if status == psutil.STATUS_ZOMBIE:
        raise NotProfilable(f"PID {pid} ({name}) has exited (zombie): nothing to sample")
    try:
        if _stat_flags(pid) & _PF_KTHREAD:
            raise NotProfilable(
                f"PID {pid} ({name}) is a kernel thread: it has no user space to sample"
            )
    except (OSError, ValueError, IndexError):
        raise ProcessNotFound(f"no process with PID {pid}") from None
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        cmdline = " ".join(proc.cmdline())
    except PermissionError as error:
        raise PermissionDenied(f"cannot read /proc/{pid}/exe: permission denied") from error
    except (FileNotFoundError, psutil.NoSuchProcess):
        raise ProcessNotFound(f"no process with PID {pid}") from None
    return Target(pid=pid, name=name, exe=exe, cmdline=cmdline)


def target_from_name(pattern: str) -> Target:
    """The one user-space process whose name contains `pattern` (rsprof's -P)."""
    own = {os.getpid(), os.getppid()}
    matches = []
    for proc in psutil.process_iter(["pid", "name"]):
        name = proc.info.get("name") or ""
        if pattern in name and proc.info["pid"] not in own:
            try:
                if _stat_flags(proc.info["pid"]) & _PF_KTHREAD:
                    continue
            except (OSError, ValueError, IndexError):
                continue
            matches.append((proc.info["pid"], name))
    if not matches:
        raise ProcessNotFound(f"no process whose name contains {pattern!r}")
    if len(matches) > 1:
        listed = ", ".join(f"{pid} ({name})" for pid, name in sorted(matches))
        raise ProcessNotFound(
            f"{len(matches)} processes match {pattern!r}: {listed}; pick one with -p PID"
        )
    return target_from_pid(matches[0][0])


def thread_ids(pid: int) -> list[int]:
    try:
        return sorted(int(entry) for entry in os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, ProcessLookupError):
        return []


def thread_name(pid: int, tid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().rstrip("\n")
    except OSError:
        return None
