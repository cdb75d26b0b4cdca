"""rsprof: a live CPU and heap profiler for Linux processes.

One installed package: rsprof.collector (attach, sample, unwind, symbolize), rsprof.storage
(the profile file: schema, writer, queries, exports), rsprof.tui (Textual, reads storage
only), rsprof._native (the C core) and the CLI (rsprof.cli).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rsprof")  # one source of truth: pyproject.toml
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
