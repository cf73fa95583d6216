"""DeepSpeed's CPU shared-memory all-reduce, built from its PyPI source release, for comparison.

No DeepSpeed install is used: the sdist (``pip download --no-binary :all: --no-deps deepspeed``)
is fetched once into a cache directory (``--deepspeed-cache`` or ``$TENSORXFER_BENCH_DEEPSPEED_CACHE``,
default ``~/.cache/tensorxfer/bench-deepspeed``); ``csrc/cpu/comm/shm.cpp`` and
``shm_interface.cpp`` (with their headers) are compiled by ``torch.utils.cpp_extension.load`` with
the compiler flags DeepSpeed's own ``ShareMemCommBuilder.cxx_args`` returns (read from
``op_builder/cpu/comm.py`` in the same sdist). The op is ``torch.ops.deepspeed.inference_all_reduce_``,
what ``deepspeed.comm.inference_all_reduce`` calls on CPU. Anything missing raises
:class:`Unavailable` with the reason, which the benchmark prints as a skip.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Optional

CACHE_ENV = "TENSORXFER_BENCH_DEEPSPEED_CACHE"
SOURCES = ("csrc/cpu/comm/shm_interface.cpp", "csrc/cpu/comm/shm.cpp")
BUILDER = "op_builder/cpu/comm.py"
SHM_PREFIX = "deepspeed_allreduce_buffer"  # shm.cpp's SHM_BUFFER_NAME


class Unavailable(RuntimeError):
    """The DeepSpeed op cannot be fetched or built here; the message says why."""


def default_cache() -> Path:
    """``$TENSORXFER_BENCH_DEEPSPEED_CACHE``, else ``~/.cache/tensorxfer/bench-deepspeed``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "tensorxfer" / "bench-deepspeed"


def find_sdist(cache: Path) -> Optional[Path]:
    """The newest ``deepspeed-<version>.tar.gz`` in ``cache``, if any."""
    found = sorted(cache.glob("deepspeed-*.tar.gz"), key=lambda p: _version_key(p.name))
    return found[-1] if found else None


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name))


def fetch_sdist(cache: Path, download: bool) -> Path:
    """The sdist in ``cache``, downloaded from PyPI first when missing and ``download`` is true."""
    sdist = find_sdist(cache)
    if sdist is not None:
        return sdist
    if not download:
        raise Unavailable(f"no deepspeed-*.tar.gz in {cache} and downloading is off")
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "deepspeed",
               "-d", str(cache)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    sdist = find_sdist(cache)
    if result.returncode != 0 or sdist is None:
        raise Unavailable(f"`{' '.join(command)}` failed: {(result.stderr or result.stdout).strip()[-400:]}")
    return sdist


def extract(sdist: Path, cache: Path) -> Path:
    """Extracts the comm sources and the builder into ``cache/<sdist stem>/``; returns that root."""
    root = cache / sdist.name[: -len(".tar.gz")]
    if all((root / source).exists() for source in SOURCES) and (root / BUILDER).exists():
        return root
    wanted = ("csrc/cpu/comm/", BUILDER)
    with tarfile.open(sdist) as archive:
        members = []
        for member in archive.getmembers():
            relative = member.name.split("/", 1)[1] if "/" in member.name else ""
            if member.isfile() and relative.startswith(wanted):
                member.name = relative
                members.append(member)
        archive.extractall(root, members=members, filter="data")
    missing = [s for s in (*SOURCES, BUILDER) if not (root / s).exists()]
    if missing:
        raise Unavailable(f"{sdist.name} lacks {', '.join(missing)}")
    return root


def builder_flags(root: Path) -> list[str]:
    """The list literal ``ShareMemCommBuilder.cxx_args`` returns in the sdist's builder."""
    tree = ast.parse((root / BUILDER).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ShareMemCommBuilder":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "cxx_args":
                    for statement in ast.walk(item):
                        if isinstance(statement, ast.Return) and statement.value is not None:
                            try:
                                flags = ast.literal_eval(statement.value)
                            except ValueError:
                                break
                            return [str(flag) for flag in flags]
    raise Unavailable(f"could not read ShareMemCommBuilder.cxx_args from {root / BUILDER} as a list literal")


def build(cache: Path, download: bool = True, verbose: bool = False) -> tuple[Any, str]:
    """Builds (or loads the cached build of) the op; returns (module, description)."""
    try:
        import torch  # noqa: F401
        from torch.utils import cpp_extension
    except ImportError as error:
        raise Unavailable(f"torch is not importable ({error})") from error
    sdist = fetch_sdist(cache, download)
    root = extract(sdist, cache)
    flags = builder_flags(root)
    version = sdist.name[len("deepspeed-"): -len(".tar.gz")]
    build_dir = root / "build"
    build_dir.mkdir(exist_ok=True)
    try:
        module = cpp_extension.load(
            name="tensorxfer_bench_ds_shm_" + re.sub(r"\W", "_", version),
            sources=[str(root / source) for source in SOURCES],
            extra_cflags=flags,
            build_directory=str(build_dir),
            verbose=verbose,
        )
    except Exception as error:  # the compiler's message, whatever the failure
        raise Unavailable(f"building {', '.join(SOURCES)} of deepspeed {version} failed: {error}") from error
    return module, f"DeepSpeed {version} shm all-reduce (sdist), flags {' '.join(flags)}"


def shm_names(uid: int, addr: str, port: str, world: int) -> list[str]:
    """The /dev/shm names shm.cpp creates (and never unlinks) for this address and port."""
    return [f"{SHM_PREFIX}_{uid}_{addr}_{port}_{rank}" for rank in range(world)]
