"""Writes the small intersphinx inventories the docs build reads from this folder.

The docs build never fetches anything (the machines that build it reach only package
registries), so the inventories that link names to the Python, NumPy and PyTorch
documentation are kept here, cut down to the names the reference and the guides use:

* ``python.inv``: the entries of the real inventory of the Python documentation,
  read from Debian's ``python3.11-doc`` (``/usr/share/doc/python3.11/html/objects.inv``).
* ``numpy.inv`` and ``torch.inv``: written from the table below (neither project has a
  Debian or PyPI package with its inventory); each URI is the page of that object in the
  project's documentation.

Run it after adding a name (``python docs/_inventories/make_inventories.py``); the docs
build fails (``-n``) on a reference to an external name that no inventory has.
"""

from __future__ import annotations

import pathlib
import sys
import zlib
from typing import Dict, List, Tuple

HERE = pathlib.Path(__file__).resolve().parent
DEBIAN_PYTHON_INVENTORY = pathlib.Path("/usr/share/doc/python3.11/html/objects.inv")

#: (name, domain:role) of the Python documentation's entries the docs refer to.
PYTHON_NAMES: List[Tuple[str, str]] = [
    ("abc.ABC", "py:class"),
    ("collections.abc.Sequence", "py:class"),
    ("concurrent.futures.Future", "py:class"),
    ("ctypes.CDLL", "py:class"),
    ("dataclasses.dataclass", "py:function"),
    ("enum.Enum", "py:class"),
    ("KeyboardInterrupt", "py:exception"),
    ("OSError", "py:exception"),
    ("RuntimeError", "py:exception"),
    ("TimeoutError", "py:exception"),
    ("TypeError", "py:exception"),
    ("ValueError", "py:exception"),
    ("ImportError", "py:exception"),
    ("multiprocessing", "py:module"),
    ("threading.Thread", "py:class"),
    ("typing.Protocol", "py:class"),
    ("bytes", "py:class"),
    ("bytearray", "py:class"),
    ("memoryview", "py:class"),
    ("int", "py:class"),
    ("float", "py:class"),
    ("str", "py:class"),
    ("bool", "py:class"),
    ("dict", "py:class"),
    ("list", "py:class"),
    ("tuple", "py:class"),
    ("object", "py:class"),
]

#: (name, domain:role, URI relative to https://numpy.org/doc/stable/).
NUMPY_ENTRIES: List[Tuple[str, str, str]] = [
    ("numpy.ndarray", "py:class", "reference/generated/numpy.ndarray.html#numpy.ndarray"),
    ("numpy.dtype", "py:class", "reference/generated/numpy.dtype.html#numpy.dtype"),
    ("numpy.typing.ArrayLike", "py:data", "reference/typing.html#numpy.typing.ArrayLike"),
    ("numpy.typing.DTypeLike", "py:data", "reference/typing.html#numpy.typing.DTypeLike"),
    ("numpy.typing.NDArray", "py:data", "reference/typing.html#numpy.typing.NDArray"),
    ("numpy.uint8", "py:class", "reference/arrays.scalars.html#numpy.uint8"),
    ("numpy.uint64", "py:class", "reference/arrays.scalars.html#numpy.uint64"),
    ("numpy.int64", "py:class", "reference/arrays.scalars.html#numpy.int64"),
]

#: (name, domain:role, URI relative to https://docs.pytorch.org/docs/stable/).
TORCH_ENTRIES: List[Tuple[str, str, str]] = [
    ("torch.Tensor", "py:class", "tensors.html#torch.Tensor"),
    ("torch.dtype", "py:class", "tensor_attributes.html#torch.dtype"),
    ("torch.device", "py:class", "tensor_attributes.html#torch.device"),
    ("torch.nn.Module", "py:class", "generated/torch.nn.Module.html#torch.nn.Module"),
    ("torch.distributed.init_process_group", "py:function",
     "distributed.html#torch.distributed.init_process_group"),
    ("torch.distributed.ProcessGroup", "py:class", "distributed.html#torch.distributed.ProcessGroup"),
    ("torch.cuda.Stream", "py:class", "generated/torch.cuda.Stream.html#torch.cuda.Stream"),
    ("torch.cuda.Event", "py:class", "generated/torch.cuda.Event.html#torch.cuda.Event"),
]


def read_inventory(path: pathlib.Path) -> Dict[Tuple[str, str], str]:
    """(name, domain:role) -> the rest of its line, from a version 2 inventory."""
    data = path.read_bytes()
    header_end = 0
    for _ in range(4):
        header_end = data.index(b"\n", header_end) + 1
    entries = {}
    for line in zlib.decompress(data[header_end:]).decode().splitlines():
        name, role, rest = line.split(" ", 2)
        entries[(name, role)] = rest
    return entries


def write_inventory(path: pathlib.Path, project: str, version: str, lines: List[str]) -> None:
    """Writes a version 2 inventory (the format intersphinx reads) of ``lines``."""
    header = (f"# Sphinx inventory version 2\n# Project: {project}\n# Version: {version}\n"
              "# The remainder of this file is compressed using zlib.\n")
    path.write_bytes(header.encode() + zlib.compress("".join(f"{line}\n" for line in sorted(lines)).encode(), 9))


def main() -> int:
    if not DEBIAN_PYTHON_INVENTORY.exists():
        print(f"{DEBIAN_PYTHON_INVENTORY} is missing: apt-get install python3.11-doc", file=sys.stderr)
        return 1
    python = read_inventory(DEBIAN_PYTHON_INVENTORY)
    missing = [name for name, role in PYTHON_NAMES if (name, role) not in python]
    if missing:
        print(f"not in the Python inventory: {missing}", file=sys.stderr)
        return 1
    write_inventory(HERE / "python.inv", "Python", "3.11",
                    [f"{name} {role} {python[(name, role)]}" for name, role in PYTHON_NAMES])
    write_inventory(HERE / "numpy.inv", "NumPy", "stable",
                    [f"{name} {role} 1 {uri} -" for name, role, uri in NUMPY_ENTRIES])
    write_inventory(HERE / "torch.inv", "PyTorch", "stable",
                    [f"{name} {role} 1 {uri} -" for name, role, uri in TORCH_ENTRIES])
    return 0


if __name__ == "__main__":
    sys.exit(main())
