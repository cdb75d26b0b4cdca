"""Build glue that pyproject.toml cannot express: the C extension, the LD_PRELOAD heap shim
(a plain shared library with no Python in it), the native demo program and the launcher
of `rsprof run`.

`pip install .` runs all four through setuptools' compiler; nobody runs make by hand.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent


def _multiarch() -> str:
    """Debian's multiarch triplet (x86_64-linux-gnu): where asm/ headers and libs live."""
    return str(sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu")
NATIVE = HERE / "native"
COMMON_CFLAGS = [
    "-O2", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Wno-unused-parameter",
]


def _require_compiler() -> None:
    """Building from source (an sdist, a checkout) needs a C compiler: without one, say so
    in one line, not in setuptools' "No such file or directory: 'x86_64-linux-gnu-gcc'"."""
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None and shutil.which("gcc") is None:
        raise SystemExit(
            f"rsprof: building from source needs a C compiler ({compiler} not found): install"
            " gcc (apt install gcc python3-dev), or install a wheel")


class BuildNative(build_ext):
    """Builds the extension as usual, then the shim, the demo and the launcher next to it."""

    def run(self) -> None:
        _require_compiler()
        bpf = self._build_bpf()
        if bpf:
            for ext in self.extensions:
                ext.define_macros.append(("RS_HAVE_BPF", "1"))
                ext.libraries.append("bpf")
        else:
            # A build folder kept from a build with BPF holds its object: not this build's.
            (self._package_dir() / "lib" / "pyperf.bpf.o").unlink(missing_ok=True)
        # Objects compiled with the other choice look up to date (same sources): rebuild.
        stamp = Path(self.build_temp) / "rsprof-bpf"
        if not stamp.exists() or stamp.read_text() != str(bpf):
            self.force = True
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(str(bpf))
        super().run()
        self._build_shim()
        self._build_demo()
        self._build_launcher()

    def _package_dir(self) -> Path:
        if self.inplace:
            return HERE / "rsprof"
        return Path(self.build_lib) / "rsprof"

    def _build_bpf(self) -> bool:
        """The BPF program that reads Python frames at sample time (native/bpf/), when clang
        and libbpf's headers and library are here (Debian: clang, libbpf-dev). Without them
        (a machine with only gcc) nothing is built and the recorder reads Python frames at
        drain time; RSPROF_NO_BPF=1 builds that way on purpose."""
        clang = shutil.which("clang")
        if os.environ.get("RSPROF_NO_BPF") == "1" or clang is None:
            return False
        dirs = ["/usr/lib/" + _multiarch(), "/usr/lib64", "/usr/lib", "/usr/local/lib"]
        # libbpf.so (the link-time name) and the headers: libbpf-dev, not just libbpf1.
        includes = ("/usr/include", "/usr/local/include")
        if not any(Path(d, "libbpf.so").exists() for d in dirs) or not any(
                Path(d, "bpf", "libbpf.h").exists() for d in includes):
            return False
        out = self._package_dir() / "lib" / "pyperf.bpf.o"
        out.parent.mkdir(parents=True, exist_ok=True)
        arch = {"x86_64": "x86", "aarch64": "arm64"}.get(platform.machine(), "")
        command = [clang, "-O2", "-g", "-target", "bpf", f"-D__TARGET_ARCH_{arch}",
                   "-I" + str(NATIVE / "bpf"), "-I/usr/include/" + _multiarch(),
                   "-c", str(NATIVE / "bpf" / "pyperf.bpf.c"), "-o", str(out)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            # No BPF headers (libbpf-dev without its bpf_helpers.h), an old clang: the
            # drain-time reader is the whole of Python support then, as without clang.
            print(f"rsprof: BPF program not built ({result.stderr.strip()[:300]})")
            out.unlink(missing_ok=True)
            return False
        return True

    def _build_shim(self) -> None:
        out_dir = self._package_dir() / "lib"
        out_dir.mkdir(parents=True, exist_ok=True)
        sources = sorted(str(p) for p in (NATIVE / "shim").glob("*.c"))
        if not sources:
            return
        objects = self.compiler.compile(
            sources,
            output_dir=self.build_temp,
            include_dirs=[str(NATIVE)],
            depends=HEADERS,
            # -fexceptions: a bad_alloc thrown by the allocator's operator new unwinds
            # through the shim's wrapper, whose cleanup must run (heapshim.c, guard_end).
            extra_preargs=[*COMMON_CFLAGS, "-fPIC", "-fvisibility=hidden", "-pthread",
                           "-fexceptions"],
        )
        # The same objects make two libraries, told apart by one constant
        # (native/shim/variant/): librsprof_heap.so for LD_PRELOAD, and
        # librsprof_heap_inject.so, which `rsprof -p` loads into a running process with
        # ptrace and which waits to be started (heapshim.c, "injected mode").
        variants = self.compiler.compile(
            sorted(str(p) for p in (NATIVE / "shim" / "variant").glob("*.c")),
            output_dir=self.build_temp, extra_preargs=[*COMMON_CFLAGS, "-fPIC"],
        )
        for name, variant in (("librsprof_heap.so", "preload"),
                              ("librsprof_heap_inject.so", "inject")):
            self.compiler.link_shared_object(
                [*objects, next(o for o in variants if Path(o).stem == variant)],
                str(out_dir / name),
                libraries=["dl", "pthread", "rt"],
                # -z now: every symbol the shim uses is bound at load. Lazily bound, the
                # first call of each (memcpy in the stack walk) went through ld.so's
                # resolver inside malloc, whose register save area took 3 KiB of the
                # target's stack.
                extra_preargs=["-pthread", "-Wl,-z,now"],
            )

    def _build_demo(self) -> None:
        # The demo's source ships beside it, and its debug info names it relative to
        # itself ("demo.c", not the build folder, which pip deletes): the symbolizer finds a
        # relative source path beside the binary (collector/symbols/symbolizer.py).
        source = NATIVE / "demo"
        self._build_program(
            "demo", "rsprof-demo",
            ["-O1", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-pthread",
             f"-ffile-prefix-map={Path.cwd()}=.", f"-ffile-prefix-map={HERE.resolve()}=.",
             f"-ffile-prefix-map={source.resolve()}=."],
            ["-pthread"],
        )
        for c_file in source.glob("*.c"):
            shutil.copyfile(c_file, self._package_dir() / "bin" / c_file.name)

    def _build_launcher(self) -> None:
        """`rsprof run` starts its target through this (native/launch/launch.c)."""
        self._build_program("launch", "rsprof-launch", [*COMMON_CFLAGS, "-std=gnu11"], [])

    def _build_program(self, folder: str, name: str, cflags: list[str],
                       ldflags: list[str]) -> None:
        out_dir = self._package_dir() / "bin"
        out_dir.mkdir(parents=True, exist_ok=True)
        sources = sorted(str(p) for p in (NATIVE / folder).glob("*.c"))
        if not sources:
            return
        objects = self.compiler.compile(sources, output_dir=self.build_temp,
                                        extra_preargs=cflags, depends=HEADERS)
        exe = out_dir / name
        self.compiler.link_executable(objects, str(exe), extra_preargs=ldflags)
        os.chmod(exe, 0o755)


# Every header: an object is rebuilt when one changes (a build folder kept from an earlier
# install had a reader of ring format 3 beside a shim of format 4: heapring.h had changed,
# no .c file of the extension had).
HEADERS = sorted(str(p.relative_to(HERE)) for p in NATIVE.rglob("*.h"))

native_ext = Extension(
    "rsprof._native",
    sources=sorted(str(p.relative_to(HERE)) for p in NATIVE.glob("*.c")),
    depends=HEADERS,
    include_dirs=["native"],
    extra_compile_args=[*COMMON_CFLAGS, "-std=gnu11"],
)

setup(ext_modules=[native_ext], cmdclass={"build_ext": BuildNative})
