"""Shared fixtures: real compiled targets, real profile files."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

TARGETS = Path(__file__).parent / "targets"
# Frame pointers everywhere (GCC 12 drops the leaf frame without the second flag).
C_FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-pthread"]
BUILD_DIR = Path(os.environ.get("RSPROF_TEST_BUILD", "/tmp/rsprof-test-targets"))


def build_target(source_name: str, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compiles tests/targets/<source_name> (C or C++) once per content and returns the binary."""
    source = TARGETS / source_name
    digest = hashlib.sha256(source.read_bytes() + " ".join(extra_flags).encode()).hexdigest()[:12]
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    binary = BUILD_DIR / f"{source.stem}-{digest}"
    if not binary.exists():
        compiler = "g++" if source.suffix in (".cc", ".cpp") else "gcc"
        tmp = binary.with_suffix(f".tmp{os.getpid()}")
        subprocess.run(
            [compiler, *C_FLAGS, *extra_flags, "-o", str(tmp), str(source)],
            check=True,
        )
        tmp.rename(binary)
    return binary


@pytest.fixture
def target_binary() -> Callable[..., Path]:
    return build_target
