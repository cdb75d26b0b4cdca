"""Errors the collector raises. The CLI maps each kind to an exit code (rsprof/exit_codes.py)."""

from __future__ import annotations

PERMISSION_HINT = (
    "run as root, or give the profiler CAP_PERFMON, or lower"
    " /proc/sys/kernel/perf_event_paranoid (e.g. `sysctl kernel.perf_event_paranoid=1`)"
)


class CollectorError(Exception):
    """Recording failed; the message says why, in one line."""


class ProcessNotFound(CollectorError):
    """No such process (or it exited before it could be sampled)."""


class NotProfilable(CollectorError):
    """The process exists but has nothing to sample (a kernel thread, a zombie)."""


class PermissionDenied(CollectorError):
    """The kernel refused perf_event_open or reading the process."""
