"""Errors the collector raises; each carries the CLI exit code rsprof documents."""

from __future__ import annotations

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_PERMISSION = 4
EXIT_DATABASE = 6

PERMISSION_HINT = (
    "run as root, or give the profiler CAP_PERFMON, or lower"
    " /proc/sys/kernel/perf_event_paranoid (e.g. `sysctl kernel.perf_event_paranoid=1`)"
)


class CollectorError(Exception):
    exit_code = EXIT_ERROR


class ProcessNotFound(CollectorError):
    exit_code = EXIT_NOT_FOUND


class NotProfilable(CollectorError):
    """The process exists but has nothing to sample (a kernel thread, a zombie)."""

    exit_code = EXIT_ERROR


class PermissionDenied(CollectorError):
    exit_code = EXIT_PERMISSION
