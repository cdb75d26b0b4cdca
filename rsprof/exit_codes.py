"""rsprof's exit codes, owned by the CLI: the layers below raise typed errors, and only the
command line turns them into numbers (docs: README, "Exit codes")."""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_PERMISSION = 4
# `rsprof -p PID --heap`: heap tracking was asked for and could not start (the CPU
# profile is recorded all the same; the reason is said in one line).
EXIT_HEAP_REFUSED = 5
EXIT_DATABASE = 6
EXIT_INTERRUPTED = 130
