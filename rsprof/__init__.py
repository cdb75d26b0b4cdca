"""rsprof: a live CPU and heap profiler for Linux processes."""

__version__ = "0.1.0"
