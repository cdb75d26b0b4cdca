"""Symbolization: ELF symbol tables, DWARF lines and inlines, demangling, per-build-id cache.

    sym = Symbolizer()                      # cache in $RSPROF_CACHE_DIR or ~/.cache/rsprof
    mod = sym.module("/usr/lib/x86_64-linux-gnu/libc.so.6")
    vaddr = mod.file_offset_to_vaddr(addr - map_start + map_pgoff)
    frames = mod.symbolize([vaddr])[0]      # innermost inlined function first

See docs/symbols.md for how addresses are resolved and where the cache lives.
"""

from .demangle import demangle
from .model import SourceFrame
from .symbolizer import Module, Symbolizer

__all__ = ["Module", "SourceFrame", "Symbolizer", "demangle"]
