"""Symbolization: ELF symbol tables, DWARF lines and inlines, demangling, per-build-id cache."""
