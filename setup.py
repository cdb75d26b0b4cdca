"""Build glue that pyproject.toml cannot express: the C extension, the LD_PRELOAD heap shim
(a plain shared library with no Python in it), the native demo program and the launcher
of `rsprof run`.

`pip install .` runs all four through setuptools' compiler; nobody runs make by hand.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
NATIVE = HERE / "native"
COMMON_CFLAGS = [
    "-O2", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Wno-unused-parameter",
]


class BuildNative(build_ext):
    """Builds the extension as usual, then the shim, the demo and the launcher next to it."""

    def run(self) -> None:
        super().run()
        self._build_shim()
        self._build_demo()
        self._build_launcher()

    def _package_dir(self) -> Path:
        if self.inplace:
            return HERE / "rsprof"
        return Path(self.build_lib) / "rsprof"

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
        self._build_program(
            "demo", "rsprof-demo",
            ["-O1", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-pthread"],
            ["-pthread"],
        )

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
