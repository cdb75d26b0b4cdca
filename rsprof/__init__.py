"""rsprof: a live CPU and heap profiler for Linux processes.

One installed package: rsprof.collector (attach, sample, unwind, symbolize), rsprof.storage
(the profile file: schema, writer, queries, exports), rsprof.tui (Textual, reads storage
only), rsprof._native (the C core) and the CLI (rsprof.cli).
"""

# The one source of truth (pyproject.toml reads it at build time). A literal, not
# importlib.metadata: that import and lookup cost 43 ms of every command's start-up, and
# `rsprof run` starts the target only after it (a 1 s program paid 4 %).
__version__ = "0.1.0"
