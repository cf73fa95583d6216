"""The extension exports its entry points and nothing from the archives linked into it.

A GPU machine's toolchain linked libstdc++ statically into the module. With the
archive's symbols exported, the process's libstdc++.so (loaded by torch) took
over half of them and the first number written to a C++ stream crashed (SIGSEGV
in the locale code). Every archive's symbols (the core library, cudart_static,
a static libstdc++) must stay private to the module.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tensorxfer import _core

# C symbols the module exists to export: Python's entry point, and the allocator
# functions torch's CUDAPluggableAllocator looks up by name.
ENTRY_POINTS = {"PyInit__core", "tensorxfer_uvm_malloc", "tensorxfer_uvm_free", "tensorxfer_uvm_last_error"}


def exported_symbols() -> list:
    result = subprocess.run(["nm", "-D", "--defined-only", "-C", _core.__file__],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [line.split(maxsplit=2)[2] for line in result.stdout.splitlines() if len(line.split(maxsplit=2)) == 3]


@pytest.mark.skipif(shutil.which("nm") is None, reason="no nm on PATH")
def test_only_the_entry_points_and_inline_templates_are_exported():
    symbols = exported_symbols()
    assert "PyInit__core" in symbols  # nm really listed the exports
    # The core library's own functions (tensorxfer::...) come from an archive.
    assert [name for name in symbols if name.startswith("tensorxfer::")] == []
    # C functions (cudart_static's cuda*, libstdc++'s and libgcc's C entry points).
    c_functions = [name for name in symbols if re.fullmatch(r"[A-Za-z_]\w*", name)]
    assert sorted(set(c_functions) - ENTRY_POINTS) == []
    # libstdc++'s non-template internals: the locale and its facets, iostream setup.
    assert [name for name in symbols if re.match(r"std::(locale|ios_base|num_put|codecvt)\b", name)] == []
