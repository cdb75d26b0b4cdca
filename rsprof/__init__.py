"""rsprof: a live CPU and heap profiler for Linux processes.

One installed package: rsprof.collector (attach, sample, unwind, symbolize), rsprof.storage
(the profile file: schema, writer, queries, exports), rsprof.tui (Textual, reads storage
only), rsprof._native (the C core) and the CLI (rsprof.cli).
"""

import os

# The one source of truth (pyproject.toml reads it at build time). A literal, not
# importlib.metadata: that import and lookup cost 43 ms of every command's start-up, and
# `rsprof run` starts the target only after it (a 1 s program paid 4 %).
__version__ = "0.1.0"


def _inherited_fds() -> tuple[int, ...]:
    """The fds open without close-on-exec when rsprof starts: the ones it inherited (a
    jobserver's, a `3<file`), since Python opens all of its own with O_CLOEXEC (PEP 446).
    Taken here, at the first import, before rsprof opens anything: `rsprof run` hands
    exactly these to its target (rsprof.session.launch)."""
    fds = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return ()
    for name in names:
        try:
            if int(name) > 2 and os.get_inheritable(int(name)):
                fds.append(int(name))
        except (OSError, ValueError):
            pass  # the listing's own fd, closed by now
    return tuple(sorted(fds))


INHERITED_FDS = _inherited_fds()
