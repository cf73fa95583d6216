"""NUMA placement of host tensors: bind their pages to a node and report where they are."""

from __future__ import annotations

import operator
from typing import Any, List

from tensorxfer import _core
from tensorxfer.inference._arguments import view_of
from tensorxfer.inference._errors import unified_errors


def _host_view(tensor: Any, name: str) -> Any:
    view = view_of(tensor, name)
    if not view.is_host:
        raise ValueError(f"{name} must be in host memory (device cpu), got {view.describe()}")
    return view


def numa_nodes_with_memory() -> List[int]:
    """The NUMA nodes this process can allocate memory on (raises UnifiedMemoryUnsupportedError without NUMA)."""
    with unified_errors():
        return list(_core.numa_nodes_with_memory())


def bind_to_numa_node(tensor: Any, node: int) -> None:
    """Bind the pages of a host tensor to NUMA ``node``, moving the resident ones there.

    Pages not yet touched are allocated on ``node`` when first written. The
    policy covers whole pages, including bytes that share them with the tensor.

    Raises:
        ValueError: ``node`` is not a node with memory (the message lists them),
            or the tensor is not contiguous host memory.
        UnifiedMemoryUnsupportedError: NUMA is unavailable in this build/kernel.
    """
    view = _host_view(tensor, "tensor")
    if isinstance(node, bool):
        raise TypeError("node must be an int NUMA node id, got bool")
    try:
        node_id = operator.index(node)
    except TypeError:
        raise TypeError(f"node must be an int NUMA node id, got {type(node).__name__}") from None
    with unified_errors():
        _core.bind_to_numa_node(view, "tensor", node_id)


def numa_nodes_of(tensor: Any) -> List[int]:
    """For each page a host tensor covers, the NUMA node holding it.

    Negative entries are ``-errno``: ``-errno.ENOENT`` for a page not resident
    yet, ``-errno.EFAULT`` for an unmapped one. An empty tensor gives ``[]``.
    """
    view = _host_view(tensor, "tensor")
    with unified_errors():
        return list(_core.numa_nodes_of(view, "tensor"))
