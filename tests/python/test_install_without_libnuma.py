"""`pip install .` alone gives NUMA placement: the extension needs no libnuma, and the
build neither looks for libnuma nor includes its headers (a machine without
libnuma-dev builds the same package)."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

from tensorxfer import _core

CHECKOUT = pathlib.Path(__file__).resolve().parents[2]
# What libnuma exports and glibc does not: the extension must import none of it.
LIBNUMA_SYMBOLS = re.compile(r"^(numa_\w+|mbind|get_mempolicy|set_mempolicy|move_pages|migrate_pages)$")


@pytest.mark.skipif(shutil.which("ldd") is None, reason="no ldd on PATH")
def test_the_extension_does_not_link_libnuma():
    result = subprocess.run(["ldd", _core.__file__], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "libc.so" in result.stdout  # ldd really listed the dependencies
    assert "libnuma" not in result.stdout, result.stdout


@pytest.mark.skipif(shutil.which("nm") is None, reason="no nm on PATH")
def test_the_extension_imports_no_libnuma_symbol():
    result = subprocess.run(["nm", "-D", "--undefined-only", _core.__file__],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    imported = [line.split()[-1].split("@")[0] for line in result.stdout.splitlines() if line.strip()]
    assert "memcpy" in imported  # nm really listed the imports
    assert [name for name in imported if LIBNUMA_SYMBOLS.match(name)] == []


needs_checkout = pytest.mark.skipif(not (CHECKOUT / "CMakeLists.txt").is_file(),
                                    reason="the build files are not beside this test (run from a checkout)")


@needs_checkout
def test_no_source_includes_the_libnuma_headers():
    pattern = re.compile(r"^\s*#\s*include\s*<(numa|numaif|numacompat1)\.h>", re.M)
    found = [path.relative_to(CHECKOUT).as_posix()
             for folder in ("cpp", "tests/cpp", "bench")
             for path in sorted((CHECKOUT / folder).rglob("*"))
             if path.suffix in (".h", ".cc", ".cu") and pattern.search(path.read_text(errors="replace"))]
    assert found == []


@needs_checkout
@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("c++") is None,
                    reason="no cmake or C++ compiler on PATH")
@pytest.mark.timeout(330)  # above the configure's own 300 s
def test_the_cmake_configuration_does_not_look_for_libnuma(tmp_path):
    result = subprocess.run(
        ["cmake", "-S", str(CHECKOUT), "-B", str(tmp_path), "-DTENSORXFER_BUILD_PYTHON=OFF",
         "-DTENSORXFER_BUILD_TESTS=OFF", "-DTENSORXFER_WITH_CUDA=OFF"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    # Paths are left out: a checkout's own directory may have "numa" in its name.
    cache = (tmp_path / "CMakeCache.txt").read_text().replace(str(CHECKOUT), "<checkout>")
    numa_entries = [line for line in cache.splitlines()
                    if not line.startswith("//") and re.search(r"numa", line, re.I)]
    assert numa_entries == []  # before: TENSORXFER_WITH_NUMA, the numa.h directory, libnuma.so
    link_flags = "".join(path.read_text(errors="replace").replace(str(CHECKOUT), "<checkout>")
                         for path in tmp_path.rglob("*")
                         if path.is_file() and path.name in ("build.ninja", "link.txt", "flags.make"))
    assert link_flags, "the configuration wrote no build files"
    assert "libnuma" not in link_flags and "-lnuma" not in link_flags
