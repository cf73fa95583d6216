"""Makes ``tensorxfer._core`` the extension built against the fake CUDA runtime.

The fake variant is built by ``scripts/fake_cuda.sh`` (CMake option
``TENSORXFER_FAKE_CUDA=ON``) into its own directory and never copied into the
package; ``install()`` loads it under the name ``tensorxfer._core`` before
``tensorxfer`` is imported from the checkout's ``python/`` sources. Call it
first in every process that tests it (the conftest does, and so must spawned
children).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]
BUILD_DIRS = ("build/fake-cuda", "build-fake")


def extension_path() -> str:
    """``TENSORXFER_FAKE_CUDA_EXTENSION``, else the latest fake build in the checkout."""
    explicit = os.environ.get("TENSORXFER_FAKE_CUDA_EXTENSION")
    if explicit:
        return explicit
    found = [path for build in BUILD_DIRS for path in glob.glob(str(ROOT / build / "_core*.so"))]
    if found:
        return max(found, key=os.path.getmtime)  # the latest build
    raise RuntimeError(
        "no extension built against the fake CUDA runtime: run scripts/fake_cuda.sh (or set "
        f"TENSORXFER_FAKE_CUDA_EXTENSION); looked in {', '.join(BUILD_DIRS)}"
    )


def install() -> ModuleType:
    """Loads the fake variant as ``tensorxfer._core`` and imports ``tensorxfer`` over it."""
    existing = sys.modules.get("tensorxfer._core")
    if existing is not None:
        if not hasattr(existing, "fake_cuda"):
            raise RuntimeError(f"tensorxfer._core was imported already, from {existing.__file__}, not the fake variant")
        return existing
    spec = importlib.util.spec_from_file_location("tensorxfer._core", extension_path())
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tensorxfer._core"] = module
    spec.loader.exec_module(module)
    sys.path.insert(0, str(ROOT / "python"))
    import tensorxfer

    tensorxfer._core = module  # type: ignore[attr-defined]
    if not hasattr(module, "fake_cuda"):
        raise RuntimeError(f"{module.__file__} was not built with TENSORXFER_FAKE_CUDA=ON")
    return module
