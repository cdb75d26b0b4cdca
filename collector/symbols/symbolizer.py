"""Module (one ELF file) and Symbolizer (modules by path, with the on-disk cache)."""

from __future__ import annotations

import bisect
import hashlib
import os
import re
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from rsprof._native import cfi_functions

from .cache import FrameCache
from .debuginfo import default_debug_roots, find_debug_file, open_debug_file
from .demangle import demangle
from .dwarf import DwarfIndex, DwarfResult
from .elf import ElfError, ElfFile
from .model import SourceFrame
from .symtab import SymbolTable

# c++filt's suffix for GCC's clones of a function (`.constprop.0`, `.isra.0`, `.cold`).
_CLONE = re.compile(r" \[clone [^\]]*\]")


def default_cache_dir() -> Path:
    env = os.environ.get("RSPROF_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "rsprof"


def cache_identity(path: str, source: str) -> str | None:
    """What the disk cache of one build id is also keyed by: the identity of the binary and
    of the file its DWARF comes from (device, inode, size, mtime, ctime). A build id is
    only a claim its file makes: a stripped and an unstripped copy share one, and anyone
    can build a binary claiming a system library's. Keyed by build id alone, the first
    one profiled named the other's code (a stripped binary hid its unstripped copy's
    names; a crafted collision put a foreign name in a profile). Two files that exist
    at once differ in inode; a file replaced in place differs in ctime, which no one can
    set. None if the files cannot be stat'ed: no disk cache then."""
    parts = []
    for name in (path, source) if source and source != path else (path,):
        try:
            st = os.stat(name)
        except OSError:
            return None
        parts.append(f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


class Module:
    """One ELF file on disk. Symbol tables and DWARF are loaded only on a cache miss."""

    def __init__(self, path: str, elf: ElfFile, cache_dir: Path | None,
                 debug_roots: Sequence[str], warn: Callable[[str], None] | None = None,
                 cancelled: Callable[[], bool] | None = None) -> None:
        self.path = path
        self._warn = warn
        self._cancelled = cancelled or (lambda: False)
        self._warned = False
        self.build_id: str | None = elf.build_id()
        self._elf = elf
        self._debug_roots = list(debug_roots)
        self._basename = os.path.basename(path)
        self._lock = threading.Lock()
        self._memo: dict[int, tuple[SourceFrame, ...]] = {}
        self._symtab: SymbolTable | None = None
        self._fdes: tuple[list[int], list[int]] | None = None
        self._sources: dict[str, str] = {}  # relative source path -> as shown (_source_path)
        self._dwarf_loaded = False
        self._dwarf: DwarfIndex | None = None
        self._dwarf_elf: ElfFile = elf  # the file the DWARF comes from (maybe a debug file)
        self._cache: FrameCache | None = None
        self.cache_path: Path | None = None  # this file's disk cache (made on first use)
        if cache_dir is not None and self.build_id:
            # The cache is only valid for the DWARF source it was built from: a debug file
            # installed later must not be hidden by results made without it.
            source = path if elf.has_dwarf() else (
                find_debug_file(path, elf, self._debug_roots) or "")
            identity = cache_identity(path, source)
            if identity is not None:
                self.cache_path = cache_dir / "symbols" / f"{self.build_id}-{identity}.db"
                self._cache = FrameCache(self.cache_path, source)

    def file_offset_to_vaddr(self, file_offset: int) -> int:
        return self._elf.file_offset_to_vaddr(file_offset)

    def bytes_before(self, file_offset: int, count: int) -> bytes:
        """The `count` bytes of the file just before `file_offset` (code before an address);
        fewer at the start of the file."""
        return bytes(self._elf.data[max(0, file_offset - count):file_offset])

    def symbolize(self, vaddrs: Sequence[int]) -> list[tuple[SourceFrame, ...]]:
        """Per address the inline chain, innermost first; never empty."""
        with self._lock:
            missing = [a for a in dict.fromkeys(vaddrs) if a not in self._memo]
            if missing and self._cache is not None:
                self._memo.update(self._cache.get_many(missing))
                missing = [a for a in missing if a not in self._memo]
            if missing:
                try:
                    resolved = self._resolve(missing)
                except Exception as error:
                    # Corrupt debug info or symbol tables cost this module its names, never
                    # the recording: symbol-table names if they still work, else
                    # module+offset.
                    self._degrade(error)
                    resolved = self._resolve_fallback(missing)
                self._memo.update(resolved)
                if self._cache is not None:
                    self._cache.put_many(resolved)
            return [self._memo[a] for a in vaddrs]

    # -- resolution (cache misses only) ---------------------------------------------------

    def _symbols(self) -> SymbolTable:
        if self._symtab is None:
            self._load_dwarf()  # a separate debug file may hold the only full .symtab
            files = [self._elf]
            if self._dwarf is not None and self._dwarf_elf is not self._elf:
                files.append(self._dwarf_elf)
            self._symtab = SymbolTable.from_elf(*files)
        return self._symtab

    def _load_dwarf(self) -> DwarfIndex | None:
        if self._dwarf_loaded:
            return self._dwarf
        self._dwarf_loaded = True
        source: ElfFile | None = self._elf
        if not self._elf.has_dwarf():
            source = open_debug_file(self.path, self._elf, self._debug_roots,
                                     warn=self._warn, cancelled=self._cancelled)
        if source is None:
            return None
        try:
            self._dwarf = DwarfIndex(source)
            self._dwarf_elf = source
        except Exception:
            # Undecodable DWARF (or the pure-Python fallback failing on it, or pyelftools not
            # installed for it): keep going on symbol tables alone, not failing the profile.
            self._dwarf = None
        return self._dwarf

    def _degrade(self, error: Exception) -> None:
        self._dwarf = None
        self._dwarf_loaded = True
        if not self._warned:
            self._warned = True
            if self._warn is not None:
                self._warn(f"{self.path}: unreadable debug info ({type(error).__name__}: "
                           f"{error}); fewer symbols for this module")

    def _resolve_fallback(self, vaddrs: list[int]) -> dict[int, tuple[SourceFrame, ...]]:
        try:
            symtab = self._symbols()
            return {a: self._frames(a, symtab.lookup(a), None) for a in vaddrs}
        except Exception:
            self._symtab = SymbolTable.from_elf()
            return {a: (SourceFrame(self._safe_unknown(a), "", 0, None),) for a in vaddrs}

    def _safe_unknown(self, vaddr: int) -> str:
        try:
            return self._unknown(vaddr)
        except Exception:
            return f"{self._basename}+0x{vaddr:x}"

    def _resolve(self, vaddrs: list[int]) -> dict[int, tuple[SourceFrame, ...]]:
        symtab = self._symbols()
        dwarf = self._load_dwarf()
        results = dwarf.lookup(vaddrs) if dwarf is not None else {}
        return {a: self._frames(a, symtab.lookup(a), results.get(a)) for a in vaddrs}

    def _source_path(self, file: str) -> str:
        """A relative source path names the file beside the binary when there is one there:
        a binary built with `-ffile-prefix-map=SRC=.` (reproducible builds do it, so does
        rsprof's own demo, whose source ships beside it) records paths relative to a build
        folder that is gone. Else the path stays as the debug info has it."""
        if not file or os.path.isabs(file):
            return file
        found = self._sources.get(file)
        if found is None:
            beside = os.path.normpath(os.path.join(os.path.dirname(self.path), file))
            found = self._sources[file] = beside if os.path.isfile(beside) else file
        return found

    def _unknown(self, vaddr: int) -> str:
        """A name for code no symbol covers. Stripped code is grouped by the function ranges
        of its CFI (the FDEs of .eh_frame), so one stripped function is one row named after
        its first byte (`xz+0x1a2b0`), not one row per instruction."""
        start = self._fde_start(vaddr)
        return f"{self._basename}+0x{self._elf.vaddr_to_file_offset(start):x}"

    def _fde_start(self, vaddr: int) -> int:
        if self._fdes is None:
            try:
                ranges = cfi_functions(self.path)[0]
            except OSError:
                ranges = []
            self._fdes = ([start for start, _ in ranges], [end for _, end in ranges])
        starts, ends = self._fdes
        i = bisect.bisect_right(starts, vaddr) - 1
        if i >= 0 and vaddr < ends[i]:
            return starts[i]
        return vaddr

    def _frames(self, vaddr: int, symbol: str | None,
                result: DwarfResult | None) -> tuple[SourceFrame, ...]:
        file, line = result.line if result is not None and result.line else ("", 0)
        file = self._source_path(file)
        if result is None or not result.scopes:
            if symbol is None:
                return (SourceFrame(self._unknown(vaddr), file, line, None),)
            shown = demangle(symbol)
            return (SourceFrame(shown, file, line, symbol if symbol != shown else None),)
        frames: list[SourceFrame] = []
        table = result.unit_files
        last = len(result.scopes) - 1
        for i, (name, linkage, call_file, call_line) in enumerate(result.scopes):
            outermost = i == last
            system = linkage
            if linkage:
                function = demangle(linkage)
            elif outermost and symbol and symbol.startswith("_Z"):
                # The out-of-line function's own mangled symbol names it as c++filt does
                # where DWARF has no linkage name (GCC omits it for anything involving a
                # local type: each lambda's `_Function_handler<...>::_M_invoke` is a
                # different symbol, one DWARF name). Clones keep one name, as above.
                function, system = _CLONE.sub("", demangle(symbol)), symbol
            elif name:
                function = name
            elif outermost and symbol:
                function, system = demangle(symbol), symbol
            else:
                function = self._unknown(vaddr)
            if outermost and system is None and symbol and symbol != function:
                system = symbol  # e.g. the clone `foo.constprop.0` of DWARF's `foo`
            frames.append(SourceFrame(function, self._source_path(file), line,
                                      system if system != function else None))
            # The next (outer) frame is positioned at the call site of this inlined one.
            file = table.file_name(call_file) if table is not None else ""
            line = call_line
        return tuple(frames)


class Symbolizer:
    """Modules by path, each opened once (reopened if the file on disk changes)."""

    def __init__(self, cache_dir: Path | str | None = None,
                 debug_roots: Sequence[str | Path] | None = None,
                 disk_cache: bool = True) -> None:
        self.cache_dir: Path | None = (Path(cache_dir) if cache_dir is not None
                                       else default_cache_dir()) if disk_cache else None
        self.debug_roots = ([str(p) for p in debug_roots] if debug_roots is not None
                            else default_debug_roots())
        self._lock = threading.Lock()
        self._modules: dict[str, tuple[tuple[int, int, int, int], Module | None]] = {}
        # Told once per module whose symbols could not be read (the recorder's warn).
        self.on_warning: Callable[[str], None] | None = None
        # True once the recording is asked to stop: long reads (a debug file's CRC) give up.
        self.cancelled: Callable[[], bool] = lambda: False

    def _warn(self, message: str) -> None:
        if self.on_warning is not None:
            self.on_warning(message)

    def module(self, path: str) -> Module | None:
        """The module for an ELF file; None if it is missing or not ELF."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None  # a FIFO or device would block or lie when mapped
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._modules.get(path)
            if hit is not None and hit[0] == key:
                return hit[1]
            module: Module | None
            try:
                module = Module(path, ElfFile(path), self.cache_dir, self.debug_roots,
                                self._warn, lambda: self.cancelled())
            except (OSError, ValueError, ElfError):
                module = None
            except Exception as error:  # e.g. struct.error on corrupt headers
                self._warn(f"{path}: unreadable ELF file ({type(error).__name__}: {error});"
                           " its frames are shown as module+offset")
                module = None
            self._modules[path] = (key, module)
            return module
