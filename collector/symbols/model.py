"""The symbolizer's result type."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceFrame:
    """One (possibly inlined) function at one source position."""

    function: str  # demangled name; "module_basename+0x<file offset>" when unresolvable
    file: str  # source file path, '' if unknown
    line: int  # 0 if unknown
    system_name: str | None  # mangled linker name when it differs from `function`, else None
