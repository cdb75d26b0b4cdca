"""Symbolizer tests against real compiled binaries, with binutils' addr2line as the reference."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import build_target, run_rsprof, top_json
from rsprof.collector.symbols import SourceFrame, Symbolizer, demangle
from rsprof.collector.symbols import dwarf as dwarf_mod
from rsprof.collector.symbols import symbolizer as symbolizer_mod
from rsprof.collector.symbols.demangle import demangle_rust_legacy, demangle_rust_v0
from rsprof.collector.symbols.dwarf import DwarfIndex
from rsprof.collector.symbols.elf import ElfFile

TARGETS = Path(__file__).parent.parent / "targets"
BUILD_DIR = Path(os.environ.get("RSPROF_TEST_BUILD", "/tmp/rsprof-test-targets"))


def child_env() -> dict[str, str]:
    """Environment for helper processes: import the very packages this test process uses
    (the installed ones in CI, the source tree with an in-place build locally)."""
    import rsprof

    root = str(Path(rsprof.__file__ or "").absolute().parent.parent)  # not resolve(): see conftest
    return {**os.environ, "PYTHONPATH": root}


needs_native = pytest.mark.skipif(
    not dwarf_mod.native_available(),
    reason="rsprof._native is not built (python setup.py build_ext --inplace)",
)

Frames = list[tuple[str, str, int]]


def nm_functions(binary: Path) -> dict[str, tuple[int, int]]:
    """Function symbols (name -> (address, size)) as nm reports them, mangled names."""
    out = subprocess.run(["nm", "-S", "--defined-only", str(binary)], capture_output=True,
                         text=True, check=True).stdout
    funcs: dict[str, tuple[int, int]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            funcs[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return funcs


def addr2line(binary: Path, addrs: list[int]) -> list[Frames]:
    """`addr2line -a -f -i -C` per address: [(function, file, line), ...] innermost first."""
    out = subprocess.run(
        ["addr2line", "-a", "-f", "-i", "-C", "-e", str(binary), *(hex(a) for a in addrs)],
        capture_output=True, text=True, check=True).stdout.splitlines()
    groups: list[Frames] = []
    i = 0
    while i < len(out):
        if out[i].startswith("0x"):
            groups.append([])
            i += 1
            continue
        fn, loc = out[i], out[i + 1]
        file, _, line = loc.split(" (discriminator")[0].rpartition(":")
        groups[-1].append((fn, "" if file == "??" else file, int(line) if line.isdigit() else 0))
        i += 2
    assert len(groups) == len(addrs)
    return groups


def as_tuples(frames: tuple[SourceFrame, ...]) -> Frames:
    return [(f.function, f.file, f.line) for f in frames]


def source_line(source: Path, marker: str) -> int:
    for number, text in enumerate(source.read_text().splitlines(), start=1):
        if marker in text:
            return number
    raise AssertionError(f"{marker} not in {source}")


def function_addrs(binary: Path, name: str) -> list[int]:
    start, size = nm_functions(binary)[name]
    return list(range(start, start + size))


@pytest.fixture
def sym(tmp_path: Path) -> Symbolizer:
    # An empty debug root keeps the host's /usr/lib/debug out of the tests.
    return Symbolizer(cache_dir=tmp_path / "cache", debug_roots=[str(tmp_path / "no-debug")])


@needs_native
def test_c_target_matches_addr2line(target_binary: Callable[..., Path], sym: Symbolizer) -> None:
    binary = target_binary("sym_basic.c")
    addrs = function_addrs(binary, "outer_work") + function_addrs(binary, "leaf_sum")
    module = sym.module(str(binary))
    assert module is not None and module.build_id
    ours = [as_tuples(f) for f in module.symbolize(addrs)]
    assert ours == addr2line(binary, addrs)


@needs_native
def test_inlined_function_is_its_own_frame(target_binary: Callable[..., Path],
                                           sym: Symbolizer) -> None:
    binary = target_binary("sym_basic.c")
    source = TARGETS / "sym_basic.c"
    call_line = source_line(source, "CALL_SITE")
    module = sym.module(str(binary))
    assert module is not None
    chains = [c for c in module.symbolize(function_addrs(binary, "outer_work")) if len(c) == 2]
    assert chains, "no address of outer_work resolved inside the inlined mix()"
    for inner, outer in chains:
        assert inner.function == "mix"
        assert inner.file.endswith("sym_basic.c")
        assert source_line(source, "INLINE_BODY") <= inner.line <= call_line - 6
        assert (outer.function, outer.line) == ("outer_work", call_line)
        assert outer.file == inner.file


def test_stripped_binary_keeps_function_names(target_binary: Callable[..., Path],
                                              sym: Symbolizer, tmp_path: Path) -> None:
    binary = target_binary("sym_basic.c")
    stripped = tmp_path / "stripped"
    subprocess.run(["strip", "--strip-debug", "-o", str(stripped), str(binary)], check=True)
    module = sym.module(str(stripped))
    assert module is not None
    funcs = nm_functions(binary)
    for name in ("outer_work", "leaf_sum", "main"):
        start, size = funcs[name]
        for frames in module.symbolize([start, start + size // 2, start + size - 1]):
            assert frames == (SourceFrame(name, "", 0, None),)


def test_dynsym_only_and_zero_size_symbols(target_binary: Callable[..., Path],
                                           sym: Symbolizer, tmp_path: Path) -> None:
    binary = target_binary("sym_basic.c", ("-rdynamic",))
    label = nm_functions(binary).get("asm_label")
    assert label is None  # nm -S lists no size for it: it is the zero-size case
    out = subprocess.run(["nm", "--defined-only", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    label_addr = next(int(ln.split()[0], 16) for ln in out.splitlines()
                      if ln.endswith(" asm_label"))
    module = sym.module(str(binary))
    assert module is not None
    # Inside the 4 instructions after the label, no size needed.
    assert module.symbolize([label_addr + 2])[0][0].function == "asm_label"

    stripped = tmp_path / "all-stripped"
    subprocess.run(["strip", "--strip-all", "-o", str(stripped), str(binary)], check=True)
    module = sym.module(str(stripped))
    assert module is not None
    start, size = nm_functions(binary)["leaf_sum"]
    assert module.symbolize([start + size // 2])[0][0].function == "leaf_sum"  # from .dynsym


def test_unresolvable_address(target_binary: Callable[..., Path], sym: Symbolizer) -> None:
    binary = target_binary("sym_basic.c")
    module = sym.module(str(binary))
    assert module is not None
    frames = module.symbolize([0x10])[0]  # the ELF header: no symbol, no line
    assert frames == (SourceFrame(f"{binary.name}+0x10", "", 0, None),)
    assert sym.module(str(binary.parent / "does-not-exist")) is None
    assert sym.module(str(TARGETS / "sym_basic.c")) is None  # not ELF


def test_file_offset_to_vaddr(target_binary: Callable[..., Path], sym: Symbolizer) -> None:
    binary = target_binary("sym_basic.c")
    module = sym.module(str(binary))
    assert module is not None
    out = subprocess.run(["readelf", "-lW", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    loads = [ln.split() for ln in out.splitlines() if ln.strip().startswith("LOAD")]
    assert loads
    for fields in loads:
        offset, vaddr, filesz = int(fields[1], 16), int(fields[2], 16), int(fields[4], 16)
        if filesz > 8:
            assert module.file_offset_to_vaddr(offset + 8) == vaddr + 8


def _split_debug(binary: Path, work: Path) -> tuple[Path, Path]:
    """objcopy --only-keep-debug + strip --strip-debug: (stripped binary, debug file)."""
    work.mkdir(parents=True, exist_ok=True)
    stripped, debug = work / binary.name, work / f"{binary.name}.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(binary), str(debug)], check=True)
    subprocess.run(["strip", "--strip-debug", "-o", str(stripped), str(binary)], check=True)
    return stripped, debug


@needs_native
@pytest.mark.parametrize("where", ["same-dir", "dot-debug", "debug-root"])
def test_gnu_debuglink(target_binary: Callable[..., Path], tmp_path: Path, where: str) -> None:
    binary = target_binary("sym_basic.c")
    stripped, debug = _split_debug(binary, tmp_path / "bin")
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(stripped)], check=True,
                   cwd=debug.parent)
    root = tmp_path / "debugroot"
    if where == "dot-debug":
        (stripped.parent / ".debug").mkdir()
        debug.rename(stripped.parent / ".debug" / debug.name)
    elif where == "debug-root":
        target = Path(str(root) + str(stripped.parent.resolve()))
        target.mkdir(parents=True)
        debug.rename(target / debug.name)
    sym = Symbolizer(cache_dir=tmp_path / "cache", debug_roots=[str(root)])
    module = sym.module(str(stripped))
    assert module is not None
    addrs = function_addrs(binary, "outer_work")
    assert [as_tuples(f) for f in module.symbolize(addrs)] == addr2line(binary, addrs)


@needs_native
def test_build_id_debug_file(target_binary: Callable[..., Path], tmp_path: Path) -> None:
    binary = target_binary("sym_basic.c")
    stripped, debug = _split_debug(binary, tmp_path / "bin")
    sym = Symbolizer(cache_dir=tmp_path / "cache", debug_roots=[str(tmp_path / "root")])
    module = sym.module(str(stripped))
    assert module is not None and module.build_id
    addrs = function_addrs(binary, "leaf_sum")
    assert all(f[0].line == 0 for f in module.symbolize(addrs))  # not installed yet

    bid = module.build_id
    place = tmp_path / "root" / ".build-id" / bid[:2] / f"{bid[2:]}.debug"
    place.parent.mkdir(parents=True)
    shutil.copy(debug, place)
    # A new Symbolizer with the same cache: the debug file appeared, so the cached
    # line-less results must not be served any more.
    sym = Symbolizer(cache_dir=tmp_path / "cache", debug_roots=[str(tmp_path / "root")])
    module = sym.module(str(stripped))
    assert module is not None
    assert [as_tuples(f) for f in module.symbolize(addrs)] == addr2line(binary, addrs)


@needs_native
def test_cpp_demangling(target_binary: Callable[..., Path], sym: Symbolizer) -> None:
    binary = target_binary("sym_cpp.cc")
    funcs = nm_functions(binary)
    total = next(n for n in funcs if "Grid" in n and "total" in n)
    scale = next(n for n in funcs if "scale" in n)
    module = sym.module(str(binary))
    assert module is not None
    loop_line = source_line(TARGETS / "sym_cpp.cc", "GRID_LOOP")
    addrs = function_addrs(binary, total)
    chains = module.symbolize(addrs)
    assert [as_tuples(c) for c in chains] == addr2line(binary, addrs)
    outer = chains[len(chains) // 2][-1]
    assert outer.function == "geometry::Grid<long>::total(int) const"
    assert outer.system_name == total
    assert any(c[0].line == loop_line for c in chains)
    frame = module.symbolize([funcs[scale][0]])[0][-1]
    assert (frame.function, frame.system_name) == ("geometry::scale(long, int)", scale)


def build_rust(mangling: str) -> Path:
    rustc = shutil.which("rustc")
    if rustc is None:
        pytest.skip("rustc is not installed")
    source = TARGETS / "sym_rust.rs"
    flags = ["-C", "force-frame-pointers=yes", "-g", "-C", "opt-level=1"]
    if mangling != "legacy":  # legacy is the default; naming it needs -Z unstable-options
        flags += ["-C", f"symbol-mangling-version={mangling}"]
    digest = hashlib.sha256(source.read_bytes() + " ".join(flags).encode()).hexdigest()[:12]
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    binary = BUILD_DIR / f"sym_rust-{mangling}-{digest}"
    if not binary.exists():
        tmp = binary.with_suffix(f".tmp{os.getpid()}")
        subprocess.run([rustc, *flags, "-o", str(tmp), str(source)], check=True)
        tmp.rename(binary)
    return binary


# Legacy mangling writes an inherent method as a plain path; v0 keeps the impl: `<Type>::fn`.
@needs_native
@pytest.mark.parametrize("mangling,prefix,expected", [
    ("legacy", "_ZN", "sym_rust::engine::Counter::crunch"),
    ("v0", "_R", "<sym_rust::engine::Counter>::crunch"),
])
def test_rust_demangling(sym: Symbolizer, mangling: str, prefix: str, expected: str) -> None:
    binary = build_rust(mangling)
    funcs = nm_functions(binary)
    mangled = [n for n in funcs if n.startswith(prefix) and "crunch" in n]
    assert len(mangled) == 1, mangled
    start, size = funcs[mangled[0]]
    module = sym.module(str(binary))
    assert module is not None
    loop_line = source_line(TARGETS / "sym_rust.rs", "CRUNCH_LOOP")
    chains = module.symbolize(list(range(start, start + size)))
    outer = {c[-1] for c in chains}
    names = {f.function for f in outer}
    assert names == {expected}
    assert {f.system_name for f in outer} == {mangled[0]}
    assert any(c[0].file.endswith("sym_rust.rs") and c[0].line == loop_line for c in chains)

    # Without DWARF the name comes from the symbol table, demangled the same way.
    stripped = Path(module.path + ".nodebug")
    subprocess.run(["strip", "--strip-debug", "-o", str(stripped), module.path], check=True)
    try:
        bare = sym.module(str(stripped))
        assert bare is not None
        frame = bare.symbolize([start + size // 2])[0][0]
        assert frame.function == expected
        assert frame.system_name == mangled[0]
    finally:
        stripped.unlink()


def test_demangle_strings() -> None:
    assert demangle("_ZN3foo3barIiEEvT_") == "void foo::bar<int>(int)"
    assert demangle_rust_legacy("_ZN4core3fmt5write17h0123456789abcdefE") == "core::fmt::write"
    assert demangle("_ZN40_$LT$tiny..Sq$u20$as$u20$tiny..Shape$GT$4area17h4253010948ee4893E"
                    ) == "<tiny::Sq as tiny::Shape>::area"
    assert demangle("_ZN4core3ops8function6FnOnce40call_once$u7b$$u7b$vtable.shim$u7d$$u7d$"
                    "17hf4b9a36ec084a505E.llvm.42") == "core::ops::function::FnOnce::" \
        "call_once{{vtable.shim}}"
    assert demangle_rust_v0("_RNvCs15kBYyAo9fc_7mycrate7example") == "mycrate::example"
    assert demangle("_RNvNtCs1234_7mycrate3foo3bar") == "mycrate::foo::bar"
    # generics, closures, impl paths and backrefs
    assert demangle(
        "_RINvMs4_NtCsgY6Mt91CT9J_14rustc_demangle2v0NtB6_7Printer13print_backrefNCNvB2_"
        "10print_paths_0EB8_") == ("<rustc_demangle::v0::Printer>::print_backref::"
                                   "<<rustc_demangle::v0::Printer>::print_path::{closure#1}>")
    assert demangle("_RNvNtCs1234_7mycrateu8gdel_5qa6escher") == "mycrate::gödel::escher"
    assert demangle("main") == "main"
    assert demangle("_RNvC") == "_RNvC"  # truncated: left alone


@needs_native
def test_cache_hit_skips_dwarf(target_binary: Callable[..., Path], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    binary = target_binary("sym_basic.c")
    addrs = function_addrs(binary, "outer_work")
    first = Symbolizer(cache_dir=tmp_path / "cache").module(str(binary))
    assert first is not None
    expected = first.symbolize(addrs)
    assert first.cache_path is not None and first.cache_path.is_file()
    assert first.cache_path.name.startswith(f"{first.build_id}-")

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("DWARF or symbols parsed despite a warm cache")

    monkeypatch.setattr(dwarf_mod.DwarfIndex, "__init__", boom)
    monkeypatch.setattr(dwarf_mod.DwarfIndex, "parse_units", boom)
    monkeypatch.setattr(symbolizer_mod.SymbolTable, "from_elf", boom)
    second = Symbolizer(cache_dir=tmp_path / "cache").module(str(binary))
    assert second is not None and second is not first
    assert second.symbolize(addrs) == expected


@needs_native
def test_cache_hit_in_another_process(target_binary: Callable[..., Path],
                                      tmp_path: Path) -> None:
    binary = target_binary("sym_basic.c")
    addrs = function_addrs(binary, "leaf_sum")
    module = Symbolizer(cache_dir=tmp_path / "cache").module(str(binary))
    assert module is not None
    expected = [as_tuples(c) for c in module.symbolize(addrs)]
    script = textwrap.dedent(f"""
        import sys
        from rsprof.collector.symbols import Symbolizer, dwarf
        def boom(*a, **k):
            raise SystemExit("DWARF opened")
        dwarf.DwarfIndex.__init__ = boom
        m = Symbolizer(cache_dir={str(tmp_path / "cache")!r}).module({str(binary)!r})
        for chain in m.symbolize({addrs!r}):
            print([(f.function, f.file, f.line) for f in chain])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=tmp_path, env=child_env(), check=True).stdout.splitlines()
    assert out == [repr(c) for c in expected]


@needs_native
def test_corrupt_cache_is_rebuilt(target_binary: Callable[..., Path], tmp_path: Path) -> None:
    binary = target_binary("sym_basic.c")
    addrs = function_addrs(binary, "leaf_sum")[:8]
    module = Symbolizer(cache_dir=tmp_path / "cache", disk_cache=False).module(str(binary))
    assert module is not None
    expected = module.symbolize(addrs)
    db = Symbolizer(cache_dir=tmp_path / "cache").module(str(binary)).cache_path  # type: ignore[union-attr]
    assert db is not None
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database" * 100)
    fresh = Symbolizer(cache_dir=tmp_path / "cache").module(str(binary))
    assert fresh is not None and fresh.symbolize(addrs) == expected
    with sqlite3.connect(db) as conn:  # rebuilt as a real cache
        assert conn.execute("SELECT count(*) FROM frames").fetchone()[0] == len(addrs)
        # Garbage rows (wrong JSON shape) are misses, never trusted.
        conn.execute("UPDATE frames SET frames = '{\"x\": 1}'")
    again = Symbolizer(cache_dir=tmp_path / "cache").module(str(binary))
    assert again is not None and again.symbolize(addrs) == expected


@needs_native
def test_concurrent_writers(target_binary: Callable[..., Path], tmp_path: Path) -> None:
    binary = target_binary("sym_basic.c")
    addrs = function_addrs(binary, "outer_work") + function_addrs(binary, "leaf_sum")
    script = textwrap.dedent("""
        import sys
        from rsprof.collector.symbols import Symbolizer
        m = Symbolizer(cache_dir=sys.argv[1]).module(sys.argv[2])
        part = [int(a) for a in sys.argv[3].split(",")]
        for _ in range(5):
            m.symbolize(part)
            m._memo.clear()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "cache"),
                               str(binary), ",".join(map(str, addrs[k::3]))],
                              cwd=tmp_path, env=child_env())
             for k in range(3)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    module = Symbolizer(cache_dir=tmp_path / "cache").module(str(binary))
    assert module is not None
    assert module.cache_path is not None
    with sqlite3.connect(module.cache_path) as conn:
        assert conn.execute("SELECT count(*) FROM frames").fetchone()[0] == len(set(addrs))
    assert [as_tuples(c) for c in module.symbolize(addrs)] == addr2line(binary, addrs)


@needs_native
@pytest.mark.parametrize("name", ["sym_basic.c", "sym_cpp.cc"])
def test_pure_python_fallback_agrees(target_binary: Callable[..., Path], name: str) -> None:
    """The pyelftools reader used when the extension is missing gives the same answers."""
    pytest.importorskip("elftools", reason="pyelftools comes with the test extra")
    binary = target_binary(name)
    elf = ElfFile(str(binary))
    addrs = [a for start, size in nm_functions(binary).values() for a in range(start, start + size)]
    native = DwarfIndex(elf, native=True).lookup(addrs)
    pure = DwarfIndex(elf, native=False).lookup(addrs)
    assert native.keys() == pure.keys() and len(native) > 100
    assert {a: (r.line, r.scopes) for a, r in native.items()} == \
        {a: (r.line, r.scopes) for a, r in pure.items()}


def _objdump_plt(binary: Path) -> dict[int, str]:
    """PLT stubs (address -> `name@plt`) as objdump -d labels them."""
    out = subprocess.run(["objdump", "-d", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    stubs = {}
    for line in out.splitlines():
        address, _, label = line.partition(" <")
        if label.endswith("@plt>:") and "*ABS*" not in label:
            stubs[int(address, 16)] = label[:-2]
    return stubs


@pytest.mark.parametrize("binary", ["plt_calls.c", "/usr/bin/gawk", "/usr/bin/sqlite3",
                                    "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"])
def test_plt_stubs_named_as_objdump(binary: str, sym: Symbolizer) -> None:
    """Every PLT stub (.plt, .plt.sec, .plt.got) is `name@plt`, demangled, at its first byte
    and inside it (it was `prog+0x1030`)."""
    path = build_target(binary, ("-fno-builtin",)) if binary.endswith(".c") else Path(binary)
    if not path.exists() or shutil.which("objdump") is None:
        pytest.skip(f"{path} or objdump is not installed")
    stubs = _objdump_plt(path)
    assert stubs, f"objdump shows no PLT stub in {path}"
    module = sym.module(str(path))
    assert module is not None
    addresses = sorted(stubs)
    starts = module.symbolize(addresses)
    inside = module.symbolize([a + 6 for a in addresses])
    for address, first, second in zip(addresses, starts, inside, strict=True):
        expected = demangle(stubs[address])
        assert first[0].function == expected, (hex(address), first, expected)
        assert second[0].function == expected, (hex(address + 6), second, expected)


def test_plt_stub_named_in_a_recording(tmp_path: Path) -> None:
    """A hot loop calling ffs() and labs() through their PLT stubs: CPU samples in a stub are
    `ffs@plt` or `labs@plt`."""
    binary = build_target("plt_calls.c", ("-fno-builtin",))
    out = tmp_path / "plt.db"
    result = run_rsprof("run", "-q", "--cpu-freq", "1999", "-o", str(out), "--", str(binary),
                        "2", timeout=180)
    assert result.returncode == 0, result.stderr
    names = {str(row["function"]) for row in top_json(out, "cpu")}
    # A stub is one jump: few samples land there on a busy machine, in one stub or the other.
    assert {"ffs@plt", "labs@plt"} & names, sorted(names)
    assert not any(name.startswith(binary.name + "+0x") for name in names), sorted(names)
