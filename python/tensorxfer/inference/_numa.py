"""NUMA placement of host tensors: bind their pages to a node and report where they are.

Every install has it: the core makes the kernel's NUMA system calls itself (no
libnuma). Where the kernel refuses them (a kernel without NUMA: ENOSYS; a
container's seccomp profile without CAP_SYS_NICE: EPERM) the calls raise
``UnifiedMemoryUnsupportedError`` naming the system call and errno; any other
failure of a system call is an ``OSError`` carrying its errno.
``python -m tensorxfer info`` shows what the kernel permits.
"""

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
    """The NUMA nodes this process can allocate memory on, ascending.

    The online nodes with memory in /sys/devices/system/node, limited to the
    process's cpuset; ``[0]`` on a machine without NUMA (it is one node).
    """
    with unified_errors():
        return list(_core.numa_nodes_with_memory())


def bind_to_numa_node(tensor: Any, node: int) -> None:
    """Bind the pages of a host tensor to NUMA ``node``, moving the resident ones there.

    Pages not yet touched are allocated on ``node`` when first written. The
    policy covers whole pages, including bytes that share them with the tensor.

    Raises:
        ValueError: ``node`` is not a node with memory (the message lists them),
            or the tensor is not contiguous host memory.
        UnifiedMemoryUnsupportedError: the kernel refuses ``mbind`` (ENOSYS, EPERM).
        OSError: ``mbind`` failed otherwise (``errno`` set, e.g. EIO when a
            resident page could not be moved).
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
    Raises ``UnifiedMemoryUnsupportedError`` where the kernel refuses ``move_pages``.
    """
    view = _host_view(tensor, "tensor")
    with unified_errors():
        return list(_core.numa_nodes_of(view, "tensor"))
