"""Process groups for the tensors the tensorxfer backend does not take (not on the CPU).

``init_process_group("cpu:tensorxfer,cuda:nccl")`` names a backend per device;
the tensorxfer group hands such tensors to a group of that backend, made on
first use on the same store. Without one named, they raise.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, ProcessGroupGloo

from tensorxfer.distributed import BACKEND_NAME


def named_backends(config: str) -> Dict[str, str]:
    """The backend named per device type in a backend string (``"cpu:tensorxfer,cuda:nccl"``); none in ``"tensorxfer"``."""
    return dict(part.split(":", 1) for part in config.split(",") if ":" in part)


def device_types(config: str) -> List[torch.device]:
    """The device types a tensorxfer group with backend string ``config`` takes tensors of: the CPU first."""
    return [torch.device("cpu")] + [torch.device(device) for device in named_backends(config) if device != "cpu"]


class OtherDevices:
    """The process group per non-CPU device type, made on demand from the backend string."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout: timedelta) -> None:
        self._store = store
        self._rank = rank
        self._world_size = world_size
        self._timeout = timeout
        self._groups: Dict[str, Any] = {}

    def group_for(self, tensors: List[torch.Tensor], op: str, config: str) -> Any:
        """The group for ``tensors`` (all on one non-CPU device type); ``config`` is the backend string."""
        types = {t.device.type for t in tensors}
        if len(types) > 1:
            raise ValueError(f"tensorxfer backend: {op} got tensors on several devices: {sorted(types)}")
        device = types.pop()
        if device not in self._groups:
            self._groups[device] = self._make(device, op, config)
        return self._groups[device]

    def _make(self, device: str, op: str, config: str) -> Any:
        backend = named_backends(config).get(device)
        if backend is None or backend == BACKEND_NAME:
            raise RuntimeError(
                f"tensorxfer backend: {op} got a {device} tensor, but the tensorxfer backend handles CPU "
                f"tensors only and no backend was named for {device} (process group backend {config!r}); "
                f"name one, e.g. init_process_group(\"cpu:tensorxfer,{device}:nccl\")")
        store = PrefixStore(f"{device}/", self._store)
        if backend == "gloo":
            return ProcessGroupGloo(store, self._rank, self._world_size, self._timeout)
        if backend == "nccl" and dist.is_nccl_available():
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self._timeout
            return dist.ProcessGroupNCCL(store, self._rank, self._world_size, options)
        raise RuntimeError(f"tensorxfer backend: the {backend!r} backend named for {device} tensors is not available")
